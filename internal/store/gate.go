package store

import (
	"context"
	"database/sql"
	"math"
	"time"
)

// An endpoint's gate (migration 012) is what every relay sharing the
// database asks before it sends to an endpoint with limits, or one whose
// circuit has failures: its rate limit's token bucket, its in-flight cap
// shared out as leased slots, and its circuit breaker. Each exchange is
// one short transaction that locks the endpoint's gate row first, so that
// relays see each other's tokens and slots: on PostgreSQL an upsert that
// locks and returns the row, a read of the slots, and one write of both
// tables; on SQLite the same in an IMMEDIATE transaction.

// GateAsk is what a relay asks of an endpoint's gate for one request.
type GateAsk struct {
	Endpoint    string
	Relay       string
	Now         time.Time // the relay's clock
	Rate        float64   // requests per second; 0: none
	Burst       int       // bucket size; ≤ 0: Rate rounded up, at least 1
	MaxInFlight int       // 0: no shared cap
	// SlotLease is how long the relay's slots count after this request
	// starts: longer than any request may run (the relay's lease).
	SlotLease time.Duration
	// Threshold is the relay's breaker threshold (≤ 0: no breaker): with
	// that many faults in a row, the circuit past its open period lets one
	// probe through at a time.
	Threshold int
}

// GateGrant is the gate's answer.
type GateGrant struct {
	OK       bool
	Probe    bool      // the request is the half-open circuit's probe
	Slot     bool      // a slot was taken: Finish must give it back
	RetryAt  time.Time // when !OK: when to ask again
	Reason   string    // when !OK: "circuit", "rate" or "busy"
	Failures int       // the circuit's faults in a row
	Opened   bool      // the circuit is open or half-open
}

// GateFinish reports the end of a request to the gate.
type GateFinish struct {
	Endpoint string
	Relay    string
	Now      time.Time
	Slot     bool // give back the slot the grant took
	Probe    bool // the request was the probe
	// Fault and Answered say how the receiver answered; neither: no
	// request was made.
	Fault, Answered bool
	Threshold       int
	Cooldown        time.Duration // first open period
	MaxCooldown     time.Duration
}

// GateState is what Finish leaves: the circuit's faults in a row, and
// when open, until when.
type GateState struct {
	Failures  int
	OpenUntil time.Time
	Opened    bool // open or half-open
}

type gateRow struct {
	tokens               float64
	refilled             Time
	failures             int
	cooldown             int64
	openUntil, probeTill Time
}

// lockGate creates the endpoint's gate row if missing and locks it,
// returning it.
func (s *Store) lockGate(ctx context.Context, q Querier, endpoint string) (gateRow, error) {
	var g gateRow
	query := `INSERT INTO txhook_endpoint_gates (endpoint_id, tokens) VALUES (?, ?)
ON CONFLICT (endpoint_id) DO UPDATE SET endpoint_id = excluded.endpoint_id
RETURNING tokens, refilled_at, failures, cooldown_us, open_until, probe_until`
	if s.Dialect == Postgres && !s.SyncRelayCommits {
		// As the relay's other statements (see asyncCommit): the commit
		// does not wait for its WAL. A crash can forget the last tokens
		// and slots taken, which lets through at most what they counted.
		query += `, set_config('synchronous_commit', 'off', true)`
	}
	var sync any
	dest := []any{&g.tokens, &g.refilled, &g.failures, &g.cooldown, &g.openUntil, &g.probeTill}
	if s.Dialect == Postgres && !s.SyncRelayCommits {
		dest = append(dest, &sync)
	}
	err := q.QueryRowContext(ctx, s.Rebind(query), endpoint, 0.0).Scan(dest...)
	return g, err
}

// nullT is the column value of t, NULL for the zero time.
func (s *Store) nullT(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return s.T(t)
}

// GateAcquire asks the endpoint's gate for one request: a token of its
// rate, a slot of its in-flight cap, passage through its circuit.
func (s *Store) GateAcquire(ctx context.Context, a GateAsk) (GateGrant, error) {
	burst := float64(a.Burst)
	if burst <= 0 {
		burst = max(1, math.Ceil(a.Rate))
	}
	var out GateGrant
	err := s.Tx(ctx, func(q Querier) error {
		out = GateGrant{}
		g, err := s.lockGate(ctx, q, a.Endpoint)
		if err != nil {
			return err
		}
		now := a.Now
		out.Failures = g.failures
		out.Opened = g.cooldown > 0 || g.openUntil.After(now)
		// The bucket. A row new to the rate starts empty, as a relay's
		// own bucket does: relays that see the endpoint for the first time
		// must not add a burst to what was just sent. An idle endpoint's
		// bucket fills up to the burst.
		tokens := g.tokens
		refilled := g.refilled.Time
		if a.Rate > 0 {
			if refilled.IsZero() {
				tokens, refilled = 0, now
			} else if now.After(refilled) {
				tokens = min(burst, tokens+now.Sub(refilled).Seconds()*a.Rate)
				refilled = now
			}
			tokens = min(tokens, burst)
		}
		var blocked time.Time
		probe := false
		switch {
		case g.openUntil.After(now):
			out.Reason, out.RetryAt, blocked = "circuit", g.openUntil.Time, g.openUntil.Time
		case a.Threshold > 0 && g.failures >= a.Threshold && g.cooldown > 0:
			// Half-open: one probe at a time, whichever relay asks first.
			if g.probeTill.After(now) {
				// The probe may answer any moment: ask again soon, not
				// when its lease ends.
				out.Reason, out.RetryAt = "circuit", minTime(g.probeTill.Time, now.Add(100*time.Millisecond))
			} else {
				probe = true
			}
		}
		var own, others int
		var firstExpiry Time
		if out.Reason == "" && a.MaxInFlight > 0 {
			err := q.QueryRowContext(ctx, s.Rebind(`SELECT
    COALESCE(SUM(CASE WHEN relay = ? THEN slots END), 0),
    COALESCE(SUM(CASE WHEN relay <> ? THEN slots END), 0),
    MIN(expires_at)
FROM txhook_gate_slots WHERE endpoint_id = ? AND expires_at > ? AND slots > 0`),
				a.Relay, a.Relay, a.Endpoint, s.T(now)).Scan(&own, &others, &firstExpiry)
			if err != nil {
				return err
			}
			if own+others >= a.MaxInFlight {
				// Until a slot comes back (Finish clears blocked_until),
				// or the first lease ends.
				out.Reason, out.RetryAt, blocked = "busy", now.Add(50*time.Millisecond), firstExpiry.Time
			}
		}
		if out.Reason == "" && a.Rate > 0 && tokens < 1 {
			at := now.Add(time.Duration((1 - tokens) / a.Rate * float64(time.Second)))
			out.Reason, out.RetryAt, blocked = "rate", at, at
		}
		if out.Reason == "" {
			out.OK, out.Probe = true, probe
			if a.Rate > 0 {
				tokens--
				if tokens < 1 {
					blocked = now.Add(time.Duration((1 - tokens) / a.Rate * float64(time.Second)))
				}
			}
		}
		probeTill := g.probeTill.Time
		if probe {
			probeTill = now.Add(a.SlotLease)
		}
		if _, err := q.ExecContext(ctx, s.Rebind(`UPDATE txhook_endpoint_gates
SET tokens = ?, refilled_at = ?, probe_until = ?, blocked_until = ? WHERE endpoint_id = ?`),
			tokens, s.nullT(refilled), s.nullT(probeTill), s.nullT(blocked), a.Endpoint); err != nil {
			return err
		}
		if out.OK && a.MaxInFlight > 0 {
			out.Slot = true
			_, err := q.ExecContext(ctx, s.Rebind(`INSERT INTO txhook_gate_slots (endpoint_id, relay, slots, expires_at) VALUES (?, ?, ?, ?)
ON CONFLICT (endpoint_id, relay) DO UPDATE SET slots = excluded.slots, expires_at = excluded.expires_at`),
				a.Endpoint, a.Relay, own+1, s.T(now.Add(a.SlotLease)))
			return err
		}
		return nil
	})
	return out, err
}

// GateFinish reports the end of a request the gate let through, or a
// receiver's answer to one it did not need to: it gives back the slot,
// and counts the fault or the answer toward the shared circuit, which a
// fault opens once Threshold faults come in a row (or the probe fails).
func (s *Store) GateFinish(ctx context.Context, f GateFinish) (GateState, error) {
	var st GateState
	err := s.Tx(ctx, func(q Querier) error {
		g, err := s.lockGate(ctx, q, f.Endpoint)
		if err != nil {
			return err
		}
		now := f.Now
		failures, cooldown := g.failures, g.cooldown
		openUntil, probeTill := g.openUntil.Time, g.probeTill.Time
		if f.Probe {
			probeTill = time.Time{}
		}
		switch {
		case f.Fault:
			failures++
			// A closed circuit opens at Threshold faults in a row; a
			// half-open one (opened before: cooldown set) only when its
			// probe fails. Other requests' faults then only count: were
			// each to reopen it, relays that send without asking (no
			// limits, no fault seen yet) would double the cooldown again
			// and again at a flaky receiver's random faults, and stall
			// it for minutes.
			if f.Threshold > 0 && !openUntil.After(now) && (f.Probe || cooldown == 0 && failures >= f.Threshold) {
				if cooldown == 0 {
					cooldown = f.Cooldown.Microseconds()
				} else {
					cooldown = min(2*cooldown, f.MaxCooldown.Microseconds())
				}
				openUntil = now.Add(time.Duration(cooldown) * time.Microsecond)
			}
		case f.Answered:
			failures, cooldown, openUntil, probeTill = 0, 0, time.Time{}, time.Time{}
		}
		var blocked any
		if openUntil.After(now) {
			blocked = s.T(openUntil)
		}
		if _, err := q.ExecContext(ctx, s.Rebind(`UPDATE txhook_endpoint_gates
SET failures = ?, cooldown_us = ?, open_until = ?, probe_until = ?, blocked_until = ? WHERE endpoint_id = ?`),
			failures, cooldown, s.nullT(openUntil), s.nullT(probeTill), blocked, f.Endpoint); err != nil {
			return err
		}
		if f.Slot {
			if _, err := q.ExecContext(ctx, s.Rebind(`UPDATE txhook_gate_slots SET slots = slots - 1
WHERE endpoint_id = ? AND relay = ? AND slots > 0`), f.Endpoint, f.Relay); err != nil {
				return err
			}
		}
		st = GateState{Failures: failures, Opened: cooldown > 0 || openUntil.After(now)}
		if openUntil.After(now) {
			st.OpenUntil = openUntil
		}
		return nil
	})
	return st, err
}

// GateSlots returns the slots of the endpoint's in-flight cap that relays
// hold now, for tests and the operations view.
func (s *Store) GateSlots(ctx context.Context, endpoint string, now time.Time) (int, error) {
	var n sql.NullInt64
	err := s.DB.QueryRowContext(ctx, s.Rebind(`SELECT SUM(slots) FROM txhook_gate_slots WHERE endpoint_id = ? AND expires_at > ?`),
		endpoint, s.T(now)).Scan(&n)
	return int(n.Int64), err
}

// GatePeek reads the endpoint's shared circuit without locking or
// writing anything: its faults in a row (0 when it has no gate row), and
// whether it has opened since its last answer (open, or half-open).
func (s *Store) GatePeek(ctx context.Context, endpoint string) (failures int, opened bool, err error) {
	var cooldown int64
	var openUntil Time
	err = s.DB.QueryRowContext(ctx, s.Rebind(`SELECT failures, cooldown_us, open_until FROM txhook_endpoint_gates WHERE endpoint_id = ?`), endpoint).Scan(&failures, &cooldown, &openUntil)
	if err == sql.ErrNoRows {
		return 0, false, nil
	}
	return failures, cooldown > 0 || !openUntil.IsZero(), err
}

// GateBlock marks the endpoint blocked until `until` (keeping a later
// mark): claims skip its deliveries meanwhile. A relay whose requests to
// the endpoint hang sets it; GateFinish clears it.
func (s *Store) GateBlock(ctx context.Context, endpoint string, until time.Time) error {
	var q string
	if s.Dialect == Postgres {
		q = `INSERT INTO txhook_endpoint_gates (endpoint_id, blocked_until) VALUES (?, ?)
ON CONFLICT (endpoint_id) DO UPDATE SET blocked_until = GREATEST(txhook_endpoint_gates.blocked_until, excluded.blocked_until)`
	} else {
		q = `INSERT INTO txhook_endpoint_gates (endpoint_id, blocked_until) VALUES (?, ?)
ON CONFLICT (endpoint_id) DO UPDATE SET blocked_until = max(COALESCE(txhook_endpoint_gates.blocked_until, 0), excluded.blocked_until)`
	}
	_, err := s.DB.ExecContext(ctx, s.Rebind(q), endpoint, s.T(until))
	return err
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
