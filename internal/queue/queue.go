// Package queue is what a relay needs from a message queue that hands it
// deliveries instead of the database (broker mode, package outbox/broker):
// receive deliveries, and settle each once its outcome is recorded. It
// knows no broker; outbox/broker implements Source on NATS JetStream and
// gives it to a relay through internal/link.
package queue

import (
	"context"
	"time"
)

// Event is the event a delivery carries, as Enqueue stored it.
type Event struct {
	ID          string
	Tenant      string
	Type        string
	Version     int
	Payload     []byte
	CreatedAt   time.Time
	TraceParent string
	TraceState  string
}

// Delivery is one delivery a queue hands to a relay: one attempt at sending
// an event to an endpoint.
type Delivery struct {
	// Key names the delivery in the queue, the same for all its attempts.
	Key string
	// Row is the delivery's row in the database: 0 until its first
	// outcome is recorded (for a delivery of a new event).
	Row int64
	// Base is the number of attempts the delivery's row had recorded when
	// the message was sent: its outcome is written only if that still
	// holds. Attempt is the number of the attempt the message asks for:
	// Base+1, or more when holders before made attempts they did not
	// record (each is recorded as lapsed with the outcome).
	Base, Attempt int
	// Deliveries is how many times the queue handed this message out,
	// this one included: above 1, holders before died or stalled without
	// settling it (each may or may not have made its attempt).
	Deliveries int
	// Lapsed says that attempt Base was counted and never recorded: a
	// table-mode relay's lease on the row lapsed with it in flight.
	Lapsed bool
	// RefusedSince is when relays' target rules first refused the
	// endpoint for this delivery (zero: not refused).
	RefusedSince time.Time
	Event        Event
	EndpointID   string
	// Received is, on the local monotonic clock, a moment before the
	// queue handed the message out (when the relay asked for it): the
	// queue's lease on it started no earlier.
	Received time.Time
	// Handle is the queue's own.
	Handle any
}

// Action is what settling does with a delivery.
type Action int

const (
	// Ack removes the delivery from the queue: it is finished, or its next
	// step is recorded elsewhere (a paused row, a dead letter).
	Ack Action = iota
	// Retry queues the next attempt, Attempt, of the delivery (whose row
	// is Row, with Base attempts recorded) to be handed out at At, and
	// removes this one.
	Retry
	// Defer queues the delivery again for At, unspent: Attempt is the
	// attempt to make then (Base and Row unchanged).
	Defer
	// Release gives the delivery back to the queue at once, for any
	// relay (this one is stopping).
	Release
)

// Settlement is what becomes of one delivery.
type Settlement struct {
	D            *Delivery
	Action       Action
	At           time.Time
	Base         int
	Attempt      int
	Row          int64
	RefusedSince time.Time
}

// Source hands deliveries to a relay.
type Source interface {
	// Open readies the source as the relay starts: an error fails Start.
	Open(ctx context.Context) error
	// Close releases the source once the relay has stopped and settled
	// everything it held.
	Close()
	// Receive returns up to max deliveries, waiting for at least one
	// until ctx ends (then it returns ctx's error) or the source has
	// nothing for a while (then none and no error).
	Receive(ctx context.Context, max int) ([]*Delivery, error)
	// Settle settles deliveries, as many at once as it can. It reports
	// failures through its own logging: a delivery whose settlement is
	// lost is handed out again after its lease, and the relay that gets it
	// finds its outcome recorded.
	Settle(ctx context.Context, ss []Settlement)
	// Lease is how long the queue lets a relay hold a delivery before it
	// hands it to another.
	Lease() time.Duration
}
