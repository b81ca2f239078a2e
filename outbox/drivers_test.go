package outbox_test

import (
	"context"
	"database/sql"
	"os/exec"
	"strings"
	"testing"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// Importing txhook for SQLite links no PostgreSQL driver: those live in
// outbox/pgxoutbox and outbox/pqlisten, which only their users import.
func TestNoPostgresDriverInSQLiteBuild(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list dependencies: %v", err)
	}
	for _, pkg := range []string{
		"github.com/txhook/txhook/outbox",
		"github.com/txhook/txhook/dlq",
		"github.com/txhook/txhook/examples/quickstart",
	} {
		out, err := exec.Command(goTool, "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "github.com/lib/pq") || strings.HasPrefix(dep, "github.com/jackc/pgx") {
				t.Errorf("%s depends on %s", pkg, dep)
			}
		}
	}
}

// A host that stays in table mode builds no NATS code: only package
// outbox/broker imports the NATS client, and only tests the server.
func TestNoNATSInTableModeBuild(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list dependencies: %v", err)
	}
	for _, pkg := range []string{
		"github.com/txhook/txhook/outbox",
		"github.com/txhook/txhook/outbox/pgxoutbox",
		"github.com/txhook/txhook/outbox/pqlisten",
		"github.com/txhook/txhook/outbox/portal",
		"github.com/txhook/txhook/outbox/metrics",
		"github.com/txhook/txhook/dlq",
		"github.com/txhook/txhook/verify",
		"github.com/txhook/txhook/examples/quickstart",
	} {
		out, err := exec.Command(goTool, "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "github.com/nats-io/") {
				t.Errorf("%s depends on %s", pkg, dep)
			}
		}
	}
	out, err := exec.Command(goTool, "list", "-deps", "github.com/txhook/txhook/outbox/broker").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps outbox/broker: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/nats-io/nats-server") {
			t.Errorf("outbox/broker links the NATS server (%s); only its tests may", dep)
		}
	}
}

// SQLiteDSN configures each SQLite driver the same way: WAL, the busy
// timeout, foreign keys, and transactions that take the write lock at
// BEGIN.
func TestSQLiteDSNOnEachDriver(t *testing.T) {
	for _, b := range testdb.SQLiteBackends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.SQLiteWith(t, b)
			db.SetMaxOpenConns(1)
			for pragma, want := range map[string]string{"journal_mode": "wal", "busy_timeout": "10000", "foreign_keys": "1"} {
				var got string
				if err := db.QueryRowContext(ctx, "PRAGMA "+pragma).Scan(&got); err != nil || got != want {
					t.Errorf("PRAGMA %s = %q, %v; want %q", pragma, got, err, want)
				}
			}
			ob, err := outbox.New(ctx, db.DB, outbox.Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer ob.Close()
			if ob.Dialect() != "sqlite" {
				t.Fatalf("dialect %q detected for driver %q", ob.Dialect(), b.Driver)
			}
			db.SetMaxOpenConns(0)

			// An empty transaction already holds the write lock: another
			// connection that will not wait cannot take it.
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			other, err := sql.Open(b.Driver, strings.Replace(db.DSN, "_busy_timeout=10000", "_busy_timeout=0", 1))
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			_, err = other.ExecContext(ctx, "BEGIN IMMEDIATE")
			if err == nil {
				t.Fatal("a second writer began while a transaction was open: _txlock=immediate not applied")
			}
			if class := store.ErrorClass(err); class != "SQLite error 5/5" {
				t.Fatalf("second writer: %v (%s), want SQLITE_BUSY", err, class)
			}
		})
	}
}
