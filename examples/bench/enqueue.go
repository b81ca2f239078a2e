package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
				tx, err := db.BeginTx(ctx, nil)
				if err == nil {
					if err = fn(tx, i); err == nil {
						err = tx.Commit()
					} else {
						tx.Rollback()
					}
				}
				if err != nil {
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
		s, err := newSchema(ctx, cfg.DSN, driver, cfg.EnqueueConns, outbox.Config{})
		if err != nil {
			return err
		}
		plainRates, enqRates, ratios, err := enqueueRounds(ctx, cfg, s, p, driver)
		s.drop()
		if err != nil {
			return fmt.Errorf("%s: %w", driverName(driver), err)
		}
		r := median(ratios)
		rep.add(row{
			Part:     fmt.Sprintf("Enqueue, %s, %d connections (tx/s)", driverName(driver), cfg.EnqueueConns),
			Value:    rate(median(enqRates)),
			Baseline: rate(median(plainRates)) + " (plain INSERT)",
			Ratio:    ratio(r),
			Target:   "≥ 0.85×",
			Verdict:  verdict(r >= 0.85),
		})
		fmt.Fprintf(&detail, "%s: %d rounds of %s per arm\n  plain   tx/s: %s\n  enqueue tx/s: %s\n  ratio:        ",
			driverName(driver), len(ratios), cfg.EnqueueRound, rates(plainRates), rates(enqRates))
		for _, x := range ratios {
			fmt.Fprintf(&detail, "%.2f ", x)
		}
		detail.WriteString("\n")
	}
	rep.section("Enqueue rounds", detail.String())
	return nil
}

func enqueueRounds(ctx context.Context, cfg config, s *pgSchema, p *progress, driver string) (plainRates, enqRates, ratios []float64, err error) {
	for _, q := range []string{paymentsDDL, plainOutboxDDL} {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			return nil, nil, nil, err
		}
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
	arm := func(name string, fn func(*sql.Tx, int64) error, d time.Duration) (float64, error) {
		n, err := runTxLoop(ctx, s.db, cfg.EnqueueConns, d, fn)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", name, err)
		}
		return float64(n) / d.Seconds(), nil
	}
	// Warm-up: connections, prepared statements, caches.
	warm := max(cfg.EnqueueRound/3, 200*time.Millisecond)
	if _, err := arm("plain", plain, warm); err != nil {
		return nil, nil, nil, err
	}
	if _, err := arm("enqueue", enq, warm); err != nil {
		return nil, nil, nil, err
	}
	for round := range cfg.EnqueueRounds {
		var pr, er float64
		var err error
		if round%2 == 0 {
			if pr, err = arm("plain", plain, cfg.EnqueueRound); err == nil {
				er, err = arm("enqueue", enq, cfg.EnqueueRound)
			}
		} else {
			if er, err = arm("enqueue", enq, cfg.EnqueueRound); err == nil {
				pr, err = arm("plain", plain, cfg.EnqueueRound)
			}
		}
		if err != nil {
			return nil, nil, nil, err
		}
		plainRates, enqRates, ratios = append(plainRates, pr), append(enqRates, er), append(ratios, er/pr)
		p.logf("enqueue %s round %d/%d: plain %s tx/s, enqueue %s tx/s, ratio %.2f",
			driverName(driver), round+1, cfg.EnqueueRounds, rate(pr), rate(er), er/pr)
	}
	return plainRates, enqRates, ratios, nil
}
