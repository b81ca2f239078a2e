package main

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txhook/txhook/outbox"
)

// enqueueResult is one enqueue measurement.
type enqueueResult struct {
	driver           string
	enqueue, plain   float64 // transactions per second
	enqueueN, plainN int64
}

const paymentsDDL = `CREATE TABLE IF NOT EXISTS bench_payments (id bigserial PRIMARY KEY, merchant text NOT NULL, amount bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`

// plainOutboxDDL is the baseline's outbox: one row per event, nothing else.
const plainOutboxDDL = `CREATE TABLE IF NOT EXISTS bench_plain_outbox (id bigserial PRIMARY KEY, tenant text NOT NULL, type text NOT NULL, payload json NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`

var benchPayload = []byte(`{"payment_id":"pay_0123456789","amount":1200,"currency":"usd","customer":"cus_42","status":"succeeded"}`)

// runTxLoop runs fn in transactions from conns goroutines for d and
// returns the number committed.
func runTxLoop(ctx context.Context, db *sql.DB, conns int, d time.Duration, fn func(tx *sql.Tx, i int64) error) (int64, error) {
	var n atomic.Int64
	var firstErr error
	var once sync.Once
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				i := n.Load()
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
	return n.Load(), firstErr
}

// benchEnqueue measures business transactions {INSERT payment; Enqueue}
// against {INSERT payment; one plain INSERT of the same payload}, on one
// pool of conns connections, alternating rounds so both see the same load.
func benchEnqueue(ctx context.Context, db *sql.DB, ob *outbox.Outbox, driver string, conns int, d time.Duration, rounds int) (enqueueResult, error) {
	for _, q := range []string{paymentsDDL, plainOutboxDDL} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return enqueueResult{}, err
		}
	}
	if _, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "merchant_bench", URL: "https://93.184.216.34/hook", EventTypes: []string{"payment.*"}}); err != nil {
		return enqueueResult{}, err
	}
	ins := `INSERT INTO bench_payments (merchant, amount) VALUES ($1, $2)`
	plain := func(tx *sql.Tx, i int64) error {
		if _, err := tx.ExecContext(ctx, ins, "merchant_bench", i); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO bench_plain_outbox (tenant, type, payload) VALUES ($1, $2, $3)`, "merchant_bench", "payment.succeeded", string(benchPayload))
		return err
	}
	enq := func(tx *sql.Tx, i int64) error {
		if _, err := tx.ExecContext(ctx, ins, "merchant_bench", i); err != nil {
			return err
		}
		_, err := ob.Enqueue(ctx, tx, outbox.Event{Tenant: "merchant_bench", Type: "payment.succeeded", Payload: benchPayload})
		return err
	}
	var r enqueueResult
	r.driver = driver
	var te, tp time.Duration
	for range rounds {
		n, err := runTxLoop(ctx, db, conns, d, plain)
		if err != nil {
			return r, fmt.Errorf("plain: %w", err)
		}
		r.plainN += n
		tp += d
		n, err = runTxLoop(ctx, db, conns, d, enq)
		if err != nil {
			return r, fmt.Errorf("enqueue: %w", err)
		}
		r.enqueueN += n
		te += d
	}
	r.enqueue = float64(r.enqueueN) / te.Seconds()
	r.plain = float64(r.plainN) / tp.Seconds()
	return r, nil
}
