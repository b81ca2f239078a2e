package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/pgcluster"
)

// TestMain lets the backlog part start this test binary as its relay
// process.
func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		os.Exit(relayChild())
	}
	os.Exit(m.Run())
}

// tinyConfig runs every part at a size that only proves it works.
func tinyConfig() config {
	return config{
		DSN:              os.Getenv("TXHOOK_TEST_POSTGRES_DSN"),
		EnqueueConns:     4,
		EnqueueRound:     150 * time.Millisecond,
		EnqueueRounds:    2,
		EnqueueDrivers:   []string{"postgres", "pgx"},
		DrainEvents:      300,
		DrainConc:        []int{16, 100},
		DrainRounds:      1,
		LatencyRates:     []int{200},
		LatencyWarmup:    200 * time.Millisecond,
		LatencyDur:       500 * time.Millisecond,
		FairnessRate:     50,
		BacklogSmall:     800,
		BacklogLarge:     2000,
		ClaimSamples:     3,
		RSSEvents:        300,
		RSSTimeout:       20 * time.Second,
		RecoverRows:      3000,
		RecoverTenants:   10,
		RecoverRounds:    1,
		RecoverWALEvents: 300,
		PartitionRows:    3000,
		PartitionDays:    2,
		SQLiteEvents:     300,
		SQLiteConc:       16,
		SQLiteRounds:     1,
		SecretsEvents:    300,
		SecretsEndpoints: 30,
		SecretsConc:      16,
		SecretsRounds:    1,
		SignerBenchtime:  5 * time.Millisecond,
		RelaysCounts:     []int{1, 2},
		RelaysEvents:     300,
		RelaysRate:       200,
		RelaysSteady:     time.Second,
		RelaysRounds:     1,

		BrokerCounts:        []int{1, 2},
		BrokerEvents:        300,
		BrokerRate:          200,
		BrokerSteady:        time.Second,
		BrokerRounds:        1,
		BrokerLatencyRate:   200,
		BrokerLatencyRounds: 1,
	}
}

// TestPartsSmoke runs each part at a tiny size so the program cannot rot:
// SQLite and the signer always, the PostgreSQL parts when
// TXHOOK_TEST_POSTGRES_DSN is set. The figures mean nothing.
func TestPartsSmoke(t *testing.T) {
	want := map[string][]string{
		"enqueue":   {"Enqueue, lib/pq", "Enqueue, pgx"},
		"drain":     {"drain, PostgreSQL (pgx), 16 in flight", "drain, PostgreSQL (pgx), 100 in flight"},
		"latency":   {"latency at 200 events/s"},
		"fairness":  {"beside hostile tenants"},
		"backlog":   {"dispatch (new events", "retry claim (due deliveries)", "peak RSS", "drain of that backlog", "without a VACUUM since"},
		"recover":   {"Recover(endpoint, a day ago)", "WAL per event dispatched to no endpoint"},
		"sqlite":    {"drain, SQLite"},
		"partition": {"claim of 100 with", "lookup by delivery ID", "retention of 3,000 rows (2 days), time", "retention of 3,000 rows, WAL bytes"},
		"secrets":   {"secrets encrypted at rest", "AES-256-GCM decryption"},
		"signer":    {},
		"relays":    {"relays: 1 relay process(es)", "relays: 2 relay process(es)", "relays: 2 relay(s) at a steady"},
		"broker": {"Enqueue alone (table-mode Outbox", "broker mode, forwarding included", "history DB CPU",
			"drain of 300 events, 1 worker process", "drain of 300 events, 2 worker process", "commit→receipt latency at 200 events/s"},
	}
	for _, part := range allParts {
		t.Run(part, func(t *testing.T) {
			cfg := tinyConfig()
			if part == "relays" || part == "broker" {
				if _, err := pgcluster.Available(); err != nil {
					if os.Getenv(pgcluster.EnvRequire) == "1" {
						t.Fatalf("%s part: %v (%s=1)", part, err, pgcluster.EnvRequire)
					}
					t.Skipf("%s part skipped: it starts its own cluster: %v", part, err)
				}
			} else if cfg.DSN == "" && part != "sqlite" && part != "signer" && part != "secrets" {
				t.Skip("PostgreSQL part skipped: set TXHOOK_TEST_POSTGRES_DSN to run it")
			}
			cfg.Parts = []string{part}
			timeout := time.Minute
			if part == "broker" {
				// Two PostgreSQL clusters and a nats-server to start.
				timeout = 3 * time.Minute
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			rep, err := run(ctx, cfg, t.Output())
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range want[part] {
				found := false
				for _, r := range rep.rows {
					if strings.Contains(r.Part, w) {
						found = true
						if r.Value == "" || strings.HasPrefix(r.Value, "0 ") || r.Value == "0" {
							t.Errorf("row %q has no figure: %+v", r.Part, r)
						}
					}
				}
				if !found {
					t.Errorf("no row matching %q in:\n%s", w, rep.text())
				}
			}
			if part == "signer" && (len(rep.sections) != 1 || !strings.Contains(rep.sections[0].Body, "VerifyStandard/ed25519")) {
				t.Errorf("signer section missing:\n%s", rep.text())
			}
		})
	}
}

// TestMarkdownKeepsAnalysis checks that regenerating the report replaces
// only the text between the markers.
func TestMarkdownKeepsAnalysis(t *testing.T) {
	path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	rep := &report{started: time.Now(), command: "go run ./examples/bench", machine: []string{"CPU: test"}}
	rep.add(row{Part: "first", Value: "1"})
	if err := rep.writeMarkdown(path); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	edited := strings.Replace(string(b), endMarker, endMarker+"\n\n## Analysis\n\nhand-written", 1)
	if err := os.WriteFile(path, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	rep.rows = []row{{Part: "second", Value: "2"}}
	if err := rep.writeMarkdown(path); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(path)
	s := string(b)
	if !strings.Contains(s, "hand-written") || !strings.Contains(s, "| second | 2 |") || strings.Contains(s, "| first |") ||
		!strings.HasPrefix(s, "# Benchmarks") {
		t.Errorf("regenerated file:\n%s", s)
	}
}
