package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/sqlitelock"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

func TestMigrateConcurrentlyAndTwice(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			// Separate pools, as separate processes would have.
			other := testdb.Reopen(t, db)
			wg.Add(1)
			go func() {
				defer wg.Done()
				ob, err := outbox.New(ctx, other, outbox.Config{Logger: quietLogger()})
				if err == nil {
					err = ob.Migrate(ctx)
				}
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("concurrent migrate: %v", err)
			}
		}
		b := setup(t, db, outbox.Config{}) // migrates once more
		if err := b.ob.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if n := b.count("SELECT count(*) FROM txhook_migrations"); n < 1 {
			t.Fatalf("migrations recorded: %d", n)
		}
		if n := b.count("SELECT count(DISTINCT version) FROM txhook_migrations"); n != b.count("SELECT count(*) FROM txhook_migrations") {
			t.Fatal("a migration was recorded twice")
		}
	})
}

// TestSQLiteReplicasStartTogether starts many replicas at the same moment
// on a new SQLite file, each with its own pool (as separate processes would
// have): open, New, Migrate, then one Enqueue. None may fail with "database
// is locked"; repeated, because the collision it guards against is a race.
func TestSQLiteReplicasStartTogether(t *testing.T) {
	t.Parallel()
	const rounds, replicas = 10, 16
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for round := range rounds {
		dsn := outbox.SQLiteDSN(filepath.Join(t.TempDir(), "txhook.db"))
		start := make(chan struct{})
		errs := make(chan error, replicas)
		var wg sync.WaitGroup
		for r := range replicas {
			db, err := sql.Open(testdb.SQLiteBackends[0].Driver, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			wg.Go(func() {
				<-start
				errs <- startReplica(ctx, db, r)
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d: a replica failed to start: %v", round, err)
			}
		}
		db := testdb.Reopen(t, &testdb.DB{Backend: testdb.Backends[0], DSN: dsn})
		var mode string
		var recorded, distinct, events int
		if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRowContext(ctx, "SELECT count(*), count(DISTINCT version) FROM txhook_migrations").Scan(&recorded, &distinct); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM txhook_events").Scan(&events); err != nil {
			t.Fatal(err)
		}
		if mode != "wal" || recorded != distinct || events != replicas {
			t.Fatalf("round %d: journal_mode %s, %d migrations recorded (%d versions), %d events (want wal, each once, %d)", round, mode, recorded, distinct, events, replicas)
		}
		db.Close()
	}
}

// startReplica is what a replica does at startup: New, Migrate, and its
// first write.
func startReplica(ctx context.Context, db *sql.DB, r int) error {
	ob, err := outbox.New(ctx, db, outbox.Config{Logger: quietLogger()})
	if err != nil {
		return fmt.Errorf("new: %w", err)
	}
	defer ob.Close()
	if err := ob.Migrate(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	if _, err := ob.Enqueue(ctx, tx, outbox.Event{Tenant: "t", Type: "replica.started", Payload: []byte(fmt.Sprintf(`{"replica":%d}`, r))}); err != nil {
		return fmt.Errorf("enqueue: %w", err)
	}
	return tx.Commit()
}

// TestSQLiteNewWaitsForLock: while another connection holds the write lock
// of a new SQLite file in rollback mode, as a replica switching it to WAL
// does, a pool opened with SQLiteDSN cannot switch the file to WAL, and
// SQLite refuses that at once, busy timeout or not. New and Migrate must
// wait for the lock instead of failing the replica's startup.
func TestSQLiteNewWaitsForLock(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	path := filepath.Join(t.TempDir(), "txhook.db")
	release := testdb.HoldSQLiteLock(t, path)
	db, err := sql.Open(testdb.SQLiteBackends[0].Driver, outbox.SQLiteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	waiting := make(chan struct{})
	var once sync.Once
	wctx := sqlitelock.OnWait(ctx, func(error) { once.Do(func() { close(waiting) }) })
	done := make(chan error, 1)
	go func() { done <- startReplica(wctx, db, 0) }()
	select {
	case <-waiting:
	case err := <-done:
		t.Fatalf("the replica did not wait for the lock: %v", err)
	}
	release()
	if err := <-done; err != nil {
		t.Fatalf("after the lock was released: %v", err)
	}
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode %q, %v", mode, err)
	}
}
