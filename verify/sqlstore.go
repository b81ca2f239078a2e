package verify

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/txhook/txhook/internal/sqlitelock"
)

// SQLConfig configures an SQLStore.
type SQLConfig struct {
	// Dialect is "postgres" or "sqlite"; empty means detect it from the
	// driver (lib/pq, pgx's stdlib, mattn/go-sqlite3, modernc.org/sqlite)
	// or, failing that, by asking the server.
	Dialect string
	// Table is the table's name, a plain identifier; empty means
	// "txhook_inbox".
	Table string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// SQLStore is a Store in a PostgreSQL (12+) or SQLite (3.35+) table whose
// primary key is the event ID. Besides the Store methods used by the
// middleware, MarkDoneTx marks an event done inside the receiver's own
// business transaction, so the mark commits or rolls back with the
// business write: that is what makes the effect exactly-once.
//
// Use PostgreSQL at READ COMMITTED, the default (stricter levels turn a
// concurrent duplicate into a serialization error instead of
// ErrDuplicate). Open SQLite with WAL and a busy timeout, such as
// "file:inbox.db?_journal_mode=WAL&_busy_timeout=10000&_txlock=immediate"
// for mattn/go-sqlite3, so concurrent receivers wait for the writer lock
// instead of failing.
//
// Done rows stay until Prune deletes them.
type SQLStore struct {
	db  *sql.DB
	cfg SQLConfig
	q   sqlQueries
}

// Tx is the part of *sql.Tx that MarkDoneTx uses; *sqlx.Tx and *sql.Conn
// have it too.
type Tx interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var identPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// NewSQLStore returns a store on db. It does not create the table: call
// CreateTable, or run DDL in your own migrations.
//
// On SQLite it opens one connection of the pool, waiting within ctx (one
// minute at most when ctx has no deadline) while another process holds a
// lock SQLite will not wait for: receivers opening a new database file at
// the same moment with WAL in the DSN all switch it to WAL, and all but one
// are refused at once, busy timeout or not.
func NewSQLStore(ctx context.Context, db *sql.DB, cfg SQLConfig) (*SQLStore, error) {
	if cfg.Table == "" {
		cfg.Table = "txhook_inbox"
	}
	if !identPattern.MatchString(cfg.Table) {
		return nil, fmt.Errorf("verify: table name %q is not a plain identifier", cfg.Table)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Dialect == "" {
		d, err := detectDialect(ctx, db)
		if err != nil {
			return nil, err
		}
		cfg.Dialect = d
	}
	q, err := queries(cfg.Dialect, cfg.Table)
	if err != nil {
		return nil, err
	}
	if db == nil {
		return nil, errors.New("verify: NewSQLStore: nil *sql.DB")
	}
	if cfg.Dialect == "sqlite" {
		if err := sqlitelock.Connect(ctx, db); err != nil {
			return nil, fmt.Errorf("verify: open SQLite: %w", err)
		}
	}
	return &SQLStore{db: db, cfg: cfg, q: q}, nil
}

// DDL returns the statements that create the table and its index, for the
// store's dialect. They are idempotent.
func (s *SQLStore) DDL() []string { return append([]string(nil), s.q.ddl...) }

// CreateTable runs DDL in one transaction (on PostgreSQL under an advisory
// lock, so that receivers starting together do not collide; on SQLite run
// again, within ctx, when it meets a lock SQLite did not wait for).
func (s *SQLStore) CreateTable(ctx context.Context) error {
	if s.cfg.Dialect == "sqlite" {
		return sqlitelock.Retry(ctx, func() error { return s.createTable(ctx) })
	}
	return s.createTable(ctx)
}

func (s *SQLStore) createTable(ctx context.Context) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if s.cfg.Dialect == "postgres" {
		if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", "txhook.verify."+s.cfg.Table); err != nil {
			return fmt.Errorf("verify: create table: %w", err)
		}
	}
	for _, stmt := range s.q.ddl {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("verify: create table: %w", err)
		}
	}
	return tx.Commit()
}

// Claim implements Store in one statement: insert the event's row, or take
// over a row whose lease has ended.
func (s *SQLStore) Claim(ctx context.Context, id, token string, lease time.Duration) (Status, error) {
	now := s.cfg.Now()
	// A row released between the two statements makes them disagree; go
	// round again, a bounded number of times.
	for range 3 {
		var got string
		err := s.db.QueryRowContext(ctx, s.q.claim, id, token, now.Add(lease).UnixMilli(), now.UnixMilli()).Scan(&got)
		if err == nil {
			return Acquired, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return 0, fmt.Errorf("verify: claim: %w", err)
		}
		var done bool
		err = s.db.QueryRowContext(ctx, s.q.isDone, id).Scan(&done)
		switch {
		case err == nil && done:
			return Done, nil
		case err == nil:
			return InProgress, nil
		case !errors.Is(err, sql.ErrNoRows):
			return 0, fmt.Errorf("verify: claim: %w", err)
		}
	}
	return InProgress, nil
}

// Complete implements Store. After MarkDoneTx it does nothing.
func (s *SQLStore) Complete(ctx context.Context, id, _ string) error {
	err := s.markDone(ctx, s.db, id)
	if err != nil && !errors.Is(err, ErrDuplicate) {
		return err
	}
	return nil
}

// Release implements Store.
func (s *SQLStore) Release(ctx context.Context, id, token string) error {
	if _, err := s.db.ExecContext(ctx, s.q.release, id, token); err != nil {
		return fmt.Errorf("verify: release: %w", err)
	}
	return nil
}

// MarkDoneTx marks id done through tx, the transaction that holds the
// business write of the event. If id is already done it returns
// ErrDuplicate: roll back, and answer 200. On PostgreSQL a concurrent
// MarkDoneTx of the same id waits for this transaction to end.
func (s *SQLStore) MarkDoneTx(ctx context.Context, tx Tx, id string) error {
	return s.markDone(ctx, tx, id)
}

func (s *SQLStore) markDone(ctx context.Context, q Tx, id string) error {
	now := s.cfg.Now().UnixMilli()
	var got string
	err := q.QueryRowContext(ctx, s.q.markDone, id, now).Scan(&got)
	if errors.Is(err, sql.ErrNoRows) {
		return ErrDuplicate
	}
	if err != nil {
		return fmt.Errorf("verify: mark done: %w", err)
	}
	return nil
}

// Prune deletes, in batches, the rows of events done before cutoff and of
// claims whose lease ended before it, and returns how many went. Run it now
// and then with a cutoff well behind the sender's last retry (days).
func (s *SQLStore) Prune(ctx context.Context, cutoff time.Time) (int64, error) {
	var total int64
	for {
		res, err := s.db.ExecContext(ctx, s.q.prune, cutoff.UnixMilli(), pruneBatch)
		if err != nil {
			return total, fmt.Errorf("verify: prune: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, fmt.Errorf("verify: prune: %w", err)
		}
		total += n
		if n < pruneBatch {
			return total, nil
		}
	}
}

const pruneBatch = 1000

// sqlQueries holds the statements of one dialect and table. Times are unix
// milliseconds in bigint columns, which reads the same in both dialects and
// every driver.
type sqlQueries struct {
	ddl                                     []string
	claim, isDone, markDone, release, prune string
}

// queries builds the statements. They are written once, for PostgreSQL;
// SQLite (3.35+) takes the same upsert and RETURNING syntax, with numbered
// parameters spelled ?N instead of $N.
func queries(dialect, table string) (sqlQueries, error) {
	var textT, intT string
	switch dialect {
	case "postgres":
		textT, intT = "text", "bigint"
	case "sqlite":
		textT, intT = "TEXT", "INTEGER"
	default:
		return sqlQueries{}, fmt.Errorf("verify: unknown SQL dialect %q (want postgres or sqlite)", dialect)
	}
	q := sqlQueries{
		ddl: []string{
			`CREATE TABLE IF NOT EXISTS ` + table + ` (
	event_id    ` + textT + ` PRIMARY KEY,
	claim_token ` + textT + ` NOT NULL DEFAULT '',
	lease_until ` + intT + ` NOT NULL DEFAULT 0,
	done_at     ` + intT + `,
	updated_at  ` + intT + ` NOT NULL
)`,
			`CREATE INDEX IF NOT EXISTS ` + table + `_updated_at_idx ON ` + table + ` (updated_at)`,
		},
		// $1 id, $2 token, $3 lease end, $4 now.
		claim: `INSERT INTO ` + table + ` (event_id, claim_token, lease_until, updated_at) VALUES ($1, $2, $3, $4)
ON CONFLICT (event_id) DO UPDATE SET claim_token = excluded.claim_token, lease_until = excluded.lease_until, updated_at = excluded.updated_at
WHERE ` + table + `.done_at IS NULL AND ` + table + `.lease_until <= excluded.updated_at
RETURNING event_id`,
		isDone: `SELECT done_at IS NOT NULL FROM ` + table + ` WHERE event_id = $1`,
		// $1 id, $2 now.
		markDone: `INSERT INTO ` + table + ` (event_id, done_at, updated_at) VALUES ($1, $2, $2)
ON CONFLICT (event_id) DO UPDATE SET claim_token = '', lease_until = 0, done_at = excluded.done_at, updated_at = excluded.updated_at
WHERE ` + table + `.done_at IS NULL
RETURNING event_id`,
		release: `DELETE FROM ` + table + ` WHERE event_id = $1 AND claim_token = $2 AND done_at IS NULL`,
		// $1 cut-off, $2 batch size. A claim's updated_at is its start,
		// which is before its lease end.
		prune: `DELETE FROM ` + table + ` WHERE event_id IN (SELECT event_id FROM ` + table + `
WHERE updated_at < $1 AND (done_at IS NOT NULL OR lease_until < $1) LIMIT $2)`,
	}
	if dialect == "sqlite" {
		for _, p := range []*string{&q.claim, &q.isDone, &q.markDone, &q.release, &q.prune} {
			*p = strings.ReplaceAll(*p, "$", "?")
		}
	}
	return q, nil
}

// detectDialect tells the dialect from the driver's type, or asks the
// server.
func detectDialect(ctx context.Context, db *sql.DB) (string, error) {
	switch fmt.Sprintf("%T", db.Driver()) {
	case "*pq.Driver", "*stdlib.Driver":
		return "postgres", nil
	case "*sqlite3.SQLiteDriver", "*sqlite.Driver":
		return "sqlite", nil
	}
	var v string
	if db.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&v) == nil {
		return "sqlite", nil
	}
	if db.QueryRowContext(ctx, "SELECT current_setting('server_version_num')").Scan(&v) == nil {
		return "postgres", nil
	}
	return "", fmt.Errorf("verify: cannot tell the SQL dialect of driver %T; set SQLConfig.Dialect", db.Driver())
}
