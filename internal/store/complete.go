package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/txhook/txhook/internal/sqlitelock"
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
	ID      int64 // the delivery; 0 for a first attempt claimed with its event
	Attempt int   // the claimed attempt number: the fencing token

	// CreatedAt is the delivery's created_at: the row's, or for a first
	// attempt claimed with its event when the event was claimed.
	CreatedAt time.Time

	// A first attempt claimed with its event (ID 0, see Claimed) has no
	// delivery row yet: its completion inserts it, with its outcome, while
	// the event is still leased to the owner with Lease (the fencing
	// token). Last marks the event's last outstanding delivery: its write
	// also marks the event dispatched and ends the lease.
	EventID, EndpointID string
	Lease               time.Time
	Last                bool

	State    string    // the new state
	Attempts int       // the stored attempt count (Attempt-1 when the attempt was not spent)
	NextAt   time.Time // next attempt time when State is pending
	Record   bool      // set last_status and last_error from Status and Error
	Status   int       // 0: no HTTP response
	Error    string    // may hold receiver text: Complete cleans it (see CleanText)

	// Records are attempt log rows to insert with this completion.
	Records []AttemptRecord

	// Refused marks a delivery handed back unspent (State pending)
	// because the relay's target rules refuse its endpoint's URL. The
	// write starts the delivery's refusal (refused_since, by the
	// database's clock) unless one is under way; a completion that spends
	// an attempt ends it. When RefusedLimit is positive, the refusal began
	// at least RefusedLimit ago and no attempt to the endpoint by any
	// relay started in that time (its last_success_at and
	// last_failure_at), the write dead-letters the delivery instead, with
	// reason DeadReasonRefused, and Complete reports it in RefusedDead.
	Refused      bool
	RefusedLimit time.Duration

	// Base is, for a delivery a broker holds (BrokerComplete), the number
	// of attempts its row had recorded when the broker's message was sent:
	// the fencing token, as Attempt is the relay's.
	Base int
}

// Why a delivery was dead-lettered: txhook_dead_letters.reason.
const (
	// DeadReasonFailed: its attempts ran out, or it failed in a way no
	// retry mends.
	DeadReasonFailed = "failed"
	// DeadReasonRefused: the relays' target rules refused its endpoint's
	// URL for longer than the refusing relay's limit (Completion.Refused).
	DeadReasonRefused = "refused"
)

// AttemptRecord is one row of the attempt log.
type AttemptRecord struct {
	Attempt   int
	StartedAt time.Time
	Duration  time.Duration
	Status    int
	Excerpt   string // receiver text, cleaned by Complete
	Error     string // may hold receiver text, cleaned by Complete
}

// InlineAttempt returns the attempt record that c writes in its
// delivery's row instead of txhook_attempts (migration 008): the only
// record of a first attempt that succeeded, started within InlineSlack of
// the delivery's created_at (Completion.CreatedAt). ok is false for every
// other completion, whose records are rows of txhook_attempts.
func InlineAttempt(c Completion) (r AttemptRecord, ok bool) {
	if c.State != StateSucceeded || c.Attempt != 1 || len(c.Records) != 1 {
		return AttemptRecord{}, false
	}
	r = c.Records[0]
	if d := r.StartedAt.Sub(c.CreatedAt); d <= -InlineSlack || d >= InlineSlack {
		return AttemptRecord{}, false
	}
	return r, r.Attempt == 1 && r.Error == ""
}

// InlineSlack bounds how far from its delivery's created_at a first
// attempt kept in the delivery's row started (migration 009): the reads of
// an endpoint's attempt log by start time find those attempts through the
// index of its deliveries by created_at (txhook_deliveries_endpoint_log),
// widened by this much. A first attempt claimed with its event is written
// with created_at = its start.
const InlineSlack = time.Second

// pgComplete applies a batch of completions in one statement, so the
// delivery update, its attempt records and, for a final failure, the
// dead-letter row commit together. Batches travel as json, not jsonb:
// json_to_recordset reads the text once, where jsonb would first build its
// binary form (about 1.5 µs a row more). A first attempt that succeeded is
// written in the delivery's row (ok_started_at, ok_duration_us,
// ok_excerpt; see InlineAttempt), not as an attempt row. Rows whose lease was taken over (the
// fencing condition fails) are left alone and their records dropped.
//
// refused_us is set only for a refusal (Completion.Refused): its
// RefusedLimit in microseconds, 0 for none. pgRefusedTooLong decides, by
// the database's clock, whether the refusal dead-letters the delivery.
const pgComplete = `WITH c AS (
    SELECT * FROM json_to_recordset($1::json) AS x(id bigint, attempt int, state text, attempts int,
        next_at timestamptz, record boolean, status int, error text,
        ok_started_at timestamptz, ok_duration_us bigint, ok_excerpt text, refused_us bigint)
    WHERE {{async}}
), upd AS (
    UPDATE txhook_deliveries d
    SET state = CASE WHEN c.refused_us > 0 AND ` + pgRefusedTooLong + ` THEN 'dead' ELSE c.state END,
        attempts = c.attempts, next_attempt_at = COALESCE(c.next_at, d.next_attempt_at),
        refused_since = CASE WHEN c.refused_us IS NOT NULL THEN COALESCE(d.refused_since, now())
                             WHEN c.attempts >= c.attempt THEN NULL ELSE d.refused_since END,
        lease_owner = NULL,
        ok_started_at = COALESCE(c.ok_started_at, d.ok_started_at),
        ok_duration_us = CASE WHEN c.ok_started_at IS NULL THEN d.ok_duration_us ELSE c.ok_duration_us END,
        ok_excerpt = CASE WHEN c.ok_started_at IS NULL THEN d.ok_excerpt ELSE c.ok_excerpt END,
        last_status = CASE WHEN c.record THEN c.status ELSE d.last_status END,
        last_error = CASE WHEN c.record THEN COALESCE(c.error, '') ELSE d.last_error END,
        updated_at = $3
    FROM c
    WHERE d.id = c.id AND d.id = ANY (ARRAY(SELECT id FROM c))
      AND d.state = 'running' AND d.lease_owner = $2 AND d.attempts = c.attempt
    RETURNING d.id, d.event_id, d.endpoint_id, d.state, d.attempts, d.last_status, d.last_error, c.attempt,
              c.refused_us IS NOT NULL AS refused
), att AS (
    INSERT INTO txhook_attempts (delivery_id, endpoint_id, attempt, started_at, duration_us, status, response_excerpt, error)
    SELECT a.delivery_id, upd.endpoint_id, a.attempt, a.started_at, a.duration_us, a.status,
           COALESCE(a.excerpt, ''), COALESCE(a.error, '')
    FROM json_to_recordset($4::json) AS a(delivery_id bigint, attempt int, started_at timestamptz,
        duration_us bigint, status int, excerpt text, error text)
    JOIN upd ON upd.id = a.delivery_id
), dead AS (
    INSERT INTO txhook_dead_letters (delivery_id, event_id, endpoint_id, tenant, event_type, attempts, last_status, last_error, failed_at, reason)
    SELECT upd.id, upd.event_id, upd.endpoint_id, e.tenant, e.type, upd.attempts, upd.last_status, upd.last_error, $3,
           CASE WHEN upd.refused THEN '` + DeadReasonRefused + `' ELSE '` + DeadReasonFailed + `' END
    FROM upd JOIN txhook_events e ON e.id = upd.event_id
    WHERE upd.state = 'dead'
    ON CONFLICT (delivery_id) DO NOTHING
)
SELECT id, attempt, refused AND state = 'dead' FROM upd`

// pgRefusedTooLong is the condition, on delivery d of a completion c that
// records a refusal, that the refusal has lasted c.refused_us
// microseconds by the database's clock and that no relay started an
// attempt to the endpoint in that time: relays whose rules allow the URL
// would have, as they claim the same deliveries (see
// outbox.RelayConfig.RefusedLimit).
const pgRefusedTooLong = `d.refused_since <= now() - c.refused_us * interval '1 microsecond'
        AND NOT EXISTS (SELECT 1 FROM txhook_endpoints ep WHERE ep.id = d.endpoint_id
            AND GREATEST(ep.last_success_at, ep.last_failure_at) > now() - c.refused_us * interval '1 microsecond')`

const sqliteCompleteUpdate = `UPDATE txhook_deliveries
SET state = ?, attempts = ?, next_attempt_at = COALESCE(?, next_attempt_at), lease_owner = NULL,
    refused_since = CASE WHEN ? THEN NULL ELSE refused_since END,
    ok_started_at = COALESCE(?, ok_started_at),
    ok_duration_us = CASE WHEN ? IS NULL THEN ok_duration_us ELSE ? END,
    ok_excerpt = CASE WHEN ? IS NULL THEN ok_excerpt ELSE ? END,
    last_status = CASE WHEN ? THEN ? ELSE last_status END,
    last_error = CASE WHEN ? THEN ? ELSE last_error END,
    updated_at = ?
WHERE id = ? AND state = 'running' AND lease_owner = ? AND attempts = ?`

// sqliteCompleteRefused writes a refusal (Completion.Refused), as
// pgComplete does, and returns the state written: ?1 RefusedLimit in
// microseconds (0: none), ?2 attempts, ?3 next attempt, ?4 error, ?5 now,
// then the fencing ?6 id, ?7 owner, ?8 attempt.
const sqliteCompleteRefused = `UPDATE txhook_deliveries
SET state = CASE WHEN ?1 > 0 AND refused_since <= ` + sqliteNow + ` - ?1
        AND NOT EXISTS (SELECT 1 FROM txhook_endpoints ep WHERE ep.id = txhook_deliveries.endpoint_id
            AND max(COALESCE(ep.last_success_at, 0), COALESCE(ep.last_failure_at, 0)) > ` + sqliteNow + ` - ?1)
      THEN 'dead' ELSE 'pending' END,
    attempts = ?2, next_attempt_at = ?3, lease_owner = NULL, last_status = NULL, last_error = ?4, updated_at = ?5,
    refused_since = COALESCE(refused_since, ` + sqliteNow + `)
WHERE id = ?6 AND state = 'running' AND lease_owner = ?7 AND attempts = ?8
RETURNING state`

const sqliteInsertAttempt = `INSERT INTO txhook_attempts (delivery_id, endpoint_id, attempt, started_at, duration_us, status, response_excerpt, error)
SELECT id, endpoint_id, ?, ?, ?, ?, ?, ? FROM txhook_deliveries WHERE id = ?`

const sqliteInsertDeadLetter = `INSERT INTO txhook_dead_letters (delivery_id, event_id, endpoint_id, tenant, event_type, attempts, last_status, last_error, failed_at, reason)
SELECT d.id, d.event_id, d.endpoint_id, e.tenant, e.type, d.attempts, d.last_status, d.last_error, ?, ?
FROM txhook_deliveries d JOIN txhook_events e ON e.id = d.event_id
WHERE d.id = ?
ON CONFLICT (delivery_id) DO NOTHING`

// CompleteQueries are the statements Complete runs outside a transaction,
// for Prepare.
func (s *Store) CompleteQueries() []string {
	if s.Dialect == Postgres {
		return []string{s.relaySQL(pgComplete), s.relaySQL(pgCompleteFresh), s.relaySQL(pgCompleteFreshLean)}
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
	// The inline attempt (InlineAttempt), if any.
	OKStartedAt  *string `json:"ok_started_at,omitempty"`
	OKDurationUS int64   `json:"ok_duration_us,omitempty"`
	OKExcerpt    string  `json:"ok_excerpt,omitempty"`
	// RefusedUS is set for a refusal only (Completion.Refused).
	RefusedUS *int64 `json:"refused_us,omitempty"`
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

// Completed is what Complete did with a batch; indexes are positions in
// the batch.
type Completed struct {
	// Applied lists the deliveries written: the completion itself or, for
	// those in Substituted, its fallback. A delivery neither applied,
	// refused nor unwritten had lost its lease to another relay.
	Applied []int64
	// Written maps the position of each completion written to its
	// delivery's ID, which for a first attempt claimed with its event is
	// the ID of the row the write created.
	Written map[int]int64
	// Substituted holds the completions the database refused, with the
	// refusal, whose Fallback was written in their place (when the lease
	// still held).
	Substituted map[int]error
	// Refused holds the completions that could not be written even as
	// their fallback, with the refusal: their leases will expire and other
	// relays redo them.
	Refused map[int]error
	// Unwritten lists the completions left unwritten when Complete
	// returns an error; the caller may retry them after a pause.
	Unwritten []int
	// RefusedDead holds the refusals (Completion.Refused) written as dead
	// letters: refused for longer than their RefusedLimit.
	RefusedDead map[int]bool
}

// Complete writes a batch of completions for owner. Each is cleaned first
// (Completion.Clean), so nothing a receiver sent can make the database
// refuse it.
//
// One completion the database still refuses never holds back the others:
// a refused batch is split in halves written apart, down to the single
// completion, which is written once more as its Fallback, and reported in
// Refused if even that fails. Only refusals caused by the data are handled
// so (a data exception, a constraint, a size limit). Any other failure
// (the database down, a connection reset, a lock or a serialization
// conflict) says nothing about the rows: Complete stops, returns it, and
// lists in Unwritten what it did not write, without splitting further.
func (s *Store) Complete(ctx context.Context, owner string, now time.Time, cs []Completion) (Completed, error) {
	var res Completed
	if len(cs) == 0 {
		return res, nil
	}
	clean := make([]Completion, len(cs))
	idx := make([]int, len(cs))
	for i := range cs {
		clean[i], idx[i] = cs[i].Clean(), i
	}
	res.Written = map[int]int64{}
	// Delivery rows and first attempts claimed with their events are
	// written by statements of their own, each all or nothing.
	var rowIdx, freshIdx []int
	for _, i := range idx {
		if cs[i].ID == 0 && s.Dialect == Postgres {
			freshIdx = append(freshIdx, i)
		} else {
			rowIdx = append(rowIdx, i)
		}
	}
	var err error
	for k, part := range [][]int{rowIdx, freshIdx} {
		if len(part) == 0 {
			continue
		}
		if err = s.completeSplit(ctx, owner, now, clean, part, &res, s.completeBatch); err != nil {
			if k == 0 {
				res.Unwritten = append(res.Unwritten, freshIdx...)
			}
			break
		}
	}
	for _, id := range res.Written {
		res.Applied = append(res.Applied, id)
	}
	return res, err
}

// batchWriter writes a batch of completions all or nothing and returns the
// delivery ID each written completion's position wrote, and the positions
// of refusals written as dead letters.
type batchWriter func(ctx context.Context, owner string, now time.Time, cs []Completion) (map[int]int64, map[int]bool, error)

// completeSplit writes cs[idx...] as one batch with write, splitting it on
// a refusal.
func (s *Store) completeSplit(ctx context.Context, owner string, now time.Time, cs []Completion, idx []int, res *Completed, write batchWriter) error {
	batch := make([]Completion, len(idx))
	for k, i := range idx {
		batch[k] = cs[i]
	}
	written, refusedDead, err := write(ctx, owner, now, batch)
	switch {
	case err == nil:
		for k, id := range written {
			res.Written[idx[k]] = id
		}
		for k := range refusedDead {
			res.refusedDead(idx[k])
		}
		return nil
	case !Refusal(err):
		res.Unwritten = append(res.Unwritten, idx...)
		return err
	case len(idx) > 1:
		half := len(idx) / 2
		if err := s.completeSplit(ctx, owner, now, cs, idx[:half], res, write); err != nil {
			res.Unwritten = append(res.Unwritten, idx[half:]...)
			return err
		}
		return s.completeSplit(ctx, owner, now, cs, idx[half:], res, write)
	}
	i := idx[0]
	written, refusedDead, ferr := write(ctx, owner, now, []Completion{Fallback(cs[i], err)})
	switch {
	case ferr == nil:
		if id, ok := written[0]; ok {
			res.Written[i] = id
		}
		if refusedDead[0] {
			res.refusedDead(i)
		}
		if res.Substituted == nil {
			res.Substituted = map[int]error{}
		}
		res.Substituted[i] = err
		return nil
	case !Refusal(ferr):
		res.Unwritten = append(res.Unwritten, i)
		return ferr
	}
	if res.Refused == nil {
		res.Refused = map[int]error{}
	}
	res.Refused[i] = err
	// A first attempt left unwritten must not see its event marked
	// dispatched by a sibling written after it: the event stays leased,
	// and the relay that takes it over once the lease lapses writes what
	// is missing.
	if c := cs[i]; c.ID == 0 {
		for j := i + 1; j < len(cs); j++ {
			if cs[j].ID == 0 && cs[j].EventID == c.EventID && cs[j].Lease.Equal(c.Lease) {
				cs[j].Last = false
			}
		}
	}
	return nil
}

func (res *Completed) refusedDead(i int) {
	if res.RefusedDead == nil {
		res.RefusedDead = map[int]bool{}
	}
	res.RefusedDead[i] = true
}

// Fallback is c as it is written when the database refused c: the same
// decision (state, attempts, next attempt, statuses, the attempt log's
// rows) without any text a receiver chose. Error texts say why, naming
// only the class of the refusal; excerpts are dropped.
func Fallback(c Completion, refusal error) Completion {
	msg := "outcome could not be stored: " + ErrorClass(refusal)
	c.Status = CleanStatus(c.Status)
	if c.Error != "" {
		c.Error = msg
	}
	recs := make([]AttemptRecord, len(c.Records))
	for i, r := range c.Records {
		r.Status, r.Excerpt = CleanStatus(r.Status), ""
		if r.Error != "" {
			r.Error = msg
		}
		recs[i] = r
	}
	c.Records = recs
	return c
}

// completeBatch writes cs, all of one kind (delivery rows, or on
// PostgreSQL first attempts claimed with their events), all or nothing,
// and returns the delivery ID each written completion's position wrote,
// and the positions of the refusals it dead-lettered.
func (s *Store) completeBatch(ctx context.Context, owner string, now time.Time, cs []Completion) (map[int]int64, map[int]bool, error) {
	if s.Dialect == Postgres {
		if len(cs) > 0 && cs[0].ID == 0 {
			written, err := s.pgCompleteFresh(ctx, owner, now, cs)
			return written, nil, err
		}
		return s.pgCompleteBatch(ctx, owner, now, cs)
	}
	var written map[int]int64
	var refusedDead map[int]bool
	err := s.Tx(ctx, func(q Querier) error {
		written, refusedDead = map[int]int64{}, map[int]bool{}
		for k, c := range cs {
			if c.Refused {
				var state string
				err := q.QueryRowContext(ctx, sqliteCompleteRefused, max(c.RefusedLimit.Microseconds(), 0), c.Attempts,
					s.T(c.NextAt), c.Error, s.T(now), c.ID, owner, c.Attempt).Scan(&state)
				if err == sql.ErrNoRows {
					continue
				}
				if err != nil {
					return err
				}
				written[k] = c.ID
				// A lapsed lease's record, if any.
				if err := s.sqliteInsertRecords(ctx, q, c); err != nil {
					return err
				}
				if state == StateDead {
					refusedDead[k] = true
					if _, err := q.ExecContext(ctx, sqliteInsertDeadLetter, s.T(now), DeadReasonRefused, c.ID); err != nil {
						return err
					}
				}
				continue
			}
			var next any
			if !c.NextAt.IsZero() {
				next = s.T(c.NextAt)
			}
			var status any
			if c.Status != 0 {
				status = c.Status
			}
			var okAt, okUS, okExcerpt any
			inline, isInline := InlineAttempt(c)
			if isInline {
				okAt, okUS, okExcerpt = s.T(inline.StartedAt), inline.Duration.Microseconds(), inline.Excerpt
			}
			res, err := q.ExecContext(ctx, sqliteCompleteUpdate, c.State, c.Attempts, next, c.Attempts >= c.Attempt,
				okAt, okAt, okUS, okAt, okExcerpt,
				c.Record, status, c.Record, c.Error, s.T(now), c.ID, owner, c.Attempt)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n != 1 {
				continue
			}
			written[k] = c.ID
			if isInline {
				continue
			}
			if err := s.sqliteInsertRecords(ctx, q, c); err != nil {
				return err
			}
			if c.State == StateDead {
				if _, err := q.ExecContext(ctx, sqliteInsertDeadLetter, s.T(now), DeadReasonFailed, c.ID); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return written, refusedDead, nil
}

// sqliteInsertRecords writes c's attempt records to txhook_attempts.
func (s *Store) sqliteInsertRecords(ctx context.Context, q Querier, c Completion) error {
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
	return nil
}

func (s *Store) pgCompleteBatch(ctx context.Context, owner string, now time.Time, cs []Completion) (map[int]int64, map[int]bool, error) {
	rows := make([]pgCompletion, len(cs))
	var atts []pgAttempt
	for i, c := range cs {
		r := pgCompletion{ID: c.ID, Attempt: c.Attempt, State: c.State, Attempts: c.Attempts,
			Record: c.Record, Status: c.Status, Error: c.Error}
		if c.Refused {
			us := max(c.RefusedLimit.Microseconds(), 0)
			r.RefusedUS = &us
		}
		if !c.NextAt.IsZero() {
			t := jsonTS(c.NextAt)
			r.NextAt = &t
		}
		if a, ok := InlineAttempt(c); ok {
			t := jsonTS(a.StartedAt)
			r.OKStartedAt, r.OKDurationUS, r.OKExcerpt = &t, a.Duration.Microseconds(), a.Excerpt
			rows[i] = r
			continue
		}
		rows[i] = r
		for _, a := range c.Records {
			atts = append(atts, pgAttempt{DeliveryID: c.ID, Attempt: a.Attempt,
				StartedAt: jsonTS(a.StartedAt), DurationUS: a.Duration.Microseconds(),
				Status: a.Status, Excerpt: a.Excerpt, Error: a.Error})
		}
	}
	cj, err := json.Marshal(rows)
	if err != nil {
		return nil, nil, err
	}
	if atts == nil {
		atts = []pgAttempt{}
	}
	aj, err := json.Marshal(atts)
	if err != nil {
		return nil, nil, err
	}
	res, err := s.queryPrepared(ctx, s.relaySQL(pgComplete), string(cj), owner, s.T(now), string(aj))
	if err != nil {
		return nil, nil, err
	}
	defer res.Close()
	pos := make(map[[2]int64]int, len(cs))
	for k, c := range cs {
		pos[[2]int64{c.ID, int64(c.Attempt)}] = k
	}
	written := make(map[int]int64, len(cs))
	var refusedDead map[int]bool
	for res.Next() {
		var id int64
		var attempt int
		var dead bool
		if err := res.Scan(&id, &attempt, &dead); err != nil {
			return nil, nil, err
		}
		if k, ok := pos[[2]int64{id, int64(attempt)}]; ok {
			written[k] = id
			if dead {
				if refusedDead == nil {
					refusedDead = map[int]bool{}
				}
				refusedDead[k] = true
			}
		}
	}
	return written, refusedDead, res.Err()
}

// queryPrepared runs query (before Rebind) on the pool, through its
// prepared statement when Prepare made one.
func (s *Store) queryPrepared(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	query = s.Rebind(query)
	if st := s.stmtFor(ctx, s.DB, query); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return s.DB.QueryContext(ctx, query, args...)
}

// pgCompleteFresh writes a batch of first attempts claimed with their
// events (Completion.ID 0) in one statement: for each event still leased
// to owner with the completion's lease, the delivery rows with their
// outcomes, their attempt records (a first attempt that succeeded is kept
// in its row, see InlineAttempt) and dead letters; the events whose last
// delivery is in the batch are marked dispatched, which ends their lease.
// The other events are locked FOR SHARE while their rows go in, so that
// no relay can take a lapsed lease over between the check and the insert.
// Completions whose event is no longer leased so (another relay took it
// over) write nothing. The batch holds one lease per event
// (pgCompleteFresh drops the outcomes of an earlier lease of the same
// event, which can no longer be written).
//
// Each lease is checked by a hashed subplan of the batch's (event, lease)
// pairs ("IN (...) IS TRUE" keeps the planner from turning it into a
// join): joined into the UPDATE, the batch would be a relation of the
// UPDATE, and PostgreSQL copies every batch row it reads as a whole row
// for a possible recheck (EvalPlanQual); with a batch of n it read the
// batch n times, n² whole rows, about half the statement's CPU at n = 70.
//
// The batch travels as one array per column ($1 and $5 to $17, see
// freshArrays), times as microseconds since the epoch: PostgreSQL reads
// array literals of numbers and quoted text for a fraction of what
// json_to_recordset costs (about 1.5 µs a row against 7 µs, timestamps
// parsed from text most of it). $2 is the owner, $3 now, $4 the attempt
// rows that are not kept inline, as JSON (usually none).
//
// The statement carries only the parts its batch needs (freshSQL): the
// lock of events with outcomes still to come (held), the attempt rows
// (att) and the dead letters (dead). Each part costs every execution
// whether it finds rows or not (its target table and every index of it
// opened and locked), and the common batch, first attempts that
// succeeded, each the last of its event, needs none of them.
var (
	freshHead = `WITH c AS (
    SELECT x.event_id, x.endpoint_id, ` + pgMicros("x.lease_us") + ` AS lease, x.last,
           CASE x.state WHEN '` + freshRefused + `' THEN 'pending' ELSE x.state END AS state, x.state = '` + freshRefused + `' AS refused, x.attempts,
           ` + pgMicros("x.next_us") + ` AS next_at, x.record, x.status, x.error,
           ` + pgMicros("x.ok_us") + ` AS ok_started_at, x.ok_duration_us, x.ok_excerpt, ` + pgMicros("x.created_us") + ` AS created_at
    FROM unnest($1::text[], $5::text[], $6::bigint[], $7::boolean[], $8::text[], $9::int[], $10::bigint[], $11::boolean[],
                $12::int[], $13::text[], $14::bigint[], $15::bigint[], $16::text[], $17::bigint[])
        AS x(event_id, endpoint_id, lease_us, last, state, attempts, next_us, record, status, error,
             ok_us, ok_duration_us, ok_excerpt, created_us)
    WHERE {{async}}{{noatt}}
), marked AS (
    UPDATE txhook_events e SET dispatched_at = $3, lease_owner = NULL, lease_until = NULL
    WHERE e.id = ANY (ARRAY(SELECT event_id FROM c WHERE last))
      AND e.lease_owner = $2 AND e.dispatched_at IS NULL
      AND ((e.id, e.lease_until) IN (SELECT event_id, lease FROM c WHERE last)) IS TRUE
    RETURNING e.id
)`
	freshHeld = `, held AS (
    SELECT e.id FROM txhook_events e
    WHERE e.id = ANY (ARRAY(SELECT event_id FROM c EXCEPT SELECT event_id FROM c WHERE last))
      AND e.lease_owner = $2 AND e.dispatched_at IS NULL
      AND ((e.id, e.lease_until) IN (SELECT event_id, lease FROM c)) IS TRUE
    FOR SHARE OF e
)`
	freshIns = `, ins AS (
    INSERT INTO txhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at, last_status, last_error,
        ok_started_at, ok_duration_us, ok_excerpt, created_at, updated_at, refused_since)
    SELECT c.event_id, c.endpoint_id, c.state, c.attempts, COALESCE(c.next_at, $3),
           CASE WHEN c.record THEN c.status END, CASE WHEN c.record THEN COALESCE(c.error, '') ELSE '' END,
           c.ok_started_at, c.ok_duration_us, c.ok_excerpt, c.created_at, $3, CASE WHEN c.refused THEN now() END
    FROM c
    WHERE c.event_id IN ({{written}})
    RETURNING id, event_id, endpoint_id, state, attempts, last_status, last_error
)`
	freshAtt = `, att AS (
    INSERT INTO txhook_attempts (delivery_id, endpoint_id, attempt, started_at, duration_us, status, response_excerpt, error)
    SELECT ins.id, ins.endpoint_id, a.attempt, a.started_at, a.duration_us, a.status,
           COALESCE(a.excerpt, ''), COALESCE(a.error, '')
    FROM json_to_recordset($4::json) AS a(event_id text, endpoint_id text, attempt int, started_at timestamptz,
        duration_us bigint, status int, excerpt text, error text)
    JOIN ins ON ins.event_id = a.event_id AND ins.endpoint_id = a.endpoint_id
)`
	freshDead = `, dead AS (
    INSERT INTO txhook_dead_letters (delivery_id, event_id, endpoint_id, tenant, event_type, attempts, last_status, last_error, failed_at)
    SELECT ins.id, ins.event_id, ins.endpoint_id, e.tenant, e.type, ins.attempts, ins.last_status, ins.last_error, $3
    FROM ins JOIN txhook_events e ON e.id = ins.event_id
    WHERE ins.state = 'dead'
    ON CONFLICT (delivery_id) DO NOTHING
)`
	freshTail = `
SELECT id, event_id, endpoint_id FROM ins`
)

// freshRefused is the state a refusal (Completion.Refused) travels with
// in a batch of pgCompleteFresh: written 'pending', with refused_since
// set to the database's now, the start of its refusal. Its delivery has
// no row yet, so no refusal of it can be under way: it is never
// dead-lettered here.
const freshRefused = "refused"

// freshSQL returns pgCompleteFresh with the parts a batch needs: held when
// some completion is not its event's last, att when it has attempt rows,
// dead when some completion dead-letters. Without att, $4 is only cast
// (every parameter must appear for PostgreSQL to know its type).
func freshSQL(held, att, dead bool) string {
	var b strings.Builder
	head := freshHead
	if att {
		head = strings.Replace(head, "{{noatt}}", "", 1)
	} else {
		head = strings.Replace(head, "{{noatt}}", " AND $4::text IS NOT NULL", 1)
	}
	b.WriteString(head)
	written := "SELECT id FROM marked"
	if held {
		b.WriteString(freshHeld)
		written += " UNION ALL SELECT id FROM held"
	}
	b.WriteString(strings.Replace(freshIns, "{{written}}", written, 1))
	if att {
		b.WriteString(freshAtt)
	}
	if dead {
		b.WriteString(freshDead)
	}
	b.WriteString(freshTail)
	return b.String()
}

// freshVariants holds freshSQL's eight statements, built once: index
// held | att<<1 | dead<<2 (freshVariant).
var freshVariants = func() (v [8]string) {
	for i := range v {
		v[i] = freshSQL(i&1 != 0, i&2 != 0, i&4 != 0)
	}
	return v
}()

func freshVariant(held, att, dead bool) string {
	i := 0
	if held {
		i |= 1
	}
	if att {
		i |= 2
	}
	if dead {
		i |= 4
	}
	return freshVariants[i]
}

// pgCompleteFresh is the statement with every part, and pgCompleteFreshLean
// the one for the common batch.
var (
	pgCompleteFresh     = freshVariant(true, true, true)
	pgCompleteFreshLean = freshVariant(false, false, false)
)

// pgMicros is the timestamptz of col, a bigint of microseconds since the
// epoch (or NULL), exactly.
func pgMicros(col string) string {
	return `(timestamptz 'epoch' + interval '1 microsecond' * ` + col + `)`
}

// freshArrays are the columns of a batch for pgCompleteFresh, each a
// PostgreSQL array literal built one element at a time.
type freshArrays struct {
	eventID, endpointID, lease, last, state, attempts, next, record, status, errText, okAt, okUS, okExcerpt, created arrayLiteral
}

func (a *freshArrays) args() []any {
	return []any{a.eventID.String(), a.endpointID.String(), a.lease.String(), a.last.String(), a.state.String(),
		a.attempts.String(), a.next.String(), a.record.String(), a.status.String(), a.errText.String(), a.okAt.String(),
		a.okUS.String(), a.okExcerpt.String(), a.created.String()}
}

// arrayLiteral builds the text of a one-dimensional PostgreSQL array: text
// elements double-quoted with backslash escapes, so any text (already
// valid UTF-8 without NUL, see Completion.Clean) reads back as it was.
type arrayLiteral struct{ b []byte }

func (a *arrayLiteral) next() {
	if len(a.b) == 0 {
		a.b = append(a.b, '{')
	} else {
		a.b = append(a.b, ',')
	}
}

func (a *arrayLiteral) text(s string) {
	a.next()
	a.b = append(a.b, '"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			a.b = append(a.b, '\\')
		}
		a.b = append(a.b, s[i])
	}
	a.b = append(a.b, '"')
}

// textOrNull adds s, or NULL when s is empty.
func (a *arrayLiteral) textOrNull(s string) {
	if s == "" {
		a.null()
		return
	}
	a.text(s)
}

func (a *arrayLiteral) null() {
	a.next()
	a.b = append(a.b, "NULL"...)
}

func (a *arrayLiteral) int(v int64) {
	a.next()
	a.b = strconv.AppendInt(a.b, v, 10)
}

func (a *arrayLiteral) bool(v bool) {
	a.next()
	if v {
		a.b = append(a.b, 't')
	} else {
		a.b = append(a.b, 'f')
	}
}

// micros adds t as microseconds since the epoch, or NULL for the zero time.
func (a *arrayLiteral) micros(t time.Time) {
	if t.IsZero() {
		a.null()
		return
	}
	a.int(t.UnixMicro())
}

func (a *arrayLiteral) String() string {
	if len(a.b) == 0 {
		return "{}"
	}
	return string(a.b) + "}"
}

type pgFreshAttempt struct {
	EventID    string `json:"event_id"`
	EndpointID string `json:"endpoint_id"`
	pgAttempt
}

func (s *Store) pgCompleteFresh(ctx context.Context, owner string, now time.Time, cs []Completion) (map[int]int64, error) {
	// A relay that took over its own lapsed lease may have outcomes of
	// both leases of an event in one batch. Leases of an event only grow
	// (it is leased again only once the lease before expired), so only
	// the latest can still hold: the others are left out, as the
	// database would refuse them.
	latest := make(map[string]time.Time, len(cs))
	for _, c := range cs {
		if l, ok := latest[c.EventID]; !ok || c.Lease.After(l) {
			latest[c.EventID] = c.Lease
		}
	}
	var a freshArrays
	var atts []pgFreshAttempt
	var held, dead bool
	pos := make(map[[2]string]int, len(cs))
	for k, c := range cs {
		if !c.Lease.Equal(latest[c.EventID]) {
			continue
		}
		pos[[2]string{c.EventID, c.EndpointID}] = k
		held = held || !c.Last
		dead = dead || c.State == StateDead
		a.eventID.text(c.EventID)
		a.endpointID.text(c.EndpointID)
		a.lease.micros(c.Lease)
		a.last.bool(c.Last)
		if c.Refused {
			a.state.text(freshRefused)
		} else {
			a.state.text(c.State)
		}
		a.attempts.int(int64(c.Attempts))
		a.next.micros(c.NextAt)
		a.record.bool(c.Record)
		if c.Status != 0 {
			a.status.int(int64(c.Status))
		} else {
			a.status.null()
		}
		a.errText.textOrNull(c.Error)
		created := c.CreatedAt
		if r, ok := InlineAttempt(c); ok {
			a.okAt.micros(r.StartedAt)
			a.okUS.int(r.Duration.Microseconds())
			a.okExcerpt.textOrNull(r.Excerpt)
			// Created when it was attempted: the attempt log by start
			// time reads it through created_at (InlineSlack).
			created = r.StartedAt
		} else {
			a.okAt.null()
			a.okUS.null()
			a.okExcerpt.null()
			for _, r := range c.Records {
				atts = append(atts, pgFreshAttempt{EventID: c.EventID, EndpointID: c.EndpointID, pgAttempt: pgAttempt{
					Attempt: r.Attempt, StartedAt: jsonTS(r.StartedAt),
					DurationUS: r.Duration.Microseconds(), Status: r.Status, Excerpt: r.Excerpt, Error: r.Error}})
			}
		}
		a.created.micros(created)
	}
	if atts == nil {
		atts = []pgFreshAttempt{}
	}
	aj, err := json.Marshal(atts)
	if err != nil {
		return nil, err
	}
	arrays := a.args()
	args := append([]any{arrays[0], owner, s.T(now), string(aj)}, arrays[1:]...)
	res, err := s.queryPrepared(ctx, s.relaySQL(freshVariant(held, len(atts) > 0, dead)), args...)
	if err != nil {
		return nil, err
	}
	defer res.Close()
	written := make(map[int]int64, len(cs))
	for res.Next() {
		var id int64
		var ev, ep string
		if err := res.Scan(&id, &ev, &ep); err != nil {
			return nil, err
		}
		if k, ok := pos[[2]string{ev, ep}]; ok {
			written[k] = id
		}
	}
	return written, res.Err()
}

func scanIDs(rows Rows) ([]int64, error) {
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

// Refusal reports whether err is the database refusing the data it was
// given (PostgreSQL classes 21, 22, 23 and 54: cardinality, data
// exception, integrity constraint, program limit; SQLite's constraint,
// too-big and mismatch errors), as opposed to failing for reasons of its
// own, which retrying the same rows later may cure.
func Refusal(err error) bool {
	if code := sqlState(err); code != "" {
		switch code[:2] {
		case "21", "22", "23", "54":
			return true
		}
		return false
	}
	if code, _, ok := sqlitelock.Code(err); ok {
		switch code & 0xff {
		case 18, 19, 20: // SQLITE_TOOBIG, SQLITE_CONSTRAINT, SQLITE_MISMATCH
			return true
		}
	}
	return false
}

// ErrorClass names the class of a database error without its message,
// which may quote the data: "SQLSTATE 22P05", "SQLite error 19/275".
func ErrorClass(err error) string {
	if code := sqlState(err); code != "" {
		return "SQLSTATE " + code
	}
	if code, ext, ok := sqlitelock.Code(err); ok {
		return "SQLite error " + strconv.Itoa(code) + "/" + strconv.Itoa(ext)
	}
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "context ended"
	}
	return "unclassified error"
}

// sqlState returns the SQLSTATE of a PostgreSQL error from lib/pq or pgx,
// "" for any other error.
func sqlState(err error) string {
	var e interface{ SQLState() string }
	if errors.As(err, &e) {
		if code := e.SQLState(); len(code) == 5 {
			return code
		}
	}
	return ""
}
