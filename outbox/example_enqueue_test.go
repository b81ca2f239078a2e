package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite" // pure Go; mattn/go-sqlite3 ("sqlite3") works the same

	"github.com/txhook/txhook/outbox"
)

// A retried business operation enqueues its event again with the same
// idempotency key: EnqueueDetail reports the duplicate and writes nothing.
// The key reused for other content is refused, and the transaction stays
// usable.
func ExampleOutbox_EnqueueDetail() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "txhook-example-")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	ob, _ := outbox.New(ctx, db, outbox.Config{})
	ob.Migrate(ctx)

	ev := outbox.Event{
		Tenant:         "merchant_42",
		Type:           "payment.succeeded",
		IdempotencyKey: "pay_1:succeeded",
	}
	for _, amount := range []int{1200, 1200, 1300} {
		ev.Payload = fmt.Appendf(nil, `{"payment_id":"pay_1","amount":%d}`, amount)
		tx, _ := db.BeginTx(ctx, nil)
		r, err := ob.EnqueueDetail(ctx, tx, ev)
		switch {
		case errors.Is(err, outbox.ErrIdempotencyConflict):
			fmt.Println(amount, "refused: the key was used for another event")
		case err != nil:
			tx.Rollback()
			panic(err)
		case r.Duplicate:
			fmt.Println(amount, "already enqueued")
		default:
			fmt.Println(amount, "enqueued")
		}
		tx.Commit()
	}
	// Output:
	// 1200 enqueued
	// 1200 already enqueued
	// 1300 refused: the key was used for another event
}
