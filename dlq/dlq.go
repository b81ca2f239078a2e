// Package dlq is the dead-letter table of a txhook outbox: deliveries that
// used up every attempt, or that no relay would send (the target rules
// refused their endpoint's URL for longer than RelayConfig.RefusedLimit:
// Entry.Reason), kept for operators to inspect, replay and purge.
//
// A delivery lands here after its last attempt, in the same transaction
// that records that attempt, so a failure is never silent. Replaying queues
// a fresh delivery of the same event (same event ID, same body) to the same
// endpoint, so receivers that deduplicate on the ID stay safe even if the
// first delivery did arrive after all.
//
//	q := dlq.New(ob)
//	page, err := q.List(ctx, dlq.Filter{Tenant: "merchant_42"}, "", 50)
//	for _, e := range page.Entries {
//		fmt.Println(e.EventID, e.LastStatus, e.LastError)
//	}
//	n, err := q.ReplayAll(ctx, dlq.Filter{EndpointID: "ep_…"}) // after the receiver is fixed
//
// NewUI serves the same operations as web pages for operators, with the
// endpoints' health and delivery logs, behind the host's own authorization.
package dlq

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/txhook/txhook/internal/link"
	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/outbox"
)

// Queue is the dead-letter table of one outbox. It is safe for concurrent
// use.
type Queue struct {
	ob *outbox.Outbox
	in link.Internals
}

// New returns the dead-letter table of ob.
func New(ob *outbox.Outbox) *Queue {
	return &Queue{ob: ob, in: link.Outbox(ob)}
}

// Errors; test with errors.Is.
var (
	// ErrNotFound: no dead letter has that delivery ID.
	ErrNotFound = errors.New("txhook: dead letter not found")
	// ErrEndpointGone: the dead letter's endpoint was deleted, so it cannot
	// be replayed.
	ErrEndpointGone = errors.New("txhook: endpoint of dead letter no longer exists")
	// ErrInvalidCursor: a List cursor was not produced by List. It is
	// outbox.ErrInvalidCursor, the one error for every bad page cursor.
	ErrInvalidCursor = outbox.ErrInvalidCursor
)

// Filter selects dead letters. Zero fields do not filter.
type Filter struct {
	Tenant     string
	EndpointID string
	EventType  string
	Since      time.Time // failed at or after
	Until      time.Time // failed before
	// Reason is outbox.DeadReasonFailed or outbox.DeadReasonRefused: after
	// fixing the target rules or an endpoint's URL, ReplayAll with
	// DeadReasonRefused sends what they held back.
	Reason string
}

func (f Filter) store() store.DeadFilter {
	return store.DeadFilter{Tenant: f.Tenant, EndpointID: f.EndpointID, EventType: f.EventType, Since: f.Since, Until: f.Until,
		Reason: f.Reason}
}

// Entry is one dead letter.
type Entry struct {
	DeliveryID int64
	EventID    string
	EventType  string
	Tenant     string
	EndpointID string
	Attempts   int
	LastStatus int // 0: no HTTP response
	LastError  string
	FailedAt   time.Time
	// Reason is outbox.DeadReasonFailed (its attempts ran out) or
	// outbox.DeadReasonRefused (the relays' target rules refused its
	// endpoint's URL for longer than RelayConfig.RefusedLimit; LastError
	// names the rule, and Attempts counts only the attempts made before).
	Reason string
}

// Detail is a dead letter with its event payload and attempt log.
type Detail struct {
	Entry
	Payload  json.RawMessage
	Attempts []outbox.Attempt
}

// Page is one page of a listing. Next is the cursor of the following page,
// empty on the last.
type Page struct {
	Entries []Entry
	Next    string
}

// MaxPage is the largest page List returns.
const MaxPage = 1000

// List returns dead letters matching f, newest first, limit at a time
// (default 50, at most MaxPage). Pass the previous page's Next as cursor to
// continue; "" starts at the newest.
func (q *Queue) List(ctx context.Context, f Filter, cursor string, limit int) (Page, error) {
	if limit <= 0 {
		limit = 50
	}
	limit = min(limit, MaxPage)
	var after *store.DeadCursor
	if cursor != "" {
		c, err := decodeCursor(cursor)
		if err != nil {
			return Page{}, err
		}
		after = &c
	}
	rows, err := q.in.Store.ListDead(ctx, f.store(), after, limit+1)
	if err != nil {
		return Page{}, fmt.Errorf("txhook: list dead letters: %w", err)
	}
	var p Page
	if len(rows) > limit {
		rows = rows[:limit]
		last := rows[limit-1]
		p.Next = encodeCursor(store.DeadCursor{FailedAt: last.FailedAt, DeliveryID: last.DeliveryID})
	}
	p.Entries = make([]Entry, len(rows))
	for i, r := range rows {
		p.Entries[i] = entry(r)
	}
	return p, nil
}

// Count returns how many dead letters match f.
func (q *Queue) Count(ctx context.Context, f Filter) (int, error) {
	return q.in.Store.CountDead(ctx, f.store())
}

// Get returns one dead letter with its payload and attempt log.
func (q *Queue) Get(ctx context.Context, deliveryID int64) (Detail, error) {
	rows, err := q.in.Store.ListDead(ctx, store.DeadFilter{IDs: []int64{deliveryID}}, nil, 1)
	if err != nil {
		return Detail{}, err
	}
	if len(rows) == 0 {
		return Detail{}, fmt.Errorf("%w: %d", ErrNotFound, deliveryID)
	}
	d := Detail{Entry: entry(rows[0])}
	_, payload, _, err := q.in.Store.EventPayload(ctx, d.EventID)
	if err != nil {
		return Detail{}, fmt.Errorf("txhook: event of dead letter %d: %w", deliveryID, err)
	}
	d.Payload = payload
	if d.Attempts, err = q.ob.DeliveryAttempts(ctx, deliveryID); err != nil {
		return Detail{}, err
	}
	return d, nil
}

// Replay queues a fresh delivery of the dead letter's event to its
// endpoint, due now, and removes the dead letter, in one transaction; then
// it writes an audit log entry (outbox.Outbox.AuditLog) naming ctx's actor
// (outbox.WithActor). It
// returns the new delivery's ID. If the endpoint is disabled, the delivery
// waits until it is enabled.
func (q *Queue) Replay(ctx context.Context, deliveryID int64) (int64, error) {
	got, err := q.in.Store.ReplayDead(ctx, []int64{deliveryID}, q.in.Clock.Now())
	if err != nil {
		return 0, fmt.Errorf("txhook: replay: %w", err)
	}
	if id, ok := got[deliveryID]; ok {
		q.in.Wake()
		return id, q.ob.Record(ctx, "", "dlq.replay", strconv.FormatInt(deliveryID, 10), map[string]any{"new_delivery": id})
	}
	n, err := q.in.Store.CountDead(ctx, store.DeadFilter{IDs: []int64{deliveryID}})
	if err == nil && n > 0 {
		return 0, fmt.Errorf("%w: dead letter %d", ErrEndpointGone, deliveryID)
	}
	return 0, fmt.Errorf("%w: %d", ErrNotFound, deliveryID)
}

// replayBatch bounds the work of one transaction in ReplayAll.
const replayBatch = 500

// ReplayAll replays every dead letter matching f whose endpoint still
// exists, in transactions of at most 500, and returns how many it replayed;
// then it writes one audit log entry with the filter and the count.
func (q *Queue) ReplayAll(ctx context.Context, f Filter) (int, error) {
	total := 0
	var after int64
	for {
		ids, err := q.in.Store.DeadIDs(ctx, f.store(), after, replayBatch)
		if err != nil {
			return total, fmt.Errorf("txhook: replay: %w", err)
		}
		if len(ids) == 0 {
			return total, q.recordAll(ctx, "dlq.replay_all", f, total)
		}
		got, err := q.in.Store.ReplayDead(ctx, ids, q.in.Clock.Now())
		if err != nil {
			return total, fmt.Errorf("txhook: replay: %w", err)
		}
		total += len(got)
		after = ids[len(ids)-1]
		q.in.Wake()
	}
}

// Purge deletes one dead letter, and writes an audit log entry. The event
// and its attempt log stay until retention removes them.
func (q *Queue) Purge(ctx context.Context, deliveryID int64) error {
	n, err := q.in.Store.PurgeDead(ctx, store.DeadFilter{IDs: []int64{deliveryID}}, 1)
	if err != nil {
		return fmt.Errorf("txhook: purge: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("%w: %d", ErrNotFound, deliveryID)
	}
	return q.ob.Record(ctx, "", "dlq.purge", strconv.FormatInt(deliveryID, 10), nil)
}

// PurgeAll deletes every dead letter matching f, in batches, and returns
// how many it deleted, then writes one audit log entry with the filter and
// the count. An empty filter deletes them all.
func (q *Queue) PurgeAll(ctx context.Context, f Filter) (int, error) {
	total := 0
	for {
		n, err := q.in.Store.PurgeDead(ctx, f.store(), 1000)
		total += n
		if err != nil {
			return total, fmt.Errorf("txhook: purge: %w", err)
		}
		if n == 0 {
			return total, q.recordAll(ctx, "dlq.purge_all", f, total)
		}
	}
}

// recordAll writes the audit log entry of an action on every dead letter
// matching f (see outbox.WithActor).
func (q *Queue) recordAll(ctx context.Context, action string, f Filter, n int) error {
	d := map[string]any{"count": n}
	if f.EndpointID != "" {
		d["endpoint"] = f.EndpointID
	}
	if f.EventType != "" {
		d["event_type"] = f.EventType
	}
	if f.Reason != "" {
		d["reason"] = f.Reason
	}
	if !f.Since.IsZero() {
		d["since"] = f.Since.UTC()
	}
	if !f.Until.IsZero() {
		d["until"] = f.Until.UTC()
	}
	return q.ob.Record(ctx, f.Tenant, action, "", d)
}

func entry(r store.DeadLetter) Entry {
	return Entry{DeliveryID: r.DeliveryID, EventID: r.EventID, EventType: r.EventType, Tenant: r.Tenant,
		EndpointID: r.EndpointID, Attempts: r.Attempts, LastStatus: r.LastStatus, LastError: r.LastError, FailedAt: r.FailedAt,
		Reason: r.Reason}
}

func encodeCursor(c store.DeadCursor) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.FailedAt.UnixMicro(), 10) + "." + strconv.FormatInt(c.DeliveryID, 10)))
}

func decodeCursor(s string) (store.DeadCursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return store.DeadCursor{}, ErrInvalidCursor
	}
	at, id, ok := strings.Cut(string(b), ".")
	us, err1 := strconv.ParseInt(at, 10, 64)
	n, err2 := strconv.ParseInt(id, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return store.DeadCursor{}, ErrInvalidCursor
	}
	return store.DeadCursor{FailedAt: time.UnixMicro(us).UTC(), DeliveryID: n}, nil
}
