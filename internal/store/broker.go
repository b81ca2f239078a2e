package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"time"
)

// Broker mode (package outbox/broker): a message queue, not the database,
// holds the work. The database keeps the record: a delivery's row is
// written with its first outcome and updated with each later one, in
// batches, by the relays that take their deliveries from the queue.
//
// A row whose next attempt the queue holds (a retry it will hand out at
// next_attempt_at) is 'pending' and leased to the broker: lease_owner is
// BrokerOwner. Rows the forwarders hand to the queue (a replay, a resend,
// a recovery) are leased to it the same way. Every outcome is fenced by
// the number of attempts the row had when the queue's message was sent
// (Completion.Base): a message handed out twice, or a copy the broker
// still held when a row was recovered, writes nothing the second time.

// BrokerOwner is the lease owner of delivery rows a broker's stream holds.
func BrokerOwner(stream string) string { return "broker:" + stream }

// EndpointsByID returns, for each endpoint of ids that exists, the
// columns a relay sends with, in a Claimed (EndpointID, Tenant and the
// endpoint fields; EndpointFound true).
func (s *Store) EndpointsByID(ctx context.Context, ids []string) (map[string]Claimed, error) {
	out := make(map[string]Claimed, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := s.DB.QueryContext(ctx, s.Rebind(`SELECT ep.id, ep.tenant, `+claimEndpointCols+`
FROM txhook_endpoints ep WHERE `+s.textIn("ep.id")), jsonStrings(ids))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var c Claimed
		if err := rows.Scan(append([]any{&c.EndpointID, &c.Tenant}, endpointDest(&c)...)...); err != nil {
			return nil, err
		}
		c.EndpointFound = true
		out[c.EndpointID] = c
	}
	return out, rows.Err()
}

// BrokerRow is a delivery row as a broker's relay checks it.
type BrokerRow struct {
	ID         int64
	EventID    string
	EndpointID string
	State      string
	Attempts   int
	NextAt     time.Time
	Owner      string
}

// BrokerRows returns the delivery rows with the given IDs, and for each
// (event, endpoint) pair the row of that delivery with the lowest ID (the
// one its first outcome wrote).
func (s *Store) BrokerRows(ctx context.Context, ids []int64, pairs [][2]string) (byID map[int64]BrokerRow, byPair map[[2]string]BrokerRow, err error) {
	byID, byPair = map[int64]BrokerRow{}, map[[2]string]BrokerRow{}
	scan := func(rows *sql.Rows) error {
		defer rows.Close()
		for rows.Next() {
			var r BrokerRow
			var next Time
			var owner sql.NullString
			if err := rows.Scan(&r.ID, &r.EventID, &r.EndpointID, &r.State, &r.Attempts, &next, &owner); err != nil {
				return err
			}
			r.NextAt, r.Owner = next.Time, owner.String
			byID[r.ID] = r
			k := [2]string{r.EventID, r.EndpointID}
			if old, ok := byPair[k]; !ok || r.ID < old.ID {
				byPair[k] = r
			}
		}
		return rows.Err()
	}
	const cols = `SELECT id, event_id, endpoint_id, state, attempts, next_attempt_at, lease_owner FROM txhook_deliveries WHERE `
	byIDQuery, byEventQuery := cols+s.idsIn("id"), cols+s.textIn("event_id")
	if s.Dialect == Postgres {
		byIDQuery, byEventQuery = pgBrokerRowsByID, pgBrokerRowsByEvent
	}
	if len(ids) > 0 {
		rows, err := s.DB.QueryContext(ctx, s.Rebind(byIDQuery), jsonIDs(ids))
		if err != nil {
			return nil, nil, err
		}
		if err := scan(rows); err != nil {
			return nil, nil, err
		}
	}
	if len(pairs) > 0 {
		evs := make([]string, len(pairs))
		want := make(map[[2]string]bool, len(pairs))
		for i, p := range pairs {
			evs[i] = p[0]
			want[p] = true
		}
		rows, err := s.DB.QueryContext(ctx, s.Rebind(byEventQuery), jsonStrings(evs))
		if err != nil {
			return nil, nil, err
		}
		if err := scan(rows); err != nil {
			return nil, nil, err
		}
		for k := range byPair {
			if !want[k] {
				delete(byPair, k)
			}
		}
	}
	return byID, byPair, nil
}

// The lookups of BrokerRows on PostgreSQL: one index probe per key
// (LATERAL, fenced by OFFSET 0). Written as "col IN (SELECT
// jsonb_array_elements_text(...))", a generic plan (or a custom one, the
// function's 100 rows estimated) hash-joined the keys against a
// sequential scan of the whole table: 3 ms for 5 keys beside 15,000
// deliveries, 0.09 ms now, and growing with the history.
const (
	brokerRowCols    = `d.id, d.event_id, d.endpoint_id, d.state, d.attempts, d.next_attempt_at, d.lease_owner`
	pgBrokerRowsByID = `SELECT ` + brokerRowCols + `
FROM (SELECT DISTINCT jsonb_array_elements_text($1::jsonb)::bigint AS id) k
CROSS JOIN LATERAL (SELECT * FROM txhook_deliveries x WHERE x.id = k.id OFFSET 0) d`
	pgBrokerRowsByEvent = `SELECT ` + brokerRowCols + `
FROM (SELECT DISTINCT jsonb_array_elements_text($1::jsonb) AS event_id) k
CROSS JOIN LATERAL (SELECT * FROM txhook_deliveries x WHERE x.event_id = k.event_id OFFSET 0) d`
)

// BrokerRowsQueries are the statements BrokerRows runs on PostgreSQL, by
// row ID and by event ID (each takes a JSON array), for tests of their
// plans.
func (s *Store) BrokerRowsQueries() []string {
	return []string{s.Rebind(pgBrokerRowsByID), s.Rebind(pgBrokerRowsByEvent)}
}

// BrokerComplete writes a batch of outcomes of deliveries a broker holds,
// for the broker whose rows are leased to owner (BrokerOwner). Each
// completion is one attempt's outcome (or, for an endpoint found
// disabled, the delivery parked 'paused'):
//
//   - ID 0: the first outcome of a delivery of a new event, which has no
//     row yet. Its row is inserted, unless a row of that event and
//     endpoint exists already (a message handed out twice).
//   - ID set: the row is updated if it is 'pending' or 'running', leased
//     to owner, with Base attempts recorded.
//
// A pending outcome (a retry the broker will hand out at NextAt) leaves the
// row 'pending' and leased to owner; any other leaves it unleased. A dead
// outcome with Refused set is a refusal past the refusing relay's limit:
// its dead letter's reason is DeadReasonRefused. Attempt
// records, inline first attempts (InlineAttempt) and dead letters are
// written with it in the same statement. Refusals are handled as Complete
// handles them; a completion neither written, refused nor unwritten was
// fenced out: BrokerRows tells what its row holds.
func (s *Store) BrokerComplete(ctx context.Context, owner string, now time.Time, cs []Completion) (Completed, error) {
	var res Completed
	if len(cs) == 0 {
		return res, nil
	}
	clean := make([]Completion, len(cs))
	idx := make([]int, 0, len(cs))
	seen := make(map[[2]string]bool, len(cs))
	for i := range cs {
		clean[i] = cs[i].Clean()
		if c := cs[i]; c.ID == 0 {
			// Two first outcomes of one delivery in a batch: the copies
			// of a message handed out twice. The first one counts.
			k := [2]string{c.EventID, c.EndpointID}
			if seen[k] {
				continue
			}
			seen[k] = true
		}
		idx = append(idx, i)
	}
	res.Written = map[int]int64{}
	err := s.completeSplit(ctx, owner, now, clean, idx, &res, s.brokerBatch)
	for _, id := range res.Written {
		res.Applied = append(res.Applied, id)
	}
	return res, err
}

// brokerRowOwner is the lease_owner an outcome leaves on its row.
func brokerRowOwner(c Completion, owner string) any {
	if c.State == StatePending {
		return owner
	}
	return nil
}

// pgBrokerComplete writes a batch in one statement; see BrokerComplete.
// The batch travels as JSON ($1), its attempt rows apart ($4), the owner
// as $3 and now as $2.
const pgBrokerComplete = `WITH c AS (
    SELECT * FROM json_to_recordset($1::json) AS x(i int, id bigint, base int, event_id text, endpoint_id text,
        state text, attempts int, next_at timestamptz, owner text, record boolean, status int, error text,
        ok_started_at timestamptz, ok_duration_us bigint, ok_excerpt text, created_at timestamptz, reason text)
    WHERE {{async}}
), upd AS (
    UPDATE txhook_deliveries d
    SET state = c.state, attempts = c.attempts, next_attempt_at = COALESCE(c.next_at, d.next_attempt_at),
        lease_owner = c.owner,
        ok_started_at = COALESCE(c.ok_started_at, d.ok_started_at),
        ok_duration_us = CASE WHEN c.ok_started_at IS NULL THEN d.ok_duration_us ELSE c.ok_duration_us END,
        ok_excerpt = CASE WHEN c.ok_started_at IS NULL THEN d.ok_excerpt ELSE c.ok_excerpt END,
        last_status = CASE WHEN c.record THEN c.status ELSE d.last_status END,
        last_error = CASE WHEN c.record THEN COALESCE(c.error, '') ELSE d.last_error END,
        updated_at = $2
    FROM c
    WHERE c.id > 0 AND d.id = c.id AND d.id = ANY (ARRAY(SELECT id FROM c WHERE id > 0))
      AND d.state IN ('pending', 'running') AND d.lease_owner = $3 AND d.attempts = c.base
    RETURNING c.i, d.id, d.event_id, d.endpoint_id, d.state, d.attempts, d.last_status, d.last_error
), ins AS (
    INSERT INTO txhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at, lease_owner, last_status, last_error,
        ok_started_at, ok_duration_us, ok_excerpt, created_at, updated_at)
    SELECT c.event_id, c.endpoint_id, c.state, c.attempts, COALESCE(c.next_at, $2), c.owner,
           CASE WHEN c.record THEN c.status END, CASE WHEN c.record THEN COALESCE(c.error, '') ELSE '' END,
           c.ok_started_at, c.ok_duration_us, c.ok_excerpt, c.created_at, $2
    FROM c
    WHERE c.id = 0
      -- Fenced (OFFSET 0) to the index on event_id: planned generic, or
      -- on a table whose statistics are new, the endpoint's condition was
      -- also pushed into the scan, which then combined the event's index
      -- with the endpoint's (all of its deliveries) for every row.
      AND NOT EXISTS (SELECT 1 FROM (SELECT x.endpoint_id FROM txhook_deliveries x WHERE x.event_id = c.event_id OFFSET 0) x
                      WHERE x.endpoint_id = c.endpoint_id)
    RETURNING id, event_id, endpoint_id, state, attempts, last_status, last_error
), done AS (
    SELECT i, id, event_id, endpoint_id, state, attempts, last_status, last_error FROM upd
    UNION ALL
    SELECT c.i, ins.id, ins.event_id, ins.endpoint_id, ins.state, ins.attempts, ins.last_status, ins.last_error
    FROM ins JOIN c ON c.id = 0 AND c.event_id = ins.event_id AND c.endpoint_id = ins.endpoint_id
), att AS (
    INSERT INTO txhook_attempts (delivery_id, endpoint_id, attempt, started_at, duration_us, status, response_excerpt, error)
    SELECT done.id, done.endpoint_id, a.attempt, a.started_at, a.duration_us, a.status,
           COALESCE(a.excerpt, ''), COALESCE(a.error, '')
    FROM json_to_recordset($4::json) AS a(i int, attempt int, started_at timestamptz,
        duration_us bigint, status int, excerpt text, error text)
    JOIN done ON done.i = a.i
), dead AS (
    INSERT INTO txhook_dead_letters (delivery_id, event_id, endpoint_id, tenant, event_type, attempts, last_status, last_error, failed_at, reason)
    SELECT done.id, done.event_id, done.endpoint_id, e.tenant, e.type, done.attempts, done.last_status, done.last_error, $2,
           COALESCE(c.reason, 'failed')
    FROM done JOIN c ON c.i = done.i JOIN txhook_events e ON e.id = done.event_id
    WHERE done.state = 'dead'
    ON CONFLICT (delivery_id) DO NOTHING
)
SELECT i, id FROM done`

type pgBrokerRow struct {
	I            int     `json:"i"`
	ID           int64   `json:"id"`
	Base         int     `json:"base"`
	EventID      string  `json:"event_id"`
	EndpointID   string  `json:"endpoint_id"`
	State        string  `json:"state"`
	Attempts     int     `json:"attempts"`
	NextAt       *string `json:"next_at,omitempty"`
	Owner        *string `json:"owner,omitempty"`
	Record       bool    `json:"record"`
	Status       int     `json:"status,omitempty"`
	Error        string  `json:"error,omitempty"`
	OKStartedAt  *string `json:"ok_started_at,omitempty"`
	OKDurationUS int64   `json:"ok_duration_us,omitempty"`
	OKExcerpt    *string `json:"ok_excerpt,omitempty"`
	CreatedAt    string  `json:"created_at"`
	Reason       string  `json:"reason,omitempty"`
}

type pgBrokerAttempt struct {
	I int `json:"i"`
	pgAttempt
}

// BrokerCompleteQueries are the statements BrokerComplete runs, for
// Prepare.
func (s *Store) BrokerCompleteQueries() []string {
	if s.Dialect == Postgres {
		return []string{s.relaySQL(pgBrokerComplete)}
	}
	return nil
}

// brokerBatch writes cs all or nothing; see BrokerComplete.
func (s *Store) brokerBatch(ctx context.Context, owner string, now time.Time, cs []Completion) (map[int]int64, map[int]bool, error) {
	if s.Dialect != Postgres {
		written, err := s.sqliteBrokerBatch(ctx, owner, now, cs)
		return written, nil, err
	}
	written, err := s.pgBrokerBatch(ctx, owner, now, cs)
	return written, nil, err
}

func (s *Store) pgBrokerBatch(ctx context.Context, owner string, now time.Time, cs []Completion) (map[int]int64, error) {
	rows := make([]pgBrokerRow, len(cs))
	var atts []pgBrokerAttempt
	for k, c := range cs {
		r := pgBrokerRow{I: k, ID: c.ID, Base: c.Base, EventID: c.EventID, EndpointID: c.EndpointID,
			State: c.State, Attempts: c.Attempts, Record: c.Record, Status: c.Status, Error: c.Error,
			CreatedAt: jsonTS(c.CreatedAt)}
		if c.Refused && c.State == StateDead {
			r.Reason = DeadReasonRefused
		}
		if !c.NextAt.IsZero() {
			t := jsonTS(c.NextAt)
			r.NextAt = &t
		}
		if o, ok := brokerRowOwner(c, owner).(string); ok {
			r.Owner = &o
		}
		if a, ok := InlineAttempt(c); ok {
			t, ex := jsonTS(a.StartedAt), a.Excerpt
			r.OKStartedAt, r.OKDurationUS, r.OKExcerpt = &t, a.Duration.Microseconds(), &ex
			if c.ID == 0 {
				// Created when it was attempted: the attempt log by start
				// time reads it through created_at (InlineSlack).
				r.CreatedAt = t
			}
		} else {
			for _, a := range c.Records {
				atts = append(atts, pgBrokerAttempt{I: k, pgAttempt: pgAttempt{Attempt: a.Attempt,
					StartedAt: jsonTS(a.StartedAt), DurationUS: a.Duration.Microseconds(),
					Status: a.Status, Excerpt: a.Excerpt, Error: a.Error}})
			}
		}
		rows[k] = r
	}
	cj, err := json.Marshal(rows)
	if err != nil {
		return nil, err
	}
	if atts == nil {
		atts = []pgBrokerAttempt{}
	}
	aj, err := json.Marshal(atts)
	if err != nil {
		return nil, err
	}
	res, err := s.queryPrepared(ctx, s.relaySQL(pgBrokerComplete), string(cj), s.T(now), owner, string(aj))
	if err != nil {
		return nil, err
	}
	defer res.Close()
	written := make(map[int]int64, len(cs))
	for res.Next() {
		var i int
		var id int64
		if err := res.Scan(&i, &id); err != nil {
			return nil, err
		}
		written[i] = id
	}
	return written, res.Err()
}

const sqliteBrokerUpdate = `UPDATE txhook_deliveries
SET state = ?, attempts = ?, next_attempt_at = COALESCE(?, next_attempt_at), lease_owner = ?,
    ok_started_at = COALESCE(?, ok_started_at),
    ok_duration_us = CASE WHEN ? IS NULL THEN ok_duration_us ELSE ? END,
    ok_excerpt = CASE WHEN ? IS NULL THEN ok_excerpt ELSE ? END,
    last_status = CASE WHEN ? THEN ? ELSE last_status END,
    last_error = CASE WHEN ? THEN ? ELSE last_error END,
    updated_at = ?
WHERE id = ? AND state IN ('pending', 'running') AND lease_owner = ? AND attempts = ?`

const sqliteBrokerInsert = `INSERT INTO txhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at, lease_owner,
    last_status, last_error, ok_started_at, ok_duration_us, ok_excerpt, created_at, updated_at)
SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?
WHERE NOT EXISTS (SELECT 1 FROM txhook_deliveries x WHERE x.event_id = ? AND x.endpoint_id = ?)`

func (s *Store) sqliteBrokerBatch(ctx context.Context, owner string, now time.Time, cs []Completion) (map[int]int64, error) {
	var written map[int]int64
	err := s.Tx(ctx, func(q Querier) error {
		written = map[int]int64{}
		for k, c := range cs {
			var next any
			if !c.NextAt.IsZero() {
				next = s.T(c.NextAt)
			}
			var status, lastStatus any
			if c.Status != 0 {
				status = c.Status
				if c.Record {
					lastStatus = c.Status
				}
			}
			var okAt, okUS, okExcerpt any
			created := c.CreatedAt
			inline, isInline := InlineAttempt(c)
			if isInline {
				okAt, okUS, okExcerpt = s.T(inline.StartedAt), inline.Duration.Microseconds(), inline.Excerpt
				created = inline.StartedAt
			}
			rowOwner := brokerRowOwner(c, owner)
			var id int64
			if c.ID == 0 {
				lastError := ""
				if c.Record {
					lastError = c.Error
				}
				if next == nil {
					next = s.T(now)
				}
				res, err := q.ExecContext(ctx, sqliteBrokerInsert, c.EventID, c.EndpointID, c.State, c.Attempts, next, rowOwner,
					lastStatus, lastError, okAt, okUS, okExcerpt, s.T(created), s.T(now), c.EventID, c.EndpointID)
				if err != nil {
					return err
				}
				if n, _ := res.RowsAffected(); n != 1 {
					continue
				}
				if id, err = res.LastInsertId(); err != nil {
					return err
				}
			} else {
				res, err := q.ExecContext(ctx, sqliteBrokerUpdate, c.State, c.Attempts, next, rowOwner,
					okAt, okAt, okUS, okAt, okExcerpt,
					c.Record, status, c.Record, c.Error, s.T(now), c.ID, owner, c.Base)
				if err != nil {
					return err
				}
				if n, _ := res.RowsAffected(); n != 1 {
					continue
				}
				id = c.ID
			}
			written[k] = id
			if !isInline {
				for _, r := range c.Records {
					var st any
					if r.Status != 0 {
						st = r.Status
					}
					if _, err := q.ExecContext(ctx, sqliteInsertAttempt, r.Attempt, s.T(r.StartedAt),
						r.Duration.Microseconds(), st, r.Excerpt, r.Error, id); err != nil {
						return err
					}
				}
			}
			if c.State == StateDead {
				reason := DeadReasonFailed
				if c.Refused {
					reason = DeadReasonRefused
				}
				if _, err := q.ExecContext(ctx, sqliteInsertDeadLetter, s.T(now), reason, id); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return written, nil
}
