package main

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txhook/txhook/internal/natscluster"
	"github.com/txhook/txhook/internal/pgcluster"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/broker"
	"github.com/txhook/txhook/outbox/pgxoutbox"
)

// The broker part measures broker mode (outbox/broker) beside table mode
// in one run (issue 24 §8): a payment database and a history database,
// each a PostgreSQL cluster of its own (internal/pgcluster, the relays
// part's settings), and one nats-server (internal/natscluster, file
// storage). Its arms:
//
//   - enqueue: Enqueue alone on a table-mode Outbox, nothing delivering:
//     the baseline of the payment database's cost;
//   - enqueue-broker: Enqueue alone on a broker-mode Outbox;
//   - broker: worker processes (this program with TXHOOK_BENCH_CHILD=
//     broker), each running a worker and a forwarder (one holds the
//     cursor and forwards, the others stand by), endpoints and history
//     in the history database;
//   - table: relay processes (as in the relays part) on the payment
//     database.
//
// It measures the payment database's CPU (every process of its cluster)
// and WAL per event at a steady rate, each arm against Enqueue alone;
// drains of a backlog by 1, 2 and 4 processes, broker against table; and
// commit→receipt latency (the latency part's generator), broker against
// table. CPU comes from /proc: the clusters', the nats-server's and the
// child processes'.

const (
	envChildHist    = "TXHOOK_BENCH_CHILD_HISTORY_DSN"
	envChildNATS    = "TXHOOK_BENCH_CHILD_NATS"
	envChildStream  = "TXHOOK_BENCH_CHILD_STREAM"
	brokerTenant    = "relays"
	brokerChildIdle = 8 // idle connections the child pools keep
)

// brokerEnv is what the broker part runs on.
type brokerEnv struct {
	payBase, histBase   string  // database bench on each cluster
	payAdmin, histAdmin *sql.DB // on database bench
	payPM, histPM       int     // postmaster pids
	nats                *natscluster.Cluster
	js                  jetstream.JetStream
	rcv                 *receiver
}

// brokerResult is one timed run of one arm.
type brokerResult struct {
	arm            string
	procs          int
	steady         bool
	events         int
	took           time.Duration
	rate           float64 // deliveries (enqueue arms: commits) per second
	forwardTook    time.Duration
	payUS, payWAL  float64 // payment cluster: CPU µs and WAL bytes per event
	histUS, histWB float64 // history cluster per delivery
	natsUS         float64 // nats-server CPU µs per delivery
	procUS         float64 // the child processes' CPU µs per delivery
	lagEnd         time.Duration
	perProc        []uint64
}

func (r brokerResult) fwdRate() float64 {
	if r.forwardTook <= 0 {
		return 0
	}
	return float64(r.events) / r.forwardTook.Seconds()
}

// partBroker runs the broker part.
func partBroker(ctx context.Context, cfg config, rep *report, p *progress, rcv *receiver) error {
	if _, err := pgcluster.Available(); err != nil {
		rep.note("broker part skipped: %v", err)
		return nil
	}
	if _, err := natscluster.Binary(ctx); err != nil {
		rep.note("broker part skipped: no nats-server: %v", err)
		return nil
	}
	env := &brokerEnv{rcv: rcv}
	var dbs [2]*pgcluster.Cluster
	for i := range dbs {
		c, err := pgcluster.Start(ctx, pgcluster.Options{Settings: relaysSettings(), Logf: p.logf})
		if err != nil {
			return err
		}
		defer c.Close()
		if err := c.CreateDatabase(ctx, "bench"); err != nil {
			return err
		}
		dbs[i] = c
	}
	set, err := dbs[0].ShowSettings(ctx)
	if err != nil {
		return err
	}
	var sb strings.Builder
	for _, s := range set {
		sb.WriteString(s.String() + "\n")
	}
	rep.section("Broker part: settings of the payment and the history clusters (internal/pgcluster Production + pg_stat_statements)", sb.String())
	env.payBase, env.histBase = dbs[0].DSN("bench"), dbs[1].DSN("bench")
	for _, x := range []struct {
		dsn string
		db  **sql.DB
		pm  *int
	}{{env.payBase, &env.payAdmin, &env.payPM}, {env.histBase, &env.histAdmin, &env.histPM}} {
		db, err := sql.Open("pgx", x.dsn)
		if err != nil {
			return err
		}
		defer db.Close()
		db.SetMaxOpenConns(2)
		db.SetMaxIdleConns(2)
		if *x.pm, err = postmasterPID(ctx, db); err != nil {
			return err
		}
		*x.db = db
	}
	nc, err := natscluster.Start(ctx, natscluster.Options{Nodes: 1, Logf: p.logf})
	if err != nil {
		return err
	}
	defer nc.Close()
	env.nats = nc
	conn, err := nats.Connect(nc.ClientURL())
	if err != nil {
		return err
	}
	defer conn.Close()
	if env.js, err = jetstream.New(conn); err != nil {
		return err
	}

	var steadyRuns = map[string][]brokerResult{}
	var drainRuns = map[string][]brokerResult{}
	steadyArms := []string{"enqueue", "enqueue-broker", "broker", "table"}
	for round := range cfg.BrokerRounds {
		arms := append([]string(nil), steadyArms...)
		if round%2 == 1 {
			for i, j := 0, len(arms)-1; i < j; i, j = i+1, j-1 {
				arms[i], arms[j] = arms[j], arms[i]
			}
		}
		for _, arm := range arms {
			r, err := brokerOnce(ctx, cfg, env, arm, 1, true, p)
			if err != nil {
				return fmt.Errorf("steady %s: %w", arm, err)
			}
			steadyRuns[arm] = append(steadyRuns[arm], r)
			p.logf("broker steady round %d/%d, %s: payment DB %.0f µs CPU, %.0f B WAL per event; history %.0f µs, NATS %.0f µs, processes %.0f µs per delivery",
				round+1, cfg.BrokerRounds, arm, r.payUS, r.payWAL, r.histUS, r.natsUS, r.procUS)
		}
		for _, n := range cfg.BrokerCounts {
			order := []string{"broker", "table"}
			if round%2 == 1 {
				order = []string{"table", "broker"}
			}
			for _, arm := range order {
				r, err := brokerOnce(ctx, cfg, env, arm, n, false, p)
				if err != nil {
					return fmt.Errorf("drain %s, %d processes: %w", arm, n, err)
				}
				key := fmt.Sprintf("%s/%d", arm, n)
				drainRuns[key] = append(drainRuns[key], r)
				p.logf("broker drain round %d/%d, %s × %d: %s/s delivered (forwarded %s/s); CPU µs per delivery payment DB %.0f, history %.0f, NATS %.0f, processes %.0f",
					round+1, cfg.BrokerRounds, arm, n, rate(r.rate), rate(r.fwdRate()), r.payUS, r.histUS, r.natsUS, r.procUS)
			}
		}
	}
	lat := map[string][]latencyResult{}
	lcfg := cfg
	lcfg.DSN = env.payBase
	for round := range cfg.BrokerLatencyRounds {
		order := []string{"table", "broker"}
		if round%2 == 1 {
			order = []string{"broker", "table"}
		}
		for _, arm := range order {
			var mode *latencyMode
			if arm == "broker" {
				mode = &latencyMode{broker: true, start: env.latencyBroker}
			}
			res, err := latencyRunMode(ctx, lcfg, rcv, cfg.BrokerLatencyRate, p, nil, mode)
			if err != nil {
				return fmt.Errorf("latency %s: %w", arm, err)
			}
			lat[arm] = append(lat[arm], res)
		}
	}
	brokerReport(cfg, rep, steadyRuns, drainRuns, lat)
	return nil
}

// latencyBroker starts, in this process, a forwarder on the payment
// Outbox of s (sharing its pool, as a service running it in-process
// would) and a worker, with endpoints and history in a schema of the
// history database.
func (env *brokerEnv) latencyBroker(ctx context.Context, s *pgSchema, tenant, url string) (func(), error) {
	hc := localOutbox()
	hc.Broker = true
	h, err := newSchema(ctx, env.histBase, "pgx", 16, hc)
	if err != nil {
		return nil, err
	}
	if _, err := h.ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: tenant, URL: url}); err != nil {
		h.drop()
		return nil, err
	}
	stream := streamName(s.name)
	bc := broker.Config{JetStream: env.js, Stream: stream, Subjects: strings.ToLower(stream), History: h.ob, Logger: quiet()}
	fwd, err := broker.NewForwarder(s.ob, bc)
	if err != nil {
		h.drop()
		return nil, err
	}
	w, err := broker.NewWorker(s.ob, bc)
	if err != nil {
		h.drop()
		return nil, err
	}
	if err := fwd.Start(ctx); err != nil {
		h.drop()
		return nil, err
	}
	if err := w.Start(ctx); err != nil {
		fwd.Stop(ctx)
		h.drop()
		return nil, err
	}
	return func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		w.Stop(stopCtx)
		fwd.Stop(stopCtx)
		_ = env.js.DeleteStream(stopCtx, stream)
		h.drop()
	}, nil
}

// streamName is a stream of a run's own, named after its schema.
func streamName(schema string) string {
	return "BENCH_" + strings.ToUpper(strings.TrimPrefix(schema, "txhook_bench_"))
}

// brokerOnce runs one arm with n processes, at a steady rate
// (cfg.BrokerRate for cfg.BrokerSteady) or draining a backlog of
// cfg.BrokerEvents.
func brokerOnce(ctx context.Context, cfg config, env *brokerEnv, arm string, n int, steady bool, p *progress) (brokerResult, error) {
	res := brokerResult{arm: arm, procs: n, steady: steady}
	isBroker := arm == "broker" || arm == "enqueue-broker"
	delivering := arm == "broker" || arm == "table"
	obCfg := localOutbox()
	obCfg.Broker = isBroker
	pay, err := newSchema(ctx, env.payBase, "pgx", 16, obCfg)
	if err != nil {
		return res, err
	}
	defer pay.drop()
	var hist *pgSchema
	stream := streamName(pay.name)
	if arm == "broker" {
		hc := localOutbox()
		hc.Broker = true
		if hist, err = newSchema(ctx, env.histBase, "pgx", 4, hc); err != nil {
			return res, err
		}
		defer hist.drop()
		if _, err := hist.ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: brokerTenant, URL: env.rcv.URL}); err != nil {
			return res, err
		}
		if err := broker.Setup(ctx, broker.Config{JetStream: env.js, Stream: stream, Subjects: strings.ToLower(stream)}); err != nil {
			return res, err
		}
		defer func() { _ = env.js.DeleteStream(context.Background(), stream) }()
	} else if !isBroker {
		if _, err := pay.ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: brokerTenant, URL: env.rcv.URL}); err != nil {
			return res, err
		}
	}
	total := cfg.BrokerEvents
	if steady {
		total = int(cfg.BrokerSteady.Seconds() * float64(cfg.BrokerRate))
	} else if err := fillByEnqueue(ctx, pay.db, pay.ob, brokerTenant, total); err != nil {
		return res, err
	}
	res.events = total

	var procs []*relayProc
	if delivering {
		payDSN, err := withParams(pay.dsn, map[string]string{"application_name": pay.name + "_child"})
		if err != nil {
			return res, err
		}
		if arm == "table" {
			procs, err = startRelayProcs(ctx, payDSN, n)
		} else {
			procs, err = startChildProcs(ctx, n, func(i int) []string {
				return []string{envChild + "=broker", envChildDSN + "=" + payDSN, envChildHist + "=" + hist.dsn,
					envChildNATS + "=" + env.nats.ClientURL(), envChildStream + "=" + stream}
			})
		}
		if err != nil {
			return res, err
		}
		defer func() {
			for _, pr := range procs {
				pr.kill()
			}
		}()
	}
	lsn := func(db *sql.DB) (string, error) {
		var l string
		err := db.QueryRowContext(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&l)
		return l, err
	}
	walSince := func(db *sql.DB, l string) (float64, error) {
		var b float64
		err := db.QueryRowContext(ctx, "SELECT pg_current_wal_lsn() - $1::pg_lsn", l).Scan(&b)
		return b, err
	}
	payLSN, err := lsn(env.payAdmin)
	if err != nil {
		return res, err
	}
	histLSN, err := lsn(env.histAdmin)
	if err != nil {
		return res, err
	}
	natsPid := env.nats.Pid(0)
	procTotal := func() int64 {
		var t int64
		for _, pr := range procs {
			t += procTicks(pr.cmd.Process.Pid)
		}
		return t
	}
	pay0, hist0, nats0, proc0 := clusterTicks(env.payPM), clusterTicks(env.histPM), procTicks(natsPid), procTotal()
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
		go func() { genDone <- steadyEnqueue(ctx, pay, total, cfg.BrokerRate, start, &lastCommit) }()
	}
	sum := func(f func(procStats) uint64) uint64 {
		var s uint64
		for _, pr := range procs {
			s += f(pr.stats())
		}
		return s
	}
	if delivering {
		deadline := start.Add(time.Duration(total)*time.Millisecond + 2*time.Minute)
		lastLog := time.Now()
		for {
			if arm == "broker" && res.forwardTook == 0 && sum(func(s procStats) uint64 { return s.forwarded }) >= uint64(total) {
				res.forwardTook = time.Since(start)
			}
			if sum(func(s procStats) uint64 { return s.succeeded }) >= uint64(total) {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return res, fmt.Errorf("%d of %d delivered before giving up", sum(func(s procStats) uint64 { return s.succeeded }), total)
			}
			if genDone != nil {
				select {
				case err := <-genDone:
					if err != nil {
						return res, err
					}
					genDone = nil
				default:
				}
			}
			if time.Since(lastLog) > 5*time.Second {
				lastLog = time.Now()
				p.logf("broker part, %s × %d: %d of %d delivered", arm, n, sum(func(s procStats) uint64 { return s.succeeded }), total)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	if genDone != nil {
		if err := <-genDone; err != nil {
			return res, err
		}
	}
	res.took = time.Since(start)
	if steady {
		res.lagEnd = res.took - time.Duration(lastCommit.Load())
	}
	pay1, hist1, nats1, proc1 := clusterTicks(env.payPM), clusterTicks(env.histPM), procTicks(natsPid), procTotal()
	payW, err := walSince(env.payAdmin, payLSN)
	if err != nil {
		return res, err
	}
	histW, err := walSince(env.histAdmin, histLSN)
	if err != nil {
		return res, err
	}
	per := func(ticks int64) float64 { return float64(ticks) / clockTicks * 1e6 / float64(total) }
	res.rate = float64(total) / res.took.Seconds()
	res.payUS, res.payWAL = per(pay1-pay0), payW/float64(total)
	if arm == "broker" {
		res.histUS, res.histWB, res.natsUS = per(hist1-hist0), histW/float64(total), per(nats1-nats0)
	}
	res.procUS = per(proc1 - proc0)
	for _, pr := range procs {
		st, err := pr.stop()
		if err != nil {
			return res, err
		}
		res.perProc = append(res.perProc, st.succeeded)
	}
	procs = nil
	return res, nil
}

func medB(rs []brokerResult, f func(brokerResult) float64) float64 {
	xs := make([]float64, len(rs))
	for i, r := range rs {
		xs[i] = f(r)
	}
	return median(xs)
}

func brokerReport(cfg config, rep *report, steady, drain map[string][]brokerResult, lat map[string][]latencyResult) {
	base := steady["enqueue"]
	baseCPU, baseWAL := medB(base, func(r brokerResult) float64 { return r.payUS }), medB(base, func(r brokerResult) float64 { return r.payWAL })
	rateText := fmt.Sprintf("%s events/s for %s", commas(int64(cfg.BrokerRate)), cfg.BrokerSteady)
	rep.add(row{
		Part:  fmt.Sprintf("broker part: payment DB per event at a steady %s, Enqueue alone (table-mode Outbox, nothing delivering): PostgreSQL CPU (all server processes); WAL", rateText),
		Value: fmt.Sprintf("%.0f µs; %.0f B", baseCPU, baseWAL),
	})
	names := map[string]string{
		"enqueue-broker": "Enqueue alone on a broker-mode Outbox",
		"broker":         "broker mode, forwarding included (1 worker process with a forwarder; history DB of its own)",
		"table":          "table mode (1 relay process)",
	}
	for _, arm := range []string{"enqueue-broker", "broker", "table"} {
		rs := steady[arm]
		cpu, wal := medB(rs, func(r brokerResult) float64 { return r.payUS }), medB(rs, func(r brokerResult) float64 { return r.payWAL })
		for _, m := range []struct {
			what      string
			v, b      float64
			unit      string
			targetted bool
		}{{"PostgreSQL CPU", cpu, baseCPU, "µs", arm == "broker"}, {"WAL", wal, baseWAL, "B", arm == "broker"}} {
			x := row{
				Part:     fmt.Sprintf("broker part: payment DB %s per event at %s, %s, against Enqueue alone", m.what, rateText, names[arm]),
				Value:    fmt.Sprintf("%.0f %s", m.v, m.unit),
				Baseline: fmt.Sprintf("%.0f %s", m.b, m.unit),
				Ratio:    ratio(m.v / m.b),
			}
			if m.targetted {
				x.Target = "≤ 1.25×"
				x.Verdict = verdict(m.v <= 1.25*m.b)
			}
			rep.add(x)
		}
	}
	bs := steady["broker"]
	ts := steady["table"]
	rep.add(row{
		Part: fmt.Sprintf("broker part: at %s, per delivery: history DB CPU; history DB WAL; nats-server CPU; worker process CPU (table mode: relay process CPU)", rateText),
		Value: fmt.Sprintf("%.0f µs; %.0f B; %.0f µs; %.0f µs", medB(bs, func(r brokerResult) float64 { return r.histUS }),
			medB(bs, func(r brokerResult) float64 { return r.histWB }), medB(bs, func(r brokerResult) float64 { return r.natsUS }),
			medB(bs, func(r brokerResult) float64 { return r.procUS })),
		Baseline: fmt.Sprintf("relay %.0f µs", medB(ts, func(r brokerResult) float64 { return r.procUS })),
	})
	for _, n := range cfg.BrokerCounts {
		b, t := drain[fmt.Sprintf("broker/%d", n)], drain[fmt.Sprintf("table/%d", n)]
		br, tr := medB(b, func(r brokerResult) float64 { return r.rate }), medB(t, func(r brokerResult) float64 { return r.rate })
		rep.add(row{
			Part:     fmt.Sprintf("broker part: drain of %s events, %d worker process(es) (each with a forwarder) against %d table-mode relay process(es) (deliveries/s)", commas(int64(cfg.BrokerEvents)), n, n),
			Value:    rate(br),
			Baseline: rate(tr),
			Ratio:    ratio(br / tr),
			Target:   "≥ 1.00×",
			Verdict:  verdict(br >= tr),
		})
		rep.add(row{
			Part: fmt.Sprintf("… %d process(es): events forwarded out of the payment DB per second; CPU per delivery: payment DB, history DB, nats-server, worker processes (table: payment DB, relay processes)", n),
			Value: fmt.Sprintf("%s/s; %.0f + %.0f + %.0f + %.0f µs", rate(medB(b, func(r brokerResult) float64 { return r.fwdRate() })),
				medB(b, func(r brokerResult) float64 { return r.payUS }), medB(b, func(r brokerResult) float64 { return r.histUS }),
				medB(b, func(r brokerResult) float64 { return r.natsUS }), medB(b, func(r brokerResult) float64 { return r.procUS })),
			Baseline: fmt.Sprintf("%.0f + %.0f µs", medB(t, func(r brokerResult) float64 { return r.payUS }), medB(t, func(r brokerResult) float64 { return r.procUS })),
		})
	}
	lq := func(rs []latencyResult, f func(latencyResult) time.Duration) time.Duration {
		xs := make([]float64, len(rs))
		for i, r := range rs {
			xs[i] = float64(f(r))
		}
		return time.Duration(median(xs))
	}
	pcts := func(rs []latencyResult) (string, time.Duration) {
		p99 := lq(rs, func(r latencyResult) time.Duration { return r.p99 })
		return ms(lq(rs, func(r latencyResult) time.Duration { return r.p50 })) + " / " + ms(p99) + " / " +
			ms(lq(rs, func(r latencyResult) time.Duration { return r.p999 })) + " / " + ms(lq(rs, func(r latencyResult) time.Duration { return r.maxLat })), p99
	}
	bv, bp99 := pcts(lat["broker"])
	tv, tp99 := pcts(lat["table"])
	missing := 0
	for _, r := range lat["broker"] {
		missing += r.missing
	}
	rep.add(row{
		Part: fmt.Sprintf("broker part: commit→receipt latency at %s events/s, %d goroutines on a %d-connection pool, forwarder and worker (table: relay) in the same process (p50 / p99 / p99.9 / max, median of %d rounds)",
			commas(int64(cfg.BrokerLatencyRate)), cfg.latencyWorkers(), cfg.latencyPool(), cfg.BrokerLatencyRounds),
		Value:    bv,
		Baseline: tv,
		Ratio:    fmt.Sprintf("p99 %+.1f ms", float64(bp99-tp99)/1e6),
		Target:   "p99 ≤ table + 5 ms",
		Verdict:  verdict(bp99 <= tp99+5*time.Millisecond && missing == 0),
	})

	var d strings.Builder
	for _, arm := range steadyArmsOrder {
		for i, r := range steady[arm] {
			fmt.Fprintf(&d, "steady %s, round %d: %d events in %s (last delivery %s after the last commit); payment DB %.0f µs CPU, %.0f B WAL per event; history DB %.0f µs, %.0f B; nats-server %.0f µs; processes %.0f µs per delivery\n",
				arm, i+1, r.events, r.took.Round(time.Millisecond), ms(r.lagEnd), r.payUS, r.payWAL, r.histUS, r.histWB, r.natsUS, r.procUS)
		}
	}
	for _, n := range cfg.BrokerCounts {
		for _, arm := range []string{"broker", "table"} {
			for i, r := range drain[fmt.Sprintf("%s/%d", arm, n)] {
				fmt.Fprintf(&d, "drain %s × %d, round %d: %d events in %s = %s/s", arm, n, i+1, r.events, r.took.Round(time.Millisecond), rate(r.rate))
				if arm == "broker" {
					fmt.Fprintf(&d, " (all forwarded after %s = %s/s)", r.forwardTook.Round(time.Millisecond), rate(r.fwdRate()))
				}
				fmt.Fprintf(&d, "; per process %v; per delivery: payment DB %.0f µs, %.0f B WAL; history DB %.0f µs, %.0f B; nats-server %.0f µs; processes %.0f µs\n",
					r.perProc, r.payUS, r.payWAL, r.histUS, r.histWB, r.natsUS, r.procUS)
			}
		}
	}
	for _, arm := range []string{"table", "broker"} {
		for i, r := range lat[arm] {
			fmt.Fprintf(&d, "latency %s, round %d: %d measured of %d, %.0f committed/s; p50 %s p90 %s p99 %s p99.9 %s max %s; missing %d, duplicates %d; CPU per event %.0f µs in this process + %.0f µs in the generator's backends; COMMIT p99 %s max %s\n",
				arm, i+1, r.measured, r.sent, r.achieved, ms(r.p50), ms(r.p90), ms(r.p99), ms(r.p999), ms(r.maxLat), r.missing, r.dups, r.clientUS, r.serverUS, ms(r.commitP99), ms(r.commitMax))
		}
	}
	rep.section("Broker part runs", d.String())
}

var steadyArmsOrder = []string{"enqueue", "enqueue-broker", "broker", "table"}

// brokerChild is a worker process of the broker part: a worker and a
// forwarder (default settings; history in its own database) on the
// schemas the environment names, started on "go" and stopped when stdin
// closes, printing its counts every 10 ms and once more after stopping.
func brokerChild() int {
	ctx := context.Background()
	failed := func(err error) int {
		fmt.Fprintln(os.Stderr, "broker worker process:", err)
		return 1
	}
	open := func(dsn string) (*outbox.Outbox, *sql.DB, error) {
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			return nil, nil, err
		}
		db.SetMaxIdleConns(brokerChildIdle)
		c := localOutbox()
		c.Logger = quiet()
		c.Listener = pgxoutbox.Listener()
		c.Broker = true
		ob, err := outbox.New(ctx, db, c)
		if err != nil {
			db.Close()
			return nil, nil, err
		}
		return ob, db, nil
	}
	pay, payDB, err := open(os.Getenv(envChildDSN))
	if err != nil {
		return failed(err)
	}
	defer payDB.Close()
	hist, histDB, err := open(os.Getenv(envChildHist))
	if err != nil {
		return failed(err)
	}
	defer histDB.Close()
	nc, err := nats.Connect(os.Getenv(envChildNATS))
	if err != nil {
		return failed(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return failed(err)
	}
	stream := os.Getenv(envChildStream)
	bc := broker.Config{JetStream: js, Stream: stream, Subjects: strings.ToLower(stream), History: hist, Logger: quiet()}
	fwd, err := broker.NewForwarder(pay, bc)
	if err != nil {
		return failed(err)
	}
	w, err := broker.NewWorker(pay, bc)
	if err != nil {
		return failed(err)
	}
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "ready")
	out.Flush()
	in := bufio.NewReader(os.Stdin)
	if line, err := in.ReadString('\n'); err != nil || strings.TrimSpace(line) != "go" {
		return 0
	}
	if err := fwd.Start(ctx); err != nil {
		return failed(err)
	}
	if err := w.Start(ctx); err != nil {
		return failed(err)
	}
	err = serveRelay(ctx, w, in, 10*time.Millisecond, func() {
		st, fs := w.Stats(), fwd.Stats()
		fmt.Fprintf(out, "stats %d %d %d %d %d %d %d\n", st.Succeeded, st.Claimed, st.Polls, st.EmptyPolls, st.Released, st.LeaseLost, fs.Events)
		out.Flush()
	})
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if ferr := fwd.Stop(stopCtx); err == nil {
		err = ferr
	}
	if err != nil {
		return failed(err)
	}
	return 0
}
