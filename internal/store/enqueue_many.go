package store

import (
	"context"
	"database/sql"
	"strings"
)

// Batches: InsertEvents writes many events with multi-row INSERTs, each at
// most MaxBatchRows rows and, past the first row, MaxBatchBytes of payload.
// Eleven bound values per row keep a full statement far below SQLite's limit
// of 32766 host parameters and PostgreSQL's 65535; the byte bound keeps one
// statement's message small whatever the payloads.
const (
	MaxBatchRows  = 1000
	MaxBatchBytes = 4 << 20
)

const insertEventsHead = `INSERT INTO txhook_events (id, tenant, type, payload, idempotency_key, created_at, version, ordering_key, deliver_at, trace_parent, trace_state)
VALUES `

const insertEventsRow = `(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

// BatchChunks splits evs into the slices InsertEvents writes in one
// statement each.
func BatchChunks(evs []NewEvent) [][]NewEvent {
	var out [][]NewEvent
	for len(evs) > 0 {
		n, size := 1, len(evs[0].Payload)
		for n < len(evs) && n < MaxBatchRows && size+len(evs[n].Payload) <= MaxBatchBytes {
			size += len(evs[n].Payload)
			n++
		}
		out = append(out, evs[:n])
		evs = evs[n:]
	}
	return out
}

// InsertEvents writes evs on q (the caller's transaction), one statement
// per chunk of BatchChunks, and returns the IDs it inserted. Like
// InsertEvent it never fails on a conflict: an event whose ID, or tenant
// and idempotency key, is taken is skipped, and ConflictingEvents tells
// why. The caller keeps IDs and idempotency keys unique within evs. notify
// asks, on PostgreSQL, for one wake-up sent when the transaction commits
// if any row was inserted; notified reports whether it was queued.
func (s *Store) InsertEvents(ctx context.Context, q Conn, evs []NewEvent, notify bool) (inserted map[string]bool, notified bool, err error) {
	if s.Dialect != Postgres {
		notify = false
	}
	inserted = make(map[string]bool, len(evs))
	for _, chunk := range BatchChunks(evs) {
		var b strings.Builder
		b.Grow(len(insertEventsHead) + len(chunk)*(len(insertEventsRow)+2) + 200)
		withNotify := notify && !notified
		if withNotify {
			b.WriteString("WITH ev AS (\n")
		}
		head, row := insertEventsHead, insertEventsRow
		if s.forwarding() {
			head, row = forwardEventsHead, forwardEventsRow
		}
		b.WriteString(head)
		args := make([]any, 0, 11*len(chunk))
		for i, ev := range chunk {
			if i > 0 {
				b.WriteString(",\n")
			}
			b.WriteString(row)
			var key, okey, at any
			if ev.IdempotencyKey != "" {
				key = ev.IdempotencyKey
			}
			if ev.OrderingKey != "" {
				okey = ev.OrderingKey
			}
			if !ev.DeliverAt.IsZero() {
				at = s.T(ev.DeliverAt)
			}
			var parent, state any
			if ev.TraceParent != "" {
				parent, state = ev.TraceParent, ev.TraceState
			}
			args = append(args, ev.ID, ev.Tenant, ev.Type, ev.Payload, key, s.T(ev.CreatedAt), max(ev.Version, 1), okey, at, parent, state)
		}
		b.WriteString("\nON CONFLICT DO NOTHING\nRETURNING id")
		if withNotify {
			// A NULL row stands for the wake-up, queued once if any row
			// was inserted.
			b.WriteString("\n)\nSELECT id FROM ev\nUNION ALL\nSELECT NULL FROM (SELECT pg_notify('" + WakeChannel + "', '') FROM ev LIMIT 1) n")
		}
		rows, err := q.Query(ctx, s.Rebind(b.String()), args...)
		if err != nil {
			return nil, false, err
		}
		for rows.Next() {
			var id sql.NullString
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, false, err
			}
			if id.Valid {
				inserted[id.String] = true
			} else {
				notified = true
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, false, err
		}
	}
	return inserted, notified, nil
}

// DeleteEvents deletes, on q, the events with the given IDs: an enqueue of
// many events that fails takes back the rows it had inserted.
func (s *Store) DeleteEvents(ctx context.Context, q Conn, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := q.Exec(ctx, s.Rebind(`DELETE FROM txhook_events WHERE `+s.textIn("id")), jsonStrings(ids))
	return err
}
