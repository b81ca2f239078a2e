package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"strconv"
	"time"
)

// textIn renders "col IN (…)" over a JSON array of strings.
func (s *Store) textIn(col string) string {
	if s.Dialect == Postgres {
		return col + ` IN (SELECT jsonb_array_elements_text(?::jsonb))`
	}
	return col + ` IN (SELECT value FROM json_each(?))`
}

func jsonStrings(v []string) string {
	if v == nil {
		v = []string{}
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// PruneCursor is where a walk of PruneFinished stands: the last delivery
// ID it looked at, and Done once it reached deliveries created after the
// cut (or the end of the table). The zero value starts at the first
// delivery.
type PruneCursor struct {
	After int64
	Done  bool
}

// pruneWindow is how many deliveries, in multiples of the batch size, one
// PruneFinished call looks at.
const pruneWindow = 4

// finishedBefore is the condition that delivery d may be pruned at cut
// ?: succeeded, or dead with its dead letter gone (purged or replayed),
// and finished before the cut.
const finishedBefore = `d.state IN ('succeeded', 'dead') AND d.updated_at < ?
  AND (d.state = 'succeeded' OR NOT EXISTS (SELECT 1 FROM txhook_dead_letters dl WHERE dl.delivery_id = d.id))`

// PruneFinished deletes, among the next limit×4 deliveries in ID order
// after cur, the finished ones last updated before `before`, with their
// attempts: succeeded ones, and dead ones whose dead letter is gone
// (purged or replayed). It returns how many deliveries and attempts it
// deleted and moves cur on; a walk from the zero cursor until cur.Done
// looks at every delivery created before `before` once.
//
// Deliveries are walked by ID, not through an index of finish times: IDs
// follow creation, a delivery finishes after it is created, and an index
// of finish times would cost every delivery an entry (about 80 bytes of
// WAL and its CPU, on the path every event takes). What the walk reads and
// keeps (unfinished deliveries, dead letters kept) it reads once per walk.
func (s *Store) PruneFinished(ctx context.Context, before time.Time, limit int, cur *PruneCursor) (deliveries, attempts, events int, err error) {
	if cur.Done {
		return 0, 0, 0, nil
	}
	window := max(limit, 1) * pruneWindow
	rows, err := s.DB.QueryContext(ctx, s.Rebind(`SELECT d.id, d.created_at < ?, `+finishedBefore+`
FROM txhook_deliveries d WHERE d.id > ? ORDER BY d.id LIMIT ?`), s.T(before), s.T(before), cur.After, window)
	if err != nil {
		return 0, 0, 0, err
	}
	var ids []int64
	seen, last, lastOld := 0, cur.After, false
	for rows.Next() {
		var id int64
		var old, done bool
		if err := rows.Scan(&id, &old, &done); err != nil {
			rows.Close()
			return 0, 0, 0, err
		}
		seen, last, lastOld = seen+1, id, old
		if done {
			ids = append(ids, id)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, 0, 0, err
	}
	// IDs follow creation but for the relays' clocks and the time an
	// outcome takes to be written: past the first window that ends on a
	// delivery created after the cut, the rest is newer. What sits on
	// either side of that line is pruned by a later walk.
	cur.After, cur.Done = last, seen < window || !lastOld
	for len(ids) > 0 {
		n := min(len(ids), limit)
		d, a, e, err := s.pruneDeliveries(ctx, before, ids[:n])
		deliveries, attempts, events = deliveries+d, attempts+a, events+e
		if err != nil {
			return deliveries, attempts, events, err
		}
		ids = ids[n:]
	}
	return deliveries, attempts, events, nil
}

// pruneDeliveries deletes those of ids that may still be pruned at
// before, with their attempts, and the events left with no delivery and no
// dead letter, in one transaction.
func (s *Store) pruneDeliveries(ctx context.Context, before time.Time, candidates []int64) (deliveries, attempts, events int, err error) {
	err = s.Tx(ctx, func(q Querier) error {
		deliveries, attempts, events = 0, 0, 0
		lock := ""
		if s.Dialect == Postgres {
			lock = " FOR UPDATE SKIP LOCKED"
		}
		rows, err := q.QueryContext(ctx, s.Rebind(`SELECT d.id, d.event_id FROM txhook_deliveries d
WHERE `+s.idsIn("d.id")+` AND `+finishedBefore+` ORDER BY d.id`+lock), jsonIDs(candidates), s.T(before))
		if err != nil {
			return err
		}
		var ids []int64
		var evs []string
		for rows.Next() {
			var id int64
			var ev string
			if err := rows.Scan(&id, &ev); err != nil {
				rows.Close()
				return err
			}
			ids, evs = append(ids, id), append(evs, ev)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(ids) == 0 {
			return err
		}
		res, err := q.ExecContext(ctx, s.Rebind(`DELETE FROM txhook_attempts WHERE `+s.idsIn("delivery_id")), jsonIDs(ids))
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		attempts = int(n)
		// First attempts that succeeded are in their deliveries' rows
		// (migration 008) and go with them.
		var inline int
		if err := q.QueryRowContext(ctx, s.Rebind(`SELECT count(*) FROM txhook_deliveries WHERE `+s.idsIn("id")+` AND ok_started_at IS NOT NULL`),
			jsonIDs(ids)).Scan(&inline); err != nil {
			return err
		}
		attempts += inline
		res, err = q.ExecContext(ctx, s.Rebind(`DELETE FROM txhook_deliveries WHERE `+s.idsIn("id")), jsonIDs(ids))
		if err != nil {
			return err
		}
		n, _ = res.RowsAffected()
		deliveries = int(n)
		// An event goes with the last of its deliveries. Its dispatch is
		// no later than that delivery's last update, so it is past the
		// cut too; the condition says so anyway.
		res, err = q.ExecContext(ctx, s.Rebind(`DELETE FROM txhook_events
WHERE `+s.textIn("id")+` AND dispatched_at IS NOT NULL AND dispatched_at < ?
  AND NOT EXISTS (SELECT 1 FROM txhook_deliveries d WHERE d.event_id = txhook_events.id)
  AND NOT EXISTS (SELECT 1 FROM txhook_dead_letters dl WHERE dl.event_id = txhook_events.id)`), jsonStrings(evs), s.T(before))
		if err != nil {
			return err
		}
		n, _ = res.RowsAffected()
		events = int(n)
		return nil
	})
	if err != nil {
		return 0, 0, 0, err
	}
	return deliveries, attempts, events, nil
}

// PruneDeadLetters deletes up to limit dead letters that failed before
// `before`; PruneFinished then removes their deliveries.
func (s *Store) PruneDeadLetters(ctx context.Context, before time.Time, limit int) (int, error) {
	return s.PurgeDead(ctx, DeadFilter{Until: before}, limit)
}

// EventsWalk is where a walk of PruneEvents over the tenants stands.
type EventsWalk struct {
	// Tenant is the first tenant the next call looks at; "" before the
	// walk starts.
	Tenant string
	// Done is set once the walk has passed the last tenant.
	Done bool
}

// PruneEvents deletes up to limit unrouted events (dispatched with no
// delivery, or left without one when their endpoint was deleted) dispatched
// before `before` that no delivery or dead letter refers to, tenant by
// tenant from walk.Tenant on, and moves walk on: call it until walk.Done.
// An event with deliveries goes with the last of them (PruneFinished): the
// index of unrouted events is all retention needs, where an index of every
// event's dispatch time cost each delivery an entry. That index is by
// tenant, then time (txhook_events_unrouted_tenant, which Recover reads):
// the walk takes the tenants in order, one probe of the index each to
// find the next, and one range of it per tenant for its old events, so a
// walk reads what it deletes and a few entries per tenant.
func (s *Store) PruneEvents(ctx context.Context, before time.Time, limit int, walk *EventsWalk) (int, error) {
	old := `SELECT e.id FROM t JOIN txhook_events e ON e.unrouted AND e.tenant = t.tenant AND e.dispatched_at < ?
    WHERE ` + prunableEvent + `
    LIMIT ?`
	if s.Dialect == Postgres {
		// LATERAL: one range of the index per tenant, in the walk's order,
		// whatever the planner estimates of the walk.
		old = `SELECT x.id FROM t CROSS JOIN LATERAL (
        SELECT e.id FROM txhook_events e
        WHERE e.unrouted AND e.tenant = t.tenant AND e.dispatched_at < ? AND ` + prunableEvent + `
        ORDER BY e.dispatched_at LIMIT ?) x
    LIMIT ?`
	}
	args := []any{walk.Tenant, s.T(before), limit}
	if s.Dialect == Postgres {
		args = append(args, limit)
	}
	walkSQL := `WITH RECURSIVE t(tenant) AS (
    SELECT (SELECT tenant FROM txhook_events WHERE unrouted AND tenant >= ? ORDER BY tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT e.tenant FROM txhook_events e WHERE e.unrouted AND e.tenant > t.tenant ORDER BY e.tenant LIMIT 1)
    FROM t WHERE t.tenant IS NOT NULL
), old AS (
    ` + old + `
)`
	n, last := 0, ""
	if s.Dialect == Postgres {
		// The last tenant by the database's collation, which orders the walk.
		err := s.DB.QueryRowContext(ctx, s.Rebind(walkSQL+`, del AS (
    DELETE FROM txhook_events WHERE id IN (SELECT id FROM old) RETURNING tenant
)
SELECT count(*), COALESCE(max(tenant), '') FROM del`), args...).Scan(&n, &last)
		if err != nil {
			return 0, err
		}
	} else {
		// SQLite compares text by its bytes, as Go does.
		rows, err := s.DB.QueryContext(ctx, walkSQL+`
DELETE FROM txhook_events WHERE id IN (SELECT id FROM old)
RETURNING tenant`, args...)
		if err != nil {
			return 0, err
		}
		defer rows.Close()
		for rows.Next() {
			var tenant string
			if err := rows.Scan(&tenant); err != nil {
				return n, err
			}
			n++
			last = max(last, tenant)
		}
		if err := rows.Err(); err != nil {
			return n, err
		}
	}
	if n < limit {
		walk.Done = true
	} else {
		// The last tenant may have more: it is where the next call starts.
		walk.Tenant = last
	}
	return n, nil
}

// prunableEvent is the condition that event e has no delivery and no dead
// letter.
const prunableEvent = `NOT EXISTS (SELECT 1 FROM txhook_deliveries d WHERE d.event_id = e.id)
      AND NOT EXISTS (SELECT 1 FROM txhook_dead_letters dl WHERE dl.event_id = e.id)`

// Endpoint health: every completion batch records, per endpoint, the start
// of its latest successful and latest failed attempt (last_success_at,
// last_failure_at). Both only move forward, so batches from any number of
// relays can land in any order. failing_since is derived from them and the
// attempt log: NULL when the last success is at least as late as the last
// failure, otherwise the start of the first failed attempt after the last
// success.
//
// Every statement that changes several endpoint rows locks them in ID
// order before it changes any, so relays never deadlock on them, and reads
// the values it replaces under that lock, so the statement that ends a run
// of failures is the one, across all relays, that sees it end.

// AttemptTimes are one endpoint's latest successful and latest failed
// attempt in a batch of completions; a zero time means none.
type AttemptTimes struct {
	EndpointID       string
	Success, Failure time.Time
}

// HealthState is an endpoint's recorded health as a statement left it.
type HealthState struct {
	ID      string
	Tenant  string
	Enabled bool
	// WasFailingSince is failing_since before the statement, read under
	// the row lock.
	WasFailingSince time.Time
	FailingSince    time.Time
	LastSuccessAt   time.Time
	LastFailureAt   time.Time
}

// Recovered reports whether the statement ended a run of failures.
func (h HealthState) Recovered() bool { return !h.WasFailingSince.IsZero() && h.FailingSince.IsZero() }

// pgFailingSince recomputes failing_since from the row l of new values
// (id, ok, failed, was). Besides the first failed attempt after the last
// success that this statement's snapshot shows, the previous failing_since
// counts when it is later than the last success: it was computed by a
// statement that may have seen attempts committed after this one's snapshot
// was taken (PostgreSQL takes it before the row locks are granted). Every
// candidate is a failed attempt after the last success, so the least one is
// never earlier than the truth; the relays' sweep makes it exact.
func pgFailingSince(l string) string {
	return `CASE WHEN ` + l + `.failed IS NULL OR ` + l + `.ok >= ` + l + `.failed THEN NULL
    ELSE LEAST(
        CASE WHEN ` + l + `.ok IS NULL OR ` + l + `.was > ` + l + `.ok THEN ` + l + `.was END,
        (SELECT min(a.started_at) FROM txhook_attempts a
         WHERE a.endpoint_id = ` + l + `.id AND a.error <> '' AND a.started_at > COALESCE(` + l + `.ok, '-infinity')),
        ` + l + `.failed)
    END`
}

// pgHealthUpdate applies the locked rows' new values (CTE "locked", with
// id, was, ok and failed) and returns the health of the rows it changed.
// Rows it would not change are not written.
var pgHealthUpdate = `, nv AS MATERIALIZED (
    SELECT l.id, l.was, l.ok, l.failed, ` + pgFailingSince("l") + ` AS fs
    FROM locked l
)
UPDATE txhook_endpoints ep
SET last_success_at = nv.ok, last_failure_at = nv.failed, failing_since = nv.fs
FROM nv
WHERE ep.id = nv.id
  AND (ep.last_success_at, ep.last_failure_at, ep.failing_since) IS DISTINCT FROM (nv.ok, nv.failed, nv.fs)
RETURNING ep.id, ep.tenant, ep.enabled, nv.was, ep.failing_since, ep.last_success_at, ep.last_failure_at`

// pgRecordHealth records a batch's attempt times ($1, a JSON array of
// {id, ok, failed}). MATERIALIZED, ORDER BY and FOR NO KEY UPDATE: the rows
// are sorted before they are locked, all of them before any is changed.
var pgRecordHealth = `WITH b AS (
    SELECT * FROM json_to_recordset($1::json) AS x(id text, ok timestamptz, failed timestamptz)
    WHERE {{async}}
), locked AS MATERIALIZED (
    SELECT ep.id, ep.failing_since AS was,
           GREATEST(ep.last_success_at, b.ok) AS ok, GREATEST(ep.last_failure_at, b.failed) AS failed
    FROM txhook_endpoints ep JOIN b ON b.id = ep.id
    ORDER BY ep.id
    FOR NO KEY UPDATE OF ep
)` + pgHealthUpdate

// pgRepairHealth recomputes the health of endpoints $1 (a JSON array of
// IDs) from the attempt log: the latest failed attempt through the partial
// index of failures; the latest success: the latest first attempt kept in
// a delivery's row (those are all successes) among at most $2 of the
// endpoint's deliveries created since the recorded one (an index-only walk
// of txhook_deliveries_endpoint_log), and the latest success among at most
// $2 of the attempt rows since the recorded one (NULL: all of them).
var pgRepairHealth = `WITH locked AS MATERIALIZED (
    SELECT ep.id, ep.failing_since AS was,
           GREATEST(ep.last_success_at, (
               SELECT max(x.ok_started_at) FROM (
                   SELECT d.ok_started_at FROM txhook_deliveries d
                   WHERE d.endpoint_id = ep.id
                     AND d.created_at > COALESCE(ep.last_success_at, '-infinity') - interval '1 second'
                   ORDER BY d.created_at DESC, d.id DESC LIMIT $2) x), (
               SELECT max(x.started_at) FROM (
                   SELECT a.started_at, a.error FROM txhook_attempts a
                   WHERE a.endpoint_id = ep.id AND a.started_at > COALESCE(ep.last_success_at, '-infinity')
                   ORDER BY a.started_at DESC LIMIT $2) x
               WHERE x.error = '')) AS ok,
           GREATEST(ep.last_failure_at, (
               SELECT max(a.started_at) FROM txhook_attempts a
               WHERE a.endpoint_id = ep.id AND a.error <> '')) AS failed
    FROM txhook_endpoints ep
    WHERE ep.id IN (SELECT jsonb_array_elements_text($1::jsonb))
    ORDER BY ep.id
    FOR NO KEY UPDATE OF ep
)` + pgHealthUpdate

// greatest is GREATEST(a, b) ignoring NULLs, as PostgreSQL's is; SQLite's
// max(a, b) is NULL when either is.
func (s *Store) greatest(a, b string) string {
	if s.Dialect == Postgres {
		return `GREATEST(` + a + `, ` + b + `)`
	}
	return `CASE WHEN ` + a + ` IS NULL OR (` + b + ` IS NOT NULL AND ` + b + ` > ` + a + `) THEN ` + b + ` ELSE ` + a + ` END`
}

// sqliteFailingSince recomputes failing_since from the row's (already
// updated) last_success_at and last_failure_at. SQLite has one writer at a
// time, so the attempt log is complete as of the statement; the previous
// failing_since still counts when it is later than the last success, as on
// PostgreSQL, for runs whose attempts were pruned.
const sqliteFailingSince = `CASE WHEN last_failure_at IS NULL OR last_success_at >= last_failure_at THEN NULL
    ELSE min(
        coalesce((SELECT min(a.started_at) FROM txhook_attempts a
                  WHERE a.endpoint_id = txhook_endpoints.id AND a.error <> ''
                    AND (txhook_endpoints.last_success_at IS NULL OR a.started_at > txhook_endpoints.last_success_at)),
                 last_failure_at),
        coalesce(CASE WHEN last_success_at IS NULL OR failing_since > last_success_at THEN failing_since END, last_failure_at),
        last_failure_at)
    END`

type healthJSON struct {
	ID     string  `json:"id"`
	OK     *string `json:"ok"`
	Failed *string `json:"failed"`
}

// RecordAttemptTimes records a batch's latest attempt times on their
// endpoints, recomputes failing_since, and returns the health of the
// endpoints whose record changed. It is one statement on PostgreSQL.
func (s *Store) RecordAttemptTimes(ctx context.Context, times []AttemptTimes) ([]HealthState, error) {
	if len(times) == 0 {
		return nil, nil
	}
	if s.Dialect == Postgres {
		in := make([]healthJSON, len(times))
		for i, t := range times {
			in[i] = healthJSON{ID: t.EndpointID, OK: pgTime(t.Success), Failed: pgTime(t.Failure)}
		}
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		rows, err := s.DB.QueryContext(ctx, s.Rebind(s.relaySQL(pgRecordHealth)), string(b))
		if err != nil {
			return nil, err
		}
		return scanHealth(rows)
	}
	type row struct {
		ID     string `json:"id"`
		OK     *int64 `json:"ok"`
		Failed *int64 `json:"failed"`
	}
	in := make([]row, len(times))
	ids := make([]string, len(times))
	for i, t := range times {
		in[i] = row{ID: t.EndpointID, OK: microsOrNil(t.Success), Failed: microsOrNil(t.Failure)}
		ids[i] = t.EndpointID
	}
	b, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	var out []HealthState
	err = s.Tx(ctx, func(q Querier) error {
		before, err := s.sqliteHealthBefore(ctx, q, ids)
		if err != nil {
			return err
		}
		if _, err := q.ExecContext(ctx, `UPDATE txhook_endpoints
SET last_success_at = `+s.greatest("last_success_at", "b.ok")+`,
    last_failure_at = `+s.greatest("last_failure_at", "b.failed")+`
FROM (SELECT json_extract(value, '$.id') AS id, json_extract(value, '$.ok') AS ok, json_extract(value, '$.failed') AS failed
      FROM json_each(?)) b
WHERE txhook_endpoints.id = b.id`, string(b)); err != nil {
			return err
		}
		out, err = s.sqliteFinishHealth(ctx, q, ids, before)
		return err
	})
	return out, err
}

// RepairHealth recomputes the health of the endpoints ids from the attempt
// log, for attempts whose batch was never recorded (a relay that died
// between writing a batch and recording it) and for what concurrent
// batches left approximate. The latest success is looked for among at most
// scan of the attempts since the recorded one; scan ≤ 0 looks at all of
// them. It returns the health of the endpoints whose record changed.
func (s *Store) RepairHealth(ctx context.Context, ids []string, scan int) ([]HealthState, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	if s.Dialect == Postgres {
		return s.repairHealth(ctx, s.DB, ids, scan)
	}
	var out []HealthState
	err := s.Tx(ctx, func(q Querier) error {
		var err error
		out, err = s.repairHealth(ctx, q, ids, scan)
		return err
	})
	return out, err
}

// repairHealth is RepairHealth on q; on SQLite q must be a transaction.
func (s *Store) repairHealth(ctx context.Context, q Querier, ids []string, scan int) ([]HealthState, error) {
	if s.Dialect == Postgres {
		var limit any
		if scan > 0 {
			limit = scan
		}
		rows, err := q.QueryContext(ctx, s.Rebind(pgRepairHealth), jsonStrings(ids), limit)
		if err != nil {
			return nil, err
		}
		return scanHealth(rows)
	}
	if scan <= 0 {
		scan = -1 // no limit
	}
	before, err := s.sqliteHealthBefore(ctx, q, ids)
	if err != nil {
		return nil, err
	}
	if _, err := q.ExecContext(ctx, `UPDATE txhook_endpoints
SET last_success_at = `+s.greatest(s.greatest("last_success_at", `(
        SELECT max(x.ok_started_at) FROM (
            SELECT d.ok_started_at FROM txhook_deliveries d
            WHERE d.endpoint_id = txhook_endpoints.id
              AND (txhook_endpoints.last_success_at IS NULL OR d.created_at > txhook_endpoints.last_success_at - `+strconv.FormatInt(InlineSlack.Microseconds(), 10)+`)
            ORDER BY d.created_at DESC, d.id DESC LIMIT ?2) x)`), `(
        SELECT max(x.started_at) FROM (
            SELECT a.started_at, a.error FROM txhook_attempts a
            WHERE a.endpoint_id = txhook_endpoints.id
              AND (txhook_endpoints.last_success_at IS NULL OR a.started_at > txhook_endpoints.last_success_at)
            ORDER BY a.started_at DESC LIMIT ?2) x
        WHERE x.error = '')`)+`,
    last_failure_at = `+s.greatest("last_failure_at", `(
        SELECT max(a.started_at) FROM txhook_attempts a
        WHERE a.endpoint_id = txhook_endpoints.id AND a.error <> '')`)+`
WHERE id IN (SELECT value FROM json_each(?1))`, jsonStrings(ids), scan); err != nil {
		return nil, err
	}
	return s.sqliteFinishHealth(ctx, q, ids, before)
}

// sqliteHealthBefore reads the health of endpoints before a statement
// changes it (SQLite, inside the transaction that changes them).
func (s *Store) sqliteHealthBefore(ctx context.Context, q Querier, ids []string) (map[string]HealthState, error) {
	hs, err := s.healthOf(ctx, q, ids)
	if err != nil {
		return nil, err
	}
	out := make(map[string]HealthState, len(hs))
	for _, h := range hs {
		out[h.ID] = h
	}
	return out, nil
}

// healthOf reads the recorded health of endpoints, ordered by ID.
func (s *Store) healthOf(ctx context.Context, q Querier, ids []string) ([]HealthState, error) {
	rows, err := q.QueryContext(ctx, s.Rebind(`SELECT id, tenant, enabled, NULL, failing_since, last_success_at, last_failure_at
FROM txhook_endpoints WHERE `+s.textIn("id")+` ORDER BY id`), jsonStrings(ids))
	if err != nil {
		return nil, err
	}
	return scanHealth(rows)
}

// sqliteFinishHealth recomputes failing_since of the endpoints ids after
// their last success and failure times were updated, and returns the
// health of those whose record changed since before.
func (s *Store) sqliteFinishHealth(ctx context.Context, q Querier, ids []string, before map[string]HealthState) ([]HealthState, error) {
	if _, err := q.ExecContext(ctx, `UPDATE txhook_endpoints SET failing_since = `+sqliteFailingSince+`
WHERE id IN (SELECT value FROM json_each(?))`, jsonStrings(ids)); err != nil {
		return nil, err
	}
	after, err := s.healthOf(ctx, q, ids)
	if err != nil {
		return nil, err
	}
	out := after[:0]
	for _, h := range after {
		b := before[h.ID]
		if h.FailingSince.Equal(b.FailingSince) && h.LastSuccessAt.Equal(b.LastSuccessAt) && h.LastFailureAt.Equal(b.LastFailureAt) {
			continue
		}
		h.WasFailingSince = b.FailingSince
		out = append(out, h)
	}
	return out, nil
}

func scanHealth(rows *sql.Rows) ([]HealthState, error) {
	defer rows.Close()
	var out []HealthState
	for rows.Next() {
		var h HealthState
		var w, f, ok, failed Time
		if err := rows.Scan(&h.ID, &h.Tenant, &h.Enabled, &w, &f, &ok, &failed); err != nil {
			return nil, err
		}
		h.WasFailingSince, h.FailingSince, h.LastSuccessAt, h.LastFailureAt = w.Time, f.Time, ok.Time, failed.Time
		out = append(out, h)
	}
	return out, rows.Err()
}

func pgTime(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := jsonTS(t)
	return &s
}

func microsOrNil(t time.Time) *int64 {
	if t.IsZero() {
		return nil
	}
	v := t.UnixMicro()
	return &v
}

// DisableFailing disables endpoint id if its attempts have all failed for at
// least `after`, as its attempt log shows: under the row lock it first
// repairs the endpoint's health from the whole log (the rare, exact path;
// a success that landed meanwhile ends the run), then disables it and parks
// its waiting deliveries, in one transaction. reason renders the disabled
// reason from the start of the run. It returns the endpoint's health and
// whether this call disabled it; only one caller ever does.
func (s *Store) DisableFailing(ctx context.Context, id string, after time.Duration, now time.Time, reason func(since time.Time) string) (HealthState, bool, error) {
	var h HealthState
	var disabled bool
	err := s.Tx(ctx, func(q Querier) error {
		h, disabled = HealthState{}, false
		if s.Dialect == Postgres {
			// Locked first, so that the statements after this one see every
			// attempt committed before it was granted.
			if _, err := q.ExecContext(ctx, s.Rebind(`SELECT 1 FROM txhook_endpoints WHERE id = $1 FOR NO KEY UPDATE`), id); err != nil {
				return err
			}
		}
		hs, err := s.repairHealth(ctx, q, []string{id}, 0)
		if err != nil {
			return err
		}
		cur, err := s.healthOf(ctx, q, []string{id})
		if err != nil || len(cur) == 0 {
			return err
		}
		h = cur[0]
		if len(hs) > 0 {
			h.WasFailingSince = hs[0].WasFailingSince // the repair's change
		}
		if !h.Enabled || h.FailingSince.IsZero() || h.LastFailureAt.Sub(h.FailingSince) < after {
			return nil
		}
		res, err := q.ExecContext(ctx, s.Rebind(`UPDATE txhook_endpoints SET enabled = FALSE, disabled_reason = ?, updated_at = ?
WHERE id = ? AND enabled`), reason(h.FailingSince), s.T(now), id)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return nil
		}
		disabled = true
		h.Enabled = false
		return s.pauseWaiting(ctx, q, id, now)
	})
	return h, disabled, err
}

// DisableGone disables endpoint id after it answered 410 Gone to an attempt
// started at goneAt, unless it has been disabled already or an attempt
// started after that one succeeded; it parks the endpoint's waiting
// deliveries in the same transaction. It returns the endpoint's tenant and
// whether this call disabled it; only one caller ever does.
func (s *Store) DisableGone(ctx context.Context, id string, goneAt, now time.Time, reason string) (string, bool, error) {
	var tenant string
	var disabled bool
	err := s.Tx(ctx, func(q Querier) error {
		disabled = false
		err := q.QueryRowContext(ctx, s.Rebind(`UPDATE txhook_endpoints SET enabled = FALSE, disabled_reason = ?, updated_at = ?
WHERE id = ? AND enabled AND (last_success_at IS NULL OR last_success_at < ?)
  AND NOT EXISTS (SELECT 1 FROM txhook_attempts a
                  WHERE a.endpoint_id = txhook_endpoints.id AND a.error = '' AND a.started_at > ?)
  AND NOT EXISTS (SELECT 1 FROM txhook_deliveries d
                  WHERE d.endpoint_id = txhook_endpoints.id AND d.created_at > ? AND d.ok_started_at > ?)
RETURNING tenant`), reason, s.T(now), id, s.T(goneAt), s.T(goneAt), s.T(goneAt.Add(-InlineSlack)), s.T(goneAt)).Scan(&tenant)
		if err == sql.ErrNoRows {
			return nil
		}
		if err != nil {
			return err
		}
		disabled = true
		return s.pauseWaiting(ctx, q, id, now)
	})
	return tenant, disabled, err
}

// pauseWaiting parks an endpoint's waiting deliveries ('paused'), so they
// spend no attempts while it is disabled.
func (s *Store) pauseWaiting(ctx context.Context, q Querier, id string, now time.Time) error {
	_, err := q.ExecContext(ctx, s.Rebind(`UPDATE txhook_deliveries SET state = 'paused', updated_at = ?
WHERE endpoint_id = ? AND state = 'pending'`), s.T(now), id)
	return err
}

// EndpointIDs returns up to limit endpoint IDs after `after`, in ID order:
// all endpoints, or with failing only those in a run of failures.
func (s *Store) EndpointIDs(ctx context.Context, failing bool, after string, limit int) ([]string, error) {
	where := ""
	if failing {
		where = "failing_since IS NOT NULL AND "
	}
	rows, err := s.DB.QueryContext(ctx, s.Rebind(`SELECT id FROM txhook_endpoints WHERE `+where+`id > ? ORDER BY id LIMIT ?`), after, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}
