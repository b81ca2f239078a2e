package outbox

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// Delivery states, the values of Delivery.State (and of the state column of
// txhook_deliveries).
const (
	StatePending   = "pending"   // waiting for its next attempt
	StateRunning   = "running"   // claimed by a relay, under a lease
	StateSucceeded = "succeeded" // a 2xx was received
	StateDead      = "dead"      // attempts exhausted, or refused too long (RefusedSince); in the dead-letter table
	StatePaused    = "paused"    // its endpoint is disabled
	StateBlocked   = "blocked"   // an earlier event of its ordering key goes first
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
	// RefusedSince is when the relays' target rules began refusing its
	// endpoint's URL (see Config.AllowHTTP), zero when they do not: while
	// it is pending, the delivery waits for a relay whose rules allow the
	// URL, spending no attempt; dead, it was dead-lettered for it
	// (DeadReasonRefused, see RelayConfig.RefusedLimit).
	RefusedSince time.Time
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

	// RequestHeaders are the headers the request carried, besides the
	// endpoint's custom ones (never shown): Content-Type, webhook-id,
	// webhook-timestamp, Webhook-Event-Type and -Version, Webhook-Test for a
	// test event, and webhook-signature. Only TenantView.Attempts fills
	// them, rebuilding them from the stored event, the attempt's start and
	// the endpoint's secrets: nothing more is stored per attempt. The
	// signature is the Standard Webhooks one (a relay configured with
	// another signer, such as signer.Stripe, sent its own header instead),
	// made with the secrets on record that were active at the attempt;
	// when that secret was rotated out, the endpoint deleted or the
	// secrets cannot be decrypted, it is left out and SignatureNote says
	// why. A payload converted to a pinned version is rebuilt with the
	// endpoint's current pin.
	RequestHeaders http.Header
	// SignatureNote is "" when the signature in RequestHeaders is the one
	// sent; otherwise why it is missing or may differ.
	SignatureNote string
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
		out[i] = deliveryOf(r)
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
