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
	"github.com/txhook/txhook/outbox/pgxoutbox"
)

// claimBatch is the batch size the timed statements take: the relay's
// default BatchSize.
const claimBatch = outbox.DefaultBatchSize

// claimWarmup is how many untimed batches precede the timed ones.
const claimWarmup = 3

// fillChunk is how many rows one INSERT ... SELECT generate_series writes.
const fillChunk = 100000

// fillEvents inserts n events for tenant straight in SQL, oldest first
// from `since` (a SQL time expression), with IDs prefix<n>; dispatched says
// whether they already have deliveries (retries) or wait for a relay to
// dispatch them (new events).
func fillEvents(ctx context.Context, db *sql.DB, p *progress, tenant, prefix, since string, n int, dispatched bool) error {
	disp := "NULL"
	if dispatched {
		disp = "now() - interval '1 day'"
	}
	for from := 1; from <= n; from += fillChunk {
		to := min(n, from+fillChunk-1)
		_, err := db.ExecContext(ctx, `INSERT INTO txhook_events (id, tenant, type, payload, created_at, dispatched_at)
			SELECT $1 || lpad(g::text, 10, '0'), $2, 'payment.succeeded', $3::json,
			       `+since+` + g * interval '1 microsecond', `+disp+`
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
// event prefix<n>, as a failed first attempt leaves them: what the retry
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
	for _, q := range st.ClaimQueries(claimBatch) {
		switch {
		case strings.Contains(q, "INSERT INTO txhook_deliveries"):
			dispatch = q
		case strings.Contains(q, "FROM due"):
			claim = q
		}
	}
	return dispatch, claim
}

// claimer runs the relay's dispatch or retry claim statement on one
// backlog the way the relay does: through the store, prepared. Leases last a
// day so that nothing claimed here comes back while the backlog is used
// afterwards; what a dispatch takes is written back at once, as delivered.
type claimer struct {
	name  string // for errors
	which string // "dispatch" or "claim"
	db    *sql.DB
	st    *store.Store
}

func newClaimer(ctx context.Context, db *sql.DB, which, name string) (*claimer, error) {
	st := store.New(db, store.Postgres)
	if err := st.Prepare(ctx, st.ClaimQueries(claimBatch)...); err != nil {
		return nil, err
	}
	return &claimer{name: name, which: which, db: db, st: st}, nil
}

// once times one batch; want is the number of rows it must take (-1: any).
func (c *claimer) once(ctx context.Context, want int) (float64, error) {
	now := time.Now()
	var got []store.Claimed
	var err error
	if c.which == "dispatch" {
		got, err = c.st.Dispatch(ctx, "bench-claim", now, 24*time.Hour, claimBatch)
	} else {
		got, err = c.st.Claim(ctx, "bench-claim", now, 24*time.Hour, claimBatch)
	}
	el := time.Since(now)
	if err != nil {
		return 0, fmt.Errorf("%s, %s: %w", c.which, c.name, err)
	}
	if want >= 0 && len(got) != want {
		return 0, fmt.Errorf("%s, %s: took %d rows, want %d", c.which, c.name, len(got), want)
	}
	if c.which == "dispatch" {
		// A dispatch leases the events it takes; a relay then writes the
		// deliveries, which ends the leases. Do so (untimed), or the
		// leased events pile up at the head of the index the next
		// dispatch walks, as no relay's would.
		cs := make([]store.Completion, len(got))
		for i, g := range got {
			x := g.Completion(now, true)
			x.State, x.Attempts, x.Record, x.Status = store.StateSucceeded, 1, true, 200
			x.Records = []store.AttemptRecord{{Attempt: 1, StartedAt: now, Duration: time.Millisecond, Status: 200}}
			cs[i] = x
		}
		if res, err := c.st.Complete(ctx, "bench-claim", now, cs); err != nil || len(res.Written) != len(cs) {
			return 0, fmt.Errorf("%s, %s: writing the outcomes: %d of %d, %v", c.which, c.name, len(res.Written), len(cs), err)
		}
	}
	return float64(el), nil
}

// interleave times samples batches of each claimer after claimWarmup
// untimed ones, taking turns (in an order that rotates) so that all see
// the same machine.
func interleave(ctx context.Context, cs []*claimer, samples, want int) ([][]float64, error) {
	out := make([][]float64, len(cs))
	for i := -claimWarmup; i < samples; i++ {
		for k := range cs {
			j := (k + max(i, 0)) % len(cs)
			d, err := cs[j].once(ctx, want)
			if err != nil {
				return nil, err
			}
			if i >= 0 {
				out[j] = append(out[j], d)
			}
		}
	}
	return out, nil
}

// explain runs EXPLAIN (ANALYZE, BUFFERS) of the statement with the
// relay's arguments.
func explain(ctx context.Context, db *sql.DB, query string) (string, error) {
	now := time.Now().UTC()
	rows, err := db.QueryContext(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+query, now, "bench-explain", (24 * time.Hour).Microseconds())
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

// newBacklog creates a schema with an endpoint and n undispatched events
// (retries false) or n due retries, and waits for autovacuum to vacuum and
// analyze it (see settle).
func newBacklog(ctx context.Context, cfg config, p *progress, rcv *receiver, n int, retries bool) (*pgSchema, error) {
	s, err := newSchema(ctx, cfg.DSN, "pgx", 4, localOutbox())
	if err != nil {
		return nil, err
	}
	ep, err := s.ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "backlog", URL: rcv.URL})
	if err != nil {
		s.drop()
		return nil, err
	}
	what := "undispatched events"
	if retries {
		what = "due retries"
	}
	p.logf("backlog: filling %s %s", commas(int64(n)), what)
	start := time.Now()
	err = fillEvents(ctx, s.db, p, "backlog", "evt_", "now() - interval '1 day'", n, retries)
	if err == nil && retries {
		err = fillDeliveries(ctx, s.db, p, ep.ID, "evt_", n)
	}
	if err == nil {
		err = settle(ctx, s, p, retries)
	}
	if err != nil {
		s.drop()
		return nil, err
	}
	p.logf("backlog: filled in %s", time.Since(start).Round(time.Millisecond))
	return s, nil
}

// settle waits, on a server with autovacuum on, until autovacuum has
// vacuumed and analyzed the tables just filled (a production database
// would have by the time such a backlog is claimed; no manual VACUUM), for
// at most 5 minutes; on a server with autovacuum off it runs VACUUM
// ANALYZE, as autovacuum would have.
func settle(ctx context.Context, s *pgSchema, p *progress, retries bool) error {
	var av string
	if err := s.db.QueryRowContext(ctx, "SHOW autovacuum").Scan(&av); err != nil {
		return err
	}
	if av != "on" {
		_, err := s.db.ExecContext(ctx, "VACUUM ANALYZE")
		return err
	}
	tables := []string{"txhook_events"}
	if retries {
		tables = append(tables, "txhook_deliveries")
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var waiting int
		err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_user_tables
WHERE schemaname = $1 AND relname = ANY ($2) AND (last_autovacuum IS NULL OR last_autoanalyze IS NULL)`,
			s.name, "{"+strings.Join(tables, ",")+"}").Scan(&waiting)
		if err != nil {
			return err
		}
		if waiting == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			p.logf("backlog: autovacuum had not processed %d of the tables after 5 minutes; timing them as they are", waiting)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func msStats(xs []float64) string {
	return fmt.Sprintf("median %s, p90 %s, max %s", ms(time.Duration(median(xs))), ms(time.Duration(quantile(xs, 0.9))), ms(time.Duration(quantile(xs, 1))))
}

// partBacklog times one claim batch of each statement with a small and a
// large backlog, then drains (most of) the large one with a separate relay
// process and samples its memory, then times the statements again on the
// drained tables.
func partBacklog(ctx context.Context, cfg config, rep *report, p *progress, rcv *receiver) error {
	if need := (cfg.ClaimSamples + claimWarmup) * claimBatch; cfg.BacklogSmall < need || cfg.BacklogLarge < need {
		return fmt.Errorf("backlogs of %d and %d are too small for %d timed batches of %d (need %d)",
			cfg.BacklogSmall, cfg.BacklogLarge, cfg.ClaimSamples, claimBatch, need)
	}
	var schemas []*pgSchema
	defer func() {
		for _, s := range schemas {
			s.drop()
		}
	}()
	var cs []*claimer
	for _, b := range []struct {
		n       int
		retries bool
	}{{cfg.BacklogSmall, false}, {cfg.BacklogLarge, false}, {cfg.BacklogSmall, true}, {cfg.BacklogLarge, true}} {
		s, err := newBacklog(ctx, cfg, p, rcv, b.n, b.retries)
		if err != nil {
			return err
		}
		schemas = append(schemas, s)
		which := "dispatch"
		if b.retries {
			which = "claim"
		}
		c, err := newClaimer(ctx, s.db, which, commas(int64(b.n))+" pending")
		if err != nil {
			return err
		}
		defer c.st.Close()
		cs = append(cs, c)
	}
	times, err := interleave(ctx, cs, cfg.ClaimSamples, claimBatch)
	if err != nil {
		return err
	}
	var detail strings.Builder
	for i, w := range []string{"dispatch (new events → deliveries, claimed)", "retry claim (due deliveries)"} {
		sm, lg := times[2*i], times[2*i+1]
		r := median(lg) / median(sm)
		rep.add(row{
			Part:     fmt.Sprintf("one claim batch of %d, %s: %s vs %s pending (median)", claimBatch, w, commas(int64(cfg.BacklogLarge)), commas(int64(cfg.BacklogSmall))),
			Value:    ms(time.Duration(median(lg))),
			Baseline: ms(time.Duration(median(sm))) + " (" + commas(int64(cfg.BacklogSmall)) + " pending)",
			Ratio:    ratio(r),
			Target:   "≤ 1.50×",
			Verdict:  verdict(r <= 1.5),
		})
		fmt.Fprintf(&detail, "%s, %d batches each, interleaved:\n  %9s pending: %s\n  %9s pending: %s\n",
			w, len(sm), commas(int64(cfg.BacklogSmall)), msStats(sm), commas(int64(cfg.BacklogLarge)), msStats(lg))
	}
	dq, cq := statements(cs[0].st)
	for _, x := range []struct {
		title string
		s     *pgSchema
		n     int
		query string
	}{
		{"dispatch", schemas[0], cfg.BacklogSmall, dq}, {"dispatch", schemas[1], cfg.BacklogLarge, dq},
		{"retry claim", schemas[2], cfg.BacklogSmall, cq}, {"retry claim", schemas[3], cfg.BacklogLarge, cq},
	} {
		plan, err := explain(ctx, x.s.db, x.query)
		if err != nil {
			return err
		}
		rep.section(fmt.Sprintf("EXPLAIN ANALYZE, %s statement, %s pending", x.title, commas(int64(x.n))), plan)
	}
	// Only the large dispatch backlog is needed from here on.
	for _, i := range []int{0, 2, 3} {
		schemas[i].drop()
	}
	large := schemas[1]
	schemas = []*pgSchema{large}

	if cfg.RSSEvents > 0 {
		if err := rssPart(ctx, cfg, rep, p, large, &detail); err != nil {
			return err
		}
	}
	rep.section("Claim batch timings", detail.String())
	return nil
}

// rssPart drains the large backlog with the relay child, then times an
// idle poll and fresh dispatch batches on the drained tables, before and
// after a VACUUM.
func rssPart(ctx context.Context, cfg config, rep *report, p *progress, large *pgSchema, detail *strings.Builder) error {
	var left int
	if err := large.db.QueryRowContext(ctx, "SELECT count(*) FROM txhook_events WHERE dispatched_at IS NULL AND (lease_until IS NULL OR lease_until <= now())").Scan(&left); err != nil {
		return err
	}
	target := min(left, cfg.RSSEvents)
	res, err := rssDrain(ctx, large.dsn, target, cfg.RSSTimeout, p)
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

	// The drained tables, as the relay sees them until the next VACUUM:
	// every delivered event and delivery left a dead entry in the partial
	// indexes the two statements scan.
	dispatch, err := newClaimer(ctx, large.db, "dispatch", "after the drain")
	if err != nil {
		return err
	}
	defer dispatch.st.Close()
	claim, err := newClaimer(ctx, large.db, "claim", "after the drain")
	if err != nil {
		return err
	}
	defer claim.st.Close()
	// Fresh events for the dispatch batches, before and after VACUUM.
	fresh := (2*cfg.ClaimSamples + 2*claimWarmup) * claimBatch
	if err := fillEvents(ctx, large.db, p, "backlog", "new_", "now()", fresh, false); err != nil {
		return err
	}
	if _, err := large.db.ExecContext(ctx, "ANALYZE"); err != nil {
		return err
	}
	measure := func() (idle, batch []float64, err error) {
		// Nothing is due when the drain finished (a drain stopped early
		// leaves some): the poll an idle relay makes every PollInterval.
		idleT, err := interleave(ctx, []*claimer{claim}, cfg.ClaimSamples, -1)
		if err != nil {
			return nil, nil, err
		}
		batchT, err := interleave(ctx, []*claimer{dispatch}, cfg.ClaimSamples, claimBatch)
		if err != nil {
			return nil, nil, err
		}
		return idleT[0], batchT[0], nil
	}
	idle1, batch1, err := measure()
	if err != nil {
		return err
	}
	start := time.Now()
	if _, err := large.db.ExecContext(ctx, "VACUUM ANALYZE"); err != nil {
		return err
	}
	vacuumTook := time.Since(start)
	idle2, batch2, err := measure()
	if err != nil {
		return err
	}
	rep.add(row{
		Part:     fmt.Sprintf("after delivering %s without a VACUUM since: retry claim poll, nothing due / dispatch batch of %d", commas(int64(res.drained)), claimBatch),
		Value:    ms(time.Duration(median(idle1))) + " / " + ms(time.Duration(median(batch1))),
		Baseline: ms(time.Duration(median(idle2))) + " / " + ms(time.Duration(median(batch2))) + " (after VACUUM)",
		Ratio:    ratio(median(idle1)/median(idle2)) + " / " + ratio(median(batch1)/median(batch2)),
	})
	fmt.Fprintf(detail, "after the relay process delivered %s (no VACUUM since), %d batches each:\n  retry claim poll, nothing due: %s\n  dispatch of fresh events:      %s\nafter VACUUM ANALYZE (%s):\n  retry claim poll, nothing due: %s\n  dispatch of fresh events:      %s\n",
		commas(int64(res.drained)), cfg.ClaimSamples, msStats(idle1), msStats(batch1), vacuumTook.Round(time.Millisecond), msStats(idle2), msStats(batch2))
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
// closes, printing "succeeded <n>" lines, then its peak memory. With
// envChild=relays it is a relay process of the relays part instead.
func relayChild() int {
	switch os.Getenv(envChild) {
	case "relays":
		return relaysChild()
	case "broker":
		return brokerChild()
	}
	ctx := context.Background()
	r, closeDB, err := childRelay(ctx, "")
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay child:", err)
		return 1
	}
	defer closeDB()
	if err := r.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "relay child:", err)
		return 1
	}
	w := bufio.NewWriter(os.Stdout)
	if err := serveRelay(ctx, r, os.Stdin, 50*time.Millisecond, func() {
		fmt.Fprintf(w, "succeeded %d\n", r.Stats().Succeeded)
		w.Flush()
	}); err != nil {
		fmt.Fprintln(os.Stderr, "relay child: stop:", err)
	}
	fmt.Fprintf(w, "heap_kb %d\n", heapInUseKB())
	fmt.Fprintf(w, "hwm_kb %d\n", procStatus(os.Getpid())["VmHWM"])
	w.Flush()
	return 0
}

// childRelay opens the schema in envChildDSN and makes a relay with
// default settings named id ("" for a generated name), for a relay child
// process. closeDB closes its pool.
func childRelay(ctx context.Context, id string) (r *outbox.Relay, closeDB func(), err error) {
	db, err := sql.Open("pgx", os.Getenv(envChildDSN))
	if err != nil {
		return nil, nil, err
	}
	// A few idle connections, as a service's pool keeps: with
	// database/sql's default of 2 a busy relay opens and closes
	// connections all the time.
	db.SetMaxIdleConns(8)
	cfg := localOutbox()
	cfg.Logger = quiet()
	cfg.Listener = pgxoutbox.Listener()
	ob, err := outbox.New(ctx, db, cfg)
	if err == nil {
		r, err = ob.NewRelay(outbox.RelayConfig{ID: id})
	}
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return r, func() { db.Close() }, nil
}

// serveRelay lets the started relay r run until in (the child's stdin)
// closes, calling report every interval, then stops r and reports once
// more.
func serveRelay(ctx context.Context, r *outbox.Relay, in io.Reader, every time.Duration, report func()) error {
	closed := make(chan struct{})
	go func() { io.Copy(io.Discard, in); close(closed) }()
	tick := time.NewTicker(every)
	defer tick.Stop()
loop:
	for {
		select {
		case <-closed:
			break loop
		case <-tick.C:
			report()
		}
	}
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := r.Stop(stopCtx)
	report()
	return err
}
