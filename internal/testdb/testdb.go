// Package testdb opens the real databases txhook's tests run against: a
// fresh SQLite file per test, through mattn/go-sqlite3 (in cgo builds) and
// modernc.org/sqlite, and a fresh PostgreSQL schema per test through lib/pq
// or pgx's stdlib driver.
//
// PostgreSQL tests read the DSN from TXHOOK_TEST_POSTGRES_DSN and skip with
// a message when it is unset; CI sets it and TXHOOK_REQUIRE_POSTGRES=1,
// which turns the skip into a failure.
package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // pgx's database/sql driver, "pgx"
	_ "github.com/lib/pq"              // lib/pq, "postgres"
	_ "modernc.org/sqlite"             // pure-Go SQLite, "sqlite"
)

// EnvDSN names the environment variable holding the PostgreSQL DSN.
const EnvDSN = "TXHOOK_TEST_POSTGRES_DSN"

// EnvRequire, set to 1, makes a missing DSN fail the test instead of
// skipping it.
const EnvRequire = "TXHOOK_REQUIRE_POSTGRES"

// Backend is one database a test runs against.
type Backend struct {
	Name   string // "sqlite", "sqlite-modernc", "postgres-libpq", "postgres-pgx", "pgbouncer-libpq", "pgbouncer-pgx"
	Driver string // database/sql driver name
	// Bouncer: PostgreSQL through PgBouncer in transaction mode (see
	// PgBouncer).
	Bouncer bool
}

// The backends.
var (
	// Mattn is SQLite through mattn/go-sqlite3, in cgo builds only.
	Mattn = Backend{Name: "sqlite", Driver: "sqlite3"}
	// Modernc is SQLite through modernc.org/sqlite, pure Go.
	Modernc = Backend{Name: "sqlite-modernc", Driver: "sqlite"}
	// LibPQ is PostgreSQL through lib/pq.
	LibPQ = Backend{Name: "postgres-libpq", Driver: "postgres"}
	// PGX is PostgreSQL through pgx's stdlib driver.
	PGX = Backend{Name: "postgres-pgx", Driver: "pgx"}
)

// SQLiteBackends are the SQLite drivers of this build: mattn/go-sqlite3
// (first, the default) and modernc.org/sqlite with cgo, mattn/go-sqlite3
// alone under the race detector (see mattn.go), modernc.org/sqlite alone
// without cgo.
var SQLiteBackends = sqliteBackends

// PostgresBackends are PostgreSQL through both drivers.
var PostgresBackends = []Backend{LibPQ, PGX}

// Backends lists every backend of this build: SQLite through each driver,
// and PostgreSQL through both.
var Backends = append(append([]Backend{}, SQLiteBackends...), PostgresBackends...)

// Postgres reports whether the backend is PostgreSQL.
func (b Backend) Postgres() bool { return b.Driver == LibPQ.Driver || b.Driver == PGX.Driver }

// DB is an open test database.
type DB struct {
	*sql.DB
	Backend Backend
	// DSN opens another pool on the same database (and schema, unless
	// Schema is set).
	DSN string
	// Schema, when set, is the schema of the test that DSN does not select
	// (through PgBouncer, which does not keep a search_path): give it to
	// outbox.Config.Schema.
	Schema string
	// DirectDSN reaches the same database and schema without a pooler in
	// between, for LISTEN; DSN itself when there is no pooler.
	DirectDSN string
}

// Open returns a fresh database for b, closed and removed when t ends.
func Open(t testing.TB, b Backend) *DB {
	t.Helper()
	if !b.Postgres() {
		return SQLiteWith(t, b)
	}
	if b.Bouncer {
		return PgBouncer(t, b.Driver)
	}
	return Postgres(t, b.Driver)
}

// Each runs fn as a parallel subtest on every backend.
func Each(t *testing.T, fn func(t *testing.T, db *DB)) {
	t.Helper()
	for _, b := range Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, Open(t, b))
		})
	}
}

// EachPostgres runs fn as a parallel subtest on PostgreSQL through each
// driver, for what only PostgreSQL does.
func EachPostgres(t *testing.T, fn func(t *testing.T, db *DB)) {
	t.Helper()
	for _, b := range PostgresBackends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, Open(t, b))
		})
	}
}

// SQLiteDSN is the DSN txhook recommends for a SQLite file: WAL so readers
// do not block the writer, a busy timeout so writers wait for each other,
// and IMMEDIATE transactions so a transaction that reads and then writes
// never fails on lock upgrade. Both SQLite drivers read it.
func SQLiteDSN(path string) string {
	return "file:" + path + "?_journal_mode=WAL&_busy_timeout=10000&_txlock=immediate&_foreign_keys=on"
}

// SQLite returns a fresh SQLite database in a temporary directory, through
// the build's default SQLite driver (SQLiteBackends[0]).
func SQLite(t testing.TB) *DB {
	t.Helper()
	return SQLiteWith(t, SQLiteBackends[0])
}

// SQLiteWith returns a fresh SQLite database in a temporary directory,
// through b's driver.
func SQLiteWith(t testing.TB, b Backend) *DB {
	t.Helper()
	dsn := SQLiteDSN(filepath.Join(t.TempDir(), "txhook.db"))
	db, err := sql.Open(b.Driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &DB{DB: db, Backend: b, DSN: dsn}
}

// PostgresDSN returns the configured DSN, skipping (or failing, in CI) the
// test when there is none.
func PostgresDSN(t testing.TB) string {
	t.Helper()
	return envOrSkip(t, EnvDSN, EnvRequire, "PostgreSQL",
		"set "+EnvDSN+" (e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable) to run it")
}

// envOrSkip returns the value of the environment variable name, and
// skips the test (saying how to run it) when it is empty, or fails it when
// require is set to 1.
func envOrSkip(t testing.TB, name, require, what, how string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		if os.Getenv(require) == "1" {
			t.Fatalf("%s is not set but %s=1: %s tests are mandatory here", name, require, what)
		}
		t.Skipf("%s test skipped: %s", what, how)
	}
	return v
}

// Postgres returns a pool on a fresh schema of the configured PostgreSQL
// database, through driver ("postgres" for lib/pq, "pgx" for pgx). The
// schema is dropped when t ends.
func Postgres(t testing.TB, driver string) *DB {
	t.Helper()
	dsn, drop, err := NewSchema(PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	b := LibPQ
	if driver == PGX.Driver {
		b = PGX
	}
	return &DB{DB: openOrDrop(t, driver, dsn, drop), Backend: b, DSN: dsn, DirectDSN: dsn}
}

// openOrDrop opens a pool on dsn, closed and then drop called when t
// ends; on failure it calls drop and fails t.
func openOrDrop(t testing.TB, driver, dsn string, drop func()) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		drop()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db.Close()
		drop()
	})
	return db
}

// NewSchema creates a fresh schema in the PostgreSQL database of base and
// returns a DSN whose search_path is that schema, and a function that drops
// it. Tests use Postgres; this is for Example functions, which have no
// testing.TB.
func NewSchema(base string) (dsn string, drop func(), err error) {
	schema, drop, err := createSchema(base)
	if err != nil {
		return "", nil, err
	}
	if dsn, err = withSearchPath(base, schema); err != nil {
		drop()
		return "", nil, err
	}
	return dsn, drop, nil
}

// createSchema creates a fresh schema in the PostgreSQL database of base
// and returns its name and a function that drops it.
func createSchema(base string) (schema string, drop func(), err error) {
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	schema = "txhook_test_" + hex.EncodeToString(rnd[:])
	admin, err := sql.Open("postgres", base)
	if err != nil {
		return "", nil, err
	}
	defer admin.Close()
	if _, err := admin.Exec("CREATE SCHEMA " + schema); err != nil {
		return "", nil, fmt.Errorf("testdb: create schema: %w", err)
	}
	drop = func() {
		admin, err := sql.Open("postgres", base)
		if err != nil {
			return
		}
		defer admin.Close()
		_, _ = admin.Exec("DROP SCHEMA " + schema + " CASCADE")
	}
	return schema, drop, nil
}

// withSearchPath adds search_path to a URL or key=value DSN; both lib/pq
// and pgx pass it to the server as a run-time parameter.
func withSearchPath(dsn, schema string) (string, error) {
	out, err := WithParams(dsn, url.Values{"search_path": {schema}})
	if err != nil {
		return "", fmt.Errorf("testdb: bad DSN: %w", err)
	}
	return out, nil
}

// Reopen returns a second pool on the same database, closed when t ends.
func Reopen(t testing.TB, db *DB) *sql.DB {
	t.Helper()
	other, err := sql.Open(db.Backend.Driver, db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	return other
}

// HoldSQLiteLock takes the write lock (RESERVED) of the SQLite file at path
// through a connection in rollback-journal mode, as a process that is
// switching a new file to WAL holds it, and returns the function that
// releases it. It is released when t ends at the latest.
func HoldSQLiteLock(t testing.TB, path string) (release func()) {
	t.Helper()
	db, err := sql.Open(SQLiteBackends[0].Driver, "file:"+path+"?_busy_timeout=10000")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			if _, err := conn.ExecContext(context.Background(), "COMMIT"); err != nil {
				t.Error(err)
			}
			conn.Close()
		})
	}
	t.Cleanup(release)
	return release
}

// SchemaDump describes what of txhook's schema db's statements see (on
// PostgreSQL, the current schema): every txhook table's columns, its
// indexes, and the migrations txhook_migrations records. Empty when there
// is no txhook table.
func (db *DB) SchemaDump(t testing.TB) string {
	t.Helper()
	queries := []string{
		`SELECT m.name || '.' || p.name || ' ' || p.type || ' ' || p."notnull" || ' ' || coalesce(p.dflt_value, '') FROM sqlite_master m, pragma_table_info(m.name) p WHERE m.type = 'table' AND m.name LIKE 'txhook%' ORDER BY 1`,
		`SELECT name || ' ' || coalesce(sql, '') FROM sqlite_master WHERE type = 'index' AND name LIKE 'txhook%' ORDER BY 1`,
	}
	if db.Backend.Postgres() {
		queries = []string{
			`SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, '') FROM information_schema.columns WHERE table_schema = current_schema() AND table_name LIKE 'txhook%' ORDER BY 1`,
			`SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename LIKE 'txhook%' ORDER BY 1`,
		}
	}
	var b strings.Builder
	for _, q := range queries {
		db.dumpRows(t, &b, q)
	}
	if strings.Contains(b.String(), "txhook_migrations.version ") {
		db.dumpRows(t, &b, `SELECT version || ' ' || name FROM txhook_migrations ORDER BY version`)
	}
	return b.String()
}

func (db *DB) dumpRows(t testing.TB, b *strings.Builder, query string) {
	t.Helper()
	rows, err := db.Query(query)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		b.WriteString(s + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}
