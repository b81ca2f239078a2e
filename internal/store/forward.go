package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Forwarding (broker mode, package outbox/broker): forwarders hand
// committed events to a message broker.
//
// On PostgreSQL an event enqueued in broker mode carries forward_xid, the
// ID of the transaction that wrote it (forward_enqueue.go). A forwarder
// keeps a cursor: the snapshot (pg_current_snapshot) up to which it has
// forwarded. The events committed since are those whose transaction was
// still running in that snapshot (its xip list) or started after it (at or
// past its xmax), and that a newer snapshot sees finished: read by the
// index of forward_xid in two ranges, they cost the forwarder no write
// at all. A transaction that runs long holds back nothing but itself: its
// events come with the round after it commits. The cursor is saved every
// few seconds, not per round; a forwarder that dies forwards again what
// came after the saved cursor, and the broker drops the copies it already
// has (its duplicate window); a copy it stores anyway is settled by the
// worker that receives it as the delivery's row says (BrokerRows).
//
// Events enqueued without broker mode, and every event on SQLite (one
// writer: no transaction IDs needed), are claimed under a lease on the
// event, as table-mode relays dispatch them, and marked forwarded once
// the broker has them.

// ForwardEvent is an event to forward.
type ForwardEvent struct {
	ID          string
	Tenant      string
	Type        string
	Version     int
	Payload     []byte
	CreatedAt   time.Time
	DeliverAt   time.Time // zero: at once
	TraceParent string
	TraceState  string
	// XID is the writing transaction's ID (PostgreSQL, broker mode); ""
	// for an event claimed under a lease.
	XID string
}

// Snapshot is a PostgreSQL snapshot, xmin:xmax:xip1,xip2,... (the text of
// pg_snapshot). The zero value stands before every transaction.
type Snapshot struct {
	Xmin, Xmax uint64
	Xip        []uint64
}

// ParseSnapshot reads the text of a pg_snapshot; "" is the zero Snapshot.
func ParseSnapshot(s string) (Snapshot, error) {
	var snap Snapshot
	if s == "" {
		return snap, nil
	}
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return snap, fmt.Errorf("txhook: malformed snapshot %q", s)
	}
	var err error
	if snap.Xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return snap, fmt.Errorf("txhook: malformed snapshot %q", s)
	}
	if snap.Xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return snap, fmt.Errorf("txhook: malformed snapshot %q", s)
	}
	if parts[2] != "" {
		for _, x := range strings.Split(parts[2], ",") {
			v, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				return snap, fmt.Errorf("txhook: malformed snapshot %q", s)
			}
			snap.Xip = append(snap.Xip, v)
		}
	}
	return snap, nil
}

// String returns the pg_snapshot text of snap, "" for the zero Snapshot.
func (snap Snapshot) String() string {
	if snap.Xmax == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(strconv.FormatUint(snap.Xmin, 10))
	b.WriteByte(':')
	b.WriteString(strconv.FormatUint(snap.Xmax, 10))
	b.WriteByte(':')
	for i, x := range snap.Xip {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(x, 10))
	}
	return b.String()
}

// snapshotArg is snap as a statement argument: its text, or the snapshot
// that no transaction is visible in.
func (snap Snapshot) arg() string {
	if snap.Xmax == 0 {
		return "1:1:"
	}
	return snap.String()
}

// CurrentSnapshot returns the database's current snapshot, the target of
// a forwarding round.
func (s *Store) CurrentSnapshot(ctx context.Context) (Snapshot, error) {
	var text string
	if err := s.DB.QueryRowContext(ctx, `SELECT pg_current_snapshot()::text`).Scan(&text); err != nil {
		return Snapshot{}, err
	}
	return ParseSnapshot(text)
}

// forwardCols are the event columns a forwarder reads.
const forwardCols = `e.id, e.tenant, e.type, e.version, e.payload, e.created_at, e.deliver_at, e.trace_parent, e.trace_state`

// The two ranges of a round from snapshot $1 (the cursor) to $2 (the
// target), paged by (forward_xid, id) after ($3, $4), $5 rows a page:
// events of transactions the cursor saw running, and events of
// transactions that started at or after its xmax.
const (
	pgForwardRunning = `SELECT ` + forwardCols + `, e.forward_xid::text
FROM txhook_events e
WHERE e.forward_xid = ANY (ARRAY(SELECT pg_snapshot_xip($1::pg_snapshot)))
  AND pg_visible_in_snapshot(e.forward_xid, $2::pg_snapshot)
  AND (e.forward_xid, e.id) > ($3::xid8, $4::text)
ORDER BY e.forward_xid, e.id
LIMIT $5`
	pgForwardNew = `SELECT ` + forwardCols + `, e.forward_xid::text
FROM txhook_events e
WHERE e.forward_xid >= pg_snapshot_xmax($1::pg_snapshot) AND e.forward_xid < pg_snapshot_xmax($2::pg_snapshot)
  AND pg_visible_in_snapshot(e.forward_xid, $2::pg_snapshot)
  AND (e.forward_xid, e.id) > ($3::xid8, $4::text)
ORDER BY e.forward_xid, e.id
LIMIT $5`
)

// pgForwardFirst is a round's first page in one statement: the current
// snapshot (the round's target) and up to $2 events of both ranges from
// the cursor $1 to it, in (forward_xid, id) order (the running range's
// transactions all precede the cursor's xmax, where the new range
// starts). With no event due it returns one row of the snapshot alone.
// Each range is read as ForwardPage reads it, through the index on
// forward_xid: written as one OR, the plan scanned the whole index (78 ms
// beside 200,000 events), and bounded below by the cursor's xmin instead,
// it read every event written since the oldest running transaction.
const pgForwardFirst = `SELECT s.snap::text, e.id, e.tenant, e.type, e.version, e.payload, e.created_at, e.deliver_at,
    e.trace_parent, e.trace_state, e.forward_xid::text
FROM (SELECT pg_current_snapshot() AS snap) s
LEFT JOIN LATERAL (
    SELECT * FROM (
        (SELECT ` + forwardCols + `, e.forward_xid
         FROM txhook_events e
         WHERE e.forward_xid = ANY (ARRAY(SELECT pg_snapshot_xip($1::pg_snapshot)))
           AND pg_visible_in_snapshot(e.forward_xid, s.snap)
         ORDER BY e.forward_xid, e.id
         LIMIT $2)
        UNION ALL
        (SELECT ` + forwardCols + `, e.forward_xid
         FROM txhook_events e
         WHERE e.forward_xid >= pg_snapshot_xmax($1::pg_snapshot) AND e.forward_xid < pg_snapshot_xmax(s.snap)
           AND pg_visible_in_snapshot(e.forward_xid, s.snap)
         ORDER BY e.forward_xid, e.id
         LIMIT $2)
    ) u
    ORDER BY u.forward_xid, u.id
    LIMIT $2
) e ON true
ORDER BY e.forward_xid, e.id`

// ForwardFirst returns the database's current snapshot, the target of a
// forwarding round from snapshot from, and the round's first page: up to
// limit events committed between the two, both ranges (see ForwardPage)
// in (forward_xid, id) order. It is CurrentSnapshot and the first
// ForwardPage of each range in one statement, which a forwarder polling
// a steady stream runs many times a second. When the page is full, page
// on with ForwardPage from its last event.
func (s *Store) ForwardFirst(ctx context.Context, from Snapshot, limit int) (Snapshot, []ForwardEvent, error) {
	rows, err := s.queryPrepared(ctx, pgForwardFirst, from.arg(), limit)
	if err != nil {
		return Snapshot{}, nil, err
	}
	defer rows.Close()
	var snap string
	var out []ForwardEvent
	for rows.Next() {
		var e ForwardEvent
		var id, tenant, typ, xid sql.NullString
		var version sql.NullInt64
		var created, at Time
		if err := rows.Scan(&snap, &id, &tenant, &typ, &version, &e.Payload, &created, &at,
			(*nullString)(&e.TraceParent), (*nullString)(&e.TraceState), &xid); err != nil {
			return Snapshot{}, nil, err
		}
		if !id.Valid {
			continue // no event: the snapshot alone
		}
		e.ID, e.Tenant, e.Type, e.Version, e.XID = id.String, tenant.String, typ.String, int(version.Int64), xid.String
		e.CreatedAt, e.DeliverAt = created.Time, at.Time
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return Snapshot{}, nil, err
	}
	to, err := ParseSnapshot(snap)
	return to, out, err
}

// ForwardPage returns up to limit events committed between snapshots from
// and to (see above), after the position (xid, id) in (forward_xid, id)
// order: running selects the events of transactions from saw running,
// otherwise those that started at or after its xmax. Start each range
// with xid "0" and id "".
func (s *Store) ForwardPage(ctx context.Context, from, to Snapshot, running bool, xid, id string, limit int) ([]ForwardEvent, error) {
	q := pgForwardNew
	if running {
		if len(from.Xip) == 0 {
			return nil, nil
		}
		q = pgForwardRunning
	}
	rows, err := s.queryPrepared(ctx, q, from.arg(), to.arg(), xid, id, limit)
	if err != nil {
		return nil, err
	}
	return scanForward(rows, true)
}

// ForwardQueries are the statements of a forwarder's rounds, for Prepare.
func (s *Store) ForwardQueries() []string {
	if s.Dialect == Postgres {
		return []string{pgForwardFirst, pgForwardRunning, pgForwardNew}
	}
	return nil
}

func scanForward(rows *sql.Rows, xid bool) ([]ForwardEvent, error) {
	defer rows.Close()
	var out []ForwardEvent
	for rows.Next() {
		var e ForwardEvent
		var created, at Time
		dest := []any{&e.ID, &e.Tenant, &e.Type, &e.Version, &e.Payload, &created, &at,
			(*nullString)(&e.TraceParent), (*nullString)(&e.TraceState)}
		if xid {
			dest = append(dest, &e.XID)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		e.CreatedAt, e.DeliverAt = created.Time, at.Time
		out = append(out, e)
	}
	return out, rows.Err()
}

// ForwardLease takes, or renews, the lease of the cursor name for owner,
// for lease by the database's clock, and returns the saved position. held
// is false when another forwarder holds it.
func (s *Store) ForwardLease(ctx context.Context, name, owner string, lease time.Duration) (position Snapshot, held bool, err error) {
	var q string
	var args []any
	if s.Dialect == Postgres {
		q = `INSERT INTO txhook_forwarders AS f (name, position, lease_owner, lease_until, updated_at)
VALUES ($1, '', $2, now() + $3::bigint * interval '1 microsecond', now())
ON CONFLICT (name) DO UPDATE SET lease_owner = EXCLUDED.lease_owner, lease_until = EXCLUDED.lease_until, updated_at = EXCLUDED.updated_at
WHERE f.lease_owner = EXCLUDED.lease_owner OR f.lease_until IS NULL OR f.lease_until <= now()
RETURNING position`
		args = []any{name, owner, lease.Microseconds()}
	} else {
		q = `INSERT INTO txhook_forwarders AS f (name, position, lease_owner, lease_until, updated_at)
VALUES (?, '', ?, ` + sqliteNow + ` + ?, ` + sqliteNow + `)
ON CONFLICT (name) DO UPDATE SET lease_owner = excluded.lease_owner, lease_until = excluded.lease_until, updated_at = excluded.updated_at
WHERE f.lease_owner = excluded.lease_owner OR f.lease_until IS NULL OR f.lease_until <= ` + sqliteNow + `
RETURNING position`
		args = []any{name, owner, lease.Microseconds()}
	}
	var text string
	err = s.DB.QueryRowContext(ctx, s.Rebind(q), args...).Scan(&text)
	if errors.Is(err, sql.ErrNoRows) {
		return Snapshot{}, false, nil
	}
	if err != nil {
		return Snapshot{}, false, err
	}
	position, err = ParseSnapshot(text)
	return position, err == nil, err
}

// ForwardSave saves position as the cursor name and renews owner's lease;
// held is false when owner no longer holds it (nothing is saved then).
func (s *Store) ForwardSave(ctx context.Context, name, owner string, position Snapshot, lease time.Duration) (held bool, err error) {
	var res sql.Result
	if s.Dialect == Postgres {
		res, err = s.DB.ExecContext(ctx, s.Rebind(`UPDATE txhook_forwarders
SET position = ?, lease_until = now() + ?::bigint * interval '1 microsecond', updated_at = now()
WHERE name = ? AND lease_owner = ?`), position.String(), lease.Microseconds(), name, owner)
	} else {
		res, err = s.DB.ExecContext(ctx, `UPDATE txhook_forwarders
SET position = ?, lease_until = `+sqliteNow+` + ?, updated_at = `+sqliteNow+`
WHERE name = ? AND lease_owner = ?`, position.String(), lease.Microseconds(), name, owner)
	}
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// ForwardRelease gives up owner's lease of the cursor name, so another
// forwarder takes over at once.
func (s *Store) ForwardRelease(ctx context.Context, name, owner string) error {
	_, err := s.DB.ExecContext(ctx, s.Rebind(`UPDATE txhook_forwarders SET lease_owner = NULL, lease_until = NULL
WHERE name = ? AND lease_owner = ?`), name, owner)
	return err
}

// ClaimUnforwarded leases up to limit undispatched events without an
// ordering key to owner, oldest first, and returns them: the events a
// forwarder publishes that are not found by the cursor (SQLite, or an
// event enqueued without broker mode). Events leased by a table-mode
// relay are left to it.
func (s *Store) ClaimUnforwarded(ctx context.Context, owner string, lease time.Duration, limit int) ([]ForwardEvent, error) {
	if s.Dialect == Postgres {
		rows, err := s.DB.QueryContext(ctx, s.Rebind(`UPDATE txhook_events e
SET lease_owner = ?, lease_until = now() + ?::bigint * interval '1 microsecond'
WHERE e.id IN (SELECT id FROM txhook_events
               WHERE dispatched_at IS NULL AND ordering_key IS NULL AND (lease_until IS NULL OR lease_until <= now())
               ORDER BY created_at LIMIT ? FOR UPDATE SKIP LOCKED)
RETURNING `+forwardCols), owner, lease.Microseconds(), limit)
		if err != nil {
			return nil, err
		}
		return scanForward(rows, false)
	}
	var out []ForwardEvent
	err := s.Tx(ctx, func(q Querier) error {
		rows, err := q.QueryContext(ctx, `UPDATE txhook_events
SET lease_owner = ?, lease_until = `+sqliteNow+` + ?
WHERE id IN (SELECT id FROM txhook_events
             WHERE dispatched_at IS NULL AND ordering_key IS NULL AND (lease_until IS NULL OR lease_until <= `+sqliteNow+`)
             ORDER BY created_at LIMIT ?)
RETURNING `+strings.ReplaceAll(forwardCols, "e.", ""), owner, lease.Microseconds(), limit)
		if err != nil {
			return err
		}
		out, err = scanForward(rows, false)
		return err
	})
	return out, err
}

// MarkForwarded marks the events of ids, leased to owner, forwarded at
// now, and those of unrouted as having no delivery (no endpoint
// subscribed): the end of their lease.
func (s *Store) MarkForwarded(ctx context.Context, owner string, now time.Time, ids, unrouted []string) error {
	if len(ids) == 0 {
		return nil
	}
	un := s.textIn("id")
	_, err := s.DB.ExecContext(ctx, s.Rebind(`UPDATE txhook_events
SET dispatched_at = ?, lease_owner = NULL, lease_until = NULL,
    unrouted = CASE WHEN `+un+` THEN `+s.boolLit(true)+` END
WHERE `+s.textIn("id")+` AND lease_owner = ? AND dispatched_at IS NULL`), s.T(now), jsonStrings(unrouted), jsonStrings(ids), owner)
	return err
}

// MarkUnrouted marks forwarded events that no endpoint subscribed to, for
// retention and Recover (txhook_events_unrouted).
func (s *Store) MarkUnrouted(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := s.DB.ExecContext(ctx, s.Rebind(`UPDATE txhook_events SET unrouted = `+s.boolLit(true)+` WHERE `+s.textIn("id")), jsonStrings(ids))
	return err
}

func (s *Store) boolLit(v bool) string {
	switch {
	case s.Dialect == Postgres && v:
		return "true"
	case s.Dialect == Postgres:
		return "false"
	case v:
		return "1"
	}
	return "0"
}

// Subscription is an enabled endpoint's subscription: its event types,
// exact names and "prefix.*" wildcards; none means every type.
type Subscription struct {
	EndpointID string
	Tenant     string
	Types      []string
}

// Subscribes reports whether sub takes events of type typ.
func (sub Subscription) Subscribes(typ string) bool {
	if len(sub.Types) == 0 {
		return true
	}
	for _, p := range sub.Types {
		if p == typ {
			return true
		}
		if strings.HasSuffix(p, "*") && strings.HasPrefix(typ, strings.TrimRight(p, "*")) {
			return true
		}
	}
	return false
}

// Subscriptions returns the enabled endpoints of the tenants, by tenant.
func (s *Store) Subscriptions(ctx context.Context, tenants []string) (map[string][]Subscription, error) {
	out := make(map[string][]Subscription, len(tenants))
	if len(tenants) == 0 {
		return out, nil
	}
	rows, err := s.DB.QueryContext(ctx, s.Rebind(`SELECT id, tenant, event_types FROM txhook_endpoints
WHERE enabled AND `+s.textIn("tenant")+` ORDER BY tenant, id`), jsonStrings(tenants))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var sub Subscription
		var types []byte
		if err := rows.Scan(&sub.EndpointID, &sub.Tenant, &types); err != nil {
			return nil, err
		}
		if err := json.Unmarshal(types, &sub.Types); err != nil {
			return nil, fmt.Errorf("txhook: endpoint %s: stored event types: %w", sub.EndpointID, err)
		}
		out[sub.Tenant] = append(out[sub.Tenant], sub)
	}
	return out, rows.Err()
}

// CopyEvents writes copies of forwarded events into this database, which
// keeps the delivery history of another (broker.Config.History): the
// attempt log, dead letters, the portal and Recover read the event there.
// Copies are marked dispatched (unrouted when in unrouted), carry no
// transaction ID, and an event copied before is left as it is.
func (s *Store) CopyEvents(ctx context.Context, now time.Time, evs []ForwardEvent, unrouted map[string]bool) error {
	if len(evs) == 0 {
		return nil
	}
	type row struct {
		ID          string  `json:"id"`
		Tenant      string  `json:"tenant"`
		Type        string  `json:"type"`
		Version     int     `json:"version"`
		Payload     string  `json:"payload"`
		CreatedAt   any     `json:"created_at"`
		DeliverAt   any     `json:"deliver_at,omitempty"`
		TraceParent *string `json:"trace_parent,omitempty"`
		TraceState  *string `json:"trace_state,omitempty"`
		Unrouted    bool    `json:"unrouted"`
	}
	rs := make([]row, len(evs))
	for i, e := range evs {
		r := row{ID: e.ID, Tenant: e.Tenant, Type: e.Type, Version: e.Version, Payload: string(e.Payload),
			CreatedAt: s.JSONTime(e.CreatedAt), Unrouted: unrouted[e.ID]}
		if !e.DeliverAt.IsZero() {
			r.DeliverAt = s.JSONTime(e.DeliverAt)
		}
		if e.TraceParent != "" {
			tp, ts := e.TraceParent, e.TraceState
			r.TraceParent, r.TraceState = &tp, &ts
		}
		rs[i] = r
	}
	b, err := json.Marshal(rs)
	if err != nil {
		return err
	}
	if s.Dialect == Postgres {
		_, err = s.DB.ExecContext(ctx, s.Rebind(`INSERT INTO txhook_events (id, tenant, type, version, payload, created_at, deliver_at,
    trace_parent, trace_state, dispatched_at, unrouted)
SELECT x.id, x.tenant, x.type, x.version, x.payload::json, x.created_at, x.deliver_at, x.trace_parent, x.trace_state, ?,
       CASE WHEN x.unrouted THEN true END
FROM json_to_recordset(?::json) AS x(id text, tenant text, type text, version int, payload text, created_at timestamptz,
    deliver_at timestamptz, trace_parent text, trace_state text, unrouted boolean)
ON CONFLICT DO NOTHING`), s.T(now), string(b))
		return err
	}
	_, err = s.DB.ExecContext(ctx, `INSERT INTO txhook_events (id, tenant, type, version, payload, created_at, deliver_at,
    trace_parent, trace_state, dispatched_at, unrouted)
SELECT json_extract(x.value, '$.id'), json_extract(x.value, '$.tenant'), json_extract(x.value, '$.type'),
       json_extract(x.value, '$.version'), json_extract(x.value, '$.payload'), json_extract(x.value, '$.created_at'),
       json_extract(x.value, '$.deliver_at'), json_extract(x.value, '$.trace_parent'), json_extract(x.value, '$.trace_state'), ?,
       CASE WHEN json_extract(x.value, '$.unrouted') THEN 1 END
FROM json_each(?) x
WHERE true
ON CONFLICT DO NOTHING`, s.T(now), string(b))
	return err
}

// ForwardRow is a delivery row a forwarder hands to the broker.
type ForwardRow struct {
	ID         int64
	Attempts   int
	Lapsed     bool // a relay's lease on it lapsed: its last attempt went unrecorded
	Rescued    bool // it was the broker's already (its message may be lost)
	EndpointID string
	Event      ForwardEvent
}

// ClaimDueRows leases to owner (BrokerOwner) up to limit due delivery
// rows that no broker holds: made due by an operation (a replay, a
// resend, a recovery, an endpoint enabled again, a test event), left by a
// table-mode relay whose lease lapsed, or the broker's own rows overdue by
// rescue (their message may be lost: the forwarder checks). Each becomes
// 'pending', leased to owner, due now; its attempts are unchanged.
func (s *Store) ClaimDueRows(ctx context.Context, owner string, rescue time.Duration, now time.Time, limit int) ([]ForwardRow, error) {
	if s.Dialect == Postgres {
		rows, err := s.DB.QueryContext(ctx, s.Rebind(`WITH due AS (
    SELECT id, state, lease_owner FROM txhook_deliveries
    WHERE state IN ('pending', 'running') AND next_attempt_at <= GREATEST(?, now())
      AND CASE WHEN state = 'running' THEN next_attempt_at <= now()
               WHEN lease_owner = ? THEN next_attempt_at <= now() - ?::bigint * interval '1 microsecond'
               ELSE next_attempt_at <= ? END
    ORDER BY next_attempt_at
    LIMIT ?
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE txhook_deliveries d SET state = 'pending', lease_owner = ?, next_attempt_at = now(), updated_at = now()
    FROM due WHERE d.id = due.id
    RETURNING d.id, d.attempts, due.state AS prev_state, due.lease_owner AS prev_owner, d.event_id, d.endpoint_id
)
SELECT c.id, c.attempts, c.prev_state, c.prev_owner, c.endpoint_id, `+forwardCols+`
FROM claimed c JOIN txhook_events e ON e.id = c.event_id
ORDER BY c.id`), s.T(now), owner, rescue.Microseconds(), s.T(now), limit, owner)
		if err != nil {
			return nil, err
		}
		return scanForwardRows(rows, owner)
	}
	var out []ForwardRow
	err := s.Tx(ctx, func(q Querier) error {
		rows, err := q.QueryContext(ctx, `SELECT d.id, d.attempts, d.state, d.lease_owner, d.endpoint_id, `+forwardCols+`
FROM txhook_deliveries d JOIN txhook_events e ON e.id = d.event_id
WHERE d.state IN ('pending', 'running')
  AND CASE WHEN d.state = 'running' THEN d.next_attempt_at <= `+sqliteNow+`
           WHEN d.lease_owner = ? THEN d.next_attempt_at <= ? - ?
           ELSE d.next_attempt_at <= ? END
ORDER BY d.next_attempt_at LIMIT ?`, owner, s.T(now), rescue.Microseconds(), s.T(now), limit)
		if err != nil {
			return err
		}
		if out, err = scanForwardRows(rows, owner); err != nil || len(out) == 0 {
			return err
		}
		ids := make([]int64, len(out))
		for i, r := range out {
			ids[i] = r.ID
		}
		_, err = q.ExecContext(ctx, `UPDATE txhook_deliveries SET state = 'pending', lease_owner = ?, next_attempt_at = ?, updated_at = ?
WHERE `+s.idsIn("id"), owner, s.T(now), s.T(now), jsonIDs(ids))
		return err
	})
	return out, err
}

func scanForwardRows(rows *sql.Rows, owner string) ([]ForwardRow, error) {
	defer rows.Close()
	var out []ForwardRow
	for rows.Next() {
		var r ForwardRow
		var prev string
		var prevOwner sql.NullString
		var created, at Time
		e := &r.Event
		if err := rows.Scan(&r.ID, &r.Attempts, &prev, &prevOwner, &r.EndpointID, &e.ID, &e.Tenant, &e.Type, &e.Version, &e.Payload,
			&created, &at, (*nullString)(&e.TraceParent), (*nullString)(&e.TraceState)); err != nil {
			return nil, err
		}
		e.CreatedAt, e.DeliverAt = created.Time, at.Time
		r.Lapsed = prev == StateRunning
		r.Rescued = prev == StatePending && prevOwner.String == owner
		out = append(out, r)
	}
	return out, rows.Err()
}

// BrokerKey returns the key of stream name with which forwarders
// authenticate their messages, making it on first use: 32 random bytes,
// base64. seal and open, when set, encrypt it at rest (Config.SecretCipher)
// and decrypt it.
func (s *Store) BrokerKey(ctx context.Context, name string, now time.Time, seal func(string) (string, error), open func(string) (string, error)) ([]byte, error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, err
	}
	fresh := base64.StdEncoding.EncodeToString(raw)
	stored := fresh
	if seal != nil {
		var err error
		if stored, err = seal(fresh); err != nil {
			return nil, err
		}
	}
	if _, err := s.DB.ExecContext(ctx, s.Rebind(`INSERT INTO txhook_broker_keys (name, mac_key, created_at) VALUES (?, ?, ?)
ON CONFLICT (name) DO NOTHING`), name, stored, s.T(now)); err != nil {
		return nil, NotMigrated(err)
	}
	var got string
	if err := s.DB.QueryRowContext(ctx, s.Rebind(`SELECT mac_key FROM txhook_broker_keys WHERE name = ?`), name).Scan(&got); err != nil {
		return nil, err
	}
	if open != nil {
		var err error
		if got, err = open(got); err != nil {
			return nil, err
		}
	}
	key, err := base64.StdEncoding.DecodeString(got)
	if err != nil || len(key) < 32 {
		return nil, fmt.Errorf("txhook: the broker key of %q is malformed", name)
	}
	return key, nil
}

// PendingOrdered returns how many events with an ordering key wait to be
// dispatched: broker mode does not order deliveries, so a forwarder will
// not start over them.
func (s *Store) PendingOrdered(ctx context.Context) (int, error) {
	var n int
	err := s.DB.QueryRowContext(ctx, s.Rebind(`SELECT count(*) FROM (SELECT 1 FROM txhook_events
WHERE dispatched_at IS NULL AND ordering_key IS NOT NULL LIMIT 1000) x`)).Scan(&n)
	return n, NotMigrated(err)
}

// PruneForwarded deletes up to limit events of broker mode (forward_xid
// set) that the cursor at has passed and that were created before
// `before`, oldest first, and reports how many it looked at and deleted,
// and whether it reached an event too new (the walk is done). It is for a
// database whose delivery history lives elsewhere (broker.Config.History),
// where no delivery row refers to an event: retention keeps events there
// only as long as it keeps delivered work in the history.
func (s *Store) PruneForwarded(ctx context.Context, at Snapshot, before time.Time, limit int) (deleted int, done bool, err error) {
	rows, err := s.DB.QueryContext(ctx, s.Rebind(`SELECT id, created_at FROM txhook_events
WHERE forward_xid IS NOT NULL AND forward_xid < pg_snapshot_xmin(?::pg_snapshot)
ORDER BY forward_xid LIMIT ?`), at.arg(), limit)
	if err != nil {
		return 0, false, err
	}
	var ids []string
	seen := 0
	for rows.Next() {
		var id string
		var created Time
		if err := rows.Scan(&id, &created); err != nil {
			rows.Close()
			return 0, false, err
		}
		seen++
		if !created.Time.Before(before) {
			done = true
			continue
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, false, err
	}
	if seen < limit {
		done = true
	}
	if len(ids) == 0 {
		return 0, done, nil
	}
	res, err := s.DB.ExecContext(ctx, s.Rebind(`DELETE FROM txhook_events WHERE `+s.textIn("id")+`
  AND NOT EXISTS (SELECT 1 FROM txhook_deliveries d WHERE d.event_id = txhook_events.id)`), jsonStrings(ids))
	if err != nil {
		return 0, false, err
	}
	n, _ := res.RowsAffected()
	return int(n), done, nil
}
