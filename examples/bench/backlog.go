package main

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/outbox"
)

// claimBatch is the batch size the timed statements take: the relay's
// default BatchSize.
const claimBatch = outbox.DefaultBatchSize

// claimWarmup is how many untimed batches precede the timed ones.
const claimWarmup = 3

// fillChunk is how many rows one INSERT ... SELECT generate_series writes.
const fillChunk = 100000

// fillEvents inserts n events for tenant straight in SQL, oldest first, with
// IDs prefix_<n>; dispatched says whether they already have deliveries
// (retries) or wait for a relay to dispatch them (new events).
func fillEvents(ctx context.Context, db *sql.DB, p *progress, tenant, prefix string, n int, dispatched bool) error {
	disp := "NULL"
	if dispatched {
		disp = "now() - interval '1 day'"
	}
	for from := 1; from <= n; from += fillChunk {
		to := min(n, from+fillChunk-1)
		_, err := db.ExecContext(ctx, `INSERT INTO txhook_events (id, tenant, type, payload, created_at, dispatched_at)
			SELECT $1 || lpad(g::text, 10, '0'), $2, 'payment.succeeded', $3::json,
			       now() - interval '1 day' + g * interval '1 microsecond', `+disp+`
			FROM generate_series($4::bigint, $5::bigint) g`,
			prefix, tenant, string(benchPayload), from, to)
		if err != nil {
			return err
		}
		if n > fillChunk {
			p.logf("backlog: %s of %s events written", commas(int64(to)), commas(int64(n)))
		}
	}
	return nil
}

// fillDeliveries inserts n pending, due deliveries to endpoint, one per
// event prefix_<n>, as a failed first attempt leaves them: what the retry
// claim takes.
func fillDeliveries(ctx context.Context, db *sql.DB, p *progress, endpoint, prefix string, n int) error {
	for from := 1; from <= n; from += fillChunk {
		to := min(n, from+fillChunk-1)
		_, err := db.ExecContext(ctx, `INSERT INTO txhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at,
			    last_status, last_error, created_at, updated_at)
			SELECT $1 || lpad(g::text, 10, '0'), $2, 'pending', 1, now() - interval '1 hour' + g * interval '1 microsecond',
			       500, 'HTTP 500', now() - interval '1 day', now() - interval '1 hour'
			FROM generate_series($3::bigint, $4::bigint) g`,
			prefix, endpoint, from, to)
		if err != nil {
			return err
		}
		if n > fillChunk {
			p.logf("backlog: %s of %s deliveries written", commas(int64(to)), commas(int64(n)))
		}
	}
	return nil
}

// statements returns the relay's dispatch and retry claim statements.
func statements(st *store.Store) (dispatch, claim string) {
	for _, q := range st.ClaimQueries() {
		switch {
		case strings.Contains(q, "INSERT INTO txhook_deliveries"):
			dispatch = q
		case strings.Contains(q, "FROM due"):
			claim = q
		}
	}
	return dispatch, claim
}

// timeClaims runs the statement (dispatch or claim) through the store the
// way the relay does, prepared, and returns the duration of each timed
// batch after a few untimed ones. Leases last a day so that nothing
// claimed here comes back while the backlog is used afterwards.
func timeClaims(ctx context.Context, db *sql.DB, which string, samples int) ([]float64, error) {
	st := store.New(db, store.Postgres)
	defer st.Close()
	if err := st.Prepare(ctx, st.ClaimQueries()...); err != nil {
		return nil, err
	}
	var out []float64
	for i := -claimWarmup; i < samples; i++ {
		now := time.Now()
		var got []store.Claimed
		var err error
		if which == "dispatch" {
			got, err = st.Dispatch(ctx, "bench-claim", now, now.Add(24*time.Hour), claimBatch)
		} else {
			got, err = st.Claim(ctx, "bench-claim", now, now.Add(24*time.Hour), claimBatch)
		}
		el := time.Since(now)
		if err != nil {
			return nil, err
		}
		if len(got) != claimBatch {
			return nil, fmt.Errorf("%s took %d rows, want %d", which, len(got), claimBatch)
		}
		if i >= 0 {
			out = append(out, float64(el))
		}
	}
	return out, nil
}

// explain runs EXPLAIN (ANALYZE, BUFFERS) of the statement with the
// relay's arguments.
func explain(ctx context.Context, db *sql.DB, query string) (string, error) {
	now := time.Now().UTC()
	rows, err := db.QueryContext(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+query, now, claimBatch, "bench-explain", now.Add(24*time.Hour))
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

type backlogTiming struct {
	size              int
	dispatch, claim   []float64 // nanoseconds per batch
	explainD, explanC string
}

// partBacklog times one claim batch of each statement with a small and a
// large backlog, then drains (most of) the large one with a separate relay
// process and samples its memory.
func partBacklog(ctx context.Context, cfg config, rep *report, p *progress, rcv *receiver) error {
	if need := (cfg.ClaimSamples + claimWarmup) * claimBatch; cfg.BacklogSmall < need || cfg.BacklogLarge < need {
		return fmt.Errorf("backlogs of %d and %d are too small for %d timed batches of %d (need %d)",
			cfg.BacklogSmall, cfg.BacklogLarge, cfg.ClaimSamples, claimBatch, need)
	}
	var timings []backlogTiming
	var keep *pgSchema // the large dispatch backlog, for the RSS drain
	defer func() {
		if keep != nil {
			keep.drop()
		}
	}()
	for _, n := range []int{cfg.BacklogSmall, cfg.BacklogLarge} {
		t := backlogTiming{size: n}
		large := n == cfg.BacklogLarge
		// New events waiting for dispatch.
		d, err := newSchema(ctx, cfg.DSN, "pgx", 4, localOutbox())
		if err != nil {
			return err
		}
		if _, err := d.ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "backlog", URL: rcv.URL}); err != nil {
			d.drop()
			return err
		}
		p.logf("backlog: filling %s undispatched events", commas(int64(n)))
		start := time.Now()
		if err := fillEvents(ctx, d.db, p, "backlog", "evt_", n, false); err != nil {
			d.drop()
			return err
		}
		if _, err := d.db.ExecContext(ctx, "VACUUM ANALYZE"); err != nil {
			d.drop()
			return err
		}
		p.logf("backlog: filled in %s", time.Since(start).Round(time.Millisecond))
		if t.dispatch, err = timeClaims(ctx, d.db, "dispatch", cfg.ClaimSamples); err != nil {
			d.drop()
			return fmt.Errorf("dispatch at %d: %w", n, err)
		}
		if large {
			dq, _ := statements(store.New(d.db, store.Postgres))
			if t.explainD, err = explain(ctx, d.db, dq); err != nil {
				d.drop()
				return err
			}
		}
		p.logf("backlog %s: dispatch batch median %s", commas(int64(n)), ms(time.Duration(median(t.dispatch))))
		if large && cfg.RSSEvents > 0 {
			keep = d
		} else {
			d.drop()
		}

		// Retries: pending deliveries that are due.
		c, err := newSchema(ctx, cfg.DSN, "pgx", 4, localOutbox())
		if err != nil {
			return err
		}
		ep, err := c.ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "backlog", URL: rcv.URL})
		if err != nil {
			c.drop()
			return err
		}
		p.logf("backlog: filling %s due retries", commas(int64(n)))
		start = time.Now()
		err = fillEvents(ctx, c.db, p, "backlog", "evt_", n, true)
		if err == nil {
			err = fillDeliveries(ctx, c.db, p, ep.ID, "evt_", n)
		}
		if err == nil {
			_, err = c.db.ExecContext(ctx, "VACUUM ANALYZE")
		}
		if err != nil {
			c.drop()
			return err
		}
		p.logf("backlog: filled in %s", time.Since(start).Round(time.Millisecond))
		if t.claim, err = timeClaims(ctx, c.db, "claim", cfg.ClaimSamples); err != nil {
			c.drop()
			return fmt.Errorf("claim at %d: %w", n, err)
		}
		if large {
			_, cq := statements(store.New(c.db, store.Postgres))
			if t.explanC, err = explain(ctx, c.db, cq); err != nil {
				c.drop()
				return err
			}
		}
		p.logf("backlog %s: retry claim batch median %s", commas(int64(n)), ms(time.Duration(median(t.claim))))
		c.drop()
		timings = append(timings, t)
	}
	small, large := timings[0], timings[1]
	var detail strings.Builder
	for _, w := range []struct {
		name     string
		sm, lg   []float64
		explainL string
	}{
		{"dispatch (new events → deliveries, claimed)", small.dispatch, large.dispatch, large.explainD},
		{"retry claim (due deliveries)", small.claim, large.claim, large.explanC},
	} {
		r := median(w.lg) / median(w.sm)
		rep.add(row{
			Part:     fmt.Sprintf("one claim batch of %d, %s: %s vs %s pending (median)", claimBatch, w.name, commas(int64(cfg.BacklogLarge)), commas(int64(cfg.BacklogSmall))),
			Value:    ms(time.Duration(median(w.lg))),
			Baseline: ms(time.Duration(median(w.sm))) + " (" + commas(int64(cfg.BacklogSmall)) + " pending)",
			Ratio:    ratio(r),
			Target:   "≤ 1.50×",
			Verdict:  verdict(r <= 1.5),
		})
		fmt.Fprintf(&detail, "%s, %d batches each:\n  %9s pending: median %s, p90 %s, max %s\n  %9s pending: median %s, p90 %s, max %s\n",
			w.name, len(w.sm),
			commas(int64(cfg.BacklogSmall)), ms(time.Duration(median(w.sm))), ms(time.Duration(quantile(w.sm, 0.9))), ms(time.Duration(quantile(w.sm, 1))),
			commas(int64(cfg.BacklogLarge)), ms(time.Duration(median(w.lg))), ms(time.Duration(quantile(w.lg, 0.9))), ms(time.Duration(quantile(w.lg, 1))))
	}
	rep.section("Claim batch timings", detail.String())
	rep.section(fmt.Sprintf("EXPLAIN ANALYZE, dispatch statement, %s pending", commas(int64(cfg.BacklogLarge))), large.explainD)
	rep.section(fmt.Sprintf("EXPLAIN ANALYZE, retry claim statement, %s pending", commas(int64(cfg.BacklogLarge))), large.explanC)

	if keep == nil {
		return nil
	}
	var left int
	if err := keep.db.QueryRowContext(ctx, "SELECT count(*) FROM txhook_events WHERE dispatched_at IS NULL").Scan(&left); err != nil {
		return err
	}
	target := min(left, cfg.RSSEvents)
	res, err := rssDrain(ctx, keep.dsn, target, cfg.RSSTimeout, p)
	if err != nil {
		return err
	}
	x := row{
		Part:     fmt.Sprintf("peak RSS of a separate relay process (default settings) draining a %s backlog", commas(int64(left))),
		Value:    fmt.Sprintf("%.1f MiB", float64(res.hwmKB)/1024),
		Baseline: fmt.Sprintf("%.1f MiB after its first deliveries", float64(res.startKB)/1024),
		Target:   "< 150 MiB",
		Verdict:  verdict(res.hwmKB < 150*1024),
	}
	if res.drained < target {
		x.Part += fmt.Sprintf(" (stopped after %s: %s delivered)", cfg.RSSTimeout, commas(int64(res.drained)))
	}
	rep.add(x)
	rep.add(row{
		Part:  "drain of that backlog by the separate relay, default settings: 32 in flight, 16 per endpoint (deliveries/s)",
		Value: rate(res.rate),
	})
	rep.section("Relay process memory", fmt.Sprintf("delivered %s of %s in %s (%.0f/s); VmHWM %.1f MiB; largest sampled VmRSS %.1f MiB; Go heap in use at the end %.1f MiB",
		commas(int64(res.drained)), commas(int64(target)), res.took.Round(time.Millisecond), res.rate,
		float64(res.hwmKB)/1024, float64(res.maxRSSKB)/1024, float64(res.heapKB)/1024))
	return nil
}

// The relay child: a separate process running one relay with default
// settings on the schema in envChildDSN, so that its memory is its own.
const (
	envChild    = "TXHOOK_BENCH_CHILD"
	envChildDSN = "TXHOOK_BENCH_CHILD_DSN"
)

type rssResult struct {
	drained                          int
	took                             time.Duration
	rate                             float64
	startKB, hwmKB, maxRSSKB, heapKB int64
}

// rssDrain starts the relay child on dsn, waits until it has delivered
// target deliveries (or timeout), and returns its memory figures.
func rssDrain(ctx context.Context, dsn string, target int, timeout time.Duration, p *progress) (rssResult, error) {
	var res rssResult
	exe, err := os.Executable()
	if err != nil {
		return res, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envChild+"=relay", envChildDSN+"="+dsn)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return res, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return res, err
	}
	cmd.Stderr = os.Stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return res, err
	}
	pid := cmd.Process.Pid
	var succeeded, heap atomic.Int64
	var finalHWM atomic.Int64
	lines := make(chan struct{})
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 2 {
				n, _ := strconv.ParseInt(f[1], 10, 64)
				switch f[0] {
				case "succeeded":
					succeeded.Store(n)
				case "heap_kb":
					heap.Store(n)
				case "hwm_kb":
					finalHWM.Store(n)
				}
			}
		}
	}()
	deadline := start.Add(timeout)
	lastLog := time.Now()
	var doneAt time.Time
	for {
		st := procStatus(pid)
		if res.startKB == 0 && succeeded.Load() > 0 {
			// The relay has started and delivered its first batch.
			res.startKB = st["VmRSS"]
		}
		res.maxRSSKB = max(res.maxRSSKB, st["VmRSS"])
		res.hwmKB = max(res.hwmKB, st["VmHWM"])
		n := int(succeeded.Load())
		if n >= target {
			doneAt = time.Now()
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		if time.Since(lastLog) >= 5*time.Second {
			lastLog = time.Now()
			el := time.Since(start)
			p.logf("rss: %s of %s delivered (%.0f/s), VmRSS %.1f MiB, VmHWM %.1f MiB", commas(int64(n)), commas(int64(target)),
				float64(n)/el.Seconds(), float64(st["VmRSS"])/1024, float64(st["VmHWM"])/1024)
		}
		time.Sleep(100 * time.Millisecond)
	}
	res.drained = int(succeeded.Load())
	if doneAt.IsZero() {
		doneAt = time.Now()
	}
	res.took = doneAt.Sub(start)
	res.rate = float64(res.drained) / res.took.Seconds()
	// Closing stdin asks the child to stop its relay and exit.
	stdin.Close()
	exited := make(chan error, 1)
	go func() { <-lines; exited <- cmd.Wait() }()
	select {
	case err = <-exited:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		err = <-exited
		if err == nil {
			err = fmt.Errorf("relay child did not exit")
		}
	}
	if err != nil {
		return res, fmt.Errorf("relay child: %w", err)
	}
	res.hwmKB = max(res.hwmKB, finalHWM.Load())
	res.heapKB = heap.Load()
	return res, nil
}

// procStatus reads the kB fields of /proc/<pid>/status.
func procStatus(pid int) map[string]int64 {
	out := map[string]int64{}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !strings.HasSuffix(v, " kB") {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(v, " kB")), 10, 64)
		if err == nil {
			out[k] = n
		}
	}
	return out
}

func heapInUseKB() int64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse >> 10)
}

// relayChild runs a default relay on the schema in envChildDSN until stdin
// closes, printing "succeeded <n>" lines, then its peak memory.
func relayChild() int {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv(envChildDSN))
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay child:", err)
		return 1
	}
	defer db.Close()
	cfg := localOutbox()
	cfg.Logger = quiet()
	ob, err := outbox.New(ctx, db, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay child:", err)
		return 1
	}
	r, err := ob.NewRelay(outbox.RelayConfig{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay child:", err)
		return 1
	}
	if err := r.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "relay child:", err)
		return 1
	}
	stdinClosed := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stdinClosed) }()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	w := bufio.NewWriter(os.Stdout)
loop:
	for {
		select {
		case <-stdinClosed:
			break loop
		case <-tick.C:
			fmt.Fprintf(w, "succeeded %d\n", r.Stats().Succeeded)
			w.Flush()
		}
	}
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := r.Stop(stopCtx); err != nil {
		fmt.Fprintln(os.Stderr, "relay child: stop:", err)
	}
	fmt.Fprintf(w, "succeeded %d\n", r.Stats().Succeeded)
	fmt.Fprintf(w, "heap_kb %d\n", heapInUseKB())
	fmt.Fprintf(w, "hwm_kb %d\n", procStatus(os.Getpid())["VmHWM"])
	w.Flush()
	return 0
}
