package pgxoutbox_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/pgxoutbox"
)

// A service on pgxpool enqueues the event in the pgx transaction that
// records the payment, and runs the relay on the same pool.
func Example() {
	ctx := context.Background()
	dsn, drop := exampleDSN() // a fresh schema of the test database
	defer drop()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	pool.Exec(ctx, `CREATE TABLE payments (id text PRIMARY KEY, amount int)`)

	// The demo receiver runs on 127.0.0.1 over http, which production
	// settings refuse.
	ob, err := pgxoutbox.New(ctx, pool, outbox.Config{AllowHTTP: true, AllowPrivateTargets: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	defer ob.DB().Close()
	if err := ob.Migrate(ctx); err != nil {
		panic(err)
	}

	got := make(chan string, 1)
	merchant := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get(outbox.HeaderEventType)
	}))
	defer merchant.Close()
	if _, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "merchant_42", URL: merchant.URL}); err != nil {
		panic(err)
	}
	relay, err := ob.NewRelay(outbox.RelayConfig{})
	if err != nil {
		panic(err)
	}
	relay.Start(ctx)
	defer func() {
		stop, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		relay.Stop(stop)
	}()

	// Rolled back: neither the payment nor its event exists.
	tx, _ := pool.Begin(ctx)
	tx.Exec(ctx, `INSERT INTO payments VALUES ('pay_1', 1200)`)
	pgxoutbox.Enqueue(ctx, ob, tx, outbox.Event{Tenant: "merchant_42", Type: "payment.failed",
		Payload: []byte(`{"payment_id":"pay_1"}`)})
	tx.Rollback(ctx)

	// Committed: the relay is woken and delivers.
	tx, _ = pool.Begin(ctx)
	tx.Exec(ctx, `INSERT INTO payments VALUES ('pay_1', 1200)`)
	if _, err := pgxoutbox.Enqueue(ctx, ob, tx, outbox.Event{
		Tenant:         "merchant_42",
		Type:           "payment.succeeded",
		IdempotencyKey: "pay_1:succeeded",
		Payload:        []byte(`{"payment_id":"pay_1","amount":1200}`),
	}); err != nil {
		tx.Rollback(ctx)
		panic(err)
	}
	tx.Commit(ctx)

	fmt.Println(<-got)
	// Output: payment.succeeded
}

// Behind PgBouncer in transaction mode, the pool sends each statement in
// one piece, the Outbox prepares nothing, and relays LISTEN on a direct
// connection. (Here both DSNs reach the test database directly, which these
// settings suit too.)
func ExampleDirectListener() {
	ctx := context.Background()
	dsn, drop := exampleDSN() // a fresh schema of the test database
	defer drop()
	bouncerDSN, directDSN := dsn, dsn

	cfg, err := pgxpool.ParseConfig(bouncerDSN)
	if err != nil {
		panic(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	ob, err := pgxoutbox.New(ctx, pool, outbox.Config{
		TransactionPooling: true,
		Listener:           pgxoutbox.DirectListener(directDSN),
		AllowHTTP:          true, AllowPrivateTargets: true, // the demo receiver
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		panic(err)
	}
	defer ob.DB().Close()
	if err := ob.Migrate(ctx); err != nil {
		panic(err)
	}
	got := make(chan string, 1)
	merchant := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get(outbox.HeaderEventType)
	}))
	defer merchant.Close()
	if _, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "merchant_42", URL: merchant.URL}); err != nil {
		panic(err)
	}
	relay, err := ob.NewRelay(outbox.RelayConfig{})
	if err != nil {
		panic(err)
	}
	if err := relay.Start(ctx); err != nil {
		panic(err)
	}
	defer func() {
		stop, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		relay.Stop(stop)
	}()

	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	if _, err := pgxoutbox.Enqueue(ctx, ob, tx, outbox.Event{Tenant: "merchant_42", Type: "payment.succeeded",
		Payload: []byte(`{"payment_id":"pay_1"}`)}); err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}
	fmt.Println(<-got)
	// Output: payment.succeeded
}
