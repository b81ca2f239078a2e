package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// TestPgBouncer runs delivery, crash and ordering tests through PgBouncer
// in pool_mode = transaction (.ci/pgbouncer.sh: 4 server connections, so
// relays with 8 to 32 workers, several relay processes and the test's own
// connections share them transaction by transaction), on lib/pq and pgx's
// stdlib driver with the settings of the PgBouncer section of docs/drivers.md:
// Config.TransactionPooling, the table schema in Config.Schema and LISTEN
// on a direct connection. Skipped without TXHOOK_TEST_PGBOUNCER_DSN,
// mandatory with TXHOOK_REQUIRE_PGBOUNCER=1.
func TestPgBouncer(t *testing.T) {
	cases := []struct {
		name       string
		subprocess bool
		run        func(*testing.T, *testdb.DB)
	}{
		{"EnqueueRollbackThenCommit", false, enqueueRollbackThenCommit},
		{"EnqueueInBusinessTransactions", false, enqueueInBusinessTransactions},
		{"OrderedPerKey", false, orderedPerKey},
		{"RelayKilledMidDelivery", true, relayKilledMidDelivery},
		{"TwoRelayProcesses", true, twoRelayProcesses},
		{"OrderedAcrossProcesses", true, orderedAcrossProcesses},
	}
	for _, be := range testdb.BouncerBackends {
		t.Run(be.Name, func(t *testing.T) {
			testdb.PgBouncerDSN(t)
			t.Parallel()
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					if c.subprocess && testing.Short() {
						t.Skip("starts subprocesses")
					}
					c.run(t, testdb.Open(t, be))
				})
			}
		})
	}
}

// enqueueInBusinessTransactions: 24 goroutines each commit or roll back
// {INSERT payment; Enqueue} while two relays of 16 workers deliver; every
// committed payment's event arrives exactly once, no rolled-back one does.
func enqueueInBusinessTransactions(t *testing.T, db *testdb.DB) {
	b := setup(t, db, outbox.Config{})
	payments := "payments"
	if db.Schema != "" {
		payments = `"` + db.Schema + `".payments`
	}
	if _, err := db.ExecContext(b.ctx, `CREATE TABLE `+payments+` (id text PRIMARY KEY, amount int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	const writers, each = 24, 25
	l := newLedger(writers * each / 2)
	srv := httptest.NewServer(l)
	t.Cleanup(srv.Close)
	b.endpoint("m", srv.URL)
	for range 2 {
		b.relay(outbox.RelayConfig{Concurrency: 16, Retry: fastRetry()})
	}
	var mu sync.Mutex
	committed := map[string]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				pay := fmt.Sprintf("pay_%d_%d", w, i)
				tx, err := db.BeginTx(b.ctx, nil)
				if err != nil {
					errs <- err
					return
				}
				if _, err := tx.ExecContext(b.ctx, `INSERT INTO `+payments+` (id, amount) VALUES ($1, $2)`, pay, i); err != nil {
					tx.Rollback()
					errs <- err
					return
				}
				id, err := b.ob.Enqueue(b.ctx, tx, outbox.Event{Tenant: "m", Type: "payment.succeeded",
					IdempotencyKey: pay, Payload: []byte(fmt.Sprintf(`{"payment_id":%q}`, pay))})
				if err != nil {
					tx.Rollback()
					errs <- err
					return
				}
				if (w+i)%2 == 1 {
					if err := tx.Rollback(); err != nil {
						errs <- err
						return
					}
					continue
				}
				if err := tx.Commit(); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				committed[id] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(committed) != writers*each/2 {
		t.Fatalf("%d committed, want %d", len(committed), writers*each/2)
	}
	select {
	case <-l.allArrived:
	case <-time.After(waitFor):
		l.mu.Lock()
		t.Fatalf("only %d of %d events delivered", l.distinct, len(committed))
	}
	b.eventually("every delivery recorded as succeeded", func() bool {
		return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded'") == len(committed)
	})
	if n := b.count("SELECT count(*) FROM txhook_events"); n != len(committed) {
		t.Fatalf("%d events for %d committed payments", n, len(committed))
	}
	if n := b.count("SELECT count(*) FROM " + payments); n != len(committed) {
		t.Fatalf("%d payments, %d committed", n, len(committed))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for id := range l.delivered {
		if !committed[id] {
			t.Errorf("event %s delivered, but its transaction rolled back", id)
		}
	}
	if l.total != len(committed) {
		t.Fatalf("receiver got %d requests for %d events", l.total, len(committed))
	}
}

// TestTransactionPoolingRefusesUnsafeDriverSettings: with
// TransactionPooling, New refuses lib/pq without binary_parameters and pgx
// in its default exec mode, which through PgBouncer made relays send an
// event twice and out of order (lib/pq) or fail (pgx), and accepts both
// with the settings docs/drivers.md gives.
func TestTransactionPoolingRefusesUnsafeDriverSettings(t *testing.T) {
	for _, be := range testdb.PostgresBackends {
		t.Run(be.Name, func(t *testing.T) {
			db := testdb.Open(t, be)
			ctx := context.Background()
			cfg := outbox.Config{TransactionPooling: true, Logger: quietLogger()}
			_, err := outbox.New(ctx, db.DB, cfg)
			if !errors.Is(err, outbox.ErrPoolerUnsafe) {
				t.Fatalf("New with the driver's default settings: %v, want ErrPoolerUnsafe", err)
			}
			t.Log(err)
			dsn, err := testdb.WithParams(db.DSN, testdb.PoolerParams(be.Driver))
			if err != nil {
				t.Fatal(err)
			}
			safe, err := sql.Open(be.Driver, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer safe.Close()
			if _, err := outbox.New(ctx, safe, cfg); err != nil {
				t.Fatalf("New with %v: %v", testdb.PoolerParams(be.Driver), err)
			}
			// Without TransactionPooling nothing is checked.
			cfg.TransactionPooling = false
			if _, err := outbox.New(ctx, db.DB, cfg); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestTransactionPoolingWithoutListenerWarns: a relay of an Outbox behind
// a pooler, without a Listener, polls and says which Listener to set: one
// on a direct connection.
func TestTransactionPoolingWithoutListenerWarns(t *testing.T) {
	db := testdb.PgBouncer(t, testdb.PGX.Driver)
	var logs logBuffer
	ob, err := outbox.New(context.Background(), db.DB, outbox.Config{TransactionPooling: true, Schema: db.Schema, Logger: logs.logger()})
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{t: t, db: db, ob: ob, ctx: context.Background()}
	if err := ob.Migrate(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.relay(outbox.RelayConfig{})
	if s := logs.String(); !strings.Contains(s, "no Config.Listener") || !strings.Contains(s, "pgxoutbox.DirectListener") {
		t.Fatalf("logs: %s", s)
	}
}
