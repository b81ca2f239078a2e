package store

import (
	"context"
	"database/sql"
	"encoding/json"
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

// pgDispatch takes up to $2 undispatched events, marks them dispatched and
// creates their deliveries, one per enabled endpoint of the tenant that
// subscribes to the type, already claimed by $3 for their first attempt:
// fan-out and claim in one statement, so a new event costs the relay one
// round trip before its first request.
const pgDispatch = `WITH ev AS (
    SELECT id FROM txhook_events
    WHERE dispatched_at IS NULL
    ORDER BY created_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), fan AS (
    UPDATE txhook_events e SET dispatched_at = $1
    FROM ev WHERE e.id = ev.id
    RETURNING e.id, e.tenant, e.type, e.payload, e.created_at
), ins AS (
    INSERT INTO txhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at, lease_owner, created_at, updated_at)
    SELECT fan.id, ep.id, 'running', 1, $4, $3, $1, $1
    FROM fan JOIN txhook_endpoints ep ON ep.tenant = fan.tenant AND ep.enabled
    WHERE jsonb_array_length(ep.event_types) = 0 OR EXISTS (
        SELECT 1 FROM jsonb_array_elements_text(ep.event_types) p
        WHERE p = fan.type OR (right(p, 1) = '*' AND starts_with(fan.type, rtrim(p, '*'))))
    RETURNING id, event_id, endpoint_id
)
SELECT ins.id, 1, 'pending', ins.event_id, fan.tenant, fan.type, fan.payload, fan.created_at,
       ins.endpoint_id, ep.url, ep.secrets, ep.enabled
FROM ins
JOIN fan ON fan.id = ins.event_id
JOIN txhook_endpoints ep ON ep.id = ins.endpoint_id`

const sqliteDispatchSelect = `SELECT id, tenant, type, payload, created_at FROM txhook_events
WHERE dispatched_at IS NULL
ORDER BY created_at
LIMIT ?`

const sqliteDispatchMark = `UPDATE txhook_events SET dispatched_at = ? WHERE id IN (SELECT value FROM json_each(?))`

const sqliteDispatchMatch = `SELECT e.id, ep.id, ep.url, ep.secrets
FROM txhook_events e JOIN txhook_endpoints ep ON ep.tenant = e.tenant AND ep.enabled
WHERE e.id IN (SELECT value FROM json_each(?1))
  AND (json_array_length(ep.event_types) = 0 OR EXISTS (
      SELECT 1 FROM json_each(ep.event_types) p
      WHERE p.value = e.type OR (substr(p.value, -1) = '*'
          AND substr(e.type, 1, length(p.value) - 1) = substr(p.value, 1, length(p.value) - 1))))
ORDER BY e.created_at, ep.id`

const sqliteDispatchInsert = `INSERT INTO txhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at, lease_owner, created_at, updated_at)
VALUES (?, ?, 'running', 1, ?, ?, ?, ?) RETURNING id`

// ClaimQueries are the statements Claim and Dispatch run, for Prepare.
func (s *Store) ClaimQueries() []string {
	if s.Dialect == Postgres {
		return []string{pgClaim, pgDispatch}
	}
	return nil
}

// Dispatch fans out up to limit undispatched events, oldest first: it marks
// them dispatched and creates their deliveries, claimed by owner for their
// first attempt and leased until leaseUntil. Events no endpoint subscribes
// to are marked and yield nothing.
func (s *Store) Dispatch(ctx context.Context, owner string, now, leaseUntil time.Time, limit int) ([]Claimed, error) {
	if s.Dialect == Postgres {
		var rows *sql.Rows
		var err error
		args := []any{s.T(now), limit, owner, s.T(leaseUntil)}
		if st := s.stmtFor(ctx, s.DB, pgDispatch); st != nil {
			rows, err = st.QueryContext(ctx, args...)
		} else {
			rows, err = s.DB.QueryContext(ctx, pgDispatch, args...)
		}
		if err != nil {
			return nil, err
		}
		return scanClaimed(rows, limit)
	}
	var out []Claimed
	err := s.Tx(ctx, func(q Querier) error {
		out = out[:0]
		rows, err := q.QueryContext(ctx, sqliteDispatchSelect, limit)
		if err != nil {
			return err
		}
		type event struct {
			tenant, typ string
			payload     []byte
			created     time.Time
		}
		events := map[string]event{}
		var ids []string
		for rows.Next() {
			var id string
			var e event
			var t Time
			if err := rows.Scan(&id, &e.tenant, &e.typ, &e.payload, &t); err != nil {
				rows.Close()
				return err
			}
			e.created = t.Time
			events[id] = e
			ids = append(ids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(ids) == 0 {
			return err
		}
		idJSON, err := json.Marshal(ids)
		if err != nil {
			return err
		}
		if _, err := q.ExecContext(ctx, sqliteDispatchMark, s.T(now), string(idJSON)); err != nil {
			return err
		}
		rows, err = q.QueryContext(ctx, sqliteDispatchMatch, string(idJSON))
		if err != nil {
			return err
		}
		for rows.Next() {
			var c Claimed
			var secrets string
			if err := rows.Scan(&c.EventID, &c.EndpointID, &c.URL, &secrets); err != nil {
				rows.Close()
				return err
			}
			e := events[c.EventID]
			c.Attempt, c.Tenant, c.Type, c.Payload, c.EventTime = 1, e.tenant, e.typ, e.payload, e.created
			c.Secrets, c.EndpointFound, c.Enabled = []byte(secrets), true, true
			out = append(out, c)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for i := range out {
			if err := q.QueryRowContext(ctx, sqliteDispatchInsert, out[i].EventID, out[i].EndpointID,
				s.T(leaseUntil), owner, s.T(now), s.T(now)).Scan(&out[i].ID); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
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
