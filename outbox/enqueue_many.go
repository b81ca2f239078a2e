package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/txhook/txhook/internal/store"
)

// MaxDelay is how far after the Outbox clock's now Event.DeliverAt may be:
// a year, leap day included. A later time is refused as ErrInvalidEvent; it
// is most often a unit mistake (milliseconds read as seconds).
const MaxDelay = 366 * 24 * time.Hour

// BatchError is EnqueueMany's error about one of its events: Index is the
// event's position in the slice, and Err what Enqueue would have returned
// for it, so errors.Is and errors.As see through to ErrInvalidEvent,
// ErrEventConflict and the others.
type BatchError struct {
	Index int
	Err   error
}

// Error names the event by its index.
func (e *BatchError) Error() string {
	return fmt.Sprintf("txhook: event %d of the batch: %s", e.Index, strings.TrimPrefix(e.Err.Error(), "txhook: "))
}

// Unwrap returns Err.
func (e *BatchError) Unwrap() error { return e.Err }

// EnqueueMany writes evs through tx, as many Enqueue calls in slice order
// would, in one statement (a multi-row INSERT) per store.MaxBatchRows
// events or 4 MiB of payload, and returns what was done for each event, in
// order. It checks every event as Enqueue does before writing anything; an
// invalid one fails the call with a *BatchError carrying its index.
//
// Duplicates and conflicts follow EnqueueDetail, within the batch too: an
// event repeating an earlier one of the slice (same ID, or same tenant and
// idempotency key, same content) is a Duplicate with that event's ID, and
// one colliding with different content is refused. A collision with a
// stored event costs one more read for that event. When any event is
// refused, the rows this call inserted are deleted again, so the call
// leaves nothing and, as with Enqueue, tx stays usable; the error is a
// *BatchError for the first refused event. A database error leaves the
// batch partly written: roll tx back.
//
// A call that inserts anything wakes the relays once, as one Enqueue does.
//
// With tracing on, the call is one span and every event stores its
// context, so each event's attempts continue the caller's trace.
func (o *Outbox) EnqueueMany(ctx context.Context, tx Tx, evs []Event) ([]Enqueued, error) {
	return o.enqueueManyOn(ctx, o.st.SQLConn(tx), evs)
}

// enqueueManyOn is EnqueueMany on any driver's connection: database/sql's,
// or pgx's through pgxoutbox.
func (o *Outbox) enqueueManyOn(ctx context.Context, tx store.Conn, evs []Event) ([]Enqueued, error) {
	if o.tracer != nil {
		return o.enqueueManyTraced(ctx, tx, evs)
	}
	return o.enqueueMany(ctx, tx, evs)
}

func (o *Outbox) enqueueMany(ctx context.Context, tx store.Conn, evs []Event) ([]Enqueued, error) {
	now := o.clock.Now()
	rows := make([]store.NewEvent, len(evs))
	explicit := make([]bool, len(evs))
	for i := range evs {
		row, err := o.newRow(evs[i], now)
		if err != nil {
			return nil, &BatchError{Index: i, Err: err}
		}
		o.traceInto(ctx, &row)
		rows[i], explicit[i] = row, evs[i].ID != ""
	}

	// Events that repeat an earlier one of the batch are resolved here;
	// the others go to the database.
	res := make([]Enqueued, len(evs))
	repeats := make([]int, len(evs)) // index of the earlier event, or -1
	byID := map[string]int{}
	byKey := map[[2]string]int{}
	var insert []store.NewEvent
	var firsts []int
	for i, r := range rows {
		repeats[i] = -1
		var found []store.NewEvent
		var from []int
		if j, ok := byID[r.ID]; ok {
			found, from = append(found, rows[j]), append(from, j)
		}
		if j, ok := byKey[[2]string{r.Tenant, r.IdempotencyKey}]; ok && r.IdempotencyKey != "" && (len(from) == 0 || from[0] != j) {
			found, from = append(found, rows[j]), append(from, j)
		}
		if len(found) > 0 {
			dup, err := collision(r, explicit[i], found)
			if err != nil {
				return nil, &BatchError{Index: i, Err: err}
			}
			for k, e := range found {
				if e.ID == dup.ID {
					repeats[i] = from[k]
				}
			}
			continue
		}
		byID[r.ID] = i
		if r.IdempotencyKey != "" {
			byKey[[2]string{r.Tenant, r.IdempotencyKey}] = i
		}
		insert, firsts = append(insert, r), append(firsts, i)
	}

	notify, last, at := o.notifySlot()
	inserted, notified, err := o.st.InsertEvents(ctx, tx, insert, notify)
	if notify && !notified {
		o.lastNotify.CompareAndSwap(at, last)
	}
	if err != nil {
		return nil, fmt.Errorf("txhook: enqueue: %w", err)
	}
	for _, i := range firsts {
		if inserted[rows[i].ID] {
			res[i] = Enqueued{ID: rows[i].ID}
			continue
		}
		r, more, err := o.resolve(ctx, tx, rows[i], explicit[i])
		for id := range more {
			inserted[id] = true
		}
		if err != nil {
			if derr := o.st.DeleteEvents(ctx, tx, keys(inserted)); derr != nil {
				err = fmt.Errorf("%w (and taking back the batch's rows failed: %v; roll the transaction back)", err, derr)
			}
			return nil, &BatchError{Index: i, Err: err}
		}
		res[i] = r
	}
	for i, j := range repeats {
		if j >= 0 {
			res[i] = Enqueued{ID: res[j].ID, Duplicate: true}
		}
	}
	if len(inserted) > 0 && o.st.Dialect == store.SQLite {
		o.st.WakeLocal()
	}
	return res, nil
}

// newRow checks ev as Enqueue does and returns the row to insert, with a
// new ID when ev has none.
func (o *Outbox) newRow(ev Event, now time.Time) (store.NewEvent, error) {
	if err := o.validate(&ev); err != nil {
		return store.NewEvent{}, err
	}
	at, err := deliverAt(ev.DeliverAt, now)
	if err != nil {
		return store.NewEvent{}, err
	}
	if ev.ID == "" {
		ev.ID = ulid.MustNew(ulid.Timestamp(now), ulid.DefaultEntropy()).String()
	}
	return store.NewEvent{
		ID:             ev.ID,
		Tenant:         ev.Tenant,
		Type:           ev.Type,
		Payload:        string(ev.Payload),
		IdempotencyKey: ev.IdempotencyKey,
		Version:        ev.Version,
		OrderingKey:    ev.OrderingKey,
		CreatedAt:      now,
		DeliverAt:      at,
	}, nil
}

// deliverAt checks Event.DeliverAt against now and returns the time to
// store: zero for at once (a zero, past or present time), else the time
// rounded up to the microsecond the databases keep, so that rounding never
// makes it earlier.
func deliverAt(at, now time.Time) (time.Time, error) {
	if at.IsZero() || !at.After(now) {
		return time.Time{}, nil
	}
	if at.Sub(now) > MaxDelay {
		return time.Time{}, fmt.Errorf("%w: DeliverAt %s is more than %v after now (%s)",
			ErrInvalidEvent, at.UTC().Format(time.RFC3339), MaxDelay, now.UTC().Format(time.RFC3339))
	}
	r := at.Truncate(time.Microsecond)
	if r.Before(at) {
		r = r.Add(time.Microsecond)
	}
	return r.UTC(), nil
}

// resolve decides what an event that InsertEvents skipped ran into, as
// insertEvent does for one event; if the stored event disappeared
// meanwhile (retention), it inserts row again and reports it in inserted.
func (o *Outbox) resolve(ctx context.Context, tx store.Conn, row store.NewEvent, explicitID bool) (Enqueued, map[string]bool, error) {
	for try := 0; try < 3; try++ {
		found, err := o.st.ConflictingEvents(ctx, tx, row)
		if err != nil {
			return Enqueued{}, nil, fmt.Errorf("txhook: enqueue: %w", err)
		}
		if len(found) > 0 {
			res, err := collision(row, explicitID, found)
			return res, nil, err
		}
		inserted, _, err := o.st.InsertEvents(ctx, tx, []store.NewEvent{row}, false)
		if err != nil {
			return Enqueued{}, nil, fmt.Errorf("txhook: enqueue: %w", err)
		}
		if inserted[row.ID] {
			return Enqueued{ID: row.ID}, inserted, nil
		}
	}
	return Enqueued{}, nil, fmt.Errorf("txhook: enqueue: event %q collided with an event that then disappeared, three times", row.ID)
}

// notifySlot takes, on PostgreSQL, the NotifyInterval slot for a wake-up,
// as EnqueueDetail does; a caller that queued none gives it back with
// lastNotify.CompareAndSwap(at, last).
func (o *Outbox) notifySlot() (ok bool, last, at int64) {
	if o.st.Dialect != store.Postgres || o.cfg.NotifyInterval <= 0 {
		return false, 0, 0
	}
	// Real time, not Config.Clock: this paces NOTIFYs, a load matter.
	last, at = o.lastNotify.Load(), time.Now().UnixNano()
	return at-last >= int64(o.cfg.NotifyInterval) && o.lastNotify.CompareAndSwap(last, at), last, at
}

// enqueueDelayed is EnqueueDetail for an event with a DeliverAt: the batch
// path writes the column, and its error is returned unwrapped.
func (o *Outbox) enqueueDelayed(ctx context.Context, tx store.Conn, ev Event) (Enqueued, error) {
	res, err := o.enqueueMany(ctx, tx, []Event{ev})
	if be := (*BatchError)(nil); errors.As(err, &be) {
		return Enqueued{}, be.Err
	}
	if err != nil {
		return Enqueued{}, err
	}
	return res[0], nil
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
