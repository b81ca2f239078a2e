package verify_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/sqlitelock"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/verify"
	"github.com/txhook/txhook/verify/internal/storetest"
)

func newSQLStore(t *testing.T, db *testdb.DB, now func() time.Time) *verify.SQLStore {
	t.Helper()
	s, err := verify.NewSQLStore(context.Background(), db.DB, verify.SQLConfig{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateTable(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSQLStore(t *testing.T) {
	t.Parallel()
	for _, b := range testdb.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			if b.Postgres() {
				testdb.PostgresDSN(t) // skip the whole backend when there is no PostgreSQL
			}
			storetest.Run(t, func(t *testing.T) storetest.Harness {
				clk := storetest.NewClock()
				return storetest.Harness{
					Store: newSQLStore(t, testdb.Open(t, b), clk.Now),
					Lapse: func(*testing.T, string) { clk.Advance(storetest.Lease + time.Millisecond) },
				}
			})
		})
	}
}

func TestSQLStoreSetup(t *testing.T) {
	t.Parallel()
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		s := newSQLStore(t, db, nil)
		if err := s.CreateTable(ctx); err != nil { // idempotent
			t.Fatalf("second CreateTable: %v", err)
		}
		want := "sqlite"
		if db.Backend.Postgres() {
			want = "postgres"
		}
		if ddl := strings.Join(s.DDL(), "\n"); !strings.Contains(ddl, "txhook_inbox") || strings.Contains(ddl, "$") {
			t.Fatalf("DDL:\n%s", ddl)
		}
		// The dialect given explicitly, and another table on the same database.
		s2, err := verify.NewSQLStore(ctx, db.DB, verify.SQLConfig{Dialect: want, Table: "other_inbox"})
		if err != nil {
			t.Fatal(err)
		}
		if err := s2.CreateTable(ctx); err != nil {
			t.Fatal(err)
		}
		if st, err := s2.Claim(ctx, "e", "t", time.Minute); st != verify.Acquired || err != nil {
			t.Fatalf("custom table: %v %v", st, err)
		}
		if st, err := s.Claim(ctx, "e", "t", time.Minute); st != verify.Acquired || err != nil {
			t.Fatalf("tables are not separate: %v %v", st, err)
		}
	})
	for _, c := range []verify.SQLConfig{{Dialect: "mysql"}, {Table: "inbox; DROP TABLE x"}, {Table: "a.b"}, {Dialect: "sqlite"} /* and no database */} {
		if _, err := verify.NewSQLStore(context.Background(), nil, c); err == nil {
			t.Errorf("NewSQLStore(%+v) accepted", c)
		}
	}
}

// Business transactions that each mark the same event done: exactly one
// commits its write, the others get ErrDuplicate, even when they run at
// the same time.
func TestSQLStoreMarkDoneTx(t *testing.T) {
	t.Parallel()
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		s := newSQLStore(t, db, nil)
		if _, err := db.Exec(`CREATE TABLE payments (event_id text PRIMARY KEY, amount integer NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		// The work a receiver does: one business write, marked in the same
		// transaction. The payments table deliberately has no constraint
		// that could stop a duplicate on its own... except its primary
		// key, so the write uses a generated key.
		var seq atomic.Int64
		process := func(id string, fail bool) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if _, err := tx.ExecContext(ctx, rebind(db, `INSERT INTO payments (event_id, amount) VALUES ($1, $2)`),
				fmt.Sprint(id, "#", seq.Add(1)), 100); err != nil {
				return err
			}
			if err := s.MarkDoneTx(ctx, tx, id); err != nil {
				return err
			}
			if fail {
				return errors.New("business failure after the mark")
			}
			return tx.Commit()
		}
		countPayments := func(id string) int {
			var n int
			if err := db.QueryRow(rebind(db, `SELECT count(*) FROM payments WHERE event_id LIKE $1`), id+"#%").Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}

		// A rollback leaves the event not done.
		id := storetest.ID()
		if err := process(id, true); err == nil || errors.Is(err, verify.ErrDuplicate) {
			t.Fatalf("failing transaction: %v", err)
		}
		if st, _ := s.Claim(ctx, id, "x", time.Minute); st != verify.Acquired {
			t.Fatalf("after rollback: %v, want acquired", st)
		}
		// Marking done while holding the middleware's claim works, and
		// the middleware's later Complete is a no-op.
		if err := process(id, false); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, id, "x"); err != nil {
			t.Fatal(err)
		}
		if err := process(id, false); !errors.Is(err, verify.ErrDuplicate) {
			t.Fatalf("second processing: %v, want ErrDuplicate", err)
		}
		if n := countPayments(id); n != 1 {
			t.Fatalf("%d payments, want 1", n)
		}

		// Concurrently.
		id = storetest.ID()
		const n = 20
		var ok, dup atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range n {
			wg.Go(func() {
				<-start
				switch err := process(id, false); {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, verify.ErrDuplicate):
					dup.Add(1)
				default:
					t.Error(err)
				}
			})
		}
		close(start)
		wg.Wait()
		if ok.Load() != 1 || dup.Load() != n-1 {
			t.Fatalf("%d committed, %d duplicates; want 1 and %d", ok.Load(), dup.Load(), n-1)
		}
		if c := countPayments(id); c != 1 {
			t.Fatalf("%d payments, want 1", c)
		}
	})
}

func TestSQLStorePrune(t *testing.T) {
	t.Parallel()
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		clk := storetest.NewClock()
		s := newSQLStore(t, db, clk.Now)
		start := clk.Now()
		for i := range 1500 { // more than one batch
			if err := s.Complete(ctx, fmt.Sprint("old", i), ""); err != nil {
				t.Fatal(err)
			}
		}
		s.Claim(ctx, "stale-claim", "t", time.Minute)
		s.Claim(ctx, "live-claim", "t", time.Hour)
		clk.Advance(2 * time.Minute)
		s.Complete(ctx, "new", "")
		n, err := s.Prune(ctx, start.Add(time.Minute+time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if n != 1501 {
			t.Fatalf("pruned %d rows, want 1501", n)
		}
		for id, want := range map[string]verify.Status{"old1": verify.Acquired, "stale-claim": verify.Acquired, "live-claim": verify.InProgress, "new": verify.Done} {
			if st, _ := s.Claim(ctx, id, "u", time.Minute); st != want {
				t.Errorf("%s: %v, want %v", id, st, want)
			}
		}
	})
}

// rebind turns $N into ?N for SQLite.
func rebind(db *testdb.DB, q string) string {
	if db.Backend.Postgres() {
		return q
	}
	return strings.ReplaceAll(q, "$", "?")
}

// TestSQLStoreWaitsForLock: while another connection holds the write lock
// of a new SQLite file in rollback mode, as a receiver switching it to WAL
// does, a pool whose DSN sets WAL cannot switch the file, and SQLite
// refuses that at once, busy timeout or not. NewSQLStore and CreateTable
// must wait for the lock instead of failing the receiver's startup.
func TestSQLStoreWaitsForLock(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	path := filepath.Join(t.TempDir(), "inbox.db")
	release := testdb.HoldSQLiteLock(t, path)
	db := testdb.Reopen(t, &testdb.DB{Backend: testdb.Backends[0], DSN: testdb.SQLiteDSN(path)})
	waiting := make(chan struct{})
	var once sync.Once
	wctx := sqlitelock.OnWait(ctx, func(error) { once.Do(func() { close(waiting) }) })
	done := make(chan error, 1)
	go func() {
		s, err := verify.NewSQLStore(wctx, db, verify.SQLConfig{})
		if err == nil {
			err = s.CreateTable(wctx)
		}
		if err == nil {
			_, err = s.Claim(wctx, "evt_1", "token", time.Minute)
		}
		done <- err
	}()
	select {
	case <-waiting:
	case err := <-done:
		t.Fatalf("the receiver did not wait for the lock: %v", err)
	}
	release()
	if err := <-done; err != nil {
		t.Fatalf("after the lock was released: %v", err)
	}
}
