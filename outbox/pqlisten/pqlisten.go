// Package pqlisten wakes txhook relays with PostgreSQL notifications
// through lib/pq, which cannot listen through database/sql: it opens a
// listening connection of its own.
//
//	ob, err := outbox.New(ctx, db, outbox.Config{Listener: pqlisten.New(dsn)})
//
// Only programs that import this package link lib/pq's listener; package
// outbox imports no PostgreSQL driver.
package pqlisten

import (
	"context"
	"database/sql"
	"time"

	"github.com/lib/pq"

	"github.com/txhook/txhook/outbox"
)

// New returns a Listener that listens on its own lib/pq connection to dsn,
// normally the DSN the Outbox's database was opened with.
func New(dsn string) outbox.Listener { return listener{dsn: dsn} }

type listener struct{ dsn string }

// Listen implements outbox.Listener. db is not used: lib/pq cannot
// receive notifications on a database/sql connection.
func (l listener) Listen(ctx context.Context, _ *sql.DB, channel string, wake func()) error {
	failed := make(chan error, 1)
	pl := pq.NewListener(l.dsn, 100*time.Millisecond, 10*time.Second, func(ev pq.ListenerEventType, err error) {
		if ev == pq.ListenerEventConnectionAttemptFailed && err != nil {
			select {
			case failed <- err:
			default:
			}
		}
	})
	defer pl.Close()
	if err := pl.Listen(channel); err != nil {
		return err
	}
	wake()
	ping := time.NewTicker(30 * time.Second)
	defer ping.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-pl.Notify:
			// nil after a reconnect: anything may have been missed.
			wake()
		case <-ping.C:
			go pl.Ping()
		case err := <-failed:
			return err
		}
	}
}
