package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"
)

// ErrNoListener means the driver cannot wait for PostgreSQL notifications
// through database/sql and no DSN was given for a listening connection.
var ErrNoListener = errors.New("txhook: LISTEN needs pgx's stdlib driver or a listen DSN")

// Listen waits for wake-ups on PostgreSQL's txhook channel and calls wake
// for each, until ctx is done or the connection fails. With pgx's stdlib
// driver it uses one connection of the pool; otherwise it opens its own with
// lib/pq from dsn. Callers retry after an error. Every (re)connection is
// followed by a wake, since notifications sent while not listening are lost.
func (s *Store) Listen(ctx context.Context, dsn string, wake func()) error {
	if dsn != "" {
		return listenPQ(ctx, dsn, wake)
	}
	if _, ok := s.DB.Driver().(*stdlib.Driver); !ok {
		return ErrNoListener
	}
	conn, err := s.DB.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("txhook: unexpected pgx connection type %T", dc)
		}
		pc := sc.Conn()
		if _, err := pc.Exec(ctx, "LISTEN "+WakeChannel); err != nil {
			return errors.Join(err, driver.ErrBadConn)
		}
		wake()
		for {
			if _, err := pc.WaitForNotification(ctx); err != nil {
				// The connection holds a LISTEN and may be mid-read: never
				// hand it back to the pool.
				return errors.Join(err, driver.ErrBadConn)
			}
			wake()
		}
	})
}

func listenPQ(ctx context.Context, dsn string, wake func()) error {
	failed := make(chan error, 1)
	l := pq.NewListener(dsn, 100*time.Millisecond, 10*time.Second, func(ev pq.ListenerEventType, err error) {
		if ev == pq.ListenerEventConnectionAttemptFailed && err != nil {
			select {
			case failed <- err:
			default:
			}
		}
	})
	defer l.Close()
	if err := l.Listen(WakeChannel); err != nil {
		return err
	}
	wake()
	ping := time.NewTicker(30 * time.Second)
	defer ping.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-l.Notify:
			// nil after a reconnect: anything may have been missed.
			wake()
		case <-ping.C:
			go l.Ping()
		case err := <-failed:
			return err
		}
	}
}

// local carries in-process wake-ups for databases without NOTIFY (SQLite).
var local sync.Map // *sql.DB -> *signal

type signal struct {
	mu   sync.Mutex
	subs map[chan struct{}]struct{}
}

func localSignal(db *sql.DB) *signal {
	v, _ := local.LoadOrStore(db, &signal{subs: map[chan struct{}]struct{}{}})
	return v.(*signal)
}

// WakeLocal wakes the relays of this process that use this database.
func (s *Store) WakeLocal() {
	sig := localSignal(s.DB)
	sig.mu.Lock()
	for c := range sig.subs {
		select {
		case c <- struct{}{}:
		default:
		}
	}
	sig.mu.Unlock()
}

// SubscribeLocal returns a channel that receives in-process wake-ups, and a
// function that unsubscribes it.
func (s *Store) SubscribeLocal() (<-chan struct{}, func()) {
	sig := localSignal(s.DB)
	c := make(chan struct{}, 1)
	sig.mu.Lock()
	sig.subs[c] = struct{}{}
	sig.mu.Unlock()
	return c, func() {
		sig.mu.Lock()
		delete(sig.subs, c)
		sig.mu.Unlock()
	}
}
