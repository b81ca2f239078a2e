// Package store holds every SQL statement txhook runs, for both dialects.
//
// The rest of the module speaks in Go values (times, JSON documents,
// delivery states); this package turns them into PostgreSQL or SQLite
// statements. Dialect differences live here and nowhere else.
package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Dialect is the SQL flavour of a database.
type Dialect int

const (
	// Postgres is PostgreSQL 12 or newer, through lib/pq or pgx's stdlib.
	Postgres Dialect = iota + 1
	// SQLite is SQLite 3.35 or newer, through mattn/go-sqlite3 or
	// modernc.org/sqlite.
	SQLite
)

func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "postgres"
	case SQLite:
		return "sqlite"
	}
	return "unknown"
}

// Detect works out the dialect of db: from the driver's type when it is one
// of the known drivers, otherwise by asking the server.
func Detect(ctx context.Context, db *sql.DB) (Dialect, error) {
	switch t := fmt.Sprintf("%T", db.Driver()); t {
	case "*pq.Driver", "*stdlib.Driver":
		return Postgres, nil
	case "*sqlite3.SQLiteDriver", "*sqlite.Driver": // mattn/go-sqlite3, modernc.org/sqlite
		return SQLite, nil
	}
	var v string
	if err := db.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&v); err == nil {
		return SQLite, nil
	}
	if err := db.QueryRowContext(ctx, "SELECT current_setting('server_version_num')").Scan(&v); err == nil {
		return Postgres, nil
	}
	return 0, fmt.Errorf("txhook: cannot tell the database dialect of driver %T; set Config.Dialect", db.Driver())
}

// Querier is what *sql.DB, *sql.Tx, *sql.Conn, *sqlx.DB and *sqlx.Tx share.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Store runs txhook's statements on one database.
type Store struct {
	DB      *sql.DB
	Dialect Dialect

	schema string // see SetSchema
	prefix string // `"schema".`, or "" for the search_path

	// NoPrepare makes Prepare a no-op, for a database reached through a
	// pooler in transaction mode (PgBouncer before 1.21, or without
	// max_prepared_statements): a statement prepared on one server
	// connection is missing, or named twice, on the next.
	NoPrepare bool

	// SyncRelayCommits makes the relay's statements (claims, outcomes,
	// endpoint health) commit as the server's synchronous_commit says.
	// Without it, on PostgreSQL, each of those transactions turns
	// synchronous_commit off for itself (see relaySQL).
	SyncRelayCommits bool

	// Forward writes events for the forwarders of broker mode (package
	// outbox/broker) instead of table-mode relays: see forward_enqueue.go.
	Forward bool

	mu    sync.Mutex
	stmts map[string]*sql.Stmt
}

// New returns a Store for db.
func New(db *sql.DB, d Dialect) *Store {
	return &Store{DB: db, Dialect: d, stmts: map[string]*sql.Stmt{}}
}

// asyncCommit is what a relay statement puts in the WHERE clause of its
// first CTE ({{async}} in its text), unless SyncRelayCommits: one
// evaluation of set_config(..., true), which lasts until the statement's
// own transaction ends, so that its commit does not wait for its WAL to
// be flushed (or replicated), and no other transaction on the connection
// is affected, through PgBouncer in transaction mode too. A database
// crash can forget such a commit, and only with every commit after it
// (the WAL is replayed in order): the state the relays left an instant
// before. Nothing of an event is lost so, because the event itself was
// committed by its own transaction: a forgotten lease or outcome is
// redone, and the event delivered again, which at-least-once delivery
// allows and receivers deduplicate by webhook-id.
const asyncCommit = `(SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL`

// relaySQL returns the relay statement q with its {{async}} condition
// filled in: asyncCommit, or true with SyncRelayCommits.
func (s *Store) relaySQL(q string) string {
	cond := asyncCommit
	if s.SyncRelayCommits {
		cond = "true"
	}
	return strings.Replace(q, "{{async}}", cond, 1)
}

// Close releases the prepared statements.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var first error
	for k, st := range s.stmts {
		if err := st.Close(); err != nil && first == nil {
			first = err
		}
		delete(s.stmts, k)
	}
	return first
}

// Prepare prepares queries (in their final, dialect-specific form) on the
// pool ahead of use, so that a hot statement
// later costs one round trip. It must run while the caller holds no
// connection of a small pool: preparing takes one.
func (s *Store) Prepare(ctx context.Context, queries ...string) error {
	if s.NoPrepare {
		return nil
	}
	for _, q := range queries {
		q = s.Rebind(q)
		s.mu.Lock()
		_, ok := s.stmts[q]
		s.mu.Unlock()
		if ok {
			continue
		}
		st, err := s.DB.PrepareContext(ctx, q)
		if err != nil {
			return err
		}
		s.mu.Lock()
		if _, ok := s.stmts[q]; ok {
			st.Close()
		} else {
			s.stmts[q] = st
		}
		s.mu.Unlock()
	}
	return nil
}

// stmtFor returns query (rebound, see Rebind), prepared by Prepare, bound
// to q when q is a transaction; nil when there is no such statement or q
// cannot use it.
// database/sql re-prepares it once per connection, on the transaction's own
// connection, so this never waits for a second connection.
func (s *Store) stmtFor(ctx context.Context, q Querier, query string) *sql.Stmt {
	s.mu.Lock()
	st, ok := s.stmts[query]
	s.mu.Unlock()
	if !ok {
		return nil
	}
	switch x := q.(type) {
	case *sql.DB:
		if x == s.DB {
			return st
		}
		return nil
	case interface {
		StmtContext(context.Context, *sql.Stmt) *sql.Stmt
	}:
		return x.StmtContext(ctx, st)
	}
	return nil
}

// errForeignStmt is what database/sql reports when a statement prepared on
// one pool is used in a transaction of another.
func isForeignStmt(err error) bool {
	return err != nil && strings.Contains(err.Error(), "statement from different database used")
}

// T converts a time to the dialect's column value: timestamptz for
// PostgreSQL, integer microseconds for SQLite.
func (s *Store) T(t time.Time) any {
	if s.Dialect == SQLite {
		return t.UnixMicro()
	}
	return t.UTC()
}

// JSONTime renders t for use inside a JSON document read by the dialect's
// JSON functions.
func (s *Store) JSONTime(t time.Time) any {
	if s.Dialect == SQLite {
		return t.UnixMicro()
	}
	return jsonTS(t)
}

// jsonTS renders t for PostgreSQL's JSON functions, cut to the
// microseconds PostgreSQL keeps, as pgx cuts time parameters: PostgreSQL
// rounds a finer text value, which could store a time a microsecond after
// the same time passed as a parameter by pgx, so that a delivery due at t
// would not be due at t.
func jsonTS(t time.Time) string {
	return t.UTC().Truncate(time.Microsecond).Format(time.RFC3339Nano)
}

// Time scans a time column of either dialect.
type Time struct{ time.Time }

// Scan implements sql.Scanner.
func (t *Time) Scan(v any) error {
	switch x := v.(type) {
	case nil:
		t.Time = time.Time{}
	case time.Time:
		t.Time = x.UTC()
	case int64:
		t.Time = time.UnixMicro(x).UTC()
	case []byte:
		return t.parse(string(x))
	case string:
		return t.parse(x)
	default:
		return fmt.Errorf("txhook: cannot scan %T into a time", v)
	}
	return nil
}

func (t *Time) parse(s string) error {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		t.Time = time.UnixMicro(n).UTC()
		return nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02 15:04:05.999999999-07:00", "2006-01-02 15:04:05.999999999-07"} {
		if p, err := time.Parse(layout, s); err == nil {
			t.Time = p.UTC()
			return nil
		}
	}
	return fmt.Errorf("txhook: cannot parse time %q", s)
}

// Value implements driver.Valuer for completeness; queries use T instead.
func (t Time) Value() (driver.Value, error) { return t.Time, nil }

// Rebind readies a statement for the Store, and every PostgreSQL statement
// passes through it: it turns ? placeholders into $1, $2 … and, when a
// schema is set (SetSchema), names txhook's tables in it. Queries in this
// package never contain a literal question mark. A statement already in
// its final form comes back unchanged.
func (s *Store) Rebind(q string) string {
	if s.Dialect != Postgres || s.prefix == "" && strings.IndexByte(q, '?') < 0 {
		return q
	}
	var b strings.Builder
	b.Grow(len(q) + 16)
	n := 0
	for i := 0; i < len(q); i++ {
		if q[i] == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(q[i])
	}
	if s.prefix == "" {
		return b.String()
	}
	out := b.String()
	b.Reset()
	b.Grow(len(out) + 128)
	s.qualify(&b, out)
	return b.String()
}

// Tx runs fn in a write transaction. On SQLite it begins with BEGIN
// IMMEDIATE so that the write lock is taken up front: a deferred
// transaction that reads and then writes can fail with SQLITE_BUSY instead
// of waiting. The first transaction committed in a ctx made by WithAudit
// writes that audit row too.
func (s *Store) Tx(ctx context.Context, fn func(q Querier) error) (err error) {
	if s.Dialect == SQLite {
		conn, err := s.DB.Conn(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
			return err
		}
		committed, err := s.txBody(ctx, conn, fn)
		if err != nil {
			// The rollback must run even when ctx is done, or the pooled
			// connection would go back with an open transaction.
			_, _ = conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
			return err
		}
		if _, err := conn.ExecContext(context.WithoutCancel(ctx), "COMMIT"); err != nil {
			_, _ = conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
			return err
		}
		committed()
		return nil
	}
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	committed, err := s.txBody(ctx, tx, fn)
	if err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	committed()
	return nil
}

// txBody runs fn, then writes the audit row ctx carries (WithAudit).
func (s *Store) txBody(ctx context.Context, q Querier, fn func(q Querier) error) (committed func(), err error) {
	if err := fn(q); err != nil {
		return nil, err
	}
	return s.auditInTx(ctx, q)
}

// ErrNotFound is returned when a row does not exist.
var ErrNotFound = errors.New("not found")
