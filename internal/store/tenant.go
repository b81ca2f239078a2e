package store

import (
	"context"
	"database/sql"
	"errors"
	"time"
)

// Tenant-scoped reads and writes behind outbox.TenantView. Every statement
// here names the tenant in its WHERE clause (endpoints.tenant or
// events.tenant), so another tenant's ID finds nothing, exactly like a
// missing one.

// ErrActive is returned by Resend for a delivery that is not finished.
var ErrActive = errors.New("delivery not finished")

// TenantEndpoint returns the endpoint id if it belongs to tenant, else
// ErrNotFound.
func (s *Store) TenantEndpoint(ctx context.Context, q Querier, tenant, id string) (EndpointRow, error) {
	return s.oneEndpoint(ctx, q, `id = ? AND tenant = ?`, id, tenant)
}

const tenantDeliveryColumns = `d.id, d.event_id, d.endpoint_id, d.state, d.attempts, d.next_attempt_at, d.last_status, d.last_error, d.created_at, d.updated_at, d.refused_since`

// TenantDelivery returns delivery id if its event belongs to tenant, else
// ErrNotFound.
func (s *Store) TenantDelivery(ctx context.Context, tenant string, id int64) (DeliveryRow, error) {
	return s.oneDelivery(ctx, `SELECT `+tenantDeliveryColumns+`
FROM txhook_deliveries d JOIN txhook_events e ON e.id = d.event_id
WHERE d.id = ? AND e.tenant = ?`, id, tenant)
}

// EventRow is a stored event.
type EventRow struct {
	ID, Tenant, Type string
	Version          int
	Payload          []byte
	OrderingKey      string
	CreatedAt        time.Time
	DeliverAt        time.Time
	DispatchedAt     time.Time
}

// TenantEvent returns event id if it belongs to tenant, else ErrNotFound.
func (s *Store) TenantEvent(ctx context.Context, tenant, id string) (EventRow, error) {
	var e EventRow
	var c, at, disp Time
	var key sql.NullString
	err := s.DB.QueryRowContext(ctx, s.Rebind(`SELECT id, tenant, type, version, payload, ordering_key, created_at, deliver_at, dispatched_at
FROM txhook_events WHERE id = ? AND tenant = ?`), id, tenant).Scan(&e.ID, &e.Tenant, &e.Type, &e.Version, &e.Payload, &key, &c, &at, &disp)
	if err == sql.ErrNoRows {
		return EventRow{}, ErrNotFound
	}
	e.OrderingKey, e.CreatedAt, e.DeliverAt, e.DispatchedAt = key.String, c.Time, at.Time, disp.Time
	return e, err
}

// DeliveryFilter selects a tenant's deliveries; empty fields match all.
type DeliveryFilter struct {
	EndpointID, EventID, EventType, State string
	Since, Until                          time.Time
}

// TenantDeliveries returns up to limit of tenant's deliveries matching f,
// newest first (created_at, id), after cursor when it is not nil.
func (s *Store) TenantDeliveries(ctx context.Context, tenant string, f DeliveryFilter, after *DeliveryCursor, limit int) ([]DeliveryRow, error) {
	where, args := "e.tenant = ?", []any{tenant}
	if f.EndpointID != "" {
		where, args = where+" AND d.endpoint_id = ?", append(args, f.EndpointID)
	}
	if f.EventID != "" {
		where, args = where+" AND d.event_id = ?", append(args, f.EventID)
	}
	if f.EventType != "" {
		where, args = where+" AND e.type = ?", append(args, f.EventType)
	}
	if f.State != "" {
		where, args = where+" AND d.state = ?", append(args, f.State)
	}
	if !f.Since.IsZero() {
		where, args = where+" AND d.created_at >= ?", append(args, s.T(f.Since))
	}
	if !f.Until.IsZero() {
		where, args = where+" AND d.created_at < ?", append(args, s.T(f.Until))
	}
	if after != nil {
		where += " AND (d.created_at < ? OR (d.created_at = ? AND d.id < ?))"
		args = append(args, s.T(after.CreatedAt), s.T(after.CreatedAt), after.ID)
	}
	args = append(args, limit)
	rows, err := s.DB.QueryContext(ctx, s.Rebind(`SELECT `+tenantDeliveryColumns+`
FROM txhook_deliveries d JOIN txhook_events e ON e.id = d.event_id
WHERE `+where+` ORDER BY d.created_at DESC, d.id DESC LIMIT ?`), args...)
	if err != nil {
		return nil, err
	}
	return scanDeliveries(rows)
}

// EachAttemptOf calls fn with the start, duration and status (0: no
// response) of each attempt to endpointID started in [since, until), in
// start order, reading row by row from the attempt log (the rows of
// txhook_attempts and the first attempts that succeeded, kept in their
// delivery rows since migration 008).
func (s *Store) EachAttemptOf(ctx context.Context, endpointID string, since, until time.Time, fn func(at time.Time, d time.Duration, status int)) error {
	args := append([]any{endpointID, s.T(since), s.T(until), endpointID}, s.inlineWindowArgs(since, until)...)
	rows, err := s.DB.QueryContext(ctx, s.Rebind(`SELECT started_at, duration_us, status FROM (
    SELECT started_at, duration_us, status FROM txhook_attempts WHERE endpoint_id = ? AND started_at >= ? AND started_at < ?
    UNION ALL
    SELECT ok_started_at, ok_duration_us, last_status FROM txhook_deliveries
    WHERE endpoint_id = ? AND ok_started_at IS NOT NULL `+inlineWindow+`) a
ORDER BY started_at`), args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var at Time
		var us int64
		var status sql.NullInt64
		if err := rows.Scan(&at, &us, &status); err != nil {
			return err
		}
		fn(at.Time, time.Duration(us)*time.Microsecond, int(status.Int64))
	}
	return rows.Err()
}

// ExportFilter selects the rows of an export.
type ExportFilter struct {
	Since, Until          time.Time
	EndpointID, EventType string
}

// ExportRow is one event and one of its deliveries.
type ExportRow struct {
	EventID, EventType string
	CreatedAt          time.Time
	EndpointID         string
	State              string
	Attempts           int
	LastStatus         int
	UpdatedAt          time.Time
}

// ExportTenant calls fn for each delivery of tenant's events created in
// [f.Since, f.Until) (no end when Until is zero), ordered by event creation, event ID and delivery ID,
// reading row by row; it stops at fn's first error and returns it.
func (s *Store) ExportTenant(ctx context.Context, tenant string, f ExportFilter, fn func(ExportRow) error) error {
	where, args := "e.tenant = ? AND e.created_at >= ?", []any{tenant, s.T(f.Since)}
	if !f.Until.IsZero() {
		where, args = where+" AND e.created_at < ?", append(args, s.T(f.Until))
	}
	if f.EndpointID != "" {
		where, args = where+" AND d.endpoint_id = ?", append(args, f.EndpointID)
	}
	if f.EventType != "" {
		where, args = where+" AND e.type = ?", append(args, f.EventType)
	}
	rows, err := s.DB.QueryContext(ctx, s.Rebind(`SELECT e.id, e.type, e.created_at, d.endpoint_id, d.state, d.attempts, d.last_status, d.updated_at
FROM txhook_events e JOIN txhook_deliveries d ON d.event_id = e.id
WHERE `+where+` ORDER BY e.created_at, e.id, d.id`), args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var r ExportRow
		var c, u Time
		var status sql.NullInt64
		if err := rows.Scan(&r.EventID, &r.EventType, &c, &r.EndpointID, &r.State, &r.Attempts, &status, &u); err != nil {
			return err
		}
		r.CreatedAt, r.UpdatedAt, r.LastStatus = c.Time, u.Time, int(status.Int64)
		if err := fn(r); err != nil {
			return err
		}
	}
	return rows.Err()
}

// Resend queues, in one transaction with the audit row a (nil: none), a
// fresh delivery of delivery id's event to its endpoint, due at now, when
// both belong to tenant. A dead delivery's dead letter is removed, as a
// replay does; a delivery not finished yet is ErrActive; ErrNotFound when
// the delivery, its event or its endpoint is not tenant's.
func (s *Store) Resend(ctx context.Context, tenant string, id int64, now time.Time, a *AuditRow) (int64, error) {
	var nid int64
	err := s.Tx(ctx, func(q Querier) error {
		lock := ""
		if s.Dialect == Postgres {
			lock = " FOR UPDATE OF d"
		}
		var eventID, endpointID, state string
		var enabled bool
		var key sql.NullString
		err := q.QueryRowContext(ctx, s.Rebind(`SELECT d.event_id, d.endpoint_id, d.state, ep.enabled, e.ordering_key
FROM txhook_deliveries d JOIN txhook_events e ON e.id = d.event_id JOIN txhook_endpoints ep ON ep.id = d.endpoint_id
WHERE d.id = ? AND e.tenant = ? AND ep.tenant = ?`+lock), id, tenant, tenant).Scan(&eventID, &endpointID, &state, &enabled, &key)
		if err == sql.ErrNoRows {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		if state != StateSucceeded && state != StateDead {
			return ErrActive
		}
		next := StatePending
		if key.Valid {
			if err := s.lockKeys(ctx, q, []string{lockName(tenant, key.String)}); err != nil {
				return err
			}
			var taken bool
			if err := q.QueryRowContext(ctx, s.Rebind(`SELECT EXISTS (SELECT 1 FROM txhook_deliveries
WHERE endpoint_id = ? AND ordering_key = ? AND state IN ('pending', 'running', 'paused', 'blocked'))`), endpointID, key.String).Scan(&taken); err != nil {
				return err
			}
			if taken {
				next = StateBlocked
			}
		}
		if !enabled && next == StatePending {
			next = StatePaused
		}
		if err := q.QueryRowContext(ctx, s.Rebind(`INSERT INTO txhook_deliveries (event_id, endpoint_id, state, ordering_key, next_attempt_at, created_at, updated_at)
VALUES (?, ?, ?, ?, `+s.notBefore("?", "?")+`, ?, ?) RETURNING id`), eventID, endpointID, next, key, s.T(now), eventID, s.T(now), s.T(now)).Scan(&nid); err != nil {
			return err
		}
		if state == StateDead {
			if _, err := q.ExecContext(ctx, s.Rebind(`DELETE FROM txhook_dead_letters WHERE delivery_id = ?`), id); err != nil {
				return err
			}
		}
		return s.auditAndWake(ctx, q, a)
	})
	return nid, err
}

// InsertTargeted writes event ev already dispatched, with one pending
// delivery to endpointID (which must belong to ev.Tenant, else ErrNotFound)
// due at once, and the audit row a (nil: none), in one transaction: an
// event for that endpoint only. It returns the delivery's ID.
func (s *Store) InsertTargeted(ctx context.Context, ev NewEvent, endpointID string, a *AuditRow) (int64, error) {
	var nid int64
	err := s.Tx(ctx, func(q Querier) error {
		var enabled bool
		err := q.QueryRowContext(ctx, s.Rebind(`SELECT enabled FROM txhook_endpoints WHERE id = ? AND tenant = ?`), endpointID, ev.Tenant).Scan(&enabled)
		if err == sql.ErrNoRows {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		if _, err := q.ExecContext(ctx, s.Rebind(`INSERT INTO txhook_events (id, tenant, type, payload, created_at, version, dispatched_at)
VALUES (?, ?, ?, ?, ?, ?, ?)`), ev.ID, ev.Tenant, ev.Type, ev.Payload, s.T(ev.CreatedAt), ev.Version, s.T(ev.CreatedAt)); err != nil {
			return NotMigrated(err)
		}
		state := StatePending
		if !enabled {
			state = StatePaused
		}
		if err := q.QueryRowContext(ctx, s.Rebind(`INSERT INTO txhook_deliveries (event_id, endpoint_id, state, next_attempt_at, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?) RETURNING id`), ev.ID, endpointID, state, s.T(ev.CreatedAt), s.T(ev.CreatedAt), s.T(ev.CreatedAt)).Scan(&nid); err != nil {
			return err
		}
		return s.auditAndWake(ctx, q, a)
	})
	return nid, err
}

// auditAndWake ends a transaction that queued a delivery: it writes the
// audit row a (nil: none) and, on PostgreSQL, wakes the relays at commit.
func (s *Store) auditAndWake(ctx context.Context, q Querier, a *AuditRow) error {
	if a != nil {
		if err := s.InsertAudit(ctx, q, *a); err != nil {
			return err
		}
	}
	if s.Dialect == Postgres {
		_, err := q.ExecContext(ctx, `SELECT pg_notify('`+WakeChannel+`', '')`)
		return err
	}
	return nil
}
