package main

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/pgxoutbox"
)

// The open-loop generator looks like a service: defaultLatencyWorkers
// goroutines (request handlers) commit business transactions on one pool
// of defaultLatencyPool connections, which the relay, running in the same
// process, shares. Each transaction locks a customer's account row, inserts
// the payment, updates the balance and enqueues the event.
const (
	defaultLatencyWorkers = 24
	defaultLatencyPool    = 32
	latencyAccounts       = 1000
)

const accountsDDL = `CREATE TABLE IF NOT EXISTS bench_accounts (
    id bigint PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);
INSERT INTO bench_accounts (id) SELECT g FROM generate_series(0, 999) g ON CONFLICT DO NOTHING`

type latencyResult struct {
	rate                        int
	sent, measured, missing     int
	early, dups                 int
	achieved                    float64 // committed per second over the run
	p50, p90, p99, p999, maxLat time.Duration
	maxLag                      time.Duration // worst delay between a transaction's scheduled and actual start
	stats                       outbox.RelayStats
	clientUS, serverUS          float64 // CPU per event over the measured window; negative when unknown
	// The generator's side, over the measured transactions: p99 and max of
	// the wait for a pooled connection (BeginTx) and of the COMMIT.
	beginP99, beginMax, commitP99, commitMax time.Duration
	// The receipts of the slowest 1% (over the p99), by when their
	// transaction committed: how many of them came within 5 ms of the
	// commit of another slow one (clustered: a stall of the relay or the
	// database), as a share.
	tailClustered float64
}

// partLatency measures commit-to-receipt latency at fixed rates with
// default relay settings.
func partLatency(ctx context.Context, cfg config, rep *report, p *progress, rcv *receiver) error {
	var detail strings.Builder
	for _, r := range cfg.LatencyRates {
		res, err := latencyRun(ctx, cfg, rcv, r, p, nil)
		if err != nil {
			return fmt.Errorf("%d/s: %w", r, err)
		}
		x := row{
			Part: fmt.Sprintf("commit→receipt latency at %s events/s, default relay, %d goroutines on a %d-connection pool (p50 / p99 / p99.9 / max)",
				commas(int64(r)), cfg.latencyWorkers(), cfg.latencyPool()),
			Value: ms(res.p50) + " / " + ms(res.p99) + " / " + ms(res.p999) + " / " + ms(res.maxLat),
		}
		if r == 500 {
			x.Target = "p50 < 5 ms, p99 < 25 ms"
			x.Verdict = verdict(res.p50 < 5*time.Millisecond && res.p99 < 25*time.Millisecond && res.missing == 0)
		}
		rep.add(x)
		fmt.Fprintf(&detail, "%5d/s: %d measured (after %s warm-up) of %d committed, %.0f committed/s; p50 %s p90 %s p99 %s p99.9 %s max %s; missing %d, duplicates %d, arrived before Commit returned %d; generator's worst start lag %s; CPU per event %.0f µs in this process (generator, relay, receiver) + %.0f µs in PostgreSQL\n",
			r, res.measured, cfg.LatencyWarmup, res.sent, res.achieved, ms(res.p50), ms(res.p90), ms(res.p99), ms(res.p999), ms(res.maxLat),
			res.missing, res.dups, res.early, ms(res.maxLag), res.clientUS, res.serverUS)
		fmt.Fprintf(&detail, "       generator: %d goroutines on a %d-connection pool (%s); wait for a connection p99 %s max %s, COMMIT p99 %s max %s; %.0f%% of the receipts over p99 came within 5 ms of another one's commit\n",
			cfg.latencyWorkers(), cfg.latencyPool(), relayPoolText(cfg), ms(res.beginP99), ms(res.beginMax), ms(res.commitP99), ms(res.commitMax), 100*res.tailClustered)
	}
	rep.section("Latency runs", detail.String())
	return nil
}

// latencyRun measures one tenant's commit-to-receipt latency at perSec
// events a second. neighbours, when set, is called before the relay starts
// to add other tenants' load; the function it returns stops that load.
func latencyRun(ctx context.Context, cfg config, rcv *receiver, perSec int, p *progress,
	neighbours func(ctx context.Context, s *pgSchema) (stop func(), err error)) (latencyResult, error) {
	return latencyRunMode(ctx, cfg, rcv, perSec, p, neighbours, nil)
}

// latencyMode replaces the table-mode relay of a latency run (the broker
// part's broker arm): broker says the Outbox is in broker mode, and start
// makes the tenant's endpoint and starts what delivers the events
// enqueued into s, returning what stops it.
type latencyMode struct {
	broker bool
	start  func(ctx context.Context, s *pgSchema, tenant, url string) (stop func(), err error)
}

// latencyRunMode is latencyRun with the events delivered as mode says
// (nil: a table-mode relay in this process).
func latencyRunMode(ctx context.Context, cfg config, rcv *receiver, perSec int, p *progress,
	neighbours func(ctx context.Context, s *pgSchema) (stop func(), err error), mode *latencyMode) (latencyResult, error) {
	res := latencyResult{rate: perSec}
	obCfg := localOutbox()
	obCfg.NotifyInterval = cfg.NotifyInterval
	obCfg.Broker = mode != nil && mode.broker
	workers := cfg.latencyWorkers()
	s, err := newSchema(ctx, cfg.DSN, "pgx", cfg.latencyPool(), obCfg)
	if err != nil {
		return res, err
	}
	defer s.drop()
	for _, q := range []string{paymentsDDL, accountsDDL} {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			return res, err
		}
	}
	relayOb := s.ob
	if cfg.LatencyRelayPool > 0 {
		db, err := sql.Open("pgx", s.dsn)
		if err != nil {
			return res, err
		}
		defer db.Close()
		db.SetMaxOpenConns(cfg.LatencyRelayPool)
		db.SetMaxIdleConns(cfg.LatencyRelayPool)
		rc := obCfg
		rc.Logger = quiet()
		rc.Listener = pgxoutbox.Listener()
		if relayOb, err = outbox.New(ctx, db, rc); err != nil {
			return res, err
		}
		defer relayOb.Close()
	}
	const tenant = "merchant_latency"
	var relay *outbox.Relay
	if mode != nil {
		stop, err := mode.start(ctx, s, tenant, rcv.URL)
		if err != nil {
			return res, err
		}
		defer stop()
	} else {
		if _, err := s.ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: tenant, URL: rcv.URL}); err != nil {
			return res, err
		}
		if neighbours != nil {
			stop, err := neighbours(ctx, s)
			if err != nil {
				return res, err
			}
			defer stop()
		}
		if relay, err = relayOb.NewRelay(outbox.RelayConfig{}); err != nil {
			return res, err
		}
		if err := relay.Start(ctx); err != nil {
			return res, err
		}
		defer func() {
			stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			relay.Stop(stopCtx)
		}()
	}

	total := int((cfg.LatencyWarmup + cfg.LatencyDur).Seconds() * float64(perSec))
	warmN := int(cfg.LatencyWarmup.Seconds() * float64(perSec))
	period := time.Second / time.Duration(perSec)
	base := time.Now()
	rec := newRecorder(base, total)
	rcv.rec.Store(rec)
	defer rcv.rec.Store(nil)

	commitAt := make([]time.Duration, total)
	begins, commits := make([]time.Duration, total), make([]time.Duration, total)
	var meter *cpuMeter
	meterAt := -1
	lags := make([]time.Duration, workers)
	jobs := make(chan int, total)
	var wg sync.WaitGroup
	var errOnce sync.Once
	var genErr error
	gctx, cancelGen := context.WithCancel(ctx)
	defer cancelGen()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			payload := make([]byte, 0, 256)
			for i := range jobs {
				if lag := time.Since(base) - time.Duration(i)*period; lag > lags[w] {
					lags[w] = lag
				}
				// {"seq":i,<benchPayload's members>}
				payload = strconv.AppendInt(append(payload[:0], `{"seq":`...), int64(i), 10)
				payload = append(append(payload, ','), benchPayload[1:]...)
				if err := latencyTx(gctx, s.db, s.ob, tenant, int64(i), payload, &begins[i], &commits[i]); err != nil {
					errOnce.Do(func() { genErr = err; cancelGen() })
					return
				}
				commitAt[i] = time.Since(base)
			}
		}()
	}
	// The open-loop schedule: transaction i starts at base + i*period,
	// whatever the earlier ones are doing.
	next := 0
	lastLog := time.Now()
	for next < total && gctx.Err() == nil {
		if meter == nil && next >= warmN {
			meter, meterAt = startCPU(ctx, s.db, s.name), next
		}
		due := min(total, int(time.Since(base)/period)+1)
		for ; next < due; next++ {
			jobs <- next
		}
		if time.Since(lastLog) > 5*time.Second {
			lastLog = time.Now()
			p.logf("latency %d/s: %d of %d scheduled", perSec, next, total)
		}
		time.Sleep(time.Until(base.Add(time.Duration(next) * period)))
	}
	close(jobs)
	wg.Wait()
	res.clientUS, res.serverUS = -1, -1
	if meter != nil {
		if c, sv, ok := meter.stop(ctx); ok {
			n := float64(total - meterAt)
			res.clientUS, res.serverUS = c*1e6/n, sv*1e6/n
		}
	}
	if genErr != nil {
		return res, genErr
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	res.sent = total
	res.achieved = float64(total) / commitAt[total-1].Seconds()
	for _, l := range lags {
		res.maxLag = max(res.maxLag, l)
	}
	// Wait for the measured events to arrive.
	deadline := time.Now().Add(15 * time.Second)
	for {
		missing := 0
		for i := warmN; i < total; i++ {
			if rec.at[i].Load() == 0 {
				missing++
			}
		}
		res.missing = missing
		if missing == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	lat := make([]float64, 0, total-warmN)
	var bs, cs []float64
	delay := make([]time.Duration, total)
	for i := warmN; i < total; i++ {
		bs, cs = append(bs, float64(begins[i])), append(cs, float64(commits[i]))
		at := time.Duration(rec.at[i].Load())
		if at == 0 {
			continue
		}
		d := at - commitAt[i]
		if d < 0 {
			res.early++
			d = 0
		}
		delay[i] = d
		lat = append(lat, float64(d))
	}
	res.beginP99, res.beginMax = time.Duration(quantile(bs, 0.99)), time.Duration(quantile(bs, 1))
	res.commitP99, res.commitMax = time.Duration(quantile(cs, 0.99)), time.Duration(quantile(cs, 1))
	res.tailClustered = clustered(commitAt[warmN:], delay[warmN:], time.Duration(quantile(lat, 0.99)), 5*time.Millisecond)
	res.measured = len(lat)
	res.dups = int(rec.dups.Load())
	res.p50 = time.Duration(quantile(lat, 0.50))
	res.p90 = time.Duration(quantile(lat, 0.90))
	res.p99 = time.Duration(quantile(lat, 0.99))
	res.p999 = time.Duration(quantile(lat, 0.999))
	res.maxLat = time.Duration(quantile(lat, 1))
	if relay != nil {
		res.stats = relay.Stats()
	}
	p.logf("latency %d/s: p50 %s p99 %s max %s (%d measured, %d missing; generator lag %s; CPU µs/event %.0f + %.0f)",
		perSec, ms(res.p50), ms(res.p99), ms(res.maxLat), res.measured, res.missing, ms(res.maxLag), res.clientUS, res.serverUS)
	return res, nil
}

// latencyTx is one business transaction: it locks a customer's account,
// inserts the payment, updates the balance and enqueues the event. begin
// and commit receive how long BeginTx (the pool's wait) and Commit took.
func latencyTx(ctx context.Context, db *sql.DB, ob *outbox.Outbox, tenant string, i int64, payload []byte, begin, commit *time.Duration) error {
	t0 := time.Now()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	*begin = time.Since(t0)
	account := (i * 7919) % latencyAccounts
	var balance int64
	if err := tx.QueryRowContext(ctx, `SELECT balance FROM bench_accounts WHERE id = $1 FOR UPDATE`, account).Scan(&balance); err != nil {
		tx.Rollback()
		return err
	}
	if _, err := tx.ExecContext(ctx, insertPayment, tenant, i); err != nil {
		tx.Rollback()
		return err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE bench_accounts SET balance = $2 WHERE id = $1`, account, balance+i); err != nil {
		tx.Rollback()
		return err
	}
	if _, err := ob.Enqueue(ctx, tx, outbox.Event{Tenant: tenant, Type: "payment.succeeded", Payload: payload}); err != nil {
		tx.Rollback()
		return err
	}
	t1 := time.Now()
	err = tx.Commit()
	*commit = time.Since(t1)
	return err
}

// clustered returns the share of the receipts delayed more than over
// whose transaction committed within window of another such one's: near 1
// when the tail comes in bursts (everything committed during a stall waits
// for it), near 0 when slow receipts are isolated.
func clustered(commitAt, delay []time.Duration, over, window time.Duration) float64 {
	var at []time.Duration
	for i, d := range delay {
		if d > over {
			at = append(at, commitAt[i])
		}
	}
	if len(at) == 0 {
		return 0
	}
	sort.Slice(at, func(i, j int) bool { return at[i] < at[j] })
	n := 0
	for i := range at {
		if (i > 0 && at[i]-at[i-1] <= window) || (i+1 < len(at) && at[i+1]-at[i] <= window) {
			n++
		}
	}
	return float64(n) / float64(len(at))
}

func (c config) latencyWorkers() int {
	if c.LatencyWorkers > 0 {
		return c.LatencyWorkers
	}
	return defaultLatencyWorkers
}

func (c config) latencyPool() int {
	if c.LatencyPool > 0 {
		return c.LatencyPool
	}
	return defaultLatencyPool
}

func relayPoolText(c config) string {
	if c.LatencyRelayPool > 0 {
		return fmt.Sprintf("the relay on a pool of its own of %d", c.LatencyRelayPool)
	}
	return "shared with the relay"
}
