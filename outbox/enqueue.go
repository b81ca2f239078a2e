package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/oklog/ulid/v2"

	"github.com/txhook/txhook/internal/store"
)

// Tx is what Enqueue writes through: *sql.Tx and *sqlx.Tx (and *sql.DB or
// *sql.Conn, outside a transaction) all satisfy it.
type Tx interface {
	store.Querier
}

// Event is a webhook event to enqueue.
type Event struct {
	// ID identifies the event to receivers (webhook-id), the same on every
	// attempt and replay. Empty means a new ULID. Enqueuing an ID that
	// exists is a no-op returning that ID. At most 128 characters of
	// A-Z a-z 0-9 and _ : - (Standard Webhooks forbids dots in IDs).
	ID string

	// IdempotencyKey, when set, makes a repeated Enqueue of the same key for
	// the same tenant a no-op that returns the first event's ID: use the
	// business operation's own key (a payment ID and its state) so that a
	// retried business transaction never sends the event twice. At most 255
	// characters.
	IdempotencyKey string

	// Tenant is the merchant (or account) whose endpoints receive the event.
	Tenant string

	// Type names the event, such as "payment.succeeded": letters, digits
	// and . _ : - (at most 255).
	Type string

	// Payload is the event's data as JSON. It is sent verbatim as the "data"
	// member of the envelope (unless an endpoint pinned another version).
	Payload []byte

	// Version is the schema version of Payload. Zero means the newest
	// version in Config.Catalog, or 1 without a catalog.
	Version int

	// OrderingKey, when set, orders this event's deliveries after those of
	// earlier events with the same key for the same tenant: each endpoint
	// receives them one at a time, in Enqueue order, the next only after the
	// previous one succeeded or was dead-lettered. Use the ID of the object
	// the events are about (a payment ID). Events with different keys, or
	// none, are delivered in parallel. At most 255 printable characters.
	OrderingKey string
}

var (
	idPattern   = regexp.MustCompile(`^[A-Za-z0-9_:-]{1,128}$`)
	typePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,254}$`)
)

// Enqueue writes ev through tx, which should be the caller's business
// transaction: a rollback leaves nothing, a commit makes the event due at
// once. It returns the event's ID.
//
// Enqueue writes one row, the event, so that it costs the business
// transaction about what a plain INSERT would. A relay then dispatches the
// event: it creates one delivery per enabled endpoint of ev.Tenant that
// subscribes to ev.Type, as they are at that moment (normally milliseconds
// after the commit), and makes the first attempt.
//
// Invalid events are refused before anything is written, with errors
// matching ErrInvalidEvent, ErrInvalidPayload or ErrPayloadTooLarge.
//
// On PostgreSQL the relays are woken by a NOTIFY sent when tx commits; on
// SQLite, relays of this process are woken at once and wait for the write
// lock, so they see the rows as soon as tx commits.
func (o *Outbox) Enqueue(ctx context.Context, tx Tx, ev Event) (string, error) {
	if err := o.validate(&ev); err != nil {
		return "", err
	}
	now := o.clock.Now()
	if ev.ID == "" {
		ev.ID = ulid.MustNew(ulid.Timestamp(now), ulid.DefaultEntropy()).String()
	}
	notify := false
	var last, at int64
	if o.st.Dialect == store.Postgres && o.cfg.NotifyInterval > 0 {
		// Real time, not Config.Clock: this paces NOTIFYs, a load matter.
		// The slot is taken before the statement, so that concurrent
		// Enqueues do not all see it free.
		last, at = o.lastNotify.Load(), time.Now().UnixNano()
		notify = at-last >= int64(o.cfg.NotifyInterval) && o.lastNotify.CompareAndSwap(last, at)
	}
	id, inserted, notified, err := o.st.InsertEvent(ctx, tx, store.NewEvent{
		ID:             ev.ID,
		Tenant:         ev.Tenant,
		Type:           ev.Type,
		Payload:        string(ev.Payload),
		IdempotencyKey: ev.IdempotencyKey,
		Version:        ev.Version,
		OrderingKey:    ev.OrderingKey,
		CreatedAt:      now,
	}, notify)
	if notify && !notified {
		// Nothing was queued (an error, or the event existed): give the
		// slot back.
		o.lastNotify.CompareAndSwap(at, last)
	}
	if err != nil {
		return "", fmt.Errorf("txhook: enqueue: %w", err)
	}
	if inserted && o.st.Dialect == store.SQLite {
		o.st.WakeLocal()
	}
	return id, nil
}

func (o *Outbox) validate(ev *Event) error {
	switch {
	case ev.Tenant == "":
		return fmt.Errorf("%w: tenant is empty", ErrInvalidEvent)
	case len(ev.Tenant) > 255:
		return fmt.Errorf("%w: tenant longer than 255 bytes", ErrInvalidEvent)
	case ev.Type == "":
		return fmt.Errorf("%w: type is empty", ErrInvalidEvent)
	case !typePattern.MatchString(ev.Type):
		return fmt.Errorf("%w: type %.64q: use letters, digits and . _ : - (at most 255)", ErrInvalidEvent, ev.Type)
	case ev.ID != "" && !idPattern.MatchString(ev.ID):
		return fmt.Errorf("%w: ID %.64q: use letters, digits and _ : - (at most 128)", ErrInvalidEvent, ev.ID)
	case !printable(ev.Tenant):
		return fmt.Errorf("%w: tenant must be printable UTF-8", ErrInvalidEvent)
	case len(ev.IdempotencyKey) > 255:
		return fmt.Errorf("%w: idempotency key longer than 255 bytes", ErrInvalidEvent)
	case !printable(ev.IdempotencyKey):
		return fmt.Errorf("%w: idempotency key must be printable UTF-8", ErrInvalidEvent)
	case len(ev.OrderingKey) > 255 || !printable(ev.OrderingKey):
		return fmt.Errorf("%w: ordering key must be printable UTF-8 of at most 255 bytes", ErrInvalidEvent)
	case ev.Version < 0:
		return fmt.Errorf("%w: negative version", ErrInvalidEvent)
	case len(ev.Payload) > o.cfg.MaxPayloadBytes:
		return fmt.Errorf("%w: %d bytes, limit %d", ErrPayloadTooLarge, len(ev.Payload), o.cfg.MaxPayloadBytes)
	case len(ev.Payload) == 0:
		return fmt.Errorf("%w: payload is empty", ErrInvalidPayload)
	case !json.Valid(ev.Payload):
		return ErrInvalidPayload
	}
	if c := o.cfg.Catalog; c != nil {
		if ev.Version == 0 {
			ev.Version, _ = c.Latest(ev.Type)
		}
		if !c.has(ev.Type, ev.Version) {
			return fmt.Errorf("%w: %.64q version %d", ErrUnknownEventType, ev.Type, ev.Version)
		}
	} else if ev.Version == 0 {
		ev.Version = 1
	}
	return nil
}

// printable reports whether s is valid UTF-8 without control characters,
// which databases and log lines both handle badly.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}
