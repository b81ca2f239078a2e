// Package pgxoutbox connects txhook to pgx v5: Enqueue writes events
// through a pgx.Tx, New makes an Outbox (and so relays) on a *pgxpool.Pool,
// and Listener wakes relays with PostgreSQL notifications on a pgx
// connection.
//
// The guarantees are those of outbox.Outbox.Enqueue: the event is written
// through the caller's transaction, so a rollback leaves nothing and a
// commit makes it due and wakes the relays (a NOTIFY that PostgreSQL sends
// at commit). Bad input is refused before anything is written, with the
// same typed errors, and leaves the transaction usable.
//
// Only programs that import this package link pgx; package outbox imports
// no PostgreSQL driver.
package pgxoutbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/txhook/txhook/internal/link"
	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/outbox"
)

// Tx is what Enqueue writes through: a pgx.Tx, normally the caller's
// business transaction (*pgx.Conn, *pgxpool.Conn and *pgxpool.Pool have
// these methods too, for an event written outside a transaction).
type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

var _ Tx = pgx.Tx(nil)

// ErrNotPostgres is returned by Enqueue for an Outbox on SQLite.
var ErrNotPostgres = errors.New("pgxoutbox: the outbox is not on PostgreSQL")

// Enqueue is outbox.Outbox.Enqueue through a pgx transaction: it writes ev
// through tx and returns the event's ID.
func Enqueue(ctx context.Context, o *outbox.Outbox, tx Tx, ev outbox.Event) (string, error) {
	r, err := EnqueueDetail(ctx, o, tx, ev)
	return r.ID, err
}

// EnqueueDetail is outbox.Outbox.EnqueueDetail through a pgx transaction:
// it also reports whether the same event was already there.
func EnqueueDetail(ctx context.Context, o *outbox.Outbox, tx Tx, ev outbox.Event) (outbox.Enqueued, error) {
	if o.Dialect() != "postgres" {
		return outbox.Enqueued{}, ErrNotPostgres
	}
	r, err := link.Enqueue(ctx, o, conn{tx}, ev)
	return r.(outbox.Enqueued), err
}

// EnqueueMany is outbox.Outbox.EnqueueMany through a pgx transaction: it
// writes evs through tx in as few statements as it can and returns one
// result per event, in order; a refused event fails the call with an
// *outbox.BatchError naming it, and leaves nothing of the batch.
func EnqueueMany(ctx context.Context, o *outbox.Outbox, tx Tx, evs []outbox.Event) ([]outbox.Enqueued, error) {
	if o.Dialect() != "postgres" {
		return nil, ErrNotPostgres
	}
	r, err := link.EnqueueMany(ctx, o, conn{tx}, evs)
	res, _ := r.([]outbox.Enqueued)
	return res, err
}

// conn runs txhook's enqueue statements on a pgx transaction.
type conn struct{ tx Tx }

func (c conn) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := c.tx.Exec(ctx, query, args...)
	return tag.RowsAffected(), err
}

func (c conn) Query(ctx context.Context, query string, args ...any) (store.Rows, error) {
	rows, err := c.tx.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgxRows{rows}, nil
}

type pgxRows struct{ pgx.Rows }

func (r pgxRows) Close() error {
	r.Rows.Close()
	return r.Rows.Err()
}

// New returns an Outbox on pool, for Enqueue and for relays (which run on
// a database/sql handle on the pool, stdlib.OpenDBFromPool). Its Listener
// is Listener() unless cfg sets one or sets TransactionPooling: LISTEN
// through a pooler in transaction mode hears nothing, so give such an
// Outbox DirectListener (or let its relays poll). Close the Outbox's DB() once its
// relays have stopped: that returns its connections to the pool and leaves
// the pool open.
func New(ctx context.Context, pool *pgxpool.Pool, cfg outbox.Config) (*outbox.Outbox, error) {
	if pool == nil {
		return nil, errors.New("pgxoutbox: New: nil *pgxpool.Pool")
	}
	if cfg.Dialect == "" {
		cfg.Dialect = "postgres"
	}
	if cfg.Listener == nil && !cfg.TransactionPooling {
		cfg.Listener = Listener()
	}
	db := stdlib.OpenDBFromPool(pool)
	o, err := outbox.New(ctx, db, cfg)
	if err != nil {
		db.Close()
		return nil, err
	}
	return o, nil
}

// Listener returns an outbox.Listener that listens on one connection of
// the Outbox's database, which must come from pgx's database/sql driver
// (sql.Open("pgx", dsn), or New's stdlib.OpenDBFromPool).
func Listener() outbox.Listener { return listener{} }

type listener struct{}

// Listen implements outbox.Listener.
func (listener) Listen(ctx context.Context, db *sql.DB, channel string, wake func()) error {
	c, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("pgxoutbox: Listener needs a database opened with pgx's stdlib driver, not %T", dc)
		}
		pc := sc.Conn()
		// The connection holds a LISTEN and may be mid-read when this
		// returns: never hand it back to a pool.
		defer func() {
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			pc.Close(closeCtx)
		}()
		return errors.Join(listenOn(ctx, pc, channel, wake), driver.ErrBadConn)
	})
}

// DirectListener returns an outbox.Listener that listens on a pgx
// connection of its own to dsn. Use it when the Outbox's database goes
// through PgBouncer in transaction mode (Config.TransactionPooling):
// LISTEN is session state, which such a pooler does not keep, so dsn must
// reach PostgreSQL directly. One connection per relay.
func DirectListener(dsn string) outbox.Listener { return directListener{dsn: dsn} }

type directListener struct{ dsn string }

// Listen implements outbox.Listener. db is not used.
func (l directListener) Listen(ctx context.Context, _ *sql.DB, channel string, wake func()) error {
	pc, err := pgx.Connect(ctx, l.dsn)
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		pc.Close(closeCtx)
	}()
	return listenOn(ctx, pc, channel, wake)
}

// listenOn listens on channel on pc and calls wake once listening and
// after each notification, until ctx is done or the connection fails.
func listenOn(ctx context.Context, pc *pgx.Conn, channel string, wake func()) error {
	if _, err := pc.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	wake()
	for {
		if _, err := pc.WaitForNotification(ctx); err != nil {
			return err
		}
		wake()
	}
}
