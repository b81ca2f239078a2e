package store

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"time"
)

// Claimed is a delivery taken under a lease, with what is needed to send it.
type Claimed struct {
	ID          int64
	Attempt     int  // the number of the attempt about to be made
	LeaseLapsed bool // the row was running: a previous holder's lease expired
	EventID     string
	Tenant      string
	Type        string
	Payload     []byte
	EventTime   time.Time
	EndpointID  string
	// Endpoint columns; EndpointFound is false when the endpoint row is gone.
	EndpointFound bool
	URL           string
	Secrets       []byte // JSON
	Enabled       bool
}

// pgClaim takes up to $2 due deliveries. SKIP LOCKED lets any number of
// relays claim at once without waiting on or taking each other's rows; the
// claimed rows become 'running' with next_attempt_at set to the lease
// expiry, so the same query rescues them if their holder dies.
const pgClaim = `WITH due AS (
    SELECT id, state FROM txhook_deliveries
    WHERE state IN ('pending', 'running') AND next_attempt_at <= $1
    ORDER BY next_attempt_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE txhook_deliveries d
    SET state = 'running', attempts = d.attempts + 1, lease_owner = $3, next_attempt_at = $4, updated_at = $1
    FROM due WHERE d.id = due.id
    RETURNING d.id, d.attempts, due.state AS prev_state, d.event_id, d.endpoint_id
)
SELECT c.id, c.attempts, c.prev_state, c.event_id, e.tenant, e.type, e.payload, e.created_at,
       c.endpoint_id, ep.url, ep.secrets, ep.enabled
FROM claimed c
JOIN txhook_events e ON e.id = c.event_id
LEFT JOIN txhook_endpoints ep ON ep.id = c.endpoint_id`

// SQLite has one writer at a time, so the claim is a read and an update in
// one IMMEDIATE transaction: nobody can take the rows in between.
const sqliteClaimSelect = `SELECT d.id, d.attempts + 1, d.state, d.event_id, e.tenant, e.type, e.payload, e.created_at,
       d.endpoint_id, ep.url, ep.secrets, ep.enabled
FROM txhook_deliveries d
JOIN txhook_events e ON e.id = d.event_id
LEFT JOIN txhook_endpoints ep ON ep.id = d.endpoint_id
WHERE d.state IN ('pending', 'running') AND d.next_attempt_at <= ?
ORDER BY d.next_attempt_at
LIMIT ?`

const sqliteClaimUpdate = `UPDATE txhook_deliveries
SET state = 'running', attempts = attempts + 1, lease_owner = ?, next_attempt_at = ?, updated_at = ?
WHERE id IN (SELECT value FROM json_each(?))`

// ClaimQueries are the statements Claim runs, for Prepare.
func (s *Store) ClaimQueries() []string {
	if s.Dialect == Postgres {
		return []string{pgClaim}
	}
	return nil
}

// Claim takes up to limit deliveries due at now for owner, leased until
// leaseUntil.
func (s *Store) Claim(ctx context.Context, owner string, now, leaseUntil time.Time, limit int) ([]Claimed, error) {
	if s.Dialect == Postgres {
		st := s.stmtFor(ctx, s.DB, pgClaim)
		var rows *sql.Rows
		var err error
		if st != nil {
			rows, err = st.QueryContext(ctx, s.T(now), limit, owner, s.T(leaseUntil))
		} else {
			rows, err = s.DB.QueryContext(ctx, pgClaim, s.T(now), limit, owner, s.T(leaseUntil))
		}
		if err != nil {
			return nil, err
		}
		return scanClaimed(rows, limit)
	}
	var out []Claimed
	err := s.Tx(ctx, func(q Querier) error {
		rows, err := q.QueryContext(ctx, sqliteClaimSelect, s.T(now), limit)
		if err != nil {
			return err
		}
		out, err = scanClaimed(rows, limit)
		if err != nil || len(out) == 0 {
			return err
		}
		var ids strings.Builder
		ids.WriteByte('[')
		for i, c := range out {
			if i > 0 {
				ids.WriteByte(',')
			}
			ids.WriteString(strconv.FormatInt(c.ID, 10))
		}
		ids.WriteByte(']')
		_, err = q.ExecContext(ctx, sqliteClaimUpdate, owner, s.T(leaseUntil), s.T(now), ids.String())
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func scanClaimed(rows *sql.Rows, limit int) ([]Claimed, error) {
	defer rows.Close()
	out := make([]Claimed, 0, min(limit, 64))
	for rows.Next() {
		var c Claimed
		var prev string
		var et Time
		var url, secrets sql.NullString
		var enabled sql.NullBool
		if err := rows.Scan(&c.ID, &c.Attempt, &prev, &c.EventID, &c.Tenant, &c.Type, &c.Payload, &et,
			&c.EndpointID, &url, &secrets, &enabled); err != nil {
			return nil, err
		}
		c.LeaseLapsed = prev == "running"
		c.EventTime = et.Time
		c.EndpointFound = url.Valid
		c.URL = url.String
		c.Secrets = []byte(secrets.String)
		c.Enabled = enabled.Bool
		out = append(out, c)
	}
	return out, rows.Err()
}
