package store

import (
	"context"
	"database/sql"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Claimed is a delivery taken under a lease, with what is needed to send it.
//
// On PostgreSQL a new event's first attempts are claimed with the event
// (Dispatch): the lease is on the event's row, no delivery row exists yet
// (ID is 0), and the completion writes the delivery once, with its
// outcome (see Completion). Every other claim is of a delivery row.
type Claimed struct {
	ID          int64 // the delivery; 0 for a first attempt claimed with its event
	Attempt     int   // the number of the attempt about to be made
	LeaseLapsed bool  // a previous holder's lease expired without an outcome written
	// Lease is, for a first attempt claimed with its event (ID 0), the
	// event's lease expiry as the database set it: the fencing token the
	// completion presents. Zero for a delivery row.
	Lease time.Time
	// CreatedAt is the delivery row's created_at; zero for a first attempt
	// claimed with its event.
	CreatedAt   time.Time
	EventID     string
	Tenant      string
	Type        string
	Version     int // schema version of Payload
	Payload     []byte
	EventTime   time.Time
	EndpointID  string
	OrderingKey string
	// TraceParent and TraceState are the W3C trace context Enqueue stored
	// with the event when tracing was on; "" otherwise.
	TraceParent string
	TraceState  string
	// Endpoint columns; EndpointFound is false when the endpoint row is gone.
	EndpointFound bool
	URL           string
	Secrets       []byte // JSON
	Enabled       bool
	RateLimit     float64
	RateBurst     int
	MaxInFlight   int
	Versions      []byte // JSON object: pinned schema version by type
	Headers       []byte // JSON object: custom request headers
	ClientCert    string // PEM chain; "" for none
	ClientKey     string // PEM private key of ClientCert, or its encrypted envelope (outbox/secrets.go)
}

// Completion starts the completion of c: its delivery and attempt, and
// for a first attempt claimed with its event (ID 0) the pair, the lease
// and claimedAt, when the claim ran, as the delivery's created_at. last
// says whether c is the last of its event's claimed first attempts to be
// written, whose write marks the event dispatched (see Completion).
func (c Claimed) Completion(claimedAt time.Time, last bool) Completion {
	out := Completion{ID: c.ID, Attempt: c.Attempt, CreatedAt: c.CreatedAt}
	if c.ID == 0 {
		out.EventID, out.EndpointID, out.Lease, out.CreatedAt, out.Last = c.EventID, c.EndpointID, c.Lease, claimedAt, last
	}
	return out
}

// The columns every claim returns, in scanClaimed's order, after the
// delivery's id, attempt and previous state. On PostgreSQL a claim carries
// an endpoint's columns only on its first row of the batch (the column
// "first"; the endpoint's secrets, versions and headers are JSON the
// database renders as text for every row that carries them), and the
// scan copies them to the endpoint's other rows.
const (
	claimEventCols    = `e.tenant, e.type, e.version, e.payload, e.created_at, e.trace_parent, e.trace_state`
	claimEndpointCols = `ep.url, ep.secrets, ep.enabled, ep.rate_limit, ep.rate_burst, ep.max_in_flight, ep.versions, ep.headers, ep.client_cert, ep.client_key`
)

// Leases are timed by the database's clock, not the relay's: a claimed row
// is 'running' with next_attempt_at = the database's now + the lease, and a
// running row is due again only when the database's now has passed it. A
// relay whose clock runs ahead therefore cannot take over deliveries that
// another relay still has in flight, and one that runs behind cannot hold
// a dead relay's deliveries back. Pending rows (retries, released and
// postponed work) stay due by the relay's $now, which scheduled them.
//
// The claim walks the partial index txhook_deliveries_due up to the later
// of the two clocks and filters each row by its own clock: the only rows
// read and skipped are those due by one clock and not yet by the other,
// which with clocks in step is next to none.
//
// A claim also skips the deliveries of endpoints whose shared gate
// (migration 012, gate.go) is blocked at the relay's now: circuit open,
// no rate token, no in-flight room. Claimed, they could only be handed
// back, a write each that every tenant pays for; they wait in place
// instead, and are claimed once the gate opens again.

// pgLeaseUntil is the expiry of a lease of $4 microseconds taken now;
// pgLeaseUntil3 the same for $3.
const (
	pgLeaseUntil  = `now() + $4::bigint * interval '1 microsecond'`
	pgLeaseUntil3 = `now() + $3::bigint * interval '1 microsecond'`
)

// pgClaim takes up to {{limit}} due deliveries. SKIP LOCKED lets any
// number of relays claim at once without waiting on or taking each other's
// rows; the claimed rows become 'running' with next_attempt_at set to the
// lease expiry, so the same query rescues them if their holder dies.
//
// The limit is written into the statement (see withLimit) and every
// other lookup goes through a primary key, by = ANY (ARRAY(...)) or one
// probe per row (LATERAL ... LIMIT 1, which the planner cannot turn into a
// join over the whole table): the plan
// then does not depend on the parameters or on the tables' statistics, so
// PostgreSQL keeps one generic plan for the prepared statement instead of
// planning it anew at every claim (about half a millisecond each), and the
// queue tables' churn cannot turn the joins into scans of whole tables.
const pgClaim = `WITH due AS (
    SELECT id, state FROM txhook_deliveries
    WHERE state IN ('pending', 'running') AND next_attempt_at <= GREATEST($1, now())
      AND CASE state WHEN 'running' THEN next_attempt_at <= now() ELSE next_attempt_at <= $1 END
      AND NOT EXISTS (SELECT 1 FROM txhook_endpoint_gates g WHERE g.endpoint_id = txhook_deliveries.endpoint_id AND g.blocked_until > $1)
      AND {{async}}
    ORDER BY next_attempt_at
    LIMIT {{limit}}
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE txhook_deliveries d
    SET state = 'running', attempts = d.attempts + 1, lease_owner = $2, next_attempt_at = ` + pgLeaseUntil3 + `, updated_at = $1
    FROM due WHERE d.id = due.id AND d.id = ANY (ARRAY(SELECT id FROM due))
    RETURNING d.id, d.attempts, due.state AS prev_state, d.event_id, d.endpoint_id, d.ordering_key, d.created_at AS row_created
)
SELECT c.id, c.attempts, c.prev_state, c.event_id, ` + claimEventCols + `,
       c.endpoint_id, c.ordering_key, ` + claimEndpointCols + `, NULL::timestamptz, c.row_created, c.first
FROM (SELECT claimed.*, row_number() OVER (PARTITION BY endpoint_id ORDER BY id) = 1 AS first FROM claimed) c
CROSS JOIN LATERAL (SELECT * FROM txhook_events e WHERE e.id = c.event_id LIMIT 1) e
LEFT JOIN txhook_endpoints ep ON ep.id = c.endpoint_id AND c.first
ORDER BY c.id`

// sqliteNow is SQLite's clock in the unit SQLite times are stored in,
// integer microseconds since the epoch. julianday('now') (millisecond
// resolution, within 40 µs after the conversion) works on every SQLite
// txhook supports; unixepoch('subsec') would need 3.42.
const sqliteNow = `CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)`

// SQLite has one writer at a time, so the claim is a read and an update in
// one IMMEDIATE transaction: nobody can take the rows in between. SQLite's
// own clock times the leases, as PostgreSQL's does there: relays in one
// process may each have been given a different Config.Clock.
const sqliteClaimSelect = `SELECT d.id, d.attempts + 1, d.state, d.event_id, ` + claimEventCols + `,
       d.endpoint_id, d.ordering_key, ` + claimEndpointCols + `, NULL, d.created_at
FROM txhook_deliveries d
JOIN txhook_events e ON e.id = d.event_id
LEFT JOIN txhook_endpoints ep ON ep.id = d.endpoint_id
WHERE d.state IN ('pending', 'running') AND d.next_attempt_at <= max(?1, ` + sqliteNow + `)
  AND CASE d.state WHEN 'running' THEN d.next_attempt_at <= ` + sqliteNow + ` ELSE d.next_attempt_at <= ?1 END
  AND NOT EXISTS (SELECT 1 FROM txhook_endpoint_gates g WHERE g.endpoint_id = d.endpoint_id AND g.blocked_until > ?1)
ORDER BY d.next_attempt_at
LIMIT ?2`

const sqliteClaimUpdate = `UPDATE txhook_deliveries
SET state = 'running', attempts = attempts + 1, lease_owner = ?, next_attempt_at = ` + sqliteNow + ` + ?, updated_at = ?
WHERE id IN (SELECT value FROM json_each(?))`

// subscribed is the condition that endpoint ep takes events of type typ:
// no types listed, the exact type, or a "prefix.*" (or "*") wildcard.
func (s *Store) subscribed(typ string) string {
	if s.Dialect == Postgres {
		return `(jsonb_array_length(ep.event_types) = 0 OR EXISTS (
        SELECT 1 FROM jsonb_array_elements_text(ep.event_types) p
        WHERE p = ` + typ + ` OR (right(p, 1) = '*' AND starts_with(` + typ + `, rtrim(p, '*')))))`
	}
	return `(json_array_length(ep.event_types) = 0 OR EXISTS (
        SELECT 1 FROM json_each(ep.event_types) p
        WHERE p.value = ` + typ + ` OR (substr(p.value, -1) = '*'
            AND substr(` + typ + `, 1, length(p.value) - 1) = substr(p.value, 1, length(p.value) - 1))))`
}

// pgDispatch takes up to {{limit}} undispatched events without an ordering
// key and claims their first attempts, one per enabled endpoint of the
// tenant that subscribes to the type, in one statement: a new event costs
// the relay one round trip before its first request.
//
// The lease is on the event's row (lease_owner, lease_until): no delivery
// row is written until the attempt's outcome is known, and then once, with
// the outcome (pgCompleteFresh), which also marks the event dispatched with
// the last of its deliveries. The endpoints are looked up once per tenant
// and type in the batch. Taking the lease changes no indexed column,
// so it is a HOT update (no index entry, a few dozen bytes of WAL), and
// a first attempt that succeeds writes one delivery row instead of
// inserting it running and updating it, each time in every index.
//
// An event whose lease expired (its holder died or stalled before writing
// every outcome) is taken again like a new one; the endpoints that already
// have its delivery row are left out, and the attempts of the others count
// the lapsed one (attempt 2, LeaseLapsed). An event with nothing left to
// deliver (no endpoint subscribes, or every delivery was written) is marked
// dispatched and yields nothing; when it has no delivery at all it is
// marked unrouted, which is how retention finds it (an event with
// deliveries goes with the last of them, see PruneFinished). A delayed
// event (deliver_at later than $1)
// is marked dispatched at once with its deliveries pending, due at
// deliver_at, and is not returned.
//
// $1 now, $2 owner, $3 lease in microseconds.
var pgDispatch = `WITH ev AS (
    SELECT id, tenant, type, lease_until IS NOT NULL AS lapsed, COALESCE(deliver_at > $1, false) AS later
    FROM txhook_events
    WHERE dispatched_at IS NULL AND ordering_key IS NULL AND (lease_until IS NULL OR lease_until <= now())
      AND {{async}}
    ORDER BY created_at
    LIMIT {{limit}}
    FOR UPDATE SKIP LOCKED
), tt AS MATERIALIZED (
    SELECT t.tenant, t.type, ARRAY(
        SELECT ep.id FROM txhook_endpoints ep
        WHERE ep.tenant = t.tenant AND ep.enabled AND ` + (&Store{Dialect: Postgres}).subscribed("t.type") + `
        ORDER BY ep.id) AS eps
    FROM (SELECT DISTINCT tenant, type FROM ev) t
), xs AS MATERIALIZED (
    SELECT ev.id, ev.later, ev.lapsed, CASE WHEN NOT ev.lapsed THEN tt.eps ELSE ARRAY(
        SELECT u.ep FROM unnest(tt.eps) AS u(ep)
        WHERE NOT EXISTS (SELECT 1 FROM txhook_deliveries d WHERE d.event_id = ev.id AND d.endpoint_id = u.ep)
        ORDER BY u.ep) END AS eps
    FROM ev JOIN tt ON tt.tenant = ev.tenant AND tt.type = ev.type
), x AS MATERIALIZED (
    SELECT xs.*, xs.later OR cardinality(xs.eps) = 0 AS done,
           cardinality(xs.eps) = 0 AND (NOT xs.lapsed OR NOT EXISTS (
               SELECT 1 FROM txhook_deliveries d WHERE d.event_id = xs.id)) AS unrouted
    FROM xs
), xa AS (
    SELECT ARRAY(SELECT id FROM x WHERE done) AS done, ARRAY(SELECT id FROM x WHERE unrouted) AS unrouted
), e AS (
    UPDATE txhook_events e
    SET lease_owner = CASE WHEN e.id = ANY ((SELECT done FROM xa)::text[]) THEN NULL ELSE $2 END,
        lease_until = CASE WHEN e.id = ANY ((SELECT done FROM xa)::text[]) THEN NULL ELSE ` + pgLeaseUntil3 + ` END,
        dispatched_at = CASE WHEN e.id = ANY ((SELECT done FROM xa)::text[]) THEN $1::timestamptz END,
        unrouted = CASE WHEN e.id = ANY ((SELECT unrouted FROM xa)::text[]) THEN true END
    WHERE e.id = ANY (ARRAY(SELECT id FROM ev))
    RETURNING e.id, ` + claimEventCols + `, e.deliver_at, e.lease_until
), ex AS (
    SELECT e.*, x.later, x.lapsed, x.eps FROM e JOIN x ON x.id = e.id
), ins AS (
    INSERT INTO txhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at, created_at, updated_at)
    SELECT e.id, u.ep, 'pending', 0, e.deliver_at, $1, $1
    FROM ex e CROSS JOIN LATERAL unnest(e.eps) AS u(ep)
    WHERE e.later
)
SELECT 0, CASE WHEN e.lapsed THEN 2 ELSE 1 END, CASE WHEN e.lapsed THEN 'running' ELSE 'pending' END, e.id, ` + claimEventCols + `,
       e.ep, NULL, ` + claimEndpointCols + `, e.lease_until, NULL::timestamptz, e.first
FROM (
    SELECT e.*, u.ep, row_number() OVER (PARTITION BY u.ep ORDER BY e.created_at, e.id) = 1 AS first
    FROM ex e CROSS JOIN LATERAL unnest(e.eps) AS u(ep)
    WHERE NOT e.later) e
LEFT JOIN txhook_endpoints ep ON ep.id = e.ep AND e.first
ORDER BY e.created_at, e.id, e.ep`

const sqliteDispatchSelect = `SELECT id, tenant, type, version, payload, created_at, trace_parent, trace_state, deliver_at FROM txhook_events
WHERE dispatched_at IS NULL AND ordering_key IS NULL
ORDER BY created_at
LIMIT ?`

const sqliteDispatchMark = `UPDATE txhook_events SET dispatched_at = ? WHERE id IN (SELECT value FROM json_each(?))`

var sqliteDispatchMatch = `SELECT e.id, ep.id, ` + claimEndpointCols + `
FROM txhook_events e JOIN txhook_endpoints ep ON ep.tenant = e.tenant AND ep.enabled
WHERE e.id IN (SELECT value FROM json_each(?1)) AND ` + (&Store{Dialect: SQLite}).subscribed("e.type") + `
ORDER BY e.created_at, ep.id`

const sqliteDispatchInsert = `INSERT INTO txhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at, lease_owner, created_at, updated_at)
VALUES (?, ?, 'running', 1, ` + sqliteNow + ` + ?, ?, ?, ?) RETURNING id`

// sqliteDispatchLater creates a delayed event's delivery, pending until the
// event's deliver_at.
const sqliteDispatchLater = `INSERT INTO txhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at, created_at, updated_at)
VALUES (?, ?, 'pending', 0, ?, ?, ?)`

// ClaimQueries are the statements Claim and Dispatch run for batches of
// limit, for Prepare. Other limits are prepared on first use.
func (s *Store) ClaimQueries(limit int) []string {
	if s.Dialect == Postgres {
		return []string{s.claimSQL(pgClaim, limit), s.claimSQL(pgDispatch, limit)}
	}
	return nil
}

// withLimit writes limit into query's {{limit}}. PostgreSQL plans a
// LIMIT given as a parameter for a tenth of the table, which makes the
// generic plan of a prepared statement look costly enough that every
// execution is planned again; a literal is planned for what it says.
func withLimit(query string, limit int) string {
	return strings.Replace(query, "{{limit}}", strconv.Itoa(max(limit, 1)), 1)
}

// claimSQL is the claim statement q for batches of limit (withLimit), its
// commit as relaySQL says.
func (s *Store) claimSQL(q string, limit int) string {
	return s.relaySQL(withLimit(q, limit))
}

// maxPrepared bounds the statements prepared on first use (see
// queryClaimed), so that callers passing many different limits do not
// prepare a statement per limit on every connection.
const maxPrepared = 64

// Dispatch fans out up to limit undispatched events without an ordering
// key, oldest first: it marks them dispatched and creates their
// deliveries, claimed by owner for their first attempt and leased for
// lease by the database's clock. Events no endpoint subscribes to are
// marked and yield nothing. A delayed event (deliver_at after now) gets its
// deliveries pending, due at deliver_at, and they are not returned.
func (s *Store) Dispatch(ctx context.Context, owner string, now time.Time, lease time.Duration, limit int) ([]Claimed, error) {
	if s.Dialect == Postgres {
		return s.queryClaimed(ctx, s.claimSQL(pgDispatch, limit), limit, s.T(now), owner, lease.Microseconds())
	}
	var out []Claimed
	err := s.Tx(ctx, func(q Querier) error {
		out = out[:0]
		events, ids, err := s.undispatched(ctx, q, sqliteDispatchSelect, limit)
		if err != nil || len(ids) == 0 {
			return err
		}
		idJSON := jsonStrings(ids)
		if _, err := q.ExecContext(ctx, sqliteDispatchMark, s.T(now), idJSON); err != nil {
			return err
		}
		rows, err := q.QueryContext(ctx, sqliteDispatchMatch, idJSON)
		if err != nil {
			return err
		}
		for rows.Next() {
			var c Claimed
			if err := rows.Scan(append([]any{&c.EventID, &c.EndpointID}, endpointDest(&c)...)...); err != nil {
				rows.Close()
				return err
			}
			events[c.EventID].fill(&c)
			c.Attempt, c.EndpointFound, c.CreatedAt = 1, true, now
			out = append(out, c)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if err := s.markUnrouted(ctx, q, ids, out); err != nil {
			return err
		}
		claimed := out[:0]
		for _, c := range out {
			if at := events[c.EventID].deliverAt; at.After(now) {
				if _, err := q.ExecContext(ctx, sqliteDispatchLater, c.EventID, c.EndpointID, s.T(at), s.T(now), s.T(now)); err != nil {
					return err
				}
				continue
			}
			if err := q.QueryRowContext(ctx, sqliteDispatchInsert, c.EventID, c.EndpointID,
				lease.Microseconds(), owner, s.T(now), s.T(now)).Scan(&c.ID); err != nil {
				return err
			}
			claimed = append(claimed, c)
		}
		out = claimed
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// markUnrouted marks unrouted those of the events ids (just marked
// dispatched) that got no delivery in cs.
func (s *Store) markUnrouted(ctx context.Context, q Querier, ids []string, cs []Claimed) error {
	routed := make(map[string]bool, len(cs))
	for _, c := range cs {
		routed[c.EventID] = true
	}
	var none []string
	for _, id := range ids {
		if !routed[id] {
			none = append(none, id)
		}
	}
	if len(none) == 0 {
		return nil
	}
	_, err := q.ExecContext(ctx, s.Rebind(`UPDATE txhook_events SET unrouted = TRUE WHERE `+s.textIn("id")), jsonStrings(none))
	return err
}

// pendingEvent is an undispatched event read for dispatch.
type pendingEvent struct {
	id, tenant, typ, key string
	version              int
	payload              []byte
	created              time.Time
	traceParent          nullString
	traceState           nullString
	deliverAt            time.Time // zero: at once
}

func (e pendingEvent) fill(c *Claimed) {
	c.EventID, c.Tenant, c.Type, c.Version, c.Payload, c.EventTime, c.OrderingKey = e.id, e.tenant, e.typ, e.version, e.payload, e.created, e.key
	c.TraceParent, c.TraceState = string(e.traceParent), string(e.traceState)
}

// undispatched reads events with query (columns id, tenant, type, version,
// payload, created_at, trace_parent, trace_state, then optionally
// ordering_key and deliver_at by name), in order.
func (s *Store) undispatched(ctx context.Context, q Querier, query string, args ...any) (map[string]pendingEvent, []string, error) {
	rows, err := q.QueryContext(ctx, s.Rebind(query), args...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	events := map[string]pendingEvent{}
	var ids []string
	for rows.Next() {
		var e pendingEvent
		var t, at Time
		dest := []any{&e.id, &e.tenant, &e.typ, &e.version, &e.payload, &t, &e.traceParent, &e.traceState}
		for _, c := range cols[min(8, len(cols)):] {
			switch c {
			case "ordering_key":
				dest = append(dest, &e.key)
			case "deliver_at":
				dest = append(dest, &at)
			}
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, nil, err
		}
		e.created, e.deliverAt = t.Time, at.Time
		events[e.id] = e
		ids = append(ids, e.id)
	}
	return events, ids, rows.Err()
}

// Keyed events: deliveries with the same ordering key to the same endpoint
// are made one at a time, in enqueue order. A keyed event is dispatched
// only after every earlier event of its key; its delivery to an endpoint is
// created 'blocked' when an earlier one of the key to that endpoint is
// unfinished, and the completion of that one unblocks it. On PostgreSQL an
// advisory lock per tenant and key serialises these steps across relays.

const keyedSelect = `SELECT id, tenant, type, version, payload, created_at, trace_parent, trace_state, ordering_key, deliver_at FROM txhook_events
WHERE dispatched_at IS NULL AND ordering_key IS NOT NULL
ORDER BY created_at, id
LIMIT ?`

const keyedEarlier = `SELECT count(*) FROM txhook_events
WHERE tenant = ? AND ordering_key = ? AND dispatched_at IS NULL
  AND (created_at < ? OR (created_at = ? AND id < ?))`

const keyedMark = `UPDATE txhook_events SET dispatched_at = ? WHERE id = ?`

// keyedInsert creates a keyed delivery: running, leased for the second
// time argument (microseconds, by the database's clock), or blocked, due
// at the first (nothing claims a blocked row; Unblock makes it pending).
func (s *Store) keyedInsert() string {
	next := `COALESCE(?, ` + sqliteNow + ` + ?)`
	if s.Dialect == Postgres {
		next = `COALESCE(?::timestamptz, now() + ?::bigint * interval '1 microsecond')`
	}
	return s.Rebind(`INSERT INTO txhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at, lease_owner, ordering_key, created_at, updated_at)
VALUES (?, ?, ?, ?, ` + next + `, ?, ?, ?, ?) RETURNING id`)
}

// lockKeys takes the advisory locks of the given tenant/key pairs, in one
// global order so relays never deadlock. SQLite needs none: the
// transaction already excludes every other writer.
func (s *Store) lockKeys(ctx context.Context, q Querier, keys []string) error {
	if s.Dialect != Postgres || len(keys) == 0 {
		return nil
	}
	_, err := q.ExecContext(ctx, `SELECT count(pg_advisory_xact_lock(h)) FROM (
    SELECT DISTINCT hashtextextended(k, 7) AS h FROM jsonb_array_elements_text($1::jsonb) k ORDER BY h) s`, jsonStrings(keys))
	return err
}

func lockName(tenant, key string) string { return tenant + "\x1f" + key }

// DispatchKeyed fans out up to limit undispatched events that have an
// ordering key, as Dispatch does, holding back what the order requires.
func (s *Store) DispatchKeyed(ctx context.Context, owner string, now time.Time, lease time.Duration, limit int) ([]Claimed, error) {
	// A one-row look first: most outboxes have no keyed event waiting, and
	// the transaction below would cost them three round trips (and, on
	// SQLite, the write lock) on every claim.
	var probe int
	err := s.DB.QueryRowContext(ctx, s.Rebind(`SELECT count(*) FROM (SELECT 1 FROM txhook_events
WHERE dispatched_at IS NULL AND ordering_key IS NOT NULL LIMIT 1) x`)).Scan(&probe)
	if err != nil || probe == 0 {
		return nil, err
	}
	var out []Claimed
	err = s.Tx(ctx, func(q Querier) error {
		out = out[:0]
		sel := keyedSelect
		if s.Dialect == Postgres {
			sel += " FOR UPDATE SKIP LOCKED"
		}
		events, ids, err := s.undispatched(ctx, q, s.Rebind(sel), limit)
		if err != nil || len(ids) == 0 {
			return err
		}
		keys := make([]string, 0, len(ids))
		for _, id := range ids {
			keys = append(keys, lockName(events[id].tenant, events[id].key))
		}
		if err := s.lockKeys(ctx, q, keys); err != nil {
			return err
		}
		// Numbered placeholders: the type appears more than once.
		ph := func(n int) string {
			if s.Dialect == Postgres {
				return "$" + strconv.Itoa(n)
			}
			return "?" + strconv.Itoa(n)
		}
		match := `SELECT ep.id, ` + claimEndpointCols + `, EXISTS (SELECT 1 FROM txhook_deliveries od
    WHERE od.endpoint_id = ep.id AND od.ordering_key = ` + ph(1) + ` AND od.state IN ('pending', 'running', 'paused', 'blocked'))
FROM txhook_endpoints ep
WHERE ep.tenant = ` + ph(2) + ` AND ep.enabled AND ` + s.subscribed(ph(3)) + `
ORDER BY ep.id`
		insert := s.keyedInsert()
		for _, id := range ids {
			e := events[id]
			var earlier int
			if err := q.QueryRowContext(ctx, s.Rebind(keyedEarlier), e.tenant, e.key, s.T(e.created), s.T(e.created), e.id).Scan(&earlier); err != nil {
				return err
			}
			if earlier > 0 {
				continue // an earlier event of the key goes first
			}
			if _, err := q.ExecContext(ctx, s.Rebind(keyedMark), s.T(now), e.id); err != nil {
				return err
			}
			rows, err := q.QueryContext(ctx, s.Rebind(match), e.key, e.tenant, e.typ)
			if err != nil {
				return err
			}
			var cs []Claimed
			var blocked []bool
			for rows.Next() {
				var c Claimed
				var b bool
				if err := rows.Scan(append(append([]any{&c.EndpointID}, endpointDest(&c)...), &b)...); err != nil {
					rows.Close()
					return err
				}
				e.fill(&c)
				c.Attempt, c.EndpointFound, c.CreatedAt = 1, true, now
				cs = append(cs, c)
				blocked = append(blocked, b)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			if err := s.markUnrouted(ctx, q, []string{e.id}, cs); err != nil {
				return err
			}
			for i := range cs {
				state, attempts, next, leaseUS, holder := StateRunning, 1, any(nil), any(lease.Microseconds()), any(owner)
				switch {
				case blocked[i]:
					state, attempts, next, leaseUS, holder = StateBlocked, 0, s.T(now), nil, nil
				case e.deliverAt.After(now):
					// Delayed: due at deliver_at; it holds the key's line
					// meanwhile, so later events of the key wait for it.
					state, attempts, next, leaseUS, holder = StatePending, 0, s.T(e.deliverAt), nil, nil
				}
				if err := q.QueryRowContext(ctx, insert, e.id, cs[i].EndpointID, state, attempts, next, leaseUS, holder,
					e.key, s.T(now), s.T(now)).Scan(&cs[i].ID); err != nil {
					return err
				}
				if state == StateRunning {
					out = append(out, cs[i])
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// OrderedPair names a finished keyed delivery's line: its endpoint and key.
type OrderedPair struct {
	Tenant, EndpointID, Key string
}

// Unblock makes due the next blocked delivery of each pair whose line is
// free: no delivery of the key to the endpoint pending, running or paused.
// Completions call it after writing a keyed delivery's final outcome; a
// sweep calls it for every blocked line, which repairs anything a crash
// between the two left behind. It returns how many it unblocked.
func (s *Store) Unblock(ctx context.Context, now time.Time, pairs []OrderedPair) (int, error) {
	if len(pairs) == 0 {
		return 0, nil
	}
	sort.Slice(pairs, func(i, j int) bool {
		if pairs[i].EndpointID != pairs[j].EndpointID {
			return pairs[i].EndpointID < pairs[j].EndpointID
		}
		return pairs[i].Key < pairs[j].Key
	})
	n := 0
	err := s.Tx(ctx, func(q Querier) error {
		n = 0
		keys := make([]string, len(pairs))
		for i, p := range pairs {
			keys[i] = lockName(p.Tenant, p.Key)
		}
		if err := s.lockKeys(ctx, q, keys); err != nil {
			return err
		}
		for _, p := range pairs {
			res, err := q.ExecContext(ctx, s.Rebind(`UPDATE txhook_deliveries SET state = 'pending', next_attempt_at = `+s.notBefore("?", "txhook_deliveries.event_id")+`, updated_at = ?
WHERE id = (SELECT min(id) FROM txhook_deliveries WHERE endpoint_id = ? AND ordering_key = ? AND state = 'blocked')
  AND NOT EXISTS (SELECT 1 FROM txhook_deliveries WHERE endpoint_id = ? AND ordering_key = ? AND state IN ('pending', 'running', 'paused'))`),
				s.T(now), s.T(now), p.EndpointID, p.Key, p.EndpointID, p.Key)
			if err != nil {
				return err
			}
			c, _ := res.RowsAffected()
			n += int(c)
		}
		return nil
	})
	return n, err
}

// BlockedLines returns up to limit lines that have blocked deliveries, for
// the sweep.
func (s *Store) BlockedLines(ctx context.Context, limit int) ([]OrderedPair, error) {
	rows, err := s.DB.QueryContext(ctx, s.Rebind(`SELECT DISTINCT ep.tenant, d.endpoint_id, d.ordering_key
FROM txhook_deliveries d JOIN txhook_endpoints ep ON ep.id = d.endpoint_id
WHERE d.state = 'blocked' AND d.ordering_key IS NOT NULL
LIMIT ?`), limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []OrderedPair
	for rows.Next() {
		var p OrderedPair
		if err := rows.Scan(&p.Tenant, &p.EndpointID, &p.Key); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// Claim takes up to limit deliveries for owner, leased for lease by the
// database's clock: pending ones due at now (the relay's clock, which
// scheduled them), and running ones whose lease has expired by the
// database's clock.
func (s *Store) Claim(ctx context.Context, owner string, now time.Time, lease time.Duration, limit int) ([]Claimed, error) {
	if s.Dialect == Postgres {
		return s.queryClaimed(ctx, s.claimSQL(pgClaim, limit), limit, s.T(now), owner, lease.Microseconds())
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
		_, err = q.ExecContext(ctx, sqliteClaimUpdate, owner, lease.Microseconds(), s.T(now), ids.String())
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// queryClaimed runs a PostgreSQL claim statement, prepared when possible:
// a statement not prepared yet is prepared now, unless NoPrepare is set or
// maxPrepared statements are.
func (s *Store) queryClaimed(ctx context.Context, query string, limit int, args ...any) ([]Claimed, error) {
	query = s.Rebind(query)
	var rows *sql.Rows
	var err error
	st := s.stmtFor(ctx, s.DB, query)
	if st == nil && !s.NoPrepare {
		s.mu.Lock()
		room := len(s.stmts) < maxPrepared
		s.mu.Unlock()
		if room && s.Prepare(ctx, query) == nil {
			st = s.stmtFor(ctx, s.DB, query)
		}
	}
	if st != nil {
		rows, err = st.QueryContext(ctx, args...)
	} else {
		rows, err = s.DB.QueryContext(ctx, query, args...)
	}
	if err != nil {
		return nil, err
	}
	return scanClaimed(rows, limit)
}

// endpointDest returns scan destinations for claimEndpointCols that fill c.
func endpointDest(c *Claimed) []any {
	return []any{(*nullString)(&c.URL), (*nullBytes)(&c.Secrets), (*nullBool)(&c.Enabled),
		(*nullFloat)(&c.RateLimit), (*nullInt)(&c.RateBurst), (*nullInt)(&c.MaxInFlight), (*nullBytes)(&c.Versions),
		(*nullBytes)(&c.Headers), (*nullString)(&c.ClientCert), (*nullString)(&c.ClientKey)}
}

// Scanners that take NULL as the zero value: a claimed delivery's endpoint
// may be gone (LEFT JOIN).
type (
	nullString string
	nullBytes  []byte
	nullBool   bool
	nullFloat  float64
	nullInt    int
)

func (n *nullString) Scan(v any) error {
	var x sql.NullString
	err := x.Scan(v)
	*n = nullString(x.String)
	return err
}

func (n *nullBytes) Scan(v any) error {
	var x sql.NullString
	err := x.Scan(v)
	*n = nullBytes(x.String)
	return err
}

func (n *nullBool) Scan(v any) error {
	var x sql.NullBool
	err := x.Scan(v)
	*n = nullBool(x.Bool)
	return err
}

func (n *nullFloat) Scan(v any) error {
	var x sql.NullFloat64
	err := x.Scan(v)
	*n = nullFloat(x.Float64)
	return err
}

func (n *nullInt) Scan(v any) error {
	var x sql.NullInt64
	err := x.Scan(v)
	*n = nullInt(x.Int64)
	return err
}

func scanClaimed(rows *sql.Rows, limit int) ([]Claimed, error) {
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	out := make([]Claimed, 0, min(limit, 64))
	var eps map[string]*Claimed // the row of the batch that carries each endpoint's columns
	for rows.Next() {
		var c Claimed
		var prev string
		var et, lease Time
		var key sql.NullString
		dest := append([]any{&c.ID, &c.Attempt, &prev, &c.EventID, &c.Tenant, &c.Type, &c.Version, &c.Payload, &et,
			(*nullString)(&c.TraceParent), (*nullString)(&c.TraceState), &c.EndpointID, &key}, endpointDest(&c)...)
		var created Time
		first := true
		switch len(cols) - len(dest) {
		case 1:
			dest = append(dest, &lease)
		case 2:
			dest = append(dest, &lease, &created)
		case 3:
			dest = append(dest, &lease, &created, &first)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		c.LeaseLapsed = prev == StateRunning
		c.EventTime, c.Lease, c.CreatedAt = et.Time, lease.Time, created.Time
		c.OrderingKey = key.String
		if first {
			if eps == nil {
				eps = map[string]*Claimed{}
			}
			eps[c.EndpointID] = &c
		} else if ep := eps[c.EndpointID]; ep != nil {
			c.URL, c.Secrets, c.Enabled, c.RateLimit, c.RateBurst, c.MaxInFlight = ep.URL, ep.Secrets, ep.Enabled, ep.RateLimit, ep.RateBurst, ep.MaxInFlight
			c.Versions, c.Headers, c.ClientCert, c.ClientKey = ep.Versions, ep.Headers, ep.ClientCert, ep.ClientKey
		}
		c.EndpointFound = c.URL != ""
		out = append(out, c)
	}
	return out, rows.Err()
}

// notBefore is the SQL for the later of the time now (a placeholder or
// expression) and the deliver_at of the event whose ID is eventID (an
// expression): when a delivery made due by an operation (an unblocking, an
// endpoint enabled again, a recovery, a replay) may be attempted, so that
// nothing is sent before a delayed event's time.
func (s *Store) notBefore(now, eventID string) string {
	at := `(SELECT ev.deliver_at FROM txhook_events ev WHERE ev.id = ` + eventID + `)`
	if s.Dialect == Postgres {
		return `GREATEST(` + now + `, ` + at + `)`
	}
	return `max(` + now + `, COALESCE(` + at + `, 0))`
}
