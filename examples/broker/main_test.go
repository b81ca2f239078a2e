package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestBrokerExampleRuns(t *testing.T) {
	for _, driver := range drivers {
		t.Run(driver, func(t *testing.T) {
			var out bytes.Buffer
			if err := run(&out, driver); err != nil {
				t.Fatalf("broker example failed: %v\n%s", err, out.String())
			}
			for _, want := range []string{"(driver " + driver + ")", "moved to the dead-letter table", "replays 2 dead letters", "0 dead letters left"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}
