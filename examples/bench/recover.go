package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/outbox"
)

// The recover part: Outbox.Recover of one endpoint beside many other
// tenants' rows, with the index of unrouted events the migrations define
// against the one of migration 009 (dispatched_at only), alternating; the
// plans of Recover's two statements with each; and what each index costs
// an event dispatched to no endpoint, in WAL bytes.
//
// The other tenants' rows: RecoverRows events of RecoverTenants tenants
// spread over the last two days, half of them unrouted (their tenant had no
// endpoint) and half with one succeeded delivery each. The recovering
// tenant has two endpoints and 1,000 events of the last day that only the
// other endpoint received (800) or that no endpoint was sent (200): each
// Recover queues those 1,000 to the first endpoint; their deliveries are
// deleted again between rounds, untimed.

// recoverIndexes are the two arms' DDL: the index of unrouted events by
// tenant (migration 010), and the one of migration 009.
var recoverIndexes = []struct{ name, create, drop string }{
	{"tenant index (migration 010)", `CREATE INDEX IF NOT EXISTS txhook_events_unrouted_tenant ON txhook_events (tenant, dispatched_at) WHERE unrouted`,
		`DROP INDEX IF EXISTS txhook_events_unrouted_tenant`},
	{"dispatched_at index (migration 009)", `CREATE INDEX IF NOT EXISTS txhook_events_unrouted ON txhook_events (dispatched_at) WHERE unrouted`,
		`DROP INDEX IF EXISTS txhook_events_unrouted`},
}

func partRecover(ctx context.Context, cfg config, rep *report, p *progress) error {
	s, err := newSchema(ctx, cfg.DSN, "pgx", 4, localOutbox())
	if err != nil {
		return err
	}
	defer s.drop()
	now := time.Now().UTC()
	p.logf("recover: filling %s events of %d other tenants", commas(int64(cfg.RecoverRows)), cfg.RecoverTenants)
	for _, q := range []string{
		`INSERT INTO txhook_endpoints (id, tenant, url, secrets, created_at, updated_at)
SELECT 'ep_o' || t, 'tenant_' || t, 'https://example.com/hook', '[]', $1, $1 FROM generate_series(0, $2::int - 1) t
WHERE $3::int > 0`,
		// Half unrouted, half with a delivery; one event every 2 days / n.
		`INSERT INTO txhook_events (id, tenant, type, payload, created_at, dispatched_at, unrouted)
SELECT 'evt_o' || i, 'tenant_' || (i % $2::int), 'payment.succeeded', '{}', at, at, CASE WHEN i % 2 = 0 THEN true END
FROM generate_series(1, $3::int) i,
     LATERAL (SELECT $1::timestamptz - interval '48 hours' + (i::bigint * 172800000000 / $3::int) * interval '1 microsecond' AS at) x`,
		`INSERT INTO txhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at, last_status, created_at, updated_at)
SELECT e.id, 'ep_o' || substr(e.tenant, 8), 'succeeded', 1, e.created_at, 200, e.created_at, e.created_at
FROM txhook_events e WHERE e.unrouted IS NULL AND $1::timestamptz IS NOT NULL AND $2::int > 0 AND $3::int > 0`,
	} {
		if _, err := s.db.ExecContext(ctx, q, now, cfg.RecoverTenants, cfg.RecoverRows); err != nil {
			return fmt.Errorf("fill: %w", err)
		}
	}
	target, err := s.ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "merchant_r", URL: "http://127.0.0.1:9/a"})
	if err != nil {
		return err
	}
	other, err := s.ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "merchant_r", URL: "http://127.0.0.1:9/b"})
	if err != nil {
		return err
	}
	const mine = 1000
	if _, err := s.db.ExecContext(ctx, `INSERT INTO txhook_events (id, tenant, type, payload, created_at, dispatched_at, unrouted)
SELECT 'evt_r' || i, 'merchant_r', 'payment.succeeded', '{}', at, at, CASE WHEN i % 5 = 0 THEN true END
FROM generate_series(1, $2::int) i,
     LATERAL (SELECT $1::timestamptz - interval '23 hours' + (i::bigint * 82800000000 / $2::int) * interval '1 microsecond' AS at) x`, now, mine); err != nil {
		return fmt.Errorf("fill: %w", err)
	}
	if _, err := s.db.ExecContext(ctx, `INSERT INTO txhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at, last_status, created_at, updated_at)
SELECT e.id, $1, 'succeeded', 1, e.created_at, 200, e.created_at, e.created_at
FROM txhook_events e WHERE e.tenant = 'merchant_r' AND e.unrouted IS NULL`, other.ID); err != nil {
		return fmt.Errorf("fill: %w", err)
	}
	if _, err := s.db.ExecContext(ctx, `VACUUM ANALYZE txhook_events, txhook_deliveries, txhook_endpoints`); err != nil {
		return err
	}
	var events, deliveries int64
	if err := s.db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM txhook_events), (SELECT count(*) FROM txhook_deliveries)`).Scan(&events, &deliveries); err != nil {
		return err
	}
	since := now.Add(-24 * time.Hour)
	use := func(arm int) error {
		for i, x := range recoverIndexes {
			q := x.drop
			if i == arm {
				q = x.create
			}
			if _, err := s.db.ExecContext(ctx, q); err != nil {
				return err
			}
		}
		_, err := s.db.ExecContext(ctx, `ANALYZE txhook_events`)
		return err
	}
	once := func() (time.Duration, error) {
		t0 := time.Now()
		n, err := s.ob.Recover(ctx, target.ID, since)
		took := time.Since(t0)
		if err != nil {
			return 0, err
		}
		if n != mine {
			return 0, fmt.Errorf("recover queued %d, want %d", n, mine)
		}
		_, err = s.db.ExecContext(ctx, `DELETE FROM txhook_deliveries WHERE endpoint_id = $1`, target.ID)
		return took, err
	}
	times := make([][]float64, len(recoverIndexes))
	for round := range cfg.RecoverRounds {
		for k := range recoverIndexes {
			arm := (k + round) % len(recoverIndexes)
			if err := use(arm); err != nil {
				return err
			}
			if _, err := once(); err != nil { // warm the caches
				return err
			}
			for range 3 {
				d, err := once()
				if err != nil {
					return err
				}
				times[arm] = append(times[arm], float64(d))
			}
		}
	}
	st := store.New(s.db, store.Postgres)
	next, cand := st.RecoverStatements(target.ID, since, since.Add(-store.RecoverSlack), now.Add(store.RecoverSlack), 10001)
	var plans strings.Builder
	for arm, x := range recoverIndexes {
		if err := use(arm); err != nil {
			return err
		}
		for _, e := range []struct {
			title string
			st    store.Statement
		}{
			{"RecoverNext", next},
			{"RecoverCandidates, the whole day in one window", cand},
		} {
			plan, err := explainStatement(ctx, s, e.st)
			if err != nil {
				return fmt.Errorf("explain %s: %w", e.title, err)
			}
			fmt.Fprintf(&plans, "-- %s, %s:\n%s\n", e.title, x.name, plan)
		}
	}
	tw, tb := median(times[0]), median(times[1])
	rep.add(row{
		Part: fmt.Sprintf("Recover(endpoint, a day ago), %d events to queue, beside %s events and %s deliveries of %d other tenants (median)",
			mine, commas(events-mine), commas(deliveries-mine*4/5), cfg.RecoverTenants),
		Value:    ms(time.Duration(tw)) + " (" + recoverIndexes[0].name + ")",
		Baseline: ms(time.Duration(tb)) + " (" + recoverIndexes[1].name + ")",
		Ratio:    ratio(tw / tb),
	})
	rep.section("Recover: EXPLAIN (ANALYZE, BUFFERS) with each index", plans.String())
	rep.section("Recover rounds (ms, each index in turn)", fmt.Sprintf("%s: %s\n%s: %s\n",
		recoverIndexes[0].name, msStats(times[0]), recoverIndexes[1].name, msStats(times[1])))
	return recoverWAL(ctx, cfg, rep, p)
}

// explainStatement runs EXPLAIN (ANALYZE, BUFFERS) of st.
func explainStatement(ctx context.Context, s *pgSchema, st store.Statement) (string, error) {
	rows, err := s.db.QueryContext(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+st.SQL, st.Args...)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return "", err
		}
		b.WriteString(line + "\n")
	}
	return b.String(), rows.Err()
}

// recoverWAL measures the WAL an event dispatched to no endpoint costs,
// enqueue and dispatch, with each index, alternating rounds on fresh
// schemas.
func recoverWAL(ctx context.Context, cfg config, rep *report, p *progress) error {
	n := cfg.RecoverWALEvents
	wal := make([][]float64, len(recoverIndexes))
	for round := range cfg.RecoverRounds {
		for k := range recoverIndexes {
			arm := (k + round) % len(recoverIndexes)
			b, err := unroutedWAL(ctx, cfg, arm, n)
			if err != nil {
				return err
			}
			wal[arm] = append(wal[arm], b)
			p.logf("recover: WAL per unrouted event, %s: %.0f B", recoverIndexes[arm].name, b)
		}
	}
	a, b := median(wal[0]), median(wal[1])
	rep.add(row{
		Part:     fmt.Sprintf("… WAL per event dispatched to no endpoint (unrouted), enqueue + dispatch, %s events (bytes, median)", commas(int64(n))),
		Value:    fmt.Sprintf("%.0f (%s)", a, recoverIndexes[0].name),
		Baseline: fmt.Sprintf("%.0f (%s)", b, recoverIndexes[1].name),
		Ratio:    ratio(a / b),
	})
	return nil
}

// unroutedWAL enqueues n events of a tenant with no endpoint on a fresh
// schema with the index of arm, lets a relay dispatch them and returns
// the WAL bytes per event.
func unroutedWAL(ctx context.Context, cfg config, arm, n int) (float64, error) {
	s, err := newSchema(ctx, cfg.DSN, "pgx", 8, outbox.Config{})
	if err != nil {
		return 0, err
	}
	defer s.drop()
	for i, x := range recoverIndexes {
		q := x.drop
		if i == arm {
			q = x.create
		}
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			return 0, err
		}
	}
	m, err := startWrites(ctx, s.db, s.name)
	if err != nil {
		return 0, err
	}
	if err := fillByEnqueue(ctx, s.db, s.ob, "merchant_none", n); err != nil {
		return 0, err
	}
	r, err := s.ob.NewRelay(outbox.RelayConfig{})
	if err != nil {
		return 0, err
	}
	if err := r.Start(ctx); err != nil {
		return 0, err
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var left int
		if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM txhook_events WHERE dispatched_at IS NULL`).Scan(&left); err != nil {
			r.Stop(ctx)
			return 0, err
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			r.Stop(ctx)
			return 0, fmt.Errorf("%d events still undispatched after 5 minutes", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := r.Stop(ctx); err != nil {
		return 0, err
	}
	w, err := m.stop(ctx)
	if err != nil {
		return 0, err
	}
	return float64(w.wal) / float64(n), nil
}
