package procstat

import (
	"os"
	"runtime"
	"testing"
	"time"
)

func TestTicksOfThisProcessGrowWithWork(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc is Linux's")
	}
	before := Ticks(os.Getpid())
	if before < 0 {
		t.Fatal("no CPU time read for this process")
	}
	// Spin until the kernel has charged at least two ticks, or give up
	// after a generous bound on a loaded machine.
	deadline := time.Now().Add(time.Minute)
	x := 0
	for Ticks(os.Getpid()) < before+2 {
		if time.Now().After(deadline) {
			t.Fatal("CPU time did not grow while spinning")
		}
		for i := 0; i < 1e6; i++ {
			x += i
		}
	}
	_ = x
	if Ticks(-1) != -1 || Ticks(1<<30) != -1 {
		t.Error("a process that does not exist must read as -1")
	}
}
