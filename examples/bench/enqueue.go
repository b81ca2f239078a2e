package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/outbox"
)

const paymentsDDL = `CREATE TABLE IF NOT EXISTS bench_payments (
    id bigserial PRIMARY KEY, merchant text NOT NULL, amount bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now())`

// plainOutboxDDL is the baseline's outbox: what a team writes by hand, one
// row per event with a serial key.
const plainOutboxDDL = `CREATE TABLE IF NOT EXISTS bench_plain_outbox (
    id bigserial PRIMARY KEY, tenant text NOT NULL, type text NOT NULL, payload json NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now())`

const (
	insertPayment = `INSERT INTO bench_payments (merchant, amount) VALUES ($1, $2)`
	insertPlain   = `INSERT INTO bench_plain_outbox (tenant, type, payload) VALUES ($1, $2, $3)`
)

func driverName(d string) string {
	if d == "postgres" {
		return "lib/pq"
	}
	return d
}

// inTx runs fn in a transaction and commits it, or rolls it back if fn
// fails.
func inTx(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// runTxLoop runs fn in transactions from conns goroutines for d and
// returns the number committed.
func runTxLoop(ctx context.Context, db *sql.DB, conns int, d time.Duration, fn func(tx *sql.Tx, i int64) error) (int64, error) {
	var n atomic.Int64
	var firstErr error
	var once sync.Once
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for g := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int64(g) << 32; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				if err := inTx(ctx, db, func(tx *sql.Tx) error { return fn(tx, i) }); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return n.Load(), firstErr
}

// partEnqueue measures business transactions {INSERT payment; Enqueue}
// against {INSERT payment; one plain INSERT of the same payload} on the
// same pool, in alternating rounds (ABBA order), per driver.
func partEnqueue(ctx context.Context, cfg config, rep *report, p *progress) error {
	var detail strings.Builder
	for _, driver := range cfg.EnqueueDrivers {
		s, err := newSchema(ctx, cfg.DSN, driver, cfg.EnqueueConns, outbox.Config{NotifyInterval: cfg.NotifyInterval})
		if err != nil {
			return err
		}
		res, err := enqueueRounds(ctx, cfg, s, p, driver)
		s.drop()
		if err != nil {
			return fmt.Errorf("%s: %w", driverName(driver), err)
		}
		r := median(res.ratios)
		rep.add(row{
			Part:     fmt.Sprintf("Enqueue, %s, %d connections (tx/s)", driverName(driver), cfg.EnqueueConns),
			Value:    rate(median(res.enq)),
			Baseline: rate(median(res.plain)) + " (plain INSERT)",
			Ratio:    ratio(r),
			Target:   "≥ 0.85×",
			Verdict:  verdict(r >= 0.85),
		})
		if len(res.cpuEnq) > 0 {
			rep.add(row{
				Part:     fmt.Sprintf("… CPU per transaction, %s: this process + its PostgreSQL backends (µs; ratio = plain/Enqueue)", driverName(driver)),
				Value:    fmt.Sprintf("%.0f", median(res.cpuEnq)),
				Baseline: fmt.Sprintf("%.0f (plain INSERT)", median(res.cpuPlain)),
				Ratio:    ratio(median(res.cpuPlain) / median(res.cpuEnq)),
			})
		}
		fmt.Fprintf(&detail, "%s: %d rounds of %s per arm\n  plain   tx/s: %s\n  enqueue tx/s: %s\n  ratio:        ",
			driverName(driver), len(res.ratios), cfg.EnqueueRound, rates(res.plain), rates(res.enq))
		for _, x := range res.ratios {
			fmt.Fprintf(&detail, "%.2f ", x)
		}
		if len(res.cpuEnq) > 0 {
			fmt.Fprintf(&detail, "\n  CPU µs/tx, client + server: plain %s, enqueue %s",
				cpuList(res.cpuPlainC, res.cpuPlain), cpuList(res.cpuEnqC, res.cpuEnq))
		}
		fmt.Fprintf(&detail, "\n  NOTIFYs received by the listening connection: %.0f/s during Enqueue rounds", res.notifies)
		detail.WriteString("\n")
	}
	rep.section("Enqueue rounds", detail.String())
	return nil
}

// enqueueResult holds the per-round figures of one driver.
type enqueueResult struct {
	plain, enq, ratios []float64 // tx/s, and enqueue/plain per round
	cpuPlain, cpuEnq   []float64 // µs of CPU per transaction, client + server
	cpuPlainC, cpuEnqC []float64 // of which client
	notifies           float64   // wake-ups received per second of Enqueue rounds
}

func cpuList(client, total []float64) string {
	s := make([]string, len(total))
	for i := range total {
		s[i] = fmt.Sprintf("%.0f+%.0f", client[i], total[i]-client[i])
	}
	return strings.Join(s, " ")
}

func enqueueRounds(ctx context.Context, cfg config, s *pgSchema, p *progress, driver string) (res enqueueResult, err error) {
	for _, q := range []string{paymentsDDL, plainOutboxDDL} {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			return res, err
		}
	}
	// A connection listens for the wake-ups, as a relay's would, so that
	// NOTIFY costs what it costs with a relay running (whose dispatching
	// is measured by the drain part, not here).
	lctx, stopListening := context.WithCancel(ctx)
	defer stopListening()
	notes, err := listen(lctx, s.dsn)
	if err != nil {
		return res, err
	}
	tenant := "merchant_bench"
	plain := func(tx *sql.Tx, i int64) error {
		if _, err := tx.ExecContext(ctx, insertPayment, tenant, i); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, insertPlain, tenant, "payment.succeeded", string(benchPayload))
		return err
	}
	enq := func(tx *sql.Tx, i int64) error {
		if _, err := tx.ExecContext(ctx, insertPayment, tenant, i); err != nil {
			return err
		}
		_, err := s.ob.Enqueue(ctx, tx, outbox.Event{Tenant: tenant, Type: "payment.succeeded", Payload: benchPayload})
		return err
	}
	// arm returns tx/s and, when it can be measured, µs of CPU per
	// transaction (total and client side).
	arm := func(name string, fn func(*sql.Tx, int64) error, d time.Duration) (float64, float64, float64, error) {
		m := startCPU(ctx, s.db, s.name)
		n, err := runTxLoop(ctx, s.db, cfg.EnqueueConns, d, fn)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("%s: %w", name, err)
		}
		client, server, ok := m.stop(ctx)
		if !ok || n == 0 {
			return float64(n) / d.Seconds(), -1, -1, nil
		}
		return float64(n) / d.Seconds(), (client + server) * 1e6 / float64(n), client * 1e6 / float64(n), nil
	}
	// Warm-up: connections, prepared statements, caches.
	warm := max(cfg.EnqueueRound/3, 200*time.Millisecond)
	if _, _, _, err := arm("plain", plain, warm); err != nil {
		return res, err
	}
	if _, _, _, err := arm("enqueue", enq, warm); err != nil {
		return res, err
	}
	cpuOK := true
	notes.Store(0)
	var enqTime time.Duration
	for round := range cfg.EnqueueRounds {
		enqTime += cfg.EnqueueRound
		var pr, er, pc, ec, pcc, ecc float64
		var err error
		if round%2 == 0 {
			if pr, pc, pcc, err = arm("plain", plain, cfg.EnqueueRound); err == nil {
				er, ec, ecc, err = arm("enqueue", enq, cfg.EnqueueRound)
			}
		} else {
			if er, ec, ecc, err = arm("enqueue", enq, cfg.EnqueueRound); err == nil {
				pr, pc, pcc, err = arm("plain", plain, cfg.EnqueueRound)
			}
		}
		if err != nil {
			return res, err
		}
		res.plain, res.enq, res.ratios = append(res.plain, pr), append(res.enq, er), append(res.ratios, er/pr)
		cpuOK = cpuOK && pc > 0 && ec > 0
		res.cpuPlain, res.cpuEnq = append(res.cpuPlain, pc), append(res.cpuEnq, ec)
		res.cpuPlainC, res.cpuEnqC = append(res.cpuPlainC, pcc), append(res.cpuEnqC, ecc)
		p.logf("enqueue %s round %d/%d: plain %s tx/s, enqueue %s tx/s, ratio %.2f; CPU µs/tx plain %.0f, enqueue %.0f",
			driverName(driver), round+1, cfg.EnqueueRounds, rate(pr), rate(er), er/pr, pc, ec)
	}
	if !cpuOK {
		res.cpuPlain, res.cpuEnq, res.cpuPlainC, res.cpuEnqC = nil, nil, nil, nil
	}
	res.notifies = float64(notes.Load()) / enqTime.Seconds()
	return res, nil
}

// listen opens a connection that LISTENs on the relay's wake-up channel and
// counts notifications until ctx is done.
func listen(ctx context.Context, dsn string) (*atomic.Int64, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+store.WakeChannel); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	var n atomic.Int64
	go func() {
		defer conn.Close(context.Background())
		for {
			if _, err := conn.WaitForNotification(ctx); err != nil {
				return
			}
			n.Add(1)
		}
	}()
	return &n, nil
}
