package main

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/txhook/txhook/outbox"
)

// latencyWorkers is how many goroutines (and connections) the open-loop
// generator commits from; enough that it keeps its schedule at a few
// thousand transactions a second.
const latencyWorkers = 32

type latencyResult struct {
	rate                        int
	sent, measured, missing     int
	early, dups                 int
	achieved                    float64 // committed per second over the run
	p50, p90, p99, p999, maxLat time.Duration
	maxLag                      time.Duration // worst delay between a transaction's scheduled and actual start
	stats                       outbox.RelayStats
	clientUS, serverUS          float64 // CPU per event over the measured window; negative when unknown
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
			Part:  fmt.Sprintf("commit→receipt latency at %s events/s, default relay (p50 / p99)", commas(int64(r))),
			Value: ms(res.p50) + " / " + ms(res.p99),
		}
		if r == 500 {
			x.Target = "p50 < 5 ms, p99 < 25 ms"
			x.Verdict = verdict(res.p50 < 5*time.Millisecond && res.p99 < 25*time.Millisecond && res.missing == 0)
		}
		rep.add(x)
		fmt.Fprintf(&detail, "%5d/s: %d measured (after %s warm-up) of %d committed, %.0f committed/s; p50 %s p90 %s p99 %s p99.9 %s max %s; missing %d, duplicates %d, arrived before Commit returned %d; generator's worst start lag %s; CPU per event %.0f µs in this process (generator, relay, receiver) + %.0f µs in PostgreSQL\n",
			r, res.measured, cfg.LatencyWarmup, res.sent, res.achieved, ms(res.p50), ms(res.p90), ms(res.p99), ms(res.p999), ms(res.maxLat),
			res.missing, res.dups, res.early, ms(res.maxLag), res.clientUS, res.serverUS)
	}
	rep.section("Latency runs", detail.String())
	return nil
}

// latencyRun measures one tenant's commit-to-receipt latency at perSec
// events a second. neighbours, when set, is called before the relay starts
// to add other tenants' load; the function it returns stops that load.
func latencyRun(ctx context.Context, cfg config, rcv *receiver, perSec int, p *progress,
	neighbours func(ctx context.Context, s *pgSchema) (stop func(), err error)) (latencyResult, error) {
	res := latencyResult{rate: perSec}
	obCfg := localOutbox()
	obCfg.NotifyInterval = cfg.NotifyInterval
	s, err := newSchema(ctx, cfg.DSN, "pgx", latencyWorkers+8, obCfg)
	if err != nil {
		return res, err
	}
	defer s.drop()
	if _, err := s.db.ExecContext(ctx, paymentsDDL); err != nil {
		return res, err
	}
	const tenant = "merchant_latency"
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
	relay, err := s.ob.NewRelay(outbox.RelayConfig{})
	if err != nil {
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

	total := int((cfg.LatencyWarmup + cfg.LatencyDur).Seconds() * float64(perSec))
	warmN := int(cfg.LatencyWarmup.Seconds() * float64(perSec))
	period := time.Second / time.Duration(perSec)
	base := time.Now()
	rec := newRecorder(base, total)
	rcv.rec.Store(rec)
	defer rcv.rec.Store(nil)

	commitAt := make([]time.Duration, total)
	var meter *cpuMeter
	meterAt := -1
	lags := make([]time.Duration, latencyWorkers)
	jobs := make(chan int, total)
	var wg sync.WaitGroup
	var errOnce sync.Once
	var genErr error
	gctx, cancelGen := context.WithCancel(ctx)
	defer cancelGen()
	for w := range latencyWorkers {
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
				if err := latencyTx(gctx, s.db, s.ob, tenant, int64(i), payload); err != nil {
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
	for i := warmN; i < total; i++ {
		at := time.Duration(rec.at[i].Load())
		if at == 0 {
			continue
		}
		d := at - commitAt[i]
		if d < 0 {
			res.early++
			d = 0
		}
		lat = append(lat, float64(d))
	}
	res.measured = len(lat)
	res.dups = int(rec.dups.Load())
	res.p50 = time.Duration(quantile(lat, 0.50))
	res.p90 = time.Duration(quantile(lat, 0.90))
	res.p99 = time.Duration(quantile(lat, 0.99))
	res.p999 = time.Duration(quantile(lat, 0.999))
	res.maxLat = time.Duration(quantile(lat, 1))
	res.stats = relay.Stats()
	p.logf("latency %d/s: p50 %s p99 %s max %s (%d measured, %d missing; generator lag %s; CPU µs/event %.0f + %.0f)",
		perSec, ms(res.p50), ms(res.p99), ms(res.maxLat), res.measured, res.missing, ms(res.maxLag), res.clientUS, res.serverUS)
	return res, nil
}

// latencyTx is one business transaction: the payment and its event.
func latencyTx(ctx context.Context, db *sql.DB, ob *outbox.Outbox, tenant string, i int64, payload []byte) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, insertPayment, tenant, i); err != nil {
		tx.Rollback()
		return err
	}
	if _, err := ob.Enqueue(ctx, tx, outbox.Event{Tenant: tenant, Type: "payment.succeeded", Payload: payload}); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}
