//go:build cgo

package sqlitelock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/mattn/go-sqlite3"

	"github.com/txhook/txhook/internal/sqlitelock"
	"github.com/txhook/txhook/internal/testdb"
)

// busyError returns a real SQLITE_BUSY: a write lock that another
// connection holds, taken without a busy timeout.
func busyError(t *testing.T) error {
	t.Helper()
	path := filepath.Join(t.TempDir(), "busy.db")
	testdb.HoldSQLiteLock(t, path)
	db, err := sql.Open("sqlite3", "file:"+path+"?_busy_timeout=0&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.Begin()
	if err == nil {
		tx.Rollback()
		t.Fatal("BEGIN IMMEDIATE succeeded while another connection held the lock")
	}
	return err
}

func TestBusy(t *testing.T) {
	t.Parallel()
	busy := busyError(t)
	db := testdb.SQLite(t)
	_, constraint := db.Exec("CREATE TABLE t (x INTEGER NOT NULL); INSERT INTO t VALUES (NULL)")
	_, syntax := db.Exec("SELEC 1")
	for _, c := range []struct {
		err  error
		want bool
	}{
		{busy, true},
		{fmt.Errorf("migrate: %w", busy), true},
		{sqlite3.Error{Code: sqlite3.ErrLocked, ExtendedCode: sqlite3.ErrLockedSharedCache}, true},
		{sqlite3.Error{Code: sqlite3.ErrBusy, ExtendedCode: sqlite3.ErrBusySnapshot}, true},
		{constraint, false},
		{syntax, false},
		{context.DeadlineExceeded, false},
		{errors.New("database is locked"), false}, // not a SQLite error, whatever it says
		{nil, false},
	} {
		if got := sqlitelock.Busy(c.err); got != c.want {
			t.Errorf("Busy(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	if code, _, ok := sqlitelock.Code(constraint); !ok || code != int(sqlite3.ErrConstraint) {
		t.Errorf("Code(%v) = %d, %v", constraint, code, ok)
	}
}

func TestRetry(t *testing.T) {
	t.Parallel()
	busy := busyError(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	t.Run("busy, then done", func(t *testing.T) {
		calls := 0
		err := sqlitelock.Retry(ctx, func() error {
			if calls++; calls < 4 {
				return busy
			}
			return nil
		})
		if err != nil || calls != 4 {
			t.Fatalf("err %v after %d calls, want nil after 4", err, calls)
		}
	})
	t.Run("other errors return at once", func(t *testing.T) {
		other := errors.New("disk I/O error")
		calls := 0
		err := sqlitelock.Retry(ctx, func() error {
			if calls++; calls == 1 {
				return busy
			}
			return other
		})
		if err != other || calls != 2 {
			t.Fatalf("err %v after %d calls, want %v after 2", err, calls, other)
		}
	})
	t.Run("stops when the context ends", func(t *testing.T) {
		cctx, ccancel := context.WithCancel(ctx)
		waits := 0
		cctx = sqlitelock.OnWait(cctx, func(err error) {
			if waits++; waits == 3 {
				ccancel()
			}
		})
		err := sqlitelock.Retry(cctx, func() error { return busy })
		var se sqlite3.Error
		if !errors.Is(err, context.Canceled) || !errors.As(err, &se) || se.Code != sqlite3.ErrBusy || waits != 3 {
			t.Fatalf("err %v after %d waits: want the busy error and context.Canceled after 3", err, waits)
		}
	})
}
