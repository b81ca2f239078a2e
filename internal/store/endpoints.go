package store

import (
	"context"
	"database/sql"
	"errors"
	"time"
)

// EndpointRow is a row of txhook_endpoints.
type EndpointRow struct {
	ID             string
	Tenant         string
	URL            string
	Description    string
	EventTypes     []byte // JSON array
	Secrets        []byte // JSON: the array, or its encrypted envelope (outbox/secrets.go)
	Enabled        bool
	DisabledReason string
	RateLimit      float64
	RateBurst      int
	MaxInFlight    int
	Versions       []byte // JSON object
	Headers        []byte // JSON object: custom request headers
	ClientCert     string // PEM chain; "" for none
	ClientKey      string // PEM private key of ClientCert, or its encrypted envelope (outbox/secrets.go)
	FailingSince   time.Time
	LastSuccessAt  time.Time
	LastFailureAt  time.Time
	CreatedAt      time.Time
	UpdatedAt      time.Time
}

const endpointColumns = `id, tenant, url, description, event_types, secrets, enabled, disabled_reason, rate_limit, rate_burst, max_in_flight, versions, headers, client_cert, client_key, failing_since, last_success_at, last_failure_at, created_at, updated_at`

// InsertEndpoint writes a new endpoint. An error that says the table or a
// column is missing wraps ErrNotMigrated.
func (s *Store) InsertEndpoint(ctx context.Context, q Querier, e EndpointRow) error {
	_, err := q.ExecContext(ctx, s.Rebind(`INSERT INTO txhook_endpoints (`+endpointColumns+`)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, NULL, ?, ?)`),
		e.ID, e.Tenant, e.URL, e.Description, string(e.EventTypes), string(e.Secrets), e.Enabled,
		e.DisabledReason, e.RateLimit, e.RateBurst, e.MaxInFlight, versionsJSON(e.Versions),
		versionsJSON(e.Headers), e.ClientCert, e.ClientKey, s.T(e.CreatedAt), s.T(e.UpdatedAt))
	return NotMigrated(err)
}

// UpdateEndpoint overwrites the mutable columns of an endpoint.
func (s *Store) UpdateEndpoint(ctx context.Context, q Querier, e EndpointRow) error {
	res, err := q.ExecContext(ctx, s.Rebind(`UPDATE txhook_endpoints
SET url = ?, description = ?, event_types = ?, rate_limit = ?, rate_burst = ?, max_in_flight = ?, versions = ?,
    headers = ?, client_cert = ?, client_key = ?, updated_at = ?
WHERE id = ?`), e.URL, e.Description, string(e.EventTypes), e.RateLimit, e.RateBurst, e.MaxInFlight, versionsJSON(e.Versions),
		versionsJSON(e.Headers), e.ClientCert, e.ClientKey, s.T(e.UpdatedAt), e.ID)
	return oneRow(res, err)
}

// SetEndpointEnabled enables or disables an endpoint. Disabling parks its
// waiting deliveries ('paused') so they spend no attempts; enabling makes
// them due at now (a delayed event's not before its deliver_at). A delivery in flight when the endpoint is disabled is
// parked by the relay when it completes.
func (s *Store) SetEndpointEnabled(ctx context.Context, id string, enabled bool, reason string, now time.Time) error {
	return s.Tx(ctx, func(q Querier) error {
		res, err := q.ExecContext(ctx, s.Rebind(`UPDATE txhook_endpoints SET enabled = ?, disabled_reason = ?, updated_at = ? WHERE id = ?`),
			enabled, reason, s.T(now), id)
		if err := oneRow(res, err); err != nil {
			return err
		}
		if enabled {
			_, err = q.ExecContext(ctx, s.Rebind(`UPDATE txhook_deliveries SET state = 'pending', next_attempt_at = `+s.notBefore("?", "txhook_deliveries.event_id")+`, updated_at = ?
WHERE endpoint_id = ? AND state = 'paused'`), s.T(now), s.T(now), id)
			return err
		}
		return s.pauseWaiting(ctx, q, id, now)
	})
}

// DeleteEndpoint removes an endpoint with its unfinished deliveries and
// their attempts. Dead letters stay (they are the record of what was not
// delivered) but can no longer be replayed.
func (s *Store) DeleteEndpoint(ctx context.Context, id string) error {
	return s.Tx(ctx, func(q Querier) error {
		res, err := q.ExecContext(ctx, s.Rebind(`DELETE FROM txhook_endpoints WHERE id = ?`), id)
		if err := oneRow(res, err); err != nil {
			return err
		}
		// Events left with no delivery and no dead letter are marked
		// unrouted, which is how retention finds them.
		if _, err := q.ExecContext(ctx, s.Rebind(`UPDATE txhook_events SET unrouted = TRUE
WHERE id IN (SELECT event_id FROM txhook_deliveries WHERE endpoint_id = ? AND state <> 'dead')
  AND dispatched_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM txhook_deliveries d WHERE d.event_id = txhook_events.id AND (d.endpoint_id <> ? OR d.state = 'dead'))
  AND NOT EXISTS (SELECT 1 FROM txhook_dead_letters dl WHERE dl.event_id = txhook_events.id)`), id, id); err != nil {
			return err
		}
		if _, err := q.ExecContext(ctx, s.Rebind(`DELETE FROM txhook_attempts WHERE delivery_id IN (
    SELECT id FROM txhook_deliveries WHERE endpoint_id = ? AND state <> 'dead')`), id); err != nil {
			return err
		}
		if _, err := q.ExecContext(ctx, s.Rebind(`DELETE FROM txhook_deliveries WHERE endpoint_id = ? AND state <> 'dead'`), id); err != nil {
			return err
		}
		// Its shared gate (migration 012). A relay finishing a request
		// to it now may write the row again: a few bytes, unread.
		if _, err := q.ExecContext(ctx, s.Rebind(`DELETE FROM txhook_gate_slots WHERE endpoint_id = ?`), id); err != nil {
			return err
		}
		_, err = q.ExecContext(ctx, s.Rebind(`DELETE FROM txhook_endpoint_gates WHERE endpoint_id = ?`), id)
		return err
	})
}

// GetEndpoint reads one endpoint.
func (s *Store) GetEndpoint(ctx context.Context, q Querier, id string) (EndpointRow, error) {
	return s.oneEndpoint(ctx, q, `id = ?`, id)
}

// oneEndpoint reads the endpoint matching where; ErrNotFound if none.
func (s *Store) oneEndpoint(ctx context.Context, q Querier, where string, args ...any) (EndpointRow, error) {
	rows, err := q.QueryContext(ctx, s.Rebind(`SELECT `+endpointColumns+` FROM txhook_endpoints WHERE `+where), args...)
	if err != nil {
		return EndpointRow{}, err
	}
	es, err := scanEndpoints(rows)
	if err != nil {
		return EndpointRow{}, err
	}
	if len(es) == 0 {
		return EndpointRow{}, ErrNotFound
	}
	return es[0], nil
}

// ListEndpoints reads a tenant's endpoints, or every endpoint when tenant
// is "" and all is true.
func (s *Store) ListEndpoints(ctx context.Context, tenant string, all bool) ([]EndpointRow, error) {
	var rows *sql.Rows
	var err error
	if all {
		rows, err = s.DB.QueryContext(ctx, s.Rebind(`SELECT `+endpointColumns+` FROM txhook_endpoints ORDER BY tenant, id`))
	} else {
		rows, err = s.DB.QueryContext(ctx, s.Rebind(`SELECT `+endpointColumns+` FROM txhook_endpoints WHERE tenant = ? ORDER BY id`), tenant)
	}
	if err != nil {
		return nil, err
	}
	return scanEndpoints(rows)
}

func scanEndpoints(rows *sql.Rows) ([]EndpointRow, error) {
	defer rows.Close()
	var out []EndpointRow
	for rows.Next() {
		var e EndpointRow
		var c, u, f, ok, failed Time
		var types, secrets, versions, headers string
		if err := rows.Scan(&e.ID, &e.Tenant, &e.URL, &e.Description, &types, &secrets, &e.Enabled,
			&e.DisabledReason, &e.RateLimit, &e.RateBurst, &e.MaxInFlight, &versions, &headers, &e.ClientCert, &e.ClientKey,
			&f, &ok, &failed, &c, &u); err != nil {
			return nil, err
		}
		e.EventTypes, e.Secrets, e.Versions, e.Headers = []byte(types), []byte(secrets), []byte(versions), []byte(headers)
		e.FailingSince, e.LastSuccessAt, e.LastFailureAt, e.CreatedAt, e.UpdatedAt = f.Time, ok.Time, failed.Time, c.Time, u.Time
		out = append(out, e)
	}
	return out, rows.Err()
}

func oneRow(res sql.Result, err error) error {
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}

// IsNotFound reports whether err is ErrNotFound or sql.ErrNoRows.
func IsNotFound(err error) bool {
	return errors.Is(err, ErrNotFound) || errors.Is(err, sql.ErrNoRows)
}

// ModifySecrets replaces an endpoint's secrets with fn(current) in one
// transaction, the row locked so concurrent rotations do not lose one.
func (s *Store) ModifySecrets(ctx context.Context, id string, now time.Time, fn func(current []byte) ([]byte, error)) error {
	return s.Tx(ctx, func(q Querier) error {
		lock := ""
		if s.Dialect == Postgres {
			lock = " FOR UPDATE"
		}
		var cur string
		err := q.QueryRowContext(ctx, s.Rebind(`SELECT secrets FROM txhook_endpoints WHERE id = ?`+lock), id).Scan(&cur)
		if err == sql.ErrNoRows {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		next, err := fn([]byte(cur))
		if err != nil {
			return err
		}
		_, err = q.ExecContext(ctx, s.Rebind(`UPDATE txhook_endpoints SET secrets = ?, updated_at = ? WHERE id = ?`), string(next), s.T(now), id)
		return err
	})
}

// versionsJSON is a JSON object column's value: "{}" for none.
func versionsJSON(b []byte) string {
	if len(b) == 0 {
		return "{}"
	}
	return string(b)
}
