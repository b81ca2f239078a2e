package store

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"time"
)

// DeadLetter is a row of txhook_dead_letters.
type DeadLetter struct {
	DeliveryID int64
	EventID    string
	EndpointID string
	Tenant     string
	EventType  string
	Attempts   int
	LastStatus int
	LastError  string
	FailedAt   time.Time
	Reason     string // DeadReasonFailed or DeadReasonRefused
}

// DeadFilter selects dead letters; zero fields do not filter.
type DeadFilter struct {
	Tenant     string
	EndpointID string
	EventType  string
	Since      time.Time // failed at or after
	Until      time.Time // failed before
	IDs        []int64   // only these deliveries
	Reason     string    // DeadReasonFailed or DeadReasonRefused
}

// DeadCursor is a position in the newest-first listing.
type DeadCursor struct {
	FailedAt   time.Time
	DeliveryID int64
}

const deadColumns = `delivery_id, event_id, endpoint_id, tenant, event_type, attempts, last_status, last_error, failed_at, reason`

// idsIn renders "col IN (…)" over a JSON array parameter.
func (s *Store) idsIn(col string) string {
	if s.Dialect == Postgres {
		return col + ` IN (SELECT jsonb_array_elements_text(?::jsonb)::bigint)`
	}
	return col + ` IN (SELECT value FROM json_each(?))`
}

func jsonIDs(ids []int64) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(id, 10))
	}
	b.WriteByte(']')
	return b.String()
}

func (s *Store) deadWhere(f DeadFilter, alias string) (string, []any) {
	var conds []string
	var args []any
	add := func(c string, a any) {
		conds = append(conds, alias+c)
		args = append(args, a)
	}
	if f.Tenant != "" {
		add("tenant = ?", f.Tenant)
	}
	if f.EndpointID != "" {
		add("endpoint_id = ?", f.EndpointID)
	}
	if f.EventType != "" {
		add("event_type = ?", f.EventType)
	}
	if f.Reason != "" {
		add("reason = ?", f.Reason)
	}
	if !f.Since.IsZero() {
		add("failed_at >= ?", s.T(f.Since))
	}
	if !f.Until.IsZero() {
		add("failed_at < ?", s.T(f.Until))
	}
	if f.IDs != nil {
		conds = append(conds, s.idsIn(alias+"delivery_id"))
		args = append(args, jsonIDs(f.IDs))
	}
	if len(conds) == 0 {
		return "TRUE", nil
	}
	return strings.Join(conds, " AND "), args
}

// ListDead returns up to limit dead letters matching f, newest first,
// starting after cursor when it is not nil.
func (s *Store) ListDead(ctx context.Context, f DeadFilter, after *DeadCursor, limit int) ([]DeadLetter, error) {
	where, args := s.deadWhere(f, "")
	if after != nil {
		where += " AND (failed_at < ? OR (failed_at = ? AND delivery_id < ?))"
		args = append(args, s.T(after.FailedAt), s.T(after.FailedAt), after.DeliveryID)
	}
	args = append(args, limit)
	rows, err := s.DB.QueryContext(ctx, s.Rebind(`SELECT `+deadColumns+` FROM txhook_dead_letters
WHERE `+where+` ORDER BY failed_at DESC, delivery_id DESC LIMIT ?`), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []DeadLetter
	for rows.Next() {
		var d DeadLetter
		var status sql.NullInt64
		var at Time
		if err := rows.Scan(&d.DeliveryID, &d.EventID, &d.EndpointID, &d.Tenant, &d.EventType, &d.Attempts,
			&status, &d.LastError, &at, &d.Reason); err != nil {
			return nil, err
		}
		d.LastStatus, d.FailedAt = int(status.Int64), at.Time
		out = append(out, d)
	}
	return out, rows.Err()
}

// CountDead counts dead letters matching f.
func (s *Store) CountDead(ctx context.Context, f DeadFilter) (int, error) {
	where, args := s.deadWhere(f, "")
	var n int
	err := s.DB.QueryRowContext(ctx, s.Rebind(`SELECT count(*) FROM txhook_dead_letters WHERE `+where), args...).Scan(&n)
	return n, err
}

// EventPayload reads an event's type, payload and creation time.
func (s *Store) EventPayload(ctx context.Context, id string) (typ string, payload []byte, created time.Time, err error) {
	var t Time
	err = s.DB.QueryRowContext(ctx, s.Rebind(`SELECT type, payload, created_at FROM txhook_events WHERE id = ?`), id).Scan(&typ, &payload, &t)
	if err == sql.ErrNoRows {
		err = ErrNotFound
	}
	return typ, payload, t.Time, err
}

// ReplayDead queues a fresh delivery of the same event to the same endpoint
// for each dead letter in ids, due at now (a delayed event's not before its
// deliver_at), and removes those dead letters, in one transaction. Dead letters whose endpoint no longer exists are left in
// place. It returns the new delivery IDs, keyed by the dead delivery ID.
func (s *Store) ReplayDead(ctx context.Context, ids []int64, now time.Time) (map[int64]int64, error) {
	out := map[int64]int64{}
	if len(ids) == 0 {
		return out, nil
	}
	err := s.Tx(ctx, func(q Querier) error {
		lock := ""
		if s.Dialect == Postgres {
			lock = " FOR UPDATE OF dl"
		}
		rows, err := q.QueryContext(ctx, s.Rebind(`SELECT dl.delivery_id, dl.event_id, dl.endpoint_id, ep.enabled
FROM txhook_dead_letters dl JOIN txhook_endpoints ep ON ep.id = dl.endpoint_id
WHERE `+s.idsIn("dl.delivery_id")+` ORDER BY dl.delivery_id`+lock), jsonIDs(ids))
		if err != nil {
			return err
		}
		type row struct {
			id              int64
			event, endpoint string
			enabled         bool
		}
		var rs []row
		for rows.Next() {
			var r row
			if err := rows.Scan(&r.id, &r.event, &r.endpoint, &r.enabled); err != nil {
				rows.Close()
				return err
			}
			rs = append(rs, r)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		ins := s.Rebind(`INSERT INTO txhook_deliveries (event_id, endpoint_id, state, next_attempt_at, created_at, updated_at)
VALUES (?, ?, ?, ` + s.notBefore("?", "?") + `, ?, ?) RETURNING id`)
		del := s.Rebind(`DELETE FROM txhook_dead_letters WHERE delivery_id = ?`)
		for _, r := range rs {
			state := StatePending
			if !r.enabled {
				state = StatePaused
			}
			var nid int64
			if err := q.QueryRowContext(ctx, ins, r.event, r.endpoint, state, s.T(now), r.event, s.T(now), s.T(now)).Scan(&nid); err != nil {
				return err
			}
			if _, err := q.ExecContext(ctx, del, r.id); err != nil {
				return err
			}
			out[r.id] = nid
		}
		if len(rs) > 0 && s.Dialect == Postgres {
			_, err = q.ExecContext(ctx, `SELECT pg_notify('`+WakeChannel+`', '')`)
		}
		return err
	})
	return out, err
}

// DeadIDs returns up to limit delivery IDs of dead letters matching f whose
// endpoint still exists, oldest first, after the delivery ID after.
func (s *Store) DeadIDs(ctx context.Context, f DeadFilter, after int64, limit int) ([]int64, error) {
	where, args := s.deadWhere(f, "dl.")
	args = append(args, after, limit)
	rows, err := s.DB.QueryContext(ctx, s.Rebind(`SELECT dl.delivery_id FROM txhook_dead_letters dl
JOIN txhook_endpoints ep ON ep.id = dl.endpoint_id
WHERE `+where+` AND dl.delivery_id > ? ORDER BY dl.delivery_id LIMIT ?`), args...)
	if err != nil {
		return nil, err
	}
	return scanIDs(rows)
}

// PurgeDead deletes up to limit dead letters matching f and returns how
// many it deleted.
func (s *Store) PurgeDead(ctx context.Context, f DeadFilter, limit int) (int, error) {
	where, args := s.deadWhere(f, "")
	args = append(args, limit)
	res, err := s.DB.ExecContext(ctx, s.Rebind(`DELETE FROM txhook_dead_letters WHERE delivery_id IN (
    SELECT delivery_id FROM txhook_dead_letters WHERE `+where+` ORDER BY delivery_id LIMIT ?)`), args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}
