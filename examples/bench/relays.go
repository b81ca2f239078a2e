package main

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txhook/txhook/internal/pgcluster"
	"github.com/txhook/txhook/outbox"
)

// The relays part runs 1, 2 and 4 relay processes (this program started
// again in relay mode, default relay settings each) on one PostgreSQL
// cluster of its own, started by internal/pgcluster with its Production
// settings and pg_stat_statements, so that WAL, the server's CPU and its
// statement counts are this part's alone. Two loads: a backlog drained as
// fast as the relays go, and a steady enqueue rate.

// relaysSettings are the cluster's settings: Production plus
// pg_stat_statements, which counts the claim statements.
func relaysSettings() map[string]string {
	s := pgcluster.Production()
	s["shared_preload_libraries"] = "pg_stat_statements"
	s["pg_stat_statements.max"] = "1000"
	return s
}

// relaysTables are the tables whose writes and size are reported.
var relaysTables = []string{"txhook_events", "txhook_deliveries", "txhook_attempts"}

// relaysRun is one timed run of n relay processes.
type relaysRun struct {
	relays, events int
	steady         bool
	took           time.Duration
	rate           float64 // deliveries per second
	pgUS, relayUS  float64 // CPU per delivery: every process of the cluster; the relay processes
	walB           float64 // WAL bytes per delivery (for steady runs, enqueue included)
	rows           map[string][3]float64
	sizes          map[string]float64 // total relation size per event, bytes
	polls, empty   uint64
	claimed        uint64
	released, lost uint64
	perRelay       []uint64
	waits          map[string]int // wait events seen on the relays' active backends
	samples        int            // active-backend samples taken
	claimSamples   int            // of which claim statements
	claimLockWaits int            // of which waiting on a lock
	claimLocks     map[string]int // those by lock type
	statements     []stmtStat
	lagEnd         time.Duration // steady: last delivery after the last commit
}

type stmtStat struct {
	query      string
	calls      int64
	rows       int64
	totalMS    float64
	walBytes   float64
	sharedHits int64
}

// partRelays runs the relays part.
func partRelays(ctx context.Context, cfg config, rep *report, p *progress, rcv *receiver) error {
	if _, err := pgcluster.Available(); err != nil {
		rep.note("relays part skipped: %v", err)
		return nil
	}
	c, err := pgcluster.Start(ctx, pgcluster.Options{Settings: relaysSettings(), Logf: p.logf})
	if err != nil {
		return err
	}
	defer c.Close()
	set, err := c.ShowSettings(ctx)
	if err != nil {
		return err
	}
	var sb strings.Builder
	for _, s := range set {
		sb.WriteString(s.String() + "\n")
	}
	rep.section("Relays part: cluster settings (internal/pgcluster Production + pg_stat_statements)", sb.String())
	base := c.DSN("postgres")
	admin, err := sql.Open("pgx", base)
	if err != nil {
		return err
	}
	defer admin.Close()
	admin.SetMaxOpenConns(2)
	if _, err := admin.ExecContext(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		return err
	}
	var backlog, steady = map[int][]relaysRun{}, map[int][]relaysRun{}
	for round := range cfg.RelaysRounds {
		counts := append([]int(nil), cfg.RelaysCounts...)
		if round%2 == 1 {
			sort.Sort(sort.Reverse(sort.IntSlice(counts)))
		}
		for _, kind := range []struct {
			name   string
			steady bool
			runs   map[int][]relaysRun
		}{{"backlog", false, backlog}, {"steady", true, steady}} {
			for _, n := range counts {
				r, err := relaysOnce(ctx, cfg, admin, base, rcv, n, kind.steady, p)
				if err != nil {
					return fmt.Errorf("%d relays, %s: %w", n, kind.name, err)
				}
				kind.runs[n] = append(kind.runs[n], r)
				p.logf("relays %s round %d/%d, %d relays: %s/s delivered; CPU µs per delivery PostgreSQL %.0f, relays %.0f; WAL %.0f B; polls %d (empty %d)",
					kind.name, round+1, cfg.RelaysRounds, n, rate(r.rate), r.pgUS, r.relayUS, r.walB, r.polls, r.empty)
			}
		}
	}
	relaysReport(cfg, rep, backlog, steady)
	return nil
}

func med(rs []relaysRun, f func(relaysRun) float64) float64 {
	xs := make([]float64, len(rs))
	for i, r := range rs {
		xs[i] = f(r)
	}
	return median(xs)
}

func relaysReport(cfg config, rep *report, backlog, steady map[int][]relaysRun) {
	one := cfg.RelaysCounts[0]
	base := med(backlog[one], func(r relaysRun) float64 { return r.rate })
	for _, n := range cfg.RelaysCounts {
		rs := backlog[n]
		rt := med(rs, func(r relaysRun) float64 { return r.rate })
		x := row{
			Part:  fmt.Sprintf("relays: %d relay process(es), default settings, draining %s events (deliveries/s)", n, commas(int64(cfg.RelaysEvents))),
			Value: rate(rt),
		}
		if n != one {
			x.Baseline, x.Ratio = rate(base)+fmt.Sprintf(" (%d relay)", one), ratio(rt/base)
		}
		rep.add(x)
		rep.add(row{
			Part: fmt.Sprintf("… %d relay(s): CPU per delivery, PostgreSQL (all server processes) + relay processes (µs); WAL per delivery; polls per 1,000 deliveries (empty); claim statements seen waiting on a lock", n),
			Value: fmt.Sprintf("%.0f + %.0f µs; %.0f B; %.1f (%.1f); %s",
				med(rs, func(r relaysRun) float64 { return r.pgUS }), med(rs, func(r relaysRun) float64 { return r.relayUS }),
				med(rs, func(r relaysRun) float64 { return r.walB }),
				med(rs, func(r relaysRun) float64 { return 1000 * float64(r.polls) / float64(r.events) }),
				med(rs, func(r relaysRun) float64 { return 1000 * float64(r.empty) / float64(r.events) }), claimLocks(rs)),
		})
	}
	for _, n := range cfg.RelaysCounts {
		rs := steady[n]
		rep.add(row{
			Part: fmt.Sprintf("relays: %d relay(s) at a steady %s events/s for %s: delivered/s; CPU per event PostgreSQL + relays (µs, enqueue included); WAL per event; polls per 1,000 events (empty); claim statements seen waiting on a lock",
				n, commas(int64(cfg.RelaysRate)), cfg.RelaysSteady),
			Value: fmt.Sprintf("%s/s; %.0f + %.0f µs; %.0f B; %.0f (%.0f); %s",
				rate(med(rs, func(r relaysRun) float64 { return r.rate })),
				med(rs, func(r relaysRun) float64 { return r.pgUS }), med(rs, func(r relaysRun) float64 { return r.relayUS }),
				med(rs, func(r relaysRun) float64 { return r.walB }),
				med(rs, func(r relaysRun) float64 { return 1000 * float64(r.polls) / float64(r.events) }),
				med(rs, func(r relaysRun) float64 { return 1000 * float64(r.empty) / float64(r.events) }), claimLocks(rs)),
		})
	}
	var d strings.Builder
	for _, kind := range []struct {
		name string
		runs map[int][]relaysRun
	}{{"backlog", backlog}, {"steady", steady}} {
		for _, n := range cfg.RelaysCounts {
			for i, r := range kind.runs[n] {
				fmt.Fprintf(&d, "%s, %d relay(s), round %d: %d events in %s = %s/s", kind.name, n, i+1, r.events, r.took.Round(time.Millisecond), rate(r.rate))
				if r.steady {
					fmt.Fprintf(&d, " (last delivery %s after the last commit)", ms(r.lagEnd))
				}
				fmt.Fprintf(&d, "\n  per relay delivered %v; claimed %d, released %d, lease lost %d; polls %d, empty %d (%.0f%%)\n",
					r.perRelay, r.claimed, r.released, r.lost, r.polls, r.empty, pct(r.empty, r.polls))
				fmt.Fprintf(&d, "  CPU per delivery: PostgreSQL %.0f µs, relays %.0f µs; WAL %.0f B\n", r.pgUS, r.relayUS, r.walB)
				fmt.Fprintf(&d, "  rows written per delivery (insert/update/delete):")
				for _, t := range relaysTables {
					w := r.rows[t]
					fmt.Fprintf(&d, " %s %.2f/%.2f/%.2f", strings.TrimPrefix(t, "txhook_"), w[0], w[1], w[2])
				}
				fmt.Fprintf(&d, "\n  table + indexes + TOAST per event after the run (pg_total_relation_size, no manual VACUUM):")
				for _, t := range relaysTables {
					fmt.Fprintf(&d, " %s %.0f B", strings.TrimPrefix(t, "txhook_"), r.sizes[t])
				}
				fmt.Fprintf(&d, "\n  backends sampled active %d times, claim statements %d times (waiting on a lock %d:%s)\n  most frequent waits:%s\n",
					r.samples, r.claimSamples, r.claimLockWaits, strings.ReplaceAll(waitSummary(r.claimLocks), "\n   ", ""), waitSummary(r.waits))
				for _, s := range r.statements {
					fmt.Fprintf(&d, "  %6.1f calls/1k deliveries, %6.1f rows/call, %.3f ms/call, %5.0f B WAL/call: %s\n",
						1000*float64(s.calls)/float64(r.events), float64(s.rows)/float64(max(s.calls, 1)), s.totalMS/float64(max(s.calls, 1)),
						s.walBytes/float64(max(s.calls, 1)), s.query)
				}
			}
		}
	}
	rep.section("Relay processes (one PostgreSQL cluster of their own)", d.String())
}

// claimLocks sums, over rs, the claim statements sampled waiting on a lock
// and all claim samples.
func claimLocks(rs []relaysRun) string {
	var w, n int
	for _, r := range rs {
		w, n = w+r.claimLockWaits, n+r.claimSamples
	}
	return fmt.Sprintf("%d of %d samples", w, n)
}

func pct(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

func waitSummary(w map[string]int) string {
	if len(w) == 0 {
		return "nothing"
	}
	type kv struct {
		k string
		v int
	}
	var xs []kv
	for k, v := range w {
		xs = append(xs, kv{k, v})
	}
	sort.Slice(xs, func(i, j int) bool { return xs[i].v > xs[j].v || xs[i].v == xs[j].v && xs[i].k < xs[j].k })
	var b strings.Builder
	for i, x := range xs {
		if i == 8 {
			break
		}
		fmt.Fprintf(&b, "\n    %5d %s", x.v, x.k)
	}
	return b.String()
}

// relaysOnce runs n relay processes on a fresh schema: on a backlog of
// cfg.RelaysEvents, or (steady) while cfg.RelaysRate events a second are
// enqueued for cfg.RelaysSteady.
func relaysOnce(ctx context.Context, cfg config, admin *sql.DB, base string, rcv *receiver, n int, steady bool, p *progress) (relaysRun, error) {
	res := relaysRun{relays: n, steady: steady}
	s, err := newSchema(ctx, base, "pgx", 16, localOutbox())
	if err != nil {
		return res, err
	}
	defer s.drop()
	if _, err := s.ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "relays", URL: rcv.URL}); err != nil {
		return res, err
	}
	total := cfg.RelaysEvents
	if steady {
		total = int(cfg.RelaysSteady.Seconds() * float64(cfg.RelaysRate))
	} else if err := fillByEnqueue(ctx, s.db, s.ob, "relays", total); err != nil {
		return res, err
	}
	res.events = total
	// Close the filling connections, so that their table counts are
	// flushed before the first snapshot (a backend flushes them at exit).
	s.db.SetMaxIdleConns(0)
	if err := waitBackendsGone(ctx, admin, s.name); err != nil {
		return res, err
	}
	s.db.SetMaxIdleConns(16)

	relayDSN, err := withParams(s.dsn, map[string]string{"application_name": s.name + "_relay"})
	if err != nil {
		return res, err
	}
	procs, err := startRelayProcs(ctx, relayDSN, n)
	if err != nil {
		return res, err
	}
	defer func() {
		for _, pr := range procs {
			pr.kill()
		}
	}()
	postmaster, err := postmasterPID(ctx, admin)
	if err != nil {
		return res, err
	}
	rowsBefore, err := tableWrites(ctx, admin, s.name)
	if err != nil {
		return res, err
	}
	if _, err := admin.ExecContext(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
		return res, err
	}
	var lsn0 string
	if err := admin.QueryRowContext(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn0); err != nil {
		return res, err
	}
	pg0 := clusterTicks(postmaster)
	relay0 := int64(0)
	for _, pr := range procs {
		relay0 += procTicks(pr.cmd.Process.Pid)
	}
	smp := startWaitSampler(ctx, admin, s.name)
	start := time.Now()
	for _, pr := range procs {
		if _, err := io.WriteString(pr.stdin, "go\n"); err != nil {
			return res, err
		}
	}
	var genDone chan error
	var lastCommit atomic.Int64
	if steady {
		genDone = make(chan error, 1)
		go func() { genDone <- steadyEnqueue(ctx, s, total, cfg.RelaysRate, start, &lastCommit) }()
	}
	delivered := func() uint64 {
		var sum uint64
		for _, pr := range procs {
			sum += pr.stats().succeeded
		}
		return sum
	}
	deadline := start.Add(time.Duration(total)*time.Millisecond + 2*time.Minute)
	lastLog := time.Now()
	for delivered() < uint64(total) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			smp.stop()
			return res, fmt.Errorf("%d of %d delivered before giving up", delivered(), total)
		}
		if genDone != nil {
			select {
			case err := <-genDone:
				if err != nil {
					smp.stop()
					return res, err
				}
				genDone = nil
			default:
			}
		}
		if time.Since(lastLog) > 5*time.Second {
			lastLog = time.Now()
			p.logf("relays %d: %d of %d delivered", n, delivered(), total)
		}
		time.Sleep(2 * time.Millisecond)
	}
	res.took = time.Since(start)
	if steady {
		if genDone != nil {
			if err := <-genDone; err != nil {
				return res, err
			}
		}
		res.lagEnd = res.took - time.Duration(lastCommit.Load())
	}
	pg1 := clusterTicks(postmaster)
	relay1 := int64(0)
	for _, pr := range procs {
		relay1 += procTicks(pr.cmd.Process.Pid)
	}
	var walBytes float64
	if err := admin.QueryRowContext(ctx, "SELECT pg_current_wal_lsn() - $1::pg_lsn", lsn0).Scan(&walBytes); err != nil {
		return res, err
	}
	smp.stop()
	res.waits, res.samples, res.claimSamples, res.claimLockWaits, res.claimLocks = smp.waits, smp.samples, smp.claimSamples, smp.claimLockWaits, smp.claimLocks
	res.rate = float64(total) / res.took.Seconds()
	res.pgUS = float64(pg1-pg0) / clockTicks * 1e6 / float64(total)
	res.relayUS = float64(relay1-relay0) / clockTicks * 1e6 / float64(total)
	res.walB = walBytes / float64(total)
	if res.statements, err = claimStatements(ctx, admin); err != nil {
		return res, err
	}

	// Stop the relays; their backends flush their table counts at exit.
	for _, pr := range procs {
		st, err := pr.stop()
		if err != nil {
			return res, err
		}
		res.perRelay = append(res.perRelay, st.succeeded)
		res.claimed += st.claimed
		res.polls += st.polls
		res.empty += st.empty
		res.released += st.released
		res.lost += st.lost
	}
	s.db.SetMaxIdleConns(0)
	for _, app := range []string{s.name, s.name + "_relay"} {
		if err := waitBackendsGone(ctx, admin, app); err != nil {
			return res, err
		}
	}
	rowsAfter, err := tableWrites(ctx, admin, s.name)
	if err != nil {
		return res, err
	}
	res.rows = map[string][3]float64{}
	for _, t := range relaysTables {
		a, b := rowsAfter[t], rowsBefore[t]
		res.rows[t] = [3]float64{float64(a[0]-b[0]) / float64(total), float64(a[1]-b[1]) / float64(total), float64(a[2]-b[2]) / float64(total)}
	}
	res.sizes = map[string]float64{}
	for _, t := range relaysTables {
		var sz int64
		if err := admin.QueryRowContext(ctx, "SELECT pg_total_relation_size(($1 || '.' || $2)::regclass)", s.name, t).Scan(&sz); err != nil {
			return res, err
		}
		res.sizes[t] = float64(sz) / float64(total)
	}
	return res, nil
}

// steadyEnqueue commits total events, one per transaction, at perSec a
// second on an open-loop schedule from 16 goroutines; lastCommit receives
// the time of the last commit since start.
func steadyEnqueue(ctx context.Context, s *pgSchema, total, perSec int, start time.Time, lastCommit *atomic.Int64) error {
	period := time.Second / time.Duration(perSec)
	jobs := make(chan int, total)
	var wg sync.WaitGroup
	var once sync.Once
	var firstErr error
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				err := inTx(ctx, s.db, func(tx *sql.Tx) error {
					_, err := s.ob.Enqueue(ctx, tx, outbox.Event{Tenant: "relays", Type: "payment.succeeded", Payload: benchPayload})
					return err
				})
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				at := int64(time.Since(start))
				for {
					old := lastCommit.Load()
					if at <= old || lastCommit.CompareAndSwap(old, at) {
						break
					}
				}
			}
		}()
	}
	for next := 0; next < total && ctx.Err() == nil; {
		due := min(total, int(time.Since(start)/period)+1)
		for ; next < due; next++ {
			jobs <- next
		}
		time.Sleep(time.Until(start.Add(time.Duration(next) * period)))
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// waitBackendsGone waits until no backend runs with application_name
// appName.
func waitBackendsGone(ctx context.Context, admin *sql.DB, appName string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		pids, err := backends(ctx, admin, appName)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d backends of %s still connected", len(pids), appName)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tableWrites returns inserted, updated and deleted rows per table of
// schema, as the statistics system has them.
func tableWrites(ctx context.Context, admin *sql.DB, schema string) (map[string][3]int64, error) {
	// A new transaction sees fresh counts (stats_fetch_consistency cache).
	rows, err := admin.QueryContext(ctx, `SELECT relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables WHERE schemaname = $1`, schema)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][3]int64{}
	for rows.Next() {
		var name string
		var w [3]int64
		if err := rows.Scan(&name, &w[0], &w[1], &w[2]); err != nil {
			return nil, err
		}
		out[name] = w
	}
	return out, rows.Err()
}

// claimStatements returns what pg_stat_statements counted for the relays'
// statements since the reset, most time first.
func claimStatements(ctx context.Context, admin *sql.DB) ([]stmtStat, error) {
	rows, err := admin.QueryContext(ctx, `SELECT regexp_replace(left(query, 200), '\s+', ' ', 'g'), calls, rows, total_exec_time, wal_bytes::float8, shared_blks_hit
FROM pg_stat_statements
WHERE query ~ 'txhook_' AND query !~* '^\s*(select pg_|create|drop|analyze|vacuum)'
ORDER BY total_exec_time DESC LIMIT 12`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []stmtStat
	for rows.Next() {
		var s stmtStat
		if err := rows.Scan(&s.query, &s.calls, &s.rows, &s.totalMS, &s.walBytes, &s.sharedHits); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// postmasterPID returns the pid of the server's postmaster (the parent of
// a backend).
func postmasterPID(ctx context.Context, admin *sql.DB) (int, error) {
	var pid int
	if err := admin.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return 0, err
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return strconv.Atoi(f[1])
}

// clusterTicks adds up the CPU ticks of the postmaster and its children
// (backends, autovacuum, WAL writer, checkpointer...). A process that
// exits between two readings takes its ticks with it; the relays keep
// their connections for the whole run.
func clusterTicks(postmaster int) int64 {
	total := procTicks(postmaster)
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(postmaster) {
			if t := procTicks(pid); t > 0 {
				total += t
			}
		}
	}
	return total
}

// waitSampler samples the wait events of the active backends of a run
// (application_name appName for the enqueuing pool, appName_relay for the
// relay processes) every 10 ms: lock waits show statements queueing on
// each other's rows, which SKIP LOCKED keeps out of the claims.
type waitSampler struct {
	cancel  context.CancelFunc
	done    chan struct{}
	waits   map[string]int
	samples int
	// claimSamples counts samples of claim statements (FOR UPDATE SKIP
	// LOCKED) and claimLockWaits those waiting on a heavyweight lock.
	claimSamples, claimLockWaits int
	claimLocks                   map[string]int // claim lock waits by lock type
}

func startWaitSampler(ctx context.Context, admin *sql.DB, appName string) *waitSampler {
	ctx, cancel := context.WithCancel(ctx)
	w := &waitSampler{cancel: cancel, done: make(chan struct{}), waits: map[string]int{}, claimLocks: map[string]int{}}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			// Who waits (relay or enqueue connections), on what, in which
			// statement (its first words).
			rows, err := admin.QueryContext(ctx, `SELECT CASE WHEN application_name = $1 THEN 'enqueue'
        WHEN query LIKE '%SKIP LOCKED%' THEN 'relay claim' ELSE 'relay' END,
    wait_event_type || ':' || wait_event, regexp_replace(left(query, 24), '\s+', ' ', 'g')
FROM pg_stat_activity
WHERE application_name IN ($1, $1 || '_relay') AND state = 'active' AND pid <> pg_backend_pid()`, appName)
			if err != nil {
				continue
			}
			for rows.Next() {
				var who, q string
				var ev sql.NullString
				if rows.Scan(&who, &ev, &q) == nil {
					w.samples++
					if who == "relay claim" {
						w.claimSamples++
						if strings.HasPrefix(ev.String, "Lock:") {
							w.claimLockWaits++
							w.claimLocks[ev.String]++
						}
					}
					if ev.Valid {
						w.waits[who+" "+ev.String+" in \""+q+"…\""]++
					}
				}
			}
			rows.Close()
		}
	}()
	return w
}

func (w *waitSampler) stop() *waitSampler {
	w.cancel()
	<-w.done
	return w
}

// relayProc is a relay process started by startRelayProcs.
type relayProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	last  atomic.Pointer[procStats]
	lines chan struct{} // closed when its stdout ends
}

// procStats are a child's counts; forwarded (broker children) is the
// events its forwarder has forwarded.
type procStats struct{ succeeded, claimed, polls, empty, released, lost, forwarded uint64 }

func (pr *relayProc) stats() procStats {
	if s := pr.last.Load(); s != nil {
		return *s
	}
	return procStats{}
}

// envChildID names a relay process of the relays part.
const envChildID = "TXHOOK_BENCH_CHILD_ID"

// startRelayProcs starts n relay processes on dsn and waits until each is
// ready to start its relay (on "go").
func startRelayProcs(ctx context.Context, dsn string, n int) ([]*relayProc, error) {
	return startChildProcs(ctx, n, func(i int) []string {
		return []string{envChild + "=relays", envChildDSN + "=" + dsn, envChildID + "=bench-relay-" + strconv.Itoa(i)}
	})
}

// startChildProcs starts n child processes of this program with the
// environment env(i) adds and waits until each is ready (on "go" it
// starts; "stats" lines report its counts).
func startChildProcs(ctx context.Context, n int, env func(i int) []string) ([]*relayProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var procs []*relayProc
	fail := func(err error) ([]*relayProc, error) {
		for _, pr := range procs {
			pr.kill()
		}
		return nil, err
	}
	for i := range n {
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), env(i)...)
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return fail(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return fail(err)
		}
		if err := cmd.Start(); err != nil {
			return fail(err)
		}
		pr := &relayProc{cmd: cmd, stdin: stdin, lines: make(chan struct{})}
		procs = append(procs, pr)
		ready := make(chan struct{})
		go func() {
			defer close(pr.lines)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				switch {
				case len(f) == 1 && f[0] == "ready":
					close(ready)
				case (len(f) == 7 || len(f) == 8) && f[0] == "stats":
					var v [7]uint64
					for k := range f[1:] {
						v[k], _ = strconv.ParseUint(f[k+1], 10, 64)
					}
					pr.last.Store(&procStats{v[0], v[1], v[2], v[3], v[4], v[5], v[6]})
				}
			}
		}()
		select {
		case <-ready:
		case <-pr.lines:
			return fail(fmt.Errorf("child process %d exited before it was ready", i))
		case <-time.After(time.Minute):
			return fail(fmt.Errorf("child process %d not ready after a minute", i))
		case <-ctx.Done():
			return fail(ctx.Err())
		}
	}
	return procs, nil
}

// stop closes the process's stdin, which stops its relay, and returns its
// final counts.
func (pr *relayProc) stop() (procStats, error) {
	pr.stdin.Close()
	exited := make(chan error, 1)
	go func() { <-pr.lines; exited <- pr.cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			return procStats{}, fmt.Errorf("relay process: %w", err)
		}
	case <-time.After(time.Minute):
		pr.kill()
		return procStats{}, fmt.Errorf("relay process did not exit")
	}
	return pr.stats(), nil
}

func (pr *relayProc) kill() {
	if pr.cmd.ProcessState == nil {
		_ = pr.cmd.Process.Kill()
		<-pr.lines
		_ = pr.cmd.Wait()
	}
}

// relaysChild is a relay process of the relays part: a relay with default
// settings on the schema in envChildDSN, started when "go" arrives on
// stdin and stopped when stdin closes; it prints its counts every 10 ms
// and once more after stopping.
func relaysChild() int {
	ctx := context.Background()
	r, closeDB, err := childRelay(ctx, os.Getenv(envChildID))
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay process:", err)
		return 1
	}
	defer closeDB()
	w := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(w, "ready")
	w.Flush()
	in := bufio.NewReader(os.Stdin)
	if line, err := in.ReadString('\n'); err != nil || strings.TrimSpace(line) != "go" {
		return 0 // stopped before it started
	}
	if err := r.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "relay process:", err)
		return 1
	}
	if err := serveRelay(ctx, r, in, 10*time.Millisecond, func() {
		st := r.Stats()
		fmt.Fprintf(w, "stats %d %d %d %d %d %d\n", st.Succeeded, st.Claimed, st.Polls, st.EmptyPolls, st.Released, st.LeaseLost)
		w.Flush()
	}); err != nil {
		fmt.Fprintln(os.Stderr, "relay process: stop:", err)
		return 1
	}
	return 0
}
