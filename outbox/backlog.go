package outbox

import (
	"context"
	"fmt"
)

// Backlog is what an outbox has not delivered yet, for metrics and alerts.
type Backlog struct {
	// Undispatched counts committed events that no relay has fanned out
	// into deliveries yet. Normally near zero: it grows when no relay runs
	// or relays cannot keep up, which makes it the number to alert on.
	Undispatched int
	// Deliveries counts unfinished deliveries per endpoint and state;
	// endpoints with none are absent.
	Deliveries []BacklogCount
}

// BacklogCount is how many of an endpoint's deliveries are in one
// unfinished state.
type BacklogCount struct {
	EndpointID string
	// State is StatePending (waiting for an attempt), StateRunning
	// (claimed by a relay), StatePaused (its endpoint is disabled) or
	// StateBlocked (an earlier event of its ordering key goes first).
	State string
	N     int
}

// Backlog reads the outbox's backlog, whichever relays or processes made
// it: two statements, counts on indexes. It is what the metrics packages
// read at each collection; call it from any host for your own.
func (o *Outbox) Backlog(ctx context.Context) (Backlog, error) {
	n, err := o.st.Undispatched(ctx)
	if err != nil {
		return Backlog{}, fmt.Errorf("txhook: backlog: %w", err)
	}
	rows, err := o.st.Backlog(ctx)
	if err != nil {
		return Backlog{}, fmt.Errorf("txhook: backlog: %w", err)
	}
	b := Backlog{Undispatched: n, Deliveries: make([]BacklogCount, len(rows))}
	for i, r := range rows {
		b.Deliveries[i] = BacklogCount{EndpointID: r.EndpointID, State: r.State, N: r.N}
	}
	return b, nil
}

// DeadLetterCounts counts, per endpoint ID, the dead letters not yet
// replayed or purged; endpoints with none are absent. One grouped count on
// an index.
func (o *Outbox) DeadLetterCounts(ctx context.Context) (map[string]int, error) {
	m, err := o.st.DeadLettersByEndpoint(ctx)
	if err != nil {
		return nil, fmt.Errorf("txhook: dead letter counts: %w", err)
	}
	return m, nil
}

// RefusedDeadLetterCounts counts, per endpoint ID, the dead letters among
// DeadLetterCounts' whose reason is DeadReasonRefused: deliveries no relay
// would send, their endpoint's URL refused by the target rules for longer
// than RelayConfig.RefusedLimit. Endpoints with none are absent. One
// grouped count on a partial index.
func (o *Outbox) RefusedDeadLetterCounts(ctx context.Context) (map[string]int, error) {
	m, err := o.st.RefusedDeadLettersByEndpoint(ctx)
	if err != nil {
		return nil, fmt.Errorf("txhook: refused dead letter counts: %w", err)
	}
	return m, nil
}
