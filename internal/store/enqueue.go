package store

import (
	"context"
	"database/sql"
	"errors"
	"time"
)

// NewEvent is an event row to insert.
type NewEvent struct {
	ID             string
	Tenant         string
	Type           string
	Payload        string
	IdempotencyKey string // "" for none
	CreatedAt      time.Time
}

// WakeChannel is the PostgreSQL NOTIFY channel the relay listens on.
const WakeChannel = "txhook_wake"

// pgEnqueue writes the event and its deliveries in one statement, so an
// Enqueue costs the caller's transaction a single round trip. The NOTIFY is
// queued only when asked for and only when a delivery was created; it is sent
// by PostgreSQL at commit, never before.
const pgEnqueue = `WITH ev AS (
    INSERT INTO txhook_events (id, tenant, type, payload, idempotency_key, created_at)
    VALUES ($1, $2, $3, $4, $5, $6)
    ON CONFLICT DO NOTHING
    RETURNING id, tenant, type, created_at
), dl AS (
    INSERT INTO txhook_deliveries (event_id, endpoint_id, state, next_attempt_at, created_at, updated_at)
    SELECT ev.id, ep.id, 'pending', ev.created_at, ev.created_at, ev.created_at
    FROM ev JOIN txhook_endpoints ep ON ep.tenant = ev.tenant AND ep.enabled
    WHERE jsonb_array_length(ep.event_types) = 0 OR EXISTS (
        SELECT 1 FROM jsonb_array_elements_text(ep.event_types) p
        WHERE p = ev.type OR (right(p, 1) = '*' AND starts_with(ev.type, rtrim(p, '*'))))
    RETURNING 1
), n AS (SELECT count(*) AS n FROM dl)
SELECT ev.id, n.n, (SELECT count(*) FROM (SELECT pg_notify('` + WakeChannel + `', '') WHERE $7::boolean AND n.n > 0) w)
FROM ev, n`

const sqliteInsertEvent = `INSERT INTO txhook_events (id, tenant, type, payload, idempotency_key, created_at)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT DO NOTHING`

const sqliteInsertDeliveries = `INSERT INTO txhook_deliveries (event_id, endpoint_id, state, next_attempt_at, created_at, updated_at)
SELECT ?1, ep.id, 'pending', ?3, ?3, ?3
FROM txhook_endpoints ep
WHERE ep.tenant = ?2 AND ep.enabled
  AND (json_array_length(ep.event_types) = 0 OR EXISTS (
      SELECT 1 FROM json_each(ep.event_types) p
      WHERE p.value = ?4 OR (substr(p.value, -1) = '*'
          AND substr(?4, 1, length(p.value) - 1) = substr(p.value, 1, length(p.value) - 1))))`

const existingEvent = `SELECT id FROM txhook_events WHERE id = ? OR (tenant = ? AND idempotency_key = ?)`

// InsertEvent writes ev and one pending delivery per enabled endpoint of its
// tenant subscribed to its type, on q (the caller's transaction). When an
// event with the same ID, or the same tenant and idempotency key, exists,
// nothing is written and that event's ID is returned with inserted false.
// notified reports whether a PostgreSQL wake-up was queued.
func (s *Store) InsertEvent(ctx context.Context, q Querier, ev NewEvent, notify bool) (id string, deliveries int, inserted, notified bool, err error) {
	var key any
	if ev.IdempotencyKey != "" {
		key = ev.IdempotencyKey
	}
	if s.Dialect == Postgres {
		args := []any{ev.ID, ev.Tenant, ev.Type, ev.Payload, key, s.T(ev.CreatedAt), notify}
		var n, sent int
		err = s.queryRow(ctx, q, pgEnqueue, args...).Scan(&id, &n, &sent)
		if isForeignStmt(err) {
			err = q.QueryRowContext(ctx, pgEnqueue, args...).Scan(&id, &n, &sent)
		}
		if err == nil {
			return id, n, true, sent > 0, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return "", 0, false, false, err
		}
	} else {
		res, err := s.exec(ctx, q, sqliteInsertEvent, ev.ID, ev.Tenant, ev.Type, ev.Payload, key, s.T(ev.CreatedAt))
		if err != nil {
			return "", 0, false, false, err
		}
		if c, _ := res.RowsAffected(); c == 1 {
			res, err := s.exec(ctx, q, sqliteInsertDeliveries, ev.ID, ev.Tenant, s.T(ev.CreatedAt), ev.Type)
			if err != nil {
				return "", 0, false, false, err
			}
			n, _ := res.RowsAffected()
			return ev.ID, int(n), true, false, nil
		}
	}
	// A conflict: report the event that is already there. Under READ
	// COMMITTED this new statement sees a concurrent winner that committed
	// while our insert waited on it.
	err = q.QueryRowContext(ctx, s.Rebind(existingEvent), ev.ID, ev.Tenant, ev.IdempotencyKey).Scan(&id)
	if err != nil {
		return "", 0, false, false, err
	}
	return id, 0, false, false, nil
}

// queryRow runs a hot statement, prepared when q allows it.
func (s *Store) queryRow(ctx context.Context, q Querier, query string, args ...any) *sql.Row {
	if st := s.stmtFor(ctx, q, query); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return q.QueryRowContext(ctx, query, args...)
}

// exec runs a hot statement, prepared when q allows it.
func (s *Store) exec(ctx context.Context, q Querier, query string, args ...any) (sql.Result, error) {
	if st := s.stmtFor(ctx, q, query); st != nil {
		res, err := st.ExecContext(ctx, args...)
		if !isForeignStmt(err) {
			return res, err
		}
	}
	return q.ExecContext(ctx, query, args...)
}

// EnqueueQueries are the statements InsertEvent runs, for Prepare.
func (s *Store) EnqueueQueries() []string {
	if s.Dialect == Postgres {
		return []string{pgEnqueue}
	}
	return []string{sqliteInsertEvent, sqliteInsertDeliveries}
}
