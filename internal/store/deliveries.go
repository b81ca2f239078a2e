package store

import (
	"context"
	"database/sql"
	"time"
)

// AttemptRow is a row of the attempt log.
type AttemptRow struct {
	DeliveryID int64
	EndpointID string
	Attempt    int
	StartedAt  time.Time
	Duration   time.Duration
	Status     int
	Excerpt    string
	Error      string
}

// Attempts returns a delivery's attempt log in order.
func (s *Store) Attempts(ctx context.Context, deliveryID int64) ([]AttemptRow, error) {
	rows, err := s.DB.QueryContext(ctx, s.Rebind(`SELECT delivery_id, endpoint_id, attempt, started_at, duration_us, status, response_excerpt, error
FROM txhook_attempt_log WHERE delivery_id = ? ORDER BY attempt, id`), deliveryID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []AttemptRow
	for rows.Next() {
		var a AttemptRow
		var at Time
		var us int64
		var status sql.NullInt64
		if err := rows.Scan(&a.DeliveryID, &a.EndpointID, &a.Attempt, &at, &us, &status, &a.Excerpt, &a.Error); err != nil {
			return nil, err
		}
		a.StartedAt, a.Duration, a.Status = at.Time, time.Duration(us)*time.Microsecond, int(status.Int64)
		out = append(out, a)
	}
	return out, rows.Err()
}

// DeliveryRow is a row of txhook_deliveries.
type DeliveryRow struct {
	ID            int64
	EventID       string
	EndpointID    string
	State         string
	Attempts      int
	NextAttemptAt time.Time
	LastStatus    int
	LastError     string
	CreatedAt     time.Time
	UpdatedAt     time.Time
	// RefusedSince is when the relays' target rules started refusing its
	// endpoint's URL (migration 010); zero when they do not.
	RefusedSince time.Time
}

const deliveryColumns = `id, event_id, endpoint_id, state, attempts, next_attempt_at, last_status, last_error, created_at, updated_at, refused_since`

// DeliveriesOfEvent returns an event's deliveries, oldest first.
func (s *Store) DeliveriesOfEvent(ctx context.Context, eventID string) ([]DeliveryRow, error) {
	rows, err := s.DB.QueryContext(ctx, s.Rebind(`SELECT `+deliveryColumns+` FROM txhook_deliveries WHERE event_id = ? ORDER BY id`), eventID)
	if err != nil {
		return nil, err
	}
	return scanDeliveries(rows)
}

// Delivery returns one delivery.
func (s *Store) Delivery(ctx context.Context, id int64) (DeliveryRow, error) {
	return s.oneDelivery(ctx, `SELECT `+deliveryColumns+` FROM txhook_deliveries WHERE id = ?`, id)
}

// oneDelivery reads the one delivery query returns; ErrNotFound if none.
func (s *Store) oneDelivery(ctx context.Context, query string, args ...any) (DeliveryRow, error) {
	rows, err := s.DB.QueryContext(ctx, s.Rebind(query), args...)
	if err != nil {
		return DeliveryRow{}, err
	}
	ds, err := scanDeliveries(rows)
	if err != nil {
		return DeliveryRow{}, err
	}
	if len(ds) == 0 {
		return DeliveryRow{}, ErrNotFound
	}
	return ds[0], nil
}

func scanDeliveries(rows *sql.Rows) ([]DeliveryRow, error) {
	defer rows.Close()
	var out []DeliveryRow
	for rows.Next() {
		var d DeliveryRow
		var next, c, u, refused Time
		var status sql.NullInt64
		if err := rows.Scan(&d.ID, &d.EventID, &d.EndpointID, &d.State, &d.Attempts, &next, &status, &d.LastError, &c, &u, &refused); err != nil {
			return nil, err
		}
		d.NextAttemptAt, d.LastStatus, d.CreatedAt, d.UpdatedAt = next.Time, int(status.Int64), c.Time, u.Time
		d.RefusedSince = refused.Time
		out = append(out, d)
	}
	return out, rows.Err()
}
