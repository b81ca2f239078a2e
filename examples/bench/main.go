// Command bench measures txhook against baselines run in the same process,
// on PostgreSQL and SQLite, and writes docs/BENCHMARKS.md.
//
//	TXHOOK_BENCH_POSTGRES_DSN=postgres://postgres@127.0.0.1:5432/test?sslmode=disable go run ./examples/bench
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"
	_ "github.com/mattn/go-sqlite3"

	"github.com/txhook/txhook/outbox"
)

func main() {
	only := flag.String("only", "", "run one part: enqueue, drain, latency, backlog, sqlite")
	dur := flag.Duration("d", 5*time.Second, "duration of each enqueue round")
	flag.DurationVar(&notifyInterval, "notify", 0, "Config.NotifyInterval")
	flag.Parse()
	ctx := context.Background()
	dsn := os.Getenv("TXHOOK_BENCH_POSTGRES_DSN")
	if *only == "" || *only == "enqueue" {
		for _, driver := range []string{"postgres", "pgx"} {
			db, ob, cleanup, err := freshPostgres(ctx, driver, dsn, 16)
			if err != nil {
				fail(err)
			}
			r, err := benchEnqueue(ctx, db, ob, driver, 16, *dur, 3)
			cleanup()
			if err != nil {
				fail(err)
			}
			fmt.Printf("enqueue %-8s plain %7.0f tx/s  enqueue %7.0f tx/s  ratio %.2f\n", driver, r.plain, r.enqueue, r.enqueue/r.plain)
		}
	}
	if *only == "" || *only == "drain" {
		url, _, stop, err := noopReceiver()
		if err != nil {
			fail(err)
		}
		defer stop()
		envelope := append(append([]byte(`{"id":"01JD0000000000000000000000","type":"payment.succeeded","timestamp":"2026-11-30T12:00:00.000000Z","data":`), benchPayload...), '}')
		for _, conc := range []int{16, 100} {
			db, _, cleanup, err := freshPostgres(ctx, "pgx", dsn, conc)
			if err != nil {
				fail(err)
			}
			ob2, _ := outbox.New(ctx, db, outbox.Config{Logger: quiet(), AllowHTTP: true, AllowPrivateTargets: true})
			bare, err := bareLoop(url, conc, 20000, envelope)
			if err != nil {
				fail(err)
			}
			rate, err := benchDrain(ctx, db, ob2, url, conc, 20000)
			cleanup()
			if err != nil {
				fail(err)
			}
			fmt.Printf("drain   %3d in flight: bare %7.0f/s  txhook %7.0f/s  ratio %.2f\n", conc, bare, rate, rate/bare)
		}
	}
}

var notifyInterval time.Duration

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// freshPostgres returns a pool on a new schema, migrated.
func freshPostgres(ctx context.Context, driver, dsn string, conns int) (*sql.DB, *outbox.Outbox, func(), error) {
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, nil, nil, err
	}
	schema := fmt.Sprintf("txhook_bench_%d", time.Now().UnixNano())
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		return nil, nil, nil, err
	}
	sep := "?"
	for _, c := range dsn {
		if c == '?' {
			sep = "&"
		}
	}
	db, err := sql.Open(driver, dsn+sep+"search_path="+schema)
	if err != nil {
		return nil, nil, nil, err
	}
	db.SetMaxOpenConns(conns + 4)
	db.SetMaxIdleConns(conns + 4)
	cfg := outbox.Config{Logger: quiet(), NotifyInterval: notifyInterval}
	if driver == "postgres" {
		cfg.ListenDSN = dsn + sep + "search_path=" + schema
	}
	ob, err := outbox.New(ctx, db, cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := ob.Migrate(ctx); err != nil {
		return nil, nil, nil, err
	}
	cleanup := func() {
		ob.Close()
		db.Close()
		admin.ExecContext(ctx, "DROP SCHEMA "+schema+" CASCADE")
		admin.Close()
	}
	return db, ob, cleanup, nil
}
