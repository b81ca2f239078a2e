package outbox

import (
	"context"
	"testing"
	"time"
)

// The completer's gathering window (completer.gather) lets outcomes join a
// batch for a few milliseconds. These tests give it a window of an hour,
// so that each case that must not wait for the window fails (by the test's
// own deadline) if it does, without depending on how fast the machine is.

func gatherCompleter(full int) *completer {
	return &completer{in: make(chan outcome, 16), abort: make(chan struct{}), window: time.Hour, full: full}
}

// runGather runs c.gather in the background and returns its result, or
// fails t if it has not returned within a minute.
func runGather(t *testing.T, c *completer, pending *[]outcome, until time.Time) bool {
	t.Helper()
	done := make(chan bool, 1)
	go func() { done <- c.gather(context.Background(), pending, true, until) }()
	select {
	case open := <-done:
		return open
	case <-time.After(time.Minute):
		t.Fatal("gather waited for its window where it should not have")
		return false
	}
}

func TestGatherStopsWhenTheBatchIsFull(t *testing.T) {
	c := gatherCompleter(3)
	pending := []outcome{{eventID: "a"}}
	c.in <- outcome{eventID: "b"}
	c.in <- outcome{eventID: "c"}
	c.in <- outcome{eventID: "d"}
	if !runGather(t, c, &pending, time.Now().Add(time.Hour)) {
		t.Fatal("gather reported the input closed")
	}
	if len(pending) != 3 {
		t.Fatalf("gathered %d outcomes, want a full batch of 3", len(pending))
	}
	if len(c.in) != 1 {
		t.Fatalf("%d outcomes left queued, want the one beyond the batch", len(c.in))
	}
}

func TestGatherDoesNotHoldAnOrderedOutcome(t *testing.T) {
	c := gatherCompleter(100)
	// Already pending: nothing more is taken.
	pending := []outcome{{eventID: "a"}, {eventID: "b", orderingKey: "k"}}
	c.in <- outcome{eventID: "c"}
	runGather(t, c, &pending, time.Now().Add(time.Hour))
	if len(pending) != 2 || len(c.in) != 1 {
		t.Fatalf("pending %d, queued %d: gather waited with an ordered outcome pending", len(pending), len(c.in))
	}
	// Arriving while gathering: the batch goes with it.
	pending = []outcome{{eventID: "d"}}
	go func() { c.in <- outcome{eventID: "e", orderingKey: "k"} }()
	runGather(t, c, &pending, time.Now().Add(time.Hour))
	if n := len(pending); n < 2 || pending[n-1].orderingKey != "k" {
		t.Fatalf("gather returned %+v; want it to return once the ordered outcome arrived", pending)
	}
}

func TestGatherEndsWithTheWindowOrTheInput(t *testing.T) {
	c := gatherCompleter(100)
	pending := []outcome{{eventID: "a"}}
	if !runGather(t, c, &pending, time.Now().Add(20*time.Millisecond)) || len(pending) != 1 {
		t.Fatalf("window over with nothing more: pending %d", len(pending))
	}
	// A window already over takes nothing more.
	c.in <- outcome{eventID: "b"}
	runGather(t, c, &pending, time.Now().Add(-time.Second))
	if len(pending) != 1 {
		t.Fatalf("gather took outcomes after its window: pending %d", len(pending))
	}
	<-c.in
	// The relay stopping (its input closed) ends the wait at once.
	close(c.in)
	if runGather(t, c, &pending, time.Now().Add(time.Hour)) {
		t.Fatal("gather did not report the input closed")
	}
	// Giving up ends it too.
	c = gatherCompleter(100)
	close(c.abort)
	if !runGather(t, c, &pending, time.Now().Add(time.Hour)) {
		t.Fatal("gather reported the input closed after an abort")
	}
	// No window: no wait.
	c = gatherCompleter(100)
	c.window = 0
	runGather(t, c, &pending, time.Now().Add(time.Hour))
}
