package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// BenchmarkEnqueuePooling prices TransactionPooling: one connection
// commits {INSERT payment; Enqueue} transactions directly with prepared
// statements (the default), directly with TransactionPooling and the
// drivers' pooler settings (no prepared statements), and through
// PgBouncer (.ci/pgbouncer.sh) with them. An op is one committed
// transaction.
//
//	export TXHOOK_TEST_PGBOUNCER_DSN=$(bash .ci/pgbouncer.sh)
//	go test -run '^$' -bench EnqueuePooling -benchtime 2000x -count 3 ./outbox/
func BenchmarkEnqueuePooling(b *testing.B) {
	for _, be := range testdb.PostgresBackends {
		for _, arm := range []string{"direct", "direct-txpooling", "pgbouncer"} {
			b.Run(be.Name+"/"+arm, func(b *testing.B) {
				ctx := context.Background()
				var db *sql.DB
				cfg := outbox.Config{Logger: quietLogger()}
				payments := "payments"
				switch arm {
				case "direct":
					db = testdb.Open(b, be).DB
				case "direct-txpooling":
					tdb := testdb.Open(b, be)
					dsn, err := testdb.WithParams(tdb.DSN, testdb.PoolerParams(be.Driver))
					if err != nil {
						b.Fatal(err)
					}
					if db, err = sql.Open(be.Driver, dsn); err != nil {
						b.Fatal(err)
					}
					defer db.Close()
					cfg.TransactionPooling = true
				case "pgbouncer":
					tdb := testdb.PgBouncer(b, be.Driver)
					db = tdb.DB
					cfg.TransactionPooling, cfg.Schema = true, tdb.Schema
					payments = `"` + tdb.Schema + `".payments`
				}
				db.SetMaxOpenConns(1)
				ob, err := outbox.New(ctx, db, cfg)
				if err != nil {
					b.Fatal(err)
				}
				defer ob.Close()
				if err := ob.Migrate(ctx); err != nil {
					b.Fatal(err)
				}
				if _, err := db.ExecContext(ctx, `CREATE TABLE `+payments+` (id text PRIMARY KEY, amount int NOT NULL)`); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for i := range b.N {
					pay := fmt.Sprintf("pay_%d", i)
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := tx.ExecContext(ctx, `INSERT INTO `+payments+` (id, amount) VALUES ($1, 1200)`, pay); err != nil {
						b.Fatal(err)
					}
					if _, err := ob.Enqueue(ctx, tx, outbox.Event{Tenant: "merchant_42", Type: "payment.succeeded",
						Payload: fmt.Appendf(nil, `{"payment_id":%q,"amount":1200}`, pay)}); err != nil {
						b.Fatal(err)
					}
					if err := tx.Commit(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
