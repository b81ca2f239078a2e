package outbox

import (
	"errors"
	"testing"
	"time"
)

func TestLeaseWindowKeepsTheMarginFreeOfRequests(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w := leaseWindow(t0, 30*time.Second, 5*time.Second)
	if want := t0.Add(30 * time.Second); !w.end.Equal(want) {
		t.Errorf("end %v, want %v", w.end, want)
	}
	if got := w.end.Sub(w.cutOff); got != leaseMargin(30*time.Second) || got != 6*time.Second {
		t.Errorf("margin %v, want a fifth of the lease, 6s", got)
	}
	// A request started at the last moment, run for its whole Timeout,
	// ends as the margin begins.
	if got := w.startBy.Add(5 * time.Second); !got.Equal(w.cutOff) {
		t.Errorf("a request started at startBy ends at %v, want cutOff %v", got, w.cutOff)
	}

	// A lease that leaves no room for a request besides its margin is
	// refused.
	for _, c := range []struct {
		lease, timeout time.Duration
		ok             bool
	}{
		{30 * time.Second, 5 * time.Second, true},
		{6 * time.Second, 4700 * time.Millisecond, true},  // 100 ms to spare
		{6 * time.Second, 4800 * time.Millisecond, false}, // none to spare
		{5 * time.Second, 5 * time.Second, false},
	} {
		err := RelayConfig{Lease: c.lease, Timeout: c.timeout}.withDefaults().validate()
		if (err == nil) != c.ok || err != nil && !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Lease %v, Timeout %v: %v, want ok=%v", c.lease, c.timeout, err, c.ok)
		}
	}
}
