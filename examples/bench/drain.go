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

// Issue 12's targets: the drain at least half the bare POST loop's rate in
// the same run, and the PostgreSQL backends' CPU per delivery.
const (
	drainRatioTarget = 0.5
	pgCPUTarget      = 40.0
)

// drainResult is one timed drain: deliveries (or requests) per second and
// the CPU each cost, in µs, in this process (relay or bare loop, and the
// receiver) and in the PostgreSQL backends of the pool (0 for the bare loop
// and SQLite; negative when unknown).
type drainResult struct {
	rate, clientUS, serverUS float64
	// enq and drain are what filling the backlog and draining it wrote to
	// PostgreSQL (nil for SQLite and the bare loop).
	enq, drain *writes
}

func drainRates(rs []drainResult) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = r.rate
	}
	return out
}

// cpuSummary renders the median CPU per delivery of rs, or "".
func cpuSummary(rs []drainResult, server bool) string {
	var c, sv []float64
	for _, r := range rs {
		if r.clientUS < 0 || r.serverUS < 0 {
			return ""
		}
		c, sv = append(c, r.clientUS), append(sv, r.serverUS)
	}
	if server {
		return fmt.Sprintf("%.0f + %.0f", median(c), median(sv))
	}
	return fmt.Sprintf("%.0f", median(c))
}

// partDrain delivers a backlog to the local receiver at each concurrency,
// against the bare POST loop at the same concurrency, alternating rounds.
func partDrain(ctx context.Context, cfg config, rep *report, p *progress, rcv *receiver) error {
	if err := tableSettings(ctx, cfg.DSN, rep); err != nil {
		return err
	}
	var detail strings.Builder
	for _, conc := range cfg.DrainConc {
		bare, relay, err := drainRounds(ctx, cfg.DrainRounds, conc, cfg.DrainEvents, p, "postgres", rcv,
			func() (drainResult, error) {
				return pgDrain(ctx, cfg.DSN, rcv.URL, conc, cfg.DrainEvents, localOutbox())
			})
		if err != nil {
			return err
		}
		br, rr := median(drainRates(bare)), median(drainRates(relay))
		r := row{
			Part:     fmt.Sprintf("drain, PostgreSQL (pgx), %d in flight, %s backlog (deliveries/s)", conc, commas(int64(cfg.DrainEvents))),
			Value:    rate(rr),
			Baseline: rate(br) + " (bare POST loop)",
			Ratio:    ratio(rr / br),
		}
		if t, ok := drainTargets[conc]; ok {
			r.Target = fmt.Sprintf("≥ %s/s and ≥ %.1f×", rate(t), drainRatioTarget)
			r.Verdict = verdict(rr >= t && rr/br >= drainRatioTarget)
		}
		rep.add(r)
		if c := cpuSummary(relay, true); c != "" {
			var sv []float64
			for _, x := range relay {
				sv = append(sv, x.serverUS)
			}
			rep.add(row{
				Part:     fmt.Sprintf("… CPU per delivery, %d in flight: this process (relay, receiver) + its PostgreSQL backends (µs)", conc),
				Value:    c,
				Baseline: cpuSummary(bare, false) + " (bare loop, receiver)",
				Target:   fmt.Sprintf("PostgreSQL ≤ %.0f µs", pgCPUTarget),
				Verdict:  verdict(median(sv) <= pgCPUTarget),
			})
		}
		addWrites(rep, &detail, conc, relay, cfg.DrainEvents)
		fmt.Fprintf(&detail, "%d in flight, %d rounds\n  bare   /s: %s\n  txhook /s: %s\n", conc, len(relay), rates(drainRates(bare)), rates(drainRates(relay)))
	}
	if err := syncCommitRounds(ctx, cfg, rep, p, rcv, &detail); err != nil {
		return err
	}
	rep.section("Drain rounds (PostgreSQL)", detail.String())
	return nil
}

// syncCommitRounds drains at the first concurrency with the default relay
// commits (synchronous_commit off for the relays' own transactions) and
// with Config.SyncRelayCommits, alternating, and reports what waiting for
// each relay commit's WAL flush costs.
func syncCommitRounds(ctx context.Context, cfg config, rep *report, p *progress, rcv *receiver, detail *strings.Builder) error {
	if len(cfg.DrainConc) == 0 {
		return nil
	}
	conc := cfg.DrainConc[0]
	var async, sync []drainResult
	for round := range cfg.DrainRounds {
		arms := []bool{false, true}
		if round%2 == 1 {
			arms[0], arms[1] = true, false
		}
		for _, syncCommits := range arms {
			obCfg := localOutbox()
			obCfg.SyncRelayCommits = syncCommits
			r, err := pgDrain(ctx, cfg.DSN, rcv.URL, conc, cfg.DrainEvents, obCfg)
			if err != nil {
				return err
			}
			if syncCommits {
				sync = append(sync, r)
			} else {
				async = append(async, r)
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		p.logf("drain %d in flight round %d/%d: relay commits async %s/s (CPU %.0f + %.0f µs), SyncRelayCommits %s/s (CPU %.0f + %.0f µs)",
			conc, round+1, cfg.DrainRounds, rate(async[round].rate), async[round].clientUS, async[round].serverUS,
			rate(sync[round].rate), sync[round].clientUS, sync[round].serverUS)
	}
	ar, sr := median(drainRates(async)), median(drainRates(sync))
	rep.add(row{
		Part:     fmt.Sprintf("drain, PostgreSQL (pgx), %d in flight, Config.SyncRelayCommits (each relay commit waits for its WAL flush) (deliveries/s)", conc),
		Value:    rate(sr),
		Baseline: rate(ar) + " (default: relay commits asynchronous)",
		Ratio:    ratio(sr / ar),
	})
	if c := cpuSummary(sync, true); c != "" {
		rep.add(row{
			Part:     fmt.Sprintf("… CPU per delivery, %d in flight, SyncRelayCommits: this process + its PostgreSQL backends (µs)", conc),
			Value:    c,
			Baseline: cpuSummary(async, true) + " (default)",
		})
	}
	fmt.Fprintf(detail, "%d in flight, relay commits, %d rounds\n  default (async) /s: %s\n  SyncRelayCommits /s: %s\n",
		conc, len(async), rates(drainRates(async)), rates(drainRates(sync)))
	return nil
}

// tableSettings reports the per-table storage settings the migrations
// give txhook's tables (autovacuum thresholds, fill factors), read from a
// freshly migrated schema.
func tableSettings(ctx context.Context, dsn string, rep *report) error {
	s, err := newSchema(ctx, dsn, "pgx", 2, localOutbox())
	if err != nil {
		return err
	}
	defer s.drop()
	rows, err := s.db.QueryContext(ctx, `SELECT c.relname, array_to_string(c.reloptions, ', ') FROM pg_class c
WHERE c.relnamespace = $1::regnamespace AND c.reloptions IS NOT NULL ORDER BY c.relname`, s.name)
	if err != nil {
		return err
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var rel, opts string
		if err := rows.Scan(&rel, &opts); err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s: %s\n", rel, opts)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	rep.section("Per-table settings (from the migrations)", b.String())
	return nil
}

// walTarget is the target for the WAL one delivery writes (one
// endpoint, first attempt succeeds), enqueue included, in bytes.
const walTarget = 1400

// addWrites reports the median WAL per delivery of the rounds rs, enqueue
// and drain, and the rows each delivery wrote (from the last round), by
// table.
func addWrites(rep *report, detail *strings.Builder, conc int, rs []drainResult, n int) {
	var enq, drain, tot []float64
	var last drainResult
	for _, r := range rs {
		if r.enq == nil || r.drain == nil {
			return
		}
		e, d := float64(r.enq.wal)/float64(n), float64(r.drain.wal)/float64(n)
		enq, drain, tot = append(enq, e), append(drain, d), append(tot, e+d)
		last = r
	}
	if len(rs) == 0 {
		return
	}
	t := median(tot)
	rep.add(row{
		Part:    fmt.Sprintf("… WAL per delivery, %d in flight: enqueue + drain (bytes, 1 endpoint, first attempt succeeds)", conc),
		Value:   fmt.Sprintf("%.0f + %.0f = %.0f", median(enq), median(drain), t),
		Target:  fmt.Sprintf("≤ %s", commas(walTarget)),
		Verdict: verdict(t <= walTarget),
	})
	d := last.drain.total()
	rep.add(row{
		Part: fmt.Sprintf("… rows written per delivery by the drain, %d in flight: inserted + updated (of which HOT)", conc),
		Value: fmt.Sprintf("%.2f + %.2f (%.2f HOT)", float64(d.ins)/float64(n), float64(d.upd)/float64(n),
			float64(d.hot)/float64(n)),
	})
	fmt.Fprintf(detail, "%d in flight, rows per event, last round\n  enqueue: %s\n  drain:   %s\n", conc,
		last.enq.perTable(n), last.drain.perTable(n))
	if last.enq.records != nil && last.drain.records != nil {
		fmt.Fprintf(detail, "  WAL per event by record type (pg_walinspect; bytes, records), last round\n  enqueue: %s\n  drain:   %s\n",
			last.enq.byRecord(n), last.drain.byRecord(n))
	}
}

// drainRounds alternates the bare loop and relayDrain, rounds times each.
func drainRounds(ctx context.Context, rounds, conc, events int, p *progress, label string, rcv *receiver, relayDrain func() (drainResult, error)) (bare, relay []drainResult, err error) {
	// Warm the receiver and the loopback path.
	if _, err := bareLoop(rcv.URL, conc, min(events, 2000)); err != nil {
		return nil, nil, err
	}
	for round := range rounds {
		var b, r drainResult
		first := func() error {
			m := startCPU(ctx, nil, "")
			var err error
			if b.rate, err = bareLoop(rcv.URL, conc, events); err != nil {
				return err
			}
			b.clientUS = -1
			if c, _, ok := m.stop(ctx); ok {
				b.clientUS = c * 1e6 / float64(events)
			}
			return nil
		}
		second := func() error {
			var err error
			r, err = relayDrain()
			return err
		}
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
		p.logf("drain %s %d in flight round %d/%d: bare %s/s, txhook %s/s (%.2f×); CPU µs per delivery %.0f + %.0f, per bare request %.0f",
			label, conc, round+1, rounds, rate(b.rate), rate(r.rate), r.rate/b.rate, r.clientUS, r.serverUS, b.clientUS)
		if r.enq != nil && r.drain != nil {
			p.logf("  WAL per delivery: enqueue %d B + drain %d B; drain rows: %s", r.enq.wal/int64(events), r.drain.wal/int64(events), r.drain.perTable(events))
		}
	}
	return bare, relay, nil
}

// pgDrain fills a fresh schema (an outbox configured by obCfg) with n
// events for one endpoint at url, then starts a relay with conc requests
// in flight and returns deliveries per second from Start until the last
// outcome is written.
func pgDrain(ctx context.Context, dsn, url string, conc, n int, obCfg outbox.Config) (drainResult, error) {
	s, err := newSchema(ctx, dsn, "pgx", 16, obCfg)
	if err != nil {
		return drainResult{}, err
	}
	defer s.drop()
	return drainBacklog(ctx, s.db, s.name, s.ob, url, conc, n, true)
}

// drainBacklog enqueues n events for a new endpoint at url and times a
// relay (conc in flight, to that endpoint too; other settings default)
// delivering them, until Stats().Succeeded, which counts outcomes written
// back, reaches n. appName names the pool's PostgreSQL connections for the
// CPU count ("" for SQLite).
func drainBacklog(ctx context.Context, db *sql.DB, appName string, ob *outbox.Outbox, url string, conc, n int, analyze bool) (drainResult, error) {
	var res drainResult
	tenant := "drain"
	if _, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: tenant, URL: url}); err != nil {
		return res, err
	}
	var wm *writeMeter
	if appName != "" {
		var err error
		if wm, err = startWrites(ctx, db, appName); err != nil {
			return res, err
		}
	}
	if err := fillByEnqueue(ctx, db, ob, tenant, n); err != nil {
		return res, err
	}
	var enq *writes
	if wm != nil {
		w, err := wm.stop(ctx)
		if err != nil {
			return res, err
		}
		enq = &w
	}
	res, err := timeDrain(ctx, db, appName, ob, conc, n, analyze, wm != nil)
	res.enq = enq
	return res, err
}

// timeDrain times a relay (conc in flight, to each endpoint too; other
// settings default) delivering the n deliveries waiting in ob, until
// Stats().Succeeded, which counts outcomes written back, reaches n. With
// writes (PostgreSQL only) it also measures what the drain wrote.
func timeDrain(ctx context.Context, db *sql.DB, appName string, ob *outbox.Outbox, conc, n int, analyze, writes bool) (drainResult, error) {
	var res drainResult
	if analyze {
		// The server may run with autovacuum off; a real outbox has
		// statistics.
		if _, err := db.ExecContext(ctx, "ANALYZE"); err != nil {
			return res, err
		}
	}
	r, err := ob.NewRelay(outbox.RelayConfig{Concurrency: conc, EndpointConcurrency: conc})
	if err != nil {
		return res, err
	}
	var cpuDB *sql.DB
	var wm *writeMeter
	if appName != "" {
		cpuDB = db
	}
	if writes {
		if wm, err = startWrites(ctx, db, appName); err != nil {
			return res, err
		}
	}
	m := startCPU(ctx, cpuDB, appName)
	start := time.Now()
	if err := r.Start(ctx); err != nil {
		return res, err
	}
	deadline := start.Add(time.Duration(n)*time.Millisecond + time.Minute)
	for r.Stats().Succeeded < uint64(n) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			st := r.Stats()
			r.Stop(context.Background())
			return res, fmt.Errorf("drain: %d of %d delivered before giving up (stats %+v)", st.Succeeded, n, st)
		}
		time.Sleep(time.Millisecond)
	}
	el := time.Since(start)
	res.rate, res.clientUS, res.serverUS = float64(n)/el.Seconds(), -1, -1
	if c, sv, ok := m.stop(ctx); ok {
		res.clientUS, res.serverUS = c*1e6/float64(n), sv*1e6/float64(n)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := r.Stop(stopCtx); err != nil {
		return res, err
	}
	if st := r.Stats(); st.Failed+st.DeadLettered > 0 {
		return res, fmt.Errorf("drain: failed attempts against a no-op receiver: %+v", st)
	}
	if wm != nil {
		w, err := wm.stop(ctx)
		if err != nil {
			return res, err
		}
		res.drain = &w
	}
	return res, nil
}
