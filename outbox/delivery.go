package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/txhook/txhook/internal/store"
)

// Delivery states.
const (
	StatePending   = store.StatePending   // waiting for its next attempt
	StateRunning   = store.StateRunning   // claimed by a relay
	StateSucceeded = store.StateSucceeded // a 2xx was received
	StateDead      = store.StateDead      // attempts exhausted; in the dead-letter table
	StatePaused    = store.StatePaused    // its endpoint is disabled
	StateBlocked   = store.StateBlocked   // an earlier event of its ordering key goes first
)

// Delivery is one event on its way to one endpoint. A replay creates a new
// delivery of the same event.
type Delivery struct {
	ID            int64
	EventID       string
	EndpointID    string
	State         string
	Attempts      int
	NextAttemptAt time.Time // when pending; the lease expiry when running
	LastStatus    int       // 0: no HTTP response
	LastError     string
	CreatedAt     time.Time
	UpdatedAt     time.Time
}

// Attempt is one recorded attempt of a delivery.
type Attempt struct {
	DeliveryID      int64
	Number          int
	StartedAt       time.Time
	Duration        time.Duration
	Status          int // 0: no HTTP response
	ResponseExcerpt string
	Error           string
}

// EventDeliveries returns the deliveries of an event, oldest first: what
// support staff look up when a merchant asks "did you send event X?". An
// event has none until a relay has dispatched it.
func (o *Outbox) EventDeliveries(ctx context.Context, eventID string) ([]Delivery, error) {
	rows, err := o.st.DeliveriesOfEvent(ctx, eventID)
	if err != nil {
		return nil, fmt.Errorf("txhook: deliveries of event: %w", err)
	}
	out := make([]Delivery, len(rows))
	for i, r := range rows {
		out[i] = Delivery{ID: r.ID, EventID: r.EventID, EndpointID: r.EndpointID, State: r.State, Attempts: r.Attempts,
			NextAttemptAt: r.NextAttemptAt, LastStatus: r.LastStatus, LastError: r.LastError,
			CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt}
	}
	return out, nil
}

// DeliveryAttempts returns a delivery's attempt log in order.
func (o *Outbox) DeliveryAttempts(ctx context.Context, deliveryID int64) ([]Attempt, error) {
	rows, err := o.st.Attempts(ctx, deliveryID)
	if err != nil {
		return nil, fmt.Errorf("txhook: attempts: %w", err)
	}
	out := make([]Attempt, len(rows))
	for i, a := range rows {
		out[i] = Attempt{DeliveryID: a.DeliveryID, Number: a.Attempt, StartedAt: a.StartedAt, Duration: a.Duration,
			Status: a.Status, ResponseExcerpt: a.Excerpt, Error: a.Error}
	}
	return out, nil
}
