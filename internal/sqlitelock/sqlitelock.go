// Package sqlitelock lets txhook wait for a SQLite database lock in the few
// places where SQLite itself returns SQLITE_BUSY at once instead of calling
// the busy handler that _busy_timeout installs.
//
// The case that matters is a new database file opened by several processes
// (or pools) at the same moment with _journal_mode=WAL in the DSN.
// mattn/go-sqlite3 runs "PRAGMA journal_mode = WAL" on every connection it
// opens. On a file still in rollback mode that pragma reads page 1 under a
// SHARED lock and then, to write the WAL version bytes, upgrades to a write
// lock (sqlite3BtreeSetVersion). SQLite never runs the busy handler for an
// upgrade from a read transaction (sqlite3BtreeBeginTrans retries only when
// the connection held no transaction, which is how it avoids deadlock
// between two upgraders), so when another connection holds the RESERVED
// lock, because it is switching the same file to WAL or writing it in
// rollback mode, the pragma fails at once with "database is locked",
// whatever the busy timeout, and so does opening the connection. Once the
// file is in WAL mode the pragma only reads, and opening waits on the busy
// handler as usual. A deferred transaction that reads before it writes has
// the same upgrade, and SQLITE_BUSY_SNAPSHOT in WAL mode, neither of which
// waits.
//
// Retry retries such operations with backoff, within the context; Connect
// retries opening a pool's first connection.
package sqlitelock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"time"
)

// DefaultWait bounds Retry when its context has no deadline.
const DefaultWait = time.Minute

// Backoff between attempts: the first wait is up to minDelay, doubling to
// maxDelay, each drawn at random from its upper half so that processes
// starting together do not retry in step.
const (
	minDelay = 2 * time.Millisecond
	maxDelay = 250 * time.Millisecond
)

// SQLite primary result codes.
const (
	codeBusy   = 5 // SQLITE_BUSY: another connection holds the lock
	codeLocked = 6 // SQLITE_LOCKED: a conflict inside this process (shared cache)
)

// Code returns the result codes of a SQLite error from mattn/go-sqlite3
// (read by reflection so that PostgreSQL users need not link cgo) or from a
// driver whose errors have a Code method returning the extended code, such
// as modernc.org/sqlite: the primary code is its low byte.
func Code(err error) (code, ext int, ok bool) {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if c, isCoder := e.(interface{ Code() int }); isCoder {
			return c.Code() & 0xff, c.Code(), true
		}
		v := reflect.ValueOf(e)
		if v.Kind() == reflect.Pointer && !v.IsNil() {
			v = v.Elem()
		}
		if t := v.Type(); t.Kind() == reflect.Struct && t.Name() == "Error" && t.PkgPath() == "github.com/mattn/go-sqlite3" {
			c, x := v.FieldByName("Code"), v.FieldByName("ExtendedCode")
			if c.CanInt() && x.CanInt() {
				return int(c.Int()), int(x.Int()), true
			}
		}
	}
	return 0, 0, false
}

// Busy reports whether err is a SQLite SQLITE_BUSY or SQLITE_LOCKED error
// (any extended code of either): the lock was held by another connection,
// and the same operation may succeed later.
func Busy(err error) bool {
	code, _, ok := Code(err)
	return ok && (code&0xff == codeBusy || code&0xff == codeLocked)
}

type observerKey struct{}

// OnWait returns a context under which Retry calls f with each busy error
// before it waits to try again. Tests use it to learn that a caller is
// waiting for a lock they hold.
func OnWait(ctx context.Context, f func(err error)) context.Context {
	return context.WithValue(ctx, observerKey{}, f)
}

// Retry runs fn, and runs it again while it fails with a Busy error, with
// jittered exponential backoff, until ctx ends or, when ctx has no
// deadline, DefaultWait has passed. Any other error, and success, return at
// once. When it stops waiting it returns the last busy error (errors.As
// still finds the driver's error) with the reason.
func Retry(ctx context.Context, fn func() error) error {
	start := time.Now()
	bound, hasBound := time.Time{}, false
	if _, ok := ctx.Deadline(); !ok {
		bound, hasBound = start.Add(DefaultWait), true
	}
	observe, _ := ctx.Value(observerKey{}).(func(error))
	delay := minDelay
	for {
		err := fn()
		if err == nil || !Busy(err) {
			return err
		}
		if observe != nil {
			observe(err)
		}
		if ctx.Err() != nil {
			return stopped(ctx, err)
		}
		wait := delay/2 + rand.N(delay/2+1)
		if hasBound {
			left := time.Until(bound)
			if left <= 0 {
				return fmt.Errorf("%w (waited %s for the SQLite lock)", err, time.Since(start).Round(time.Millisecond))
			}
			wait = min(wait, left)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return stopped(ctx, err)
		case <-t.C:
		}
		delay = min(2*delay, maxDelay)
	}
}

// stopped is the last busy error, with why Retry stopped waiting.
func stopped(ctx context.Context, err error) error {
	return fmt.Errorf("%w (stopped waiting for the SQLite lock: %w)", err, context.Cause(ctx))
}

// Connect takes one connection of db and puts it back, retrying as Retry
// does. On a SQLite pool whose DSN sets journal_mode this is the moment the
// file is switched to WAL; once a connection has opened, the pool's later
// connections find the file in WAL mode and wait on the busy handler.
func Connect(ctx context.Context, db *sql.DB) error {
	return Retry(ctx, func() error {
		c, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		return c.Close()
	})
}
