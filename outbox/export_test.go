package outbox

import (
	"context"
	"os"
	"sync"
	"time"

	"github.com/txhook/txhook/internal/store"
)

// Test hooks into the relay, for the external tests of this package.

func init() {
	// A relay subprocess of the tests sweeps endpoint health as often as
	// its parent asks.
	if d, err := time.ParseDuration(os.Getenv("TXHOOK_CHILD_HEALTH_SWEEP")); err == nil && d > 0 {
		healthSweepInterval = d
	}
}

// TestAttempt is an attempt that a completion batch wrote to the attempt
// log, for RecordAttempts.
type TestAttempt struct {
	EndpointID string
	Tenant     string
	StartedAt  time.Time
	Status     int
	Error      string // "" for a success
}

var testCompleters sync.Map // *Relay → *completer

// RecordAttempts runs r's endpoint bookkeeping for attempts a completion
// batch has just written, as r's completion goroutine does after each
// batch. r need not be started; it keeps its completer across calls.
// Calls for one relay must not overlap.
func RecordAttempts(ctx context.Context, r *Relay, attempts []TestAttempt) {
	v, _ := testCompleters.LoadOrStore(r, newCompleter(r, 1))
	c := v.(*completer)
	batch := make([]outcome, len(attempts))
	for i, a := range attempts {
		state := store.StateSucceeded
		if a.Error != "" {
			state = store.StatePending
		}
		id := int64(i + 1)
		batch[i] = outcome{
			Completion: store.Completion{ID: id, Attempt: 1, State: state, Attempts: 1, Record: true, Status: a.Status, Error: a.Error,
				Records: []store.AttemptRecord{{Attempt: 1, StartedAt: a.StartedAt, Status: a.Status, Error: a.Error}}},
			eventID: "evt_test", eventType: "test", tenant: a.Tenant, endpointID: a.EndpointID, written: true,
		}
	}
	c.trackEndpoints(ctx, batch)
}

// SetMaxMovedPerPartition changes how many rows o's retention moves out
// of an expired partition before it keeps the partition instead; 0
// restores the default.
func SetMaxMovedPerPartition(o *Outbox, n int) { o.maxMoved.Store(int64(n)) }

// SetPollFloor makes r wait at least d between two claims it was not woken
// for (normally a millisecond after a short claim, doubling up to
// PollInterval). Call it before Start: with d and PollInterval long, only
// a wake-up (Enqueue's NOTIFY, Wake) makes r claim after its first look.
func SetPollFloor(r *Relay, d time.Duration) { r.pollMin = d }
