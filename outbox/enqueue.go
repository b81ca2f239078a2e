package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

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
	// attempt and replay. Empty means a new ULID. IDs are unique across
	// tenants: enqueuing the same event again is a no-op returning its ID,
	// and an ID used for any other event is refused (ErrEventConflict). At
	// most 128 characters of A-Z a-z 0-9 and _ : - (Standard Webhooks
	// forbids dots in IDs).
	ID string

	// IdempotencyKey, when set, makes a repeated Enqueue of the same event
	// with the same key for the same tenant a no-op that returns the first
	// event's ID: use the business operation's own key (a payment ID and its
	// state) so that a retried business transaction never sends the event
	// twice. The key reused for another type, payload, version or ordering
	// key is refused (ErrIdempotencyConflict). At most 255 bytes of
	// printable UTF-8.
	IdempotencyKey string

	// Tenant is the merchant (or account) whose endpoints receive the
	// event: 1 to 255 bytes of printable UTF-8.
	Tenant string

	// Type names the event, such as "payment.succeeded": letters, digits
	// and . _ : - (at most 255).
	Type string

	// Payload is the event's data as JSON. It is sent verbatim as the "data"
	// member of the envelope (unless an endpoint pinned another version).
	// It must be UTF-8, nest at most 64 levels deep, and hold no \u0000 and
	// no unpaired surrogate escape such as \ud800: they are valid JSON
	// syntax, but PostgreSQL's jsonb and text refuse them, Go's decoder
	// silently replaces the surrogates, and the nesting is far beyond what
	// common receivers accept (Ruby's parser stops at 100 levels).
	Payload []byte

	// Version is the schema version of Payload, 1 to 2147483647. Zero means
	// the newest version in Config.Catalog, or 1 without a catalog.
	Version int

	// OrderingKey, when set, orders this event's deliveries after those of
	// earlier events with the same key for the same tenant: each endpoint
	// receives them one at a time, in Enqueue order, the next only after the
	// previous one succeeded or was dead-lettered. Use the ID of the object
	// the events are about (a payment ID). Events with different keys, or
	// none, are delivered in parallel. At most 255 printable characters.
	// A delayed event (DeliverAt) holds its key's line until it is
	// delivered: later events of the key wait for it.
	OrderingKey string

	// DeliverAt, when later than now, delays the event's first attempt:
	// no delivery of it is attempted before DeliverAt by the relay's
	// clock, and relays attempt it within about PollInterval after. Zero,
	// or a time not after now, means at once; more than MaxDelay after now
	// is refused (ErrInvalidEvent). The event is still written in tx and
	// dispatched when tx commits, so its deliveries go to the endpoints
	// subscribed at that moment; they wait, pending, in the deliveries
	// listings with NextAttemptAt = DeliverAt. The envelope's timestamp
	// stays the time of Enqueue. DeliverAt is not part of an event's
	// identity: enqueuing it again with another DeliverAt is a duplicate
	// and keeps the first time.
	DeliverAt time.Time
}

var (
	idPattern   = regexp.MustCompile(`^[A-Za-z0-9_:-]{1,128}$`)
	typePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,254}$`)
)

// Enqueued reports what EnqueueDetail did.
type Enqueued struct {
	// ID is the event's ID: the new event's, or the stored one's for a
	// duplicate.
	ID string
	// Duplicate is true when nothing was written because the same event
	// (same ID, or same tenant and idempotency key, identical content) was
	// already there.
	Duplicate bool
}

// Enqueue writes ev through tx, which should be the caller's business
// transaction: a rollback leaves nothing, a commit makes the event due at
// once (or at ev.DeliverAt). EnqueueMany writes many events in one
// statement. It returns the event's ID. It is EnqueueDetail for callers that do
// not need to tell a new event from a duplicate.
//
// Enqueue writes one row, the event, so that it costs the business
// transaction about what a plain INSERT would. A relay then dispatches the
// event: it creates one delivery per enabled endpoint of ev.Tenant that
// subscribes to ev.Type, as they are at that moment (normally milliseconds
// after the commit), and makes the first attempt.
//
// Invalid events are refused before anything is written, with errors
// matching ErrInvalidEvent, ErrInvalidPayload, ErrPayloadTooLarge or
// ErrUnknownEventType; an event that collides with a different one is
// refused with ErrEventConflict or ErrIdempotencyConflict. None of these
// leaves a failed statement behind, so tx stays usable (on PostgreSQL a
// failed statement would abort the whole business transaction).
//
// On PostgreSQL the relays are woken by a NOTIFY sent when tx commits; on
// SQLite, relays of this process are woken at once and wait for the write
// lock, so they see the rows as soon as tx commits.
func (o *Outbox) Enqueue(ctx context.Context, tx Tx, ev Event) (string, error) {
	r, err := o.EnqueueDetail(ctx, tx, ev)
	return r.ID, err
}

// EnqueueDetail is Enqueue, and also reports whether the event was already
// there, so a caller can tell a retried operation from a new one.
//
// A duplicate is the same event enqueued again: the same ID, or the same
// tenant and idempotency key, with the same tenant, type, payload bytes,
// version (a zero Version counts as the one it stands for), ordering key
// and idempotency key (and ID, when ev sets one). It writes nothing and
// returns the stored event's ID with Duplicate set. Anything else that
// collides is an error: an ID that another tenant used, or that names
// other content, matches ErrEventConflict and reveals nothing about the
// other event; an idempotency key that the tenant used for other content
// matches ErrIdempotencyConflict, as Stripe does.
//
// A new event costs one statement; only a collision reads the stored event.
// When two transactions enqueue the same ID or key at once, the second
// waits for the first and then sees it committed (a duplicate or a
// conflict) or rolled back (and inserts). That holds under READ COMMITTED,
// PostgreSQL's default; under REPEATABLE READ or SERIALIZABLE the second
// fails with a serialization error instead, as any write would.
func (o *Outbox) EnqueueDetail(ctx context.Context, tx Tx, ev Event) (Enqueued, error) {
	return o.enqueue(ctx, o.st.SQLConn(tx), ev)
}

// enqueue is EnqueueDetail on any driver's connection: database/sql's, or
// pgx's through pgxoutbox.
func (o *Outbox) enqueue(ctx context.Context, tx store.Conn, ev Event) (Enqueued, error) {
	if o.tracer != nil {
		return o.enqueueTraced(ctx, tx, ev)
	}
	return o.enqueueDetail(ctx, tx, ev)
}

func (o *Outbox) enqueueDetail(ctx context.Context, tx store.Conn, ev Event) (Enqueued, error) {
	if !ev.DeliverAt.IsZero() {
		return o.enqueueDelayed(ctx, tx, ev)
	}
	row, err := o.newRow(ev, o.clock.Now())
	if err != nil {
		return Enqueued{}, err
	}
	o.traceInto(ctx, &row)
	// The NOTIFY slot is taken before the statement, so that concurrent
	// Enqueues do not all see it free.
	notify, last, at := o.notifySlot()
	explicitID := ev.ID != ""
	res, notified, err := o.insertEvent(ctx, tx, row, explicitID, notify)
	if notify && !notified {
		// Nothing was queued (an error, or the event existed): give the
		// slot back.
		o.lastNotify.CompareAndSwap(at, last)
	}
	if err != nil {
		return Enqueued{}, err
	}
	if !res.Duplicate && o.st.Dialect == store.SQLite {
		o.st.WakeLocal()
	}
	return res, nil
}

// insertEvent inserts row or, when it collides, decides whether the stored
// event is the same one.
func (o *Outbox) insertEvent(ctx context.Context, tx store.Conn, row store.NewEvent, explicitID, notify bool) (Enqueued, bool, error) {
	// A colliding event can vanish between the insert and the read (the
	// retention purge): then the insert is simply tried again.
	for try := 0; try < 3; try++ {
		inserted, notified, err := o.st.InsertEvent(ctx, tx, row, notify)
		if err != nil {
			return Enqueued{}, false, fmt.Errorf("txhook: enqueue: %w", err)
		}
		if inserted {
			return Enqueued{ID: row.ID}, notified, nil
		}
		found, err := o.st.ConflictingEvents(ctx, tx, row)
		if err != nil {
			return Enqueued{}, false, fmt.Errorf("txhook: enqueue: %w", err)
		}
		if len(found) > 0 {
			res, err := collision(row, explicitID, found)
			return res, false, err
		}
	}
	return Enqueued{}, false, fmt.Errorf("txhook: enqueue: event %q collided with an event that then disappeared, three times", row.ID)
}

// collision classifies an insert of ev that ran into the stored events
// found: a duplicate or a conflict. Errors about another tenant's event
// say nothing about it, not even that it is another tenant's.
func collision(ev store.NewEvent, explicitID bool, found []store.NewEvent) (Enqueued, error) {
	for _, e := range found {
		if e.ID == ev.ID && e.Tenant != ev.Tenant {
			return Enqueued{}, fmt.Errorf("%w: %q", ErrEventConflict, ev.ID)
		}
	}
	if ev.IdempotencyKey != "" {
		for _, e := range found {
			if e.Tenant != ev.Tenant || e.IdempotencyKey != ev.IdempotencyKey {
				continue
			}
			diff := differences(e, ev)
			if explicitID && e.ID != ev.ID {
				diff = append(diff, "ID")
			}
			if len(diff) > 0 {
				return Enqueued{}, fmt.Errorf("%w: key %q was used for event %s, whose %s differs",
					ErrIdempotencyConflict, ev.IdempotencyKey, e.ID, strings.Join(diff, ", "))
			}
			return Enqueued{ID: e.ID, Duplicate: true}, nil
		}
	}
	for _, e := range found {
		if e.ID == ev.ID {
			if len(differences(e, ev)) > 0 || e.IdempotencyKey != ev.IdempotencyKey {
				return Enqueued{}, fmt.Errorf("%w: %q", ErrEventConflict, ev.ID)
			}
			return Enqueued{ID: e.ID, Duplicate: true}, nil
		}
	}
	// Unreachable: every row found matches ev's ID or its tenant and key.
	return Enqueued{}, fmt.Errorf("%w: %q", ErrEventConflict, ev.ID)
}

// differences names the fields of the same tenant's stored event e that
// differ from ev. Payloads are compared byte for byte: receivers get the
// bytes, and two encodings of the same JSON may be signed differently.
func differences(e, ev store.NewEvent) []string {
	var d []string
	if e.Type != ev.Type {
		d = append(d, "type")
	}
	if e.Payload != ev.Payload {
		d = append(d, "payload")
	}
	if e.Version != ev.Version {
		d = append(d, "version")
	}
	if e.OrderingKey != ev.OrderingKey {
		d = append(d, "ordering key")
	}
	return d
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
	case strings.HasPrefix(ev.ID, TestEventPrefix):
		return fmt.Errorf("%w: ID %.64q: the prefix %s is reserved for test events (TenantView.SendTest)", ErrInvalidEvent, ev.ID, TestEventPrefix)
	case !printable(ev.Tenant):
		return fmt.Errorf("%w: tenant must be printable UTF-8", ErrInvalidEvent)
	case len(ev.IdempotencyKey) > 255:
		return fmt.Errorf("%w: idempotency key longer than 255 bytes", ErrInvalidEvent)
	case !printable(ev.IdempotencyKey):
		return fmt.Errorf("%w: idempotency key must be printable UTF-8", ErrInvalidEvent)
	case len(ev.OrderingKey) > 255 || !printable(ev.OrderingKey):
		return fmt.Errorf("%w: ordering key must be printable UTF-8 of at most 255 bytes", ErrInvalidEvent)
	case ev.OrderingKey != "" && o.cfg.Broker:
		return ErrOrderingBroker
	case ev.Version < 0 || ev.Version > math.MaxInt32:
		return fmt.Errorf("%w: version %d out of range (0 to %d)", ErrInvalidEvent, ev.Version, math.MaxInt32)
	case len(ev.Payload) > o.cfg.MaxPayloadBytes:
		return fmt.Errorf("%w: %d bytes, limit %d", ErrPayloadTooLarge, len(ev.Payload), o.cfg.MaxPayloadBytes)
	}
	if err := checkPayload(ev.Payload); err != nil {
		return err
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

// maxPayloadDepth is how deeply a payload may nest. The envelope adds a
// level, and Ruby's JSON parser, the strictest common one, refuses more than
// 100 by default; PostgreSQL's limit depends on max_stack_depth.
const maxPayloadDepth = 64

// checkPayload refuses payloads that a database column or a receiver would
// choke on although json.Valid accepts them: invalid UTF-8 (PostgreSQL
// refuses it, SQLite would store it), \u0000 and unpaired surrogate escapes
// (jsonb and text refuse them, decoders replace or refuse them), and deep
// nesting. The error never quotes the payload, which may be confidential.
func checkPayload(p []byte) error {
	switch {
	case len(p) == 0:
		return fmt.Errorf("%w: it is empty, and a payload must be a JSON value", ErrInvalidPayload)
	case !utf8.Valid(p):
		return fmt.Errorf("%w: it is not valid UTF-8", ErrInvalidPayload)
	case !json.Valid(p):
		return fmt.Errorf("%w: it is not valid JSON", ErrInvalidPayload)
	}
	// Most payloads have neither escapes nor many brackets: two counts and
	// a search, much faster than the scan below, clear them.
	if bytes.IndexByte(p, '\\') < 0 && bytes.Count(p, []byte{'['})+bytes.Count(p, []byte{'{'}) <= maxPayloadDepth {
		return nil
	}
	// p is valid JSON from here on, so every escape is complete.
	depth, inString := 0, false
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !inString {
			switch c {
			case '"':
				inString = true
			case '[', '{':
				if depth++; depth > maxPayloadDepth {
					return fmt.Errorf("%w: it is valid JSON nested more than %d levels deep, beyond what common receivers parse (Ruby's parser stops at 100 levels)", ErrInvalidPayload, maxPayloadDepth)
				}
			case ']', '}':
				depth--
			}
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			i++
			if p[i] != 'u' {
				continue
			}
			r := hex4(p[i+1:])
			i += 4
			switch {
			case r == 0:
				return fmt.Errorf("%w: the \\u0000 escape at byte %d is valid JSON, but it stands for a NUL character, which PostgreSQL's jsonb and text cannot store, so txhook refuses it on every database; drop it, or send binary data base64-encoded", ErrInvalidPayload, i-5)
			case utf16.IsSurrogate(r):
				// A high surrogate must be followed by an escaped low one.
				if r < 0xdc00 && i+6 < len(p) && p[i+1] == '\\' && p[i+2] == 'u' {
					if lo := hex4(p[i+3:]); lo >= 0xdc00 && lo <= 0xdfff {
						i += 6
						continue
					}
				}
				return fmt.Errorf("%w: the unpaired surrogate escape at byte %d is valid JSON, but stands for no Unicode character: PostgreSQL's jsonb refuses it and decoders replace it, so txhook refuses it on every database", ErrInvalidPayload, i-5)
			}
		}
	}
	return nil
}

// hex4 decodes the four hex digits at the start of b, which JSON
// validation guarantees.
func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
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
