package store

import (
	"context"
	"database/sql"
	"time"
)

// EndpointCursor is a position in the listing of endpoints ordered by
// tenant and ID.
type EndpointCursor struct {
	Tenant string
	ID     string
}

// ListEndpointsPage returns up to limit endpoints ordered by tenant and ID,
// only tenant's when tenant is not "", starting after cursor when it is not
// nil. Both forms walk the (tenant, id) index.
func (s *Store) ListEndpointsPage(ctx context.Context, tenant string, after *EndpointCursor, limit int) ([]EndpointRow, error) {
	where, args := "TRUE", []any{}
	if tenant != "" {
		where, args = "tenant = ?", append(args, tenant)
	}
	if after != nil {
		where += " AND (tenant > ? OR (tenant = ? AND id > ?))"
		args = append(args, after.Tenant, after.Tenant, after.ID)
	}
	args = append(args, limit)
	rows, err := s.DB.QueryContext(ctx, s.Rebind(`SELECT `+endpointColumns+` FROM txhook_endpoints
WHERE `+where+` ORDER BY tenant, id LIMIT ?`), args...)
	if err != nil {
		return nil, err
	}
	return scanEndpoints(rows)
}

// DeliveryCursor is a position in an endpoint's deliveries, newest first.
// IDs alone do not order deliveries: on PostgreSQL they can commit out of
// order, so the listing pages on (created_at, id).
type DeliveryCursor struct {
	CreatedAt time.Time
	ID        int64
}

// DeliveriesOfEndpoint returns up to limit deliveries of an endpoint, newest
// first, starting after cursor when it is not nil.
func (s *Store) DeliveriesOfEndpoint(ctx context.Context, endpointID string, after *DeliveryCursor, limit int) ([]DeliveryRow, error) {
	where, args := "endpoint_id = ?", []any{endpointID}
	if after != nil {
		where += " AND (created_at < ? OR (created_at = ? AND id < ?))"
		args = append(args, s.T(after.CreatedAt), s.T(after.CreatedAt), after.ID)
	}
	args = append(args, limit)
	rows, err := s.DB.QueryContext(ctx, s.Rebind(`SELECT `+deliveryColumns+` FROM txhook_deliveries
WHERE `+where+` ORDER BY created_at DESC, id DESC LIMIT ?`), args...)
	if err != nil {
		return nil, err
	}
	return scanDeliveries(rows)
}

// AttemptsOfDeliveries returns the attempt logs of several deliveries,
// ordered by delivery and attempt.
func (s *Store) AttemptsOfDeliveries(ctx context.Context, ids []int64) ([]AttemptRow, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := s.DB.QueryContext(ctx, s.Rebind(`SELECT delivery_id, endpoint_id, attempt, started_at, duration_us, status, response_excerpt, error
FROM txhook_attempt_log WHERE `+s.idsIn("delivery_id")+` ORDER BY delivery_id, attempt, id`), jsonIDs(ids))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []AttemptRow
	for rows.Next() {
		a, err := scanAttempt(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

func scanAttempt(rows interface{ Scan(...any) error }) (AttemptRow, error) {
	var a AttemptRow
	var at Time
	var us int64
	var status sql.NullInt64
	if err := rows.Scan(&a.DeliveryID, &a.EndpointID, &a.Attempt, &at, &us, &status, &a.Excerpt, &a.Error); err != nil {
		return AttemptRow{}, err
	}
	a.StartedAt, a.Duration, a.Status = at.Time, time.Duration(us)*time.Microsecond, int(status.Int64)
	return a, nil
}
