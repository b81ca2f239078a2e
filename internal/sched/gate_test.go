package sched

import (
	"testing"
	"time"
)

// TestDeferWaitsForTheSharedGate: a job the fleet's gate refused waits,
// first in line, until the gate's time, and the endpoint starts nothing
// before; a wait beyond Horizon sends the job back to the database, due
// when the gate opens.
func TestDeferWaitsForTheSharedGate(t *testing.T) {
	h := newHarness(t, Config{Concurrency: 4})
	h.warm("t", "e", Limits{})
	a, hold, _ := h.add("t", "e", Limits{})
	if !hold {
		t.Fatal("not held")
	}
	_, hold, _ = h.add("t", "e", Limits{})
	if !hold {
		t.Fatal("second not held")
	}
	if j := h.s.Next(h.now); j != a {
		t.Fatalf("Next = %v, want the first job", j)
	}
	until := h.now.Add(300 * time.Millisecond)
	if back := h.s.Defer(h.now, a, until); len(back) != 0 {
		t.Fatalf("Defer within the horizon gave back %d", len(back))
	}
	if h.s.InFlight() != 0 || h.s.Waiting() != 2 {
		t.Fatalf("in flight %d, waiting %d; want 0, 2", h.s.InFlight(), h.s.Waiting())
	}
	if j := h.s.Next(h.now); j != nil {
		t.Fatal("started before the gate's time")
	}
	if w := h.s.Wake(h.now); !w.Equal(until) {
		t.Fatalf("Wake = %v, want the gate's time %v", w, until)
	}
	h.now = until
	if j := h.s.Next(h.now); j != a {
		t.Fatalf("at the gate's time Next = %v, want the deferred job first", j)
	}
	// Another relay's circuit opened for a minute: what waits goes back,
	// due then, and a new claim is not held.
	later := h.now.Add(time.Minute)
	back := h.s.Hold(h.now, "e", later)
	if len(back) != 1 || back[0].At.Before(later) {
		t.Fatalf("Hold gave back %+v, want one job due at %v or later", back, later)
	}
	if _, hold, at := h.add("t", "e", Limits{}); hold || at.Before(later) {
		t.Fatalf("claim during the hold: held %v, due %v", hold, at)
	}
}

// TestUnansweredEndpointWithNothingOutIsPaced (issue 25 §5): a job of an
// endpoint not yet known, refused because slow and unknown endpoints hold
// their whole share, goes back paced, not due again in 50 ms: nothing of
// its endpoint is out, so nothing will be known sooner, and a claim every
// 50 ms would only hand it back again.
func TestUnansweredEndpointWithNothingOutIsPaced(t *testing.T) {
	for _, fast := range []bool{false, true} {
		h := newHarness(t, Config{Concurrency: 4, UnansweredFast: fast}) // slow share 2
		for _, ep := range []string{"hang1", "hang2"} {
			if _, hold, _ := h.add("hostile", ep, Limits{}); !hold {
				t.Fatalf("%s not held", ep)
			}
			if h.s.Next(h.now) == nil {
				t.Fatalf("%s not started", ep)
			}
		}
		_, hold, at := h.add("calm", "new", Limits{})
		if hold {
			t.Fatal("held beyond the slow share")
		}
		if d := at.Sub(h.now); d != 50*time.Millisecond {
			t.Fatalf("UnansweredFast %v: first give-back due again in %v, want 50ms", fast, d)
		}
		// Again and again while the share stays full: doubling, up to
		// 1.6 s, unless UnansweredFast.
		for i, want := range []time.Duration{100, 200, 400, 800, 1600, 1600} {
			_, _, at := h.add("calm", "new", Limits{})
			if fast {
				want = 50
			}
			if d := at.Sub(h.now); d != want*time.Millisecond {
				t.Fatalf("UnansweredFast %v: give-back %d due again in %v, want %v", fast, i+2, d, want*time.Millisecond)
			}
		}
	}
}
