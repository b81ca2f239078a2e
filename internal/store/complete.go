package store

import (
	"context"
	"encoding/json"
	"time"
)

// Delivery states.
const (
	StatePending   = "pending"
	StateRunning   = "running"
	StateSucceeded = "succeeded"
	StateDead      = "dead"
	StatePaused    = "paused"
	StateBlocked   = "blocked"
)

// Completion is what a relay writes back for one claimed delivery.
type Completion struct {
	ID      int64
	Attempt int // the claimed attempt number: the fencing token

	State    string    // the new state
	Attempts int       // the stored attempt count (Attempt-1 when the attempt was not spent)
	NextAt   time.Time // next attempt time when State is pending
	Record   bool      // set last_status and last_error from Status and Error
	Status   int       // 0: no HTTP response
	Error    string

	// Records are attempt log rows to insert with this completion.
	Records []AttemptRecord
}

// AttemptRecord is one row of the attempt log.
type AttemptRecord struct {
	Attempt   int
	StartedAt time.Time
	Duration  time.Duration
	Status    int
	Excerpt   string
	Error     string
}

// pgComplete applies a batch of completions in one statement, so the
// delivery update, its attempt records and, for a final failure, the
// dead-letter row commit together. Rows whose lease was taken over (the
// fencing condition fails) are left alone and their records dropped.
const pgComplete = `WITH c AS (
    SELECT * FROM jsonb_to_recordset($1::jsonb) AS x(id bigint, attempt int, state text, attempts int,
        next_at timestamptz, record boolean, status int, error text)
), upd AS (
    UPDATE txhook_deliveries d
    SET state = c.state, attempts = c.attempts, next_attempt_at = COALESCE(c.next_at, d.next_attempt_at),
        lease_owner = NULL,
        last_status = CASE WHEN c.record THEN c.status ELSE d.last_status END,
        last_error = CASE WHEN c.record THEN COALESCE(c.error, '') ELSE d.last_error END,
        updated_at = $3
    FROM c
    WHERE d.id = c.id AND d.state = 'running' AND d.lease_owner = $2 AND d.attempts = c.attempt
    RETURNING d.id, d.event_id, d.endpoint_id, d.state, d.attempts, d.last_status, d.last_error
), att AS (
    INSERT INTO txhook_attempts (delivery_id, endpoint_id, attempt, started_at, duration_us, status, response_excerpt, error)
    SELECT a.delivery_id, upd.endpoint_id, a.attempt, a.started_at, a.duration_us, a.status,
           COALESCE(a.excerpt, ''), COALESCE(a.error, '')
    FROM jsonb_to_recordset($4::jsonb) AS a(delivery_id bigint, attempt int, started_at timestamptz,
        duration_us bigint, status int, excerpt text, error text)
    JOIN upd ON upd.id = a.delivery_id
), dead AS (
    INSERT INTO txhook_dead_letters (delivery_id, event_id, endpoint_id, tenant, event_type, attempts, last_status, last_error, failed_at)
    SELECT upd.id, upd.event_id, upd.endpoint_id, e.tenant, e.type, upd.attempts, upd.last_status, upd.last_error, $3
    FROM upd JOIN txhook_events e ON e.id = upd.event_id
    WHERE upd.state = 'dead'
    ON CONFLICT (delivery_id) DO NOTHING
)
SELECT id FROM upd`

const sqliteCompleteUpdate = `UPDATE txhook_deliveries
SET state = ?, attempts = ?, next_attempt_at = COALESCE(?, next_attempt_at), lease_owner = NULL,
    last_status = CASE WHEN ? THEN ? ELSE last_status END,
    last_error = CASE WHEN ? THEN ? ELSE last_error END,
    updated_at = ?
WHERE id = ? AND state = 'running' AND lease_owner = ? AND attempts = ?`

const sqliteInsertAttempt = `INSERT INTO txhook_attempts (delivery_id, endpoint_id, attempt, started_at, duration_us, status, response_excerpt, error)
SELECT id, endpoint_id, ?, ?, ?, ?, ?, ? FROM txhook_deliveries WHERE id = ?`

const sqliteInsertDeadLetter = `INSERT INTO txhook_dead_letters (delivery_id, event_id, endpoint_id, tenant, event_type, attempts, last_status, last_error, failed_at)
SELECT d.id, d.event_id, d.endpoint_id, e.tenant, e.type, d.attempts, d.last_status, d.last_error, ?
FROM txhook_deliveries d JOIN txhook_events e ON e.id = d.event_id
WHERE d.id = ?
ON CONFLICT (delivery_id) DO NOTHING`

// CompleteQueries are the statements Complete runs outside a transaction,
// for Prepare.
func (s *Store) CompleteQueries() []string {
	if s.Dialect == Postgres {
		return []string{pgComplete}
	}
	return nil
}

type pgCompletion struct {
	ID       int64   `json:"id"`
	Attempt  int     `json:"attempt"`
	State    string  `json:"state"`
	Attempts int     `json:"attempts"`
	NextAt   *string `json:"next_at,omitempty"`
	Record   bool    `json:"record"`
	Status   int     `json:"status,omitempty"`
	Error    string  `json:"error,omitempty"`
}

type pgAttempt struct {
	DeliveryID int64  `json:"delivery_id"`
	Attempt    int    `json:"attempt"`
	StartedAt  string `json:"started_at"`
	DurationUS int64  `json:"duration_us"`
	Status     int    `json:"status,omitempty"`
	Excerpt    string `json:"excerpt,omitempty"`
	Error      string `json:"error,omitempty"`
}

// Complete writes a batch of completions for owner and returns the IDs of
// the deliveries it applied to; the others had lost their lease.
func (s *Store) Complete(ctx context.Context, owner string, now time.Time, cs []Completion) ([]int64, error) {
	if len(cs) == 0 {
		return nil, nil
	}
	if s.Dialect == Postgres {
		return s.pgCompleteBatch(ctx, owner, now, cs)
	}
	var applied []int64
	err := s.Tx(ctx, func(q Querier) error {
		applied = applied[:0]
		for _, c := range cs {
			var next any
			if !c.NextAt.IsZero() {
				next = s.T(c.NextAt)
			}
			var status any
			if c.Status != 0 {
				status = c.Status
			}
			res, err := q.ExecContext(ctx, sqliteCompleteUpdate, c.State, c.Attempts, next,
				c.Record, status, c.Record, c.Error, s.T(now), c.ID, owner, c.Attempt)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n != 1 {
				continue
			}
			applied = append(applied, c.ID)
			for _, r := range c.Records {
				var st any
				if r.Status != 0 {
					st = r.Status
				}
				if _, err := q.ExecContext(ctx, sqliteInsertAttempt, r.Attempt, s.T(r.StartedAt),
					r.Duration.Microseconds(), st, r.Excerpt, r.Error, c.ID); err != nil {
					return err
				}
			}
			if c.State == StateDead {
				if _, err := q.ExecContext(ctx, sqliteInsertDeadLetter, s.T(now), c.ID); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return applied, nil
}

func (s *Store) pgCompleteBatch(ctx context.Context, owner string, now time.Time, cs []Completion) ([]int64, error) {
	rows := make([]pgCompletion, len(cs))
	var atts []pgAttempt
	for i, c := range cs {
		r := pgCompletion{ID: c.ID, Attempt: c.Attempt, State: c.State, Attempts: c.Attempts,
			Record: c.Record, Status: c.Status, Error: c.Error}
		if !c.NextAt.IsZero() {
			t := c.NextAt.UTC().Format(time.RFC3339Nano)
			r.NextAt = &t
		}
		rows[i] = r
		for _, a := range c.Records {
			atts = append(atts, pgAttempt{DeliveryID: c.ID, Attempt: a.Attempt,
				StartedAt: a.StartedAt.UTC().Format(time.RFC3339Nano), DurationUS: a.Duration.Microseconds(),
				Status: a.Status, Excerpt: a.Excerpt, Error: a.Error})
		}
	}
	cj, err := json.Marshal(rows)
	if err != nil {
		return nil, err
	}
	if atts == nil {
		atts = []pgAttempt{}
	}
	aj, err := json.Marshal(atts)
	if err != nil {
		return nil, err
	}
	args := []any{string(cj), owner, s.T(now), string(aj)}
	var q Querier = s.DB
	if st := s.stmtFor(ctx, s.DB, pgComplete); st != nil {
		res, err := st.QueryContext(ctx, args...)
		if err != nil {
			return nil, err
		}
		return scanIDs(res)
	}
	res, err := q.QueryContext(ctx, pgComplete, args...)
	if err != nil {
		return nil, err
	}
	return scanIDs(res)
}

func scanIDs(rows interface {
	Next() bool
	Scan(...any) error
	Err() error
	Close() error
}) ([]int64, error) {
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}
