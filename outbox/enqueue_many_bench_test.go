package outbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// BenchmarkEnqueueBatch compares one transaction enqueuing 100 events with
// EnqueueMany against the same transaction with 100 Enqueue calls, on each
// backend. An op is one committed transaction of 100 events; events/s is
// the rate one connection reaches.
//
//	go test -run '^$' -bench EnqueueBatch -benchtime 300x ./outbox/
func BenchmarkEnqueueBatch(b *testing.B) {
	const n = 100
	for _, be := range testdb.Backends {
		for _, mode := range []string{"many", "single"} {
			b.Run(be.Name+"/"+mode, func(b *testing.B) {
				db := testdb.Open(b, be)
				ctx := context.Background()
				ob, err := outbox.New(ctx, db.DB, outbox.Config{Logger: quietLogger()})
				if err != nil {
					b.Fatal(err)
				}
				if err := ob.Migrate(ctx); err != nil {
					b.Fatal(err)
				}
				defer ob.Close()
				evs := make([]outbox.Event, n)
				for i := range evs {
					evs[i] = outbox.Event{Tenant: "merchant_42", Type: "payment.succeeded",
						Payload: fmt.Appendf(nil, `{"payment_id":"pay_%d","amount":1200,"currency":"EUR"}`, i)}
				}
				b.ResetTimer()
				for range b.N {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						b.Fatal(err)
					}
					if mode == "many" {
						_, err = ob.EnqueueMany(ctx, tx, evs)
					} else {
						for _, ev := range evs {
							if _, err = ob.Enqueue(ctx, tx, ev); err != nil {
								break
							}
						}
					}
					if err != nil {
						tx.Rollback()
						b.Fatal(err)
					}
					if err := tx.Commit(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "events/s")
			})
		}
	}
}
