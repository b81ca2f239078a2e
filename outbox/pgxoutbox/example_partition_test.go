package pgxoutbox_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/pgxoutbox"
)

// A service that keeps months of events partitions its tables by day,
// once, on the new database: retention then drops a day's partition
// instead of deleting its rows one by one. Enqueue and relays work as
// before; idempotency keys stay unique across partitions.
func Example_partition() {
	ctx := context.Background()
	dsn, drop := exampleDSN() // a fresh schema of the test database
	defer drop()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	ob, err := pgxoutbox.New(ctx, pool, outbox.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	defer ob.DB().Close()
	if err := ob.Migrate(ctx); err != nil {
		panic(err)
	}
	if err := ob.Partition(ctx, outbox.PartitionConfig{Interval: 24 * time.Hour, Ahead: 3}); err != nil {
		panic(err)
	}
	var n int
	pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'txhook_deliveries'::regclass`).Scan(&n)
	fmt.Println("delivery partitions (today, 3 ahead, DEFAULT):", n)

	// The same payment's event twice: one event, the same ID back.
	var ids []string
	for range 2 {
		tx, _ := pool.Begin(ctx)
		id, err := pgxoutbox.Enqueue(ctx, ob, tx, outbox.Event{Tenant: "merchant_42", Type: "payment.succeeded",
			IdempotencyKey: "pay_1:succeeded", Payload: []byte(`{"payment_id":"pay_1"}`)})
		if err != nil {
			tx.Rollback(ctx)
			panic(err)
		}
		tx.Commit(ctx)
		ids = append(ids, id)
	}
	fmt.Println("same event:", ids[0] == ids[1])
	pool.QueryRow(ctx, `SELECT count(*) FROM txhook_events`).Scan(&n)
	fmt.Println("events:", n)

	// Relays prune on their own; a cron job can call Prune.
	p, err := ob.Prune(ctx, outbox.Retention{})
	fmt.Println("partitions dropped:", p.Partitions, err)
	// Output:
	// delivery partitions (today, 3 ahead, DEFAULT): 5
	// same event: true
	// events: 1
	// partitions dropped: 0 <nil>
}
