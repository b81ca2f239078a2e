package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/txhook/txhook/outbox"
)

// drainTargets are the targets for the PostgreSQL drain, by
// concurrency.
var drainTargets = map[int]float64{16: 7000, 100: 12000}

// partDrain delivers a backlog to the local receiver at each concurrency,
// against the bare POST loop at the same concurrency, alternating rounds.
func partDrain(ctx context.Context, cfg config, rep *report, p *progress, rcv *receiver) error {
	var detail strings.Builder
	for _, conc := range cfg.DrainConc {
		bare, relay, err := drainRounds(ctx, cfg.DrainRounds, conc, cfg.DrainEvents, p, "postgres", rcv,
			func() (float64, error) { return pgDrain(ctx, cfg.DSN, rcv.URL, conc, cfg.DrainEvents) })
		if err != nil {
			return err
		}
		r := row{
			Part:     fmt.Sprintf("drain, PostgreSQL (pgx), %d in flight, %s backlog (deliveries/s)", conc, commas(int64(cfg.DrainEvents))),
			Value:    rate(median(relay)),
			Baseline: rate(median(bare)) + " (bare POST loop)",
			Ratio:    ratio(median(relay) / median(bare)),
		}
		if t, ok := drainTargets[conc]; ok {
			r.Target = "≥ " + rate(t) + "/s"
			r.Verdict = verdict(median(relay) >= t)
		}
		rep.add(r)
		fmt.Fprintf(&detail, "%d in flight, %d rounds\n  bare   /s: %s\n  txhook /s: %s\n", conc, len(relay), rates(bare), rates(relay))
	}
	rep.section("Drain rounds (PostgreSQL)", detail.String())
	return nil
}

// drainRounds alternates the bare loop and relayDrain, rounds times each.
func drainRounds(ctx context.Context, rounds, conc, events int, p *progress, label string, rcv *receiver, relayDrain func() (float64, error)) (bare, relay []float64, err error) {
	// Warm the receiver and the loopback path.
	if _, err := bareLoop(rcv.URL, conc, min(events, 2000)); err != nil {
		return nil, nil, err
	}
	for round := range rounds {
		var b, r float64
		first, second := func() error { var err error; b, err = bareLoop(rcv.URL, conc, events); return err },
			func() error { var err error; r, err = relayDrain(); return err }
		if round%2 == 1 {
			first, second = second, first
		}
		if err := first(); err != nil {
			return nil, nil, err
		}
		if err := second(); err != nil {
			return nil, nil, err
		}
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		bare, relay = append(bare, b), append(relay, r)
		p.logf("drain %s %d in flight round %d/%d: bare %s/s, txhook %s/s (%.2f×)", label, conc, round+1, rounds, rate(b), rate(r), r/b)
	}
	return bare, relay, nil
}

// pgDrain fills a fresh schema with n events for one endpoint at url, then
// starts a relay with conc requests in flight and returns deliveries per
// second from Start until the last outcome is written.
func pgDrain(ctx context.Context, dsn, url string, conc, n int) (float64, error) {
	s, err := newSchema(ctx, dsn, "pgx", 16, localOutbox())
	if err != nil {
		return 0, err
	}
	defer s.drop()
	return drainBacklog(ctx, s.db, s.ob, url, conc, n, true)
}

// drainBacklog enqueues n events for a new endpoint at url and times a
// relay (conc in flight, to that endpoint too; other settings default)
// delivering them, until Stats().Succeeded, which counts outcomes written
// back, reaches n.
func drainBacklog(ctx context.Context, db *sql.DB, ob *outbox.Outbox, url string, conc, n int, analyze bool) (float64, error) {
	tenant := "drain"
	if _, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: tenant, URL: url}); err != nil {
		return 0, err
	}
	if err := fillByEnqueue(ctx, db, ob, tenant, n); err != nil {
		return 0, err
	}
	if analyze {
		// The server may run with autovacuum off; a real outbox has
		// statistics.
		if _, err := db.ExecContext(ctx, "ANALYZE"); err != nil {
			return 0, err
		}
	}
	r, err := ob.NewRelay(outbox.RelayConfig{Concurrency: conc, EndpointConcurrency: conc})
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := r.Start(ctx); err != nil {
		return 0, err
	}
	deadline := start.Add(time.Duration(n)*time.Millisecond + time.Minute)
	for r.Stats().Succeeded < uint64(n) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			st := r.Stats()
			r.Stop(context.Background())
			return 0, fmt.Errorf("drain: %d of %d delivered before giving up (stats %+v)", st.Succeeded, n, st)
		}
		time.Sleep(time.Millisecond)
	}
	el := time.Since(start)
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := r.Stop(stopCtx); err != nil {
		return 0, err
	}
	if st := r.Stats(); st.Failed+st.DeadLettered > 0 {
		return 0, fmt.Errorf("drain: failed attempts against a no-op receiver: %+v", st)
	}
	return float64(n) / el.Seconds(), nil
}
