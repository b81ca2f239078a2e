package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"time"
)

// Recovery: queue again, to one endpoint, the events it subscribes to that
// it never received: skipped while it was disabled (dispatch creates no
// delivery for a disabled endpoint) or dead-lettered.

// RecoverEvent is an event Recover may queue again.
type RecoverEvent struct {
	ID          string
	OrderingKey string // "" for none
	CreatedAt   time.Time
}

// recoverClockSlack bounds how much earlier than its creation time an
// event's dispatch time (or its deliveries' creation time) can read
// (relays' and enqueuers' clocks differ), so that the scan can start
// before since.
const recoverClockSlack = time.Hour

// RecoverSlack is how long before since a recovery starts looking for the
// events dispatched at or after since.
const RecoverSlack = recoverClockSlack

// unreceived is the condition that event e has no delivery to endpoint ep
// that succeeded or is unfinished.
const unreceived = `NOT EXISTS (SELECT 1 FROM txhook_deliveries d
    WHERE d.event_id = e.id AND d.endpoint_id = ep.id
      AND d.state IN ('succeeded', 'pending', 'running', 'paused', 'blocked'))`

// RecoverCandidates returns, in (created_at, id) order, up to limit events
// that endpoint endpointID would be sent by Recover among those
// dispatched in [from, to): events of its tenant created at or after
// since, that a relay has dispatched, of a type it subscribes to, with no
// delivery to it that succeeded or is unfinished. Undispatched events are
// left to the relays. more reports that the window held more than limit,
// and the caller should ask again for a shorter one.
//
// There is no index of events by time: an event's dispatch is found
// through its tenant's deliveries by creation time (every endpoint's,
// txhook_deliveries_endpoint_log) and, for an event with no delivery at
// all, through the tenant's unrouted events (txhook_events_unrouted_tenant,
// migration 010). Both start with the tenant or its endpoints, so what
// other tenants store is never read. An event with deliveries created at
// different times comes up in more than one window; Recover checks again
// before it queues anything. The deliveries of one ordering key are
// created in the key's order, so windows taken in time order keep it.
func (s *Store) RecoverCandidates(ctx context.Context, endpointID string, since, from, to time.Time, limit int) (out []RecoverEvent, more bool, err error) {
	_, q := s.RecoverStatements(endpointID, since, from, to, limit+1)
	rows, err := s.DB.QueryContext(ctx, q.SQL, q.Args...)
	if err != nil {
		return nil, false, err
	}
	defer rows.Close()
	for rows.Next() {
		var e RecoverEvent
		var key sql.NullString
		var t Time
		if err := rows.Scan(&e.ID, &key, &t); err != nil {
			return nil, false, err
		}
		e.OrderingKey, e.CreatedAt = key.String, t.Time
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, false, err
	}
	if len(out) > limit {
		return out[:limit], true, nil
	}
	return out, false, nil
}

// RecoverNext returns the earliest time at or after from at which an event
// of endpoint endpointID's tenant was dispatched, as RecoverCandidates
// sees dispatch times; ok is false when there is none. Each part is one
// probe of an index (per endpoint of the tenant, and the tenant's unrouted
// events), so a recovery skips over quiet stretches at once.
func (s *Store) RecoverNext(ctx context.Context, endpointID string, from time.Time) (at time.Time, ok bool, err error) {
	var t Time
	q, _ := s.RecoverStatements(endpointID, time.Time{}, from, time.Time{}, 0)
	err = s.DB.QueryRowContext(ctx, q.SQL, q.Args...).Scan(&t)
	if err != nil {
		return time.Time{}, false, err
	}
	return t.Time, !t.Time.IsZero(), nil
}

// Statement is a statement with its arguments.
type Statement struct {
	SQL  string
	Args []any
}

// RecoverStatements returns the statements of RecoverNext (from) and
// RecoverCandidates (all of them; limit rows), with their arguments: what
// they run, for EXPLAIN (examples/bench).
func (s *Store) RecoverStatements(endpointID string, since, from, to time.Time, limit int) (next, candidates Statement) {
	next = Statement{s.Rebind(`SELECT min(t) FROM (
    SELECT (SELECT min(d.created_at) FROM txhook_deliveries d WHERE d.endpoint_id = o.id AND d.created_at >= ?) AS t
    FROM txhook_endpoints o WHERE o.tenant = (SELECT x.tenant FROM txhook_endpoints x WHERE x.id = ?)
    UNION ALL
    SELECT min(u.dispatched_at) FROM txhook_events u
    WHERE u.unrouted AND u.tenant = (SELECT x.tenant FROM txhook_endpoints x WHERE x.id = ?) AND u.dispatched_at >= ?
) n`), []any{s.T(from), endpointID, endpointID, s.T(from)}}
	// The events are looked up by ID, one probe each: joined to the set of
	// IDs, PostgreSQL may read the whole table instead (it did, for 100
	// candidates among 20,000 events).
	in, end := `e.id IN (`, `)`
	if s.Dialect == Postgres {
		in, end = `e.id = ANY (ARRAY(`, `))`
	}
	candidates = Statement{s.Rebind(`SELECT e.id, e.ordering_key, e.created_at
FROM txhook_events e JOIN txhook_endpoints ep ON ep.id = ? AND ep.tenant = e.tenant
WHERE ` + in + `
    SELECT d.event_id FROM txhook_deliveries d
    WHERE d.endpoint_id IN (SELECT o.id FROM txhook_endpoints o
                            WHERE o.tenant = (SELECT x.tenant FROM txhook_endpoints x WHERE x.id = ?))
      AND d.created_at >= ? AND d.created_at < ?
    UNION
    SELECT u.id FROM txhook_events u
    WHERE u.unrouted AND u.tenant = (SELECT x.tenant FROM txhook_endpoints x WHERE x.id = ?)
      AND u.dispatched_at >= ? AND u.dispatched_at < ?` + end + `
  AND e.dispatched_at IS NOT NULL AND e.created_at >= ?
  AND ` + s.subscribed("e.type") + `
  AND ` + unreceived + `
ORDER BY e.created_at, e.id
LIMIT ?`), []any{endpointID, endpointID, s.T(from), s.T(to), endpointID, s.T(from), s.T(to), s.T(since), limit}}
	return next, candidates
}

// Recover queues a fresh delivery of each of events (in created order, as
// RecoverCandidates returns them) to endpoint endpointID, due at now (a
// delayed event's not before its deliver_at), in
// one transaction. It checks again, under the endpoint's row lock, that the
// event has no succeeded or unfinished delivery to the endpoint, and
// removes the event's dead letters for the endpoint (a dead letter being
// replayed meanwhile is left to the replay). Deliveries to a disabled
// endpoint are created 'paused'. Keyed events keep their order: the first
// of a key goes only if no delivery of that key to the endpoint is
// unfinished, the others wait 'blocked' behind it. It returns how many
// deliveries it queued; ErrNotFound when the endpoint does not exist.
func (s *Store) Recover(ctx context.Context, endpointID string, events []RecoverEvent, now time.Time) (int, error) {
	if len(events) == 0 {
		return 0, nil
	}
	queued := 0
	err := s.Tx(ctx, func(q Querier) error {
		queued = 0
		lock := ""
		if s.Dialect == Postgres {
			// Recoveries of one endpoint queue one at a time; enabling or
			// disabling it waits, so the state chosen below holds.
			lock = " FOR NO KEY UPDATE"
		}
		var tenant string
		var enabled bool
		err := q.QueryRowContext(ctx, s.Rebind(`SELECT tenant, enabled FROM txhook_endpoints WHERE id = ?`+lock), endpointID).Scan(&tenant, &enabled)
		if err == sql.ErrNoRows {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		var keys []string
		ids := make([]string, len(events))
		for i, e := range events {
			ids[i] = e.ID
		}
		for _, e := range events {
			if e.OrderingKey != "" {
				keys = append(keys, lockName(tenant, e.OrderingKey))
			}
		}
		// The same locks as keyed dispatch and unblocking, so the lines
		// checked below stay as they are until this commits.
		if err := s.lockKeys(ctx, q, keys); err != nil {
			return err
		}
		// Dead letters being replayed are locked by the replay; once it
		// commits they are gone and its delivery is visible below. Locked
		// in delivery ID order, as replays lock them.
		deadLock := ""
		if s.Dialect == Postgres {
			deadLock = " FOR UPDATE"
		}
		rows, err := q.QueryContext(ctx, s.Rebind(`SELECT delivery_id FROM txhook_dead_letters
WHERE endpoint_id = ? AND `+s.textIn("event_id")+` ORDER BY delivery_id`+deadLock), endpointID, jsonStrings(ids))
		if err != nil {
			return err
		}
		if _, err := scanIDs(rows); err != nil {
			return err
		}
		rows, err = q.QueryContext(ctx, s.Rebind(`SELECT e.id FROM txhook_events e JOIN txhook_endpoints ep ON ep.id = ?
WHERE `+s.textIn("e.id")+` AND `+unreceived), endpointID, jsonStrings(ids))
		if err != nil {
			return err
		}
		ok := map[string]bool{}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			ok[id] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		type newDelivery struct {
			EventID string  `json:"event_id"`
			State   string  `json:"state"`
			Key     *string `json:"key"`
		}
		var ins []newDelivery
		var sent []string
		busy := map[string]bool{} // keys whose line to the endpoint is taken
		first := StatePending
		if !enabled {
			first = StatePaused
		}
		for _, e := range events {
			if !ok[e.ID] {
				continue
			}
			ok[e.ID] = false // once, should the list repeat an event
			d := newDelivery{EventID: e.ID, State: first}
			if e.OrderingKey != "" {
				k := e.OrderingKey
				d.Key = &k
				taken, seen := busy[k]
				if !seen {
					if err := q.QueryRowContext(ctx, s.Rebind(`SELECT EXISTS (SELECT 1 FROM txhook_deliveries
WHERE endpoint_id = ? AND ordering_key = ? AND state IN ('pending', 'running', 'paused', 'blocked'))`), endpointID, k).Scan(&taken); err != nil {
						return err
					}
				}
				if taken {
					d.State = StateBlocked
				}
				busy[k] = true
			}
			ins = append(ins, d)
			sent = append(sent, e.ID)
		}
		if len(ins) == 0 {
			return nil
		}
		if _, err := q.ExecContext(ctx, s.Rebind(`DELETE FROM txhook_dead_letters WHERE endpoint_id = ? AND `+s.textIn("event_id")),
			endpointID, jsonStrings(sent)); err != nil {
			return err
		}
		b, err := json.Marshal(ins)
		if err != nil {
			return err
		}
		// One statement, rows in the list's order, so delivery IDs follow
		// the events' order: blocked deliveries are released lowest ID first.
		var res sql.Result
		if s.Dialect == Postgres {
			res, err = q.ExecContext(ctx, s.Rebind(`INSERT INTO txhook_deliveries (event_id, endpoint_id, state, ordering_key, next_attempt_at, created_at, updated_at)
SELECT x.event_id, $1, x.state, x.key, `+s.notBefore("$2", "x.event_id")+`, $2, $2
FROM ROWS FROM (jsonb_to_recordset($3::jsonb) AS (event_id text, state text, key text)) WITH ORDINALITY AS x(event_id, state, key, n)
ORDER BY x.n`), endpointID, s.T(now), string(b))
		} else {
			res, err = q.ExecContext(ctx, `INSERT INTO txhook_deliveries (event_id, endpoint_id, state, ordering_key, next_attempt_at, created_at, updated_at)
SELECT json_extract(value, '$.event_id'), ?1, json_extract(value, '$.state'), json_extract(value, '$.key'),
       `+s.notBefore("?2", "json_extract(value, '$.event_id')")+`, ?2, ?2
FROM json_each(?3)
ORDER BY CAST(key AS INTEGER)`, endpointID, s.T(now), string(b))
		}
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		queued = int(n)
		return err
	})
	return queued, err
}
