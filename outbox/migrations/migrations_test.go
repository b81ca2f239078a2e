package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/golang-migrate/migrate/v4"
	mpostgres "github.com/golang-migrate/migrate/v4/database/postgres"
	msqlite "github.com/golang-migrate/migrate/v4/database/sqlite3"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/pressly/goose/v3"

	"github.com/txhook/txhook/internal/migfile"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testlisten"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/migrations"
)

// waitFor bounds every wait for something asynchronous: generous, as test
// machines are small and busy.
const waitFor = 2 * time.Minute

func files(db *testdb.DB) fs.FS {
	if db.Backend.Postgres() {
		return migrations.Postgres
	}
	return migrations.SQLite
}

func gooseProvider(t *testing.T, db *testdb.DB) *goose.Provider {
	t.Helper()
	d := goose.DialectSQLite3
	if db.Backend.Postgres() {
		d = goose.DialectPostgres
	}
	p, err := goose.NewProvider(d, db.DB, files(db))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// golangMigrate returns a migrate.Migrate on db's pool. It is not closed:
// closing it would close the pool.
func golangMigrate(t *testing.T, db *testdb.DB) *migrate.Migrate {
	t.Helper()
	src, err := iofs.New(migrations.UpDown(files(db)), ".")
	if err != nil {
		t.Fatal(err)
	}
	var m *migrate.Migrate
	if db.Backend.Postgres() {
		drv, err := mpostgres.WithInstance(db.DB, &mpostgres.Config{})
		if err != nil {
			t.Fatal(err)
		}
		m, err = migrate.NewWithInstance("iofs", src, "postgres", drv)
		if err != nil {
			t.Fatal(err)
		}
	} else {
		drv, err := msqlite.WithInstance(db.DB, &msqlite.Config{})
		if err != nil {
			t.Fatal(err)
		}
		m, err = migrate.NewWithInstance("iofs", src, "sqlite3", drv)
		if err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// deliver runs one event end to end on a migrated db: an endpoint, a
// relay, an Enqueue committed with a business row, and the receiver
// getting it.
func deliver(t *testing.T, db *testdb.DB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	cfg := outbox.Config{AllowHTTP: true, AllowPrivateTargets: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	cfg.Listener = testlisten.For(db.Backend.Driver, db.DSN)
	ob, err := outbox.New(ctx, db.DB, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	got := make(chan string, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Webhook-Id")
	}))
	defer srv.Close()
	if _, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "m", URL: srv.URL}); err != nil {
		t.Fatal(err)
	}
	relay, err := ob.NewRelay(outbox.RelayConfig{PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer relay.Stop(context.Background())
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := ob.Enqueue(ctx, tx, outbox.Event{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"amount":1200}`)})
	if err != nil {
		tx.Rollback()
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case h := <-got:
		if h != id {
			t.Fatalf("receiver got webhook-id %q, want %q", h, id)
		}
	case <-ctx.Done():
		t.Fatal("timed out waiting for the delivery")
	}
}

func TestGooseAppliesTheFilesAndADeliveryRuns(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		p := gooseProvider(t, db)
		res, err := p.Up(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ms, _ := migfile.List(files(db))
		if len(res) != len(ms) {
			t.Fatalf("goose applied %d migrations, want %d", len(res), len(ms))
		}
		deliver(t, db)

		// Down all the way leaves no txhook table; up again works.
		if _, err := p.DownTo(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if got := db.SchemaDump(t); got != "" {
			t.Fatalf("left after goose down:\n%s", got)
		}
		if _, err := p.Up(ctx); err != nil {
			t.Fatal(err)
		}
		deliver(t, db)
	})
}

func TestGolangMigrateAppliesTheFilesAndADeliveryRuns(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		m := golangMigrate(t, db)
		if err := m.Up(); err != nil {
			t.Fatal(err)
		}
		ms, _ := migfile.List(files(db))
		if v, dirty, err := m.Version(); err != nil || dirty || int(v) != ms[len(ms)-1].Version {
			t.Fatalf("golang-migrate version %d dirty %v err %v", v, dirty, err)
		}
		deliver(t, db)

		if err := m.Down(); err != nil {
			t.Fatal(err)
		}
		if got := db.SchemaDump(t); got != "" {
			t.Fatalf("left after golang-migrate down:\n%s", got)
		}
		if err := m.Up(); err != nil {
			t.Fatal(err)
		}
		deliver(t, db)
	})
}

// A database is migrated one way. Switching ways changes nothing: goose
// on a database Migrate created fails on its first migration; Migrate on a
// database goose migrated finds every migration recorded.
func TestMigrateAndAToolDoNotCorruptEachOther(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		ob, err := outbox.New(ctx, db.DB, outbox.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		defer ob.Close()
		if err := ob.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		before := db.SchemaDump(t)
		if _, err := gooseProvider(t, db).Up(ctx); err == nil || !strings.Contains(err.Error(), "already exists") {
			t.Fatalf("goose up after Migrate: %v, want an 'already exists' failure", err)
		}
		if err := golangMigrate(t, db).Up(); err == nil || !strings.Contains(err.Error(), "already exists") {
			t.Fatalf("golang-migrate up after Migrate: %v, want an 'already exists' failure", err)
		}
		dropToolTables(t, db)
		if after := db.SchemaDump(t); after != before {
			t.Fatalf("a failed tool run changed the schema:\n%s\n---\n%s", before, after)
		}
		deliver(t, db)

		// The other way round, on a fresh database.
		db2 := testdb.Open(t, db.Backend)
		if _, err := gooseProvider(t, db2).Up(ctx); err != nil {
			t.Fatal(err)
		}
		before = db2.SchemaDump(t)
		ob2, err := outbox.New(ctx, db2.DB, outbox.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		defer ob2.Close()
		if err := ob2.CheckSchema(ctx); err != nil {
			t.Fatalf("CheckSchema after goose: %v", err)
		}
		if err := ob2.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if after := db2.SchemaDump(t); after != before {
			t.Fatalf("Migrate after goose changed the schema:\n%s\n---\n%s", before, after)
		}
		if res, err := gooseProvider(t, db2).Up(ctx); err != nil || len(res) != 0 {
			t.Fatalf("goose up after Migrate: %v %v, want nothing to do", res, err)
		}
	})
}

// dropToolTables removes what a failed first tool run leaves behind: its
// own version table, which it creates before applying anything.
func dropToolTables(t *testing.T, db *testdb.DB) {
	t.Helper()
	for _, tbl := range []string{"goose_db_version", "schema_migrations"} {
		if _, err := db.Exec("DROP TABLE IF EXISTS " + tbl); err != nil {
			t.Fatal(err)
		}
	}
}

// UpDown is a well-formed fs.FS holding an up and a down file per
// migration, split where goose splits.
func TestUpDownFS(t *testing.T) {
	for name, src := range map[string]fs.FS{"postgres": migrations.Postgres, "sqlite": migrations.SQLite} {
		t.Run(name, func(t *testing.T) {
			ms, err := migfile.List(src)
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, m := range ms {
				want = append(want, m.Name+".up.sql", m.Name+".down.sql")
			}
			fsys := migrations.UpDown(src)
			if err := fstest.TestFS(fsys, want...); err != nil {
				t.Fatal(err)
			}
			for _, m := range ms {
				up, _ := fs.ReadFile(fsys, m.Name+".up.sql")
				down, _ := fs.ReadFile(fsys, m.Name+".down.sql")
				if string(up) != m.Up || string(down) != m.Down || strings.Contains(string(up), "+goose") || strings.Contains(string(down), "+goose") {
					t.Fatalf("%s: split differs from the goose sections", m.Name)
				}
			}
			for _, bad := range []string{"001_init.sql", "009_missing.up.sql", "x/001_init.up.sql", "../001_init.up.sql"} {
				if _, err := fsys.Open(bad); !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, fs.ErrInvalid) {
					t.Errorf("Open(%q) = %v, want not found", bad, err)
				}
			}
		})
	}
}

// The rules of outbox/migrations/README.md: both dialects have the same
// migrations; each records its own version and name, and its down section
// removes that record.
func TestFilesFollowTheFormat(t *testing.T) {
	pg, err := migfile.List(migrations.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	lite, err := migfile.List(migrations.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	if len(pg) != len(lite) {
		t.Fatalf("%d PostgreSQL migrations, %d SQLite ones", len(pg), len(lite))
	}
	for i := range pg {
		if pg[i].Name != lite[i].Name || pg[i].Version != i+1 {
			t.Errorf("migration %d: %s, SQLite %s: want the same names, numbered from 1 without gaps", i+1, pg[i].Name, lite[i].Name)
		}
	}
	for _, m := range append(pg, lite...) {
		record := fmt.Sprintf("INSERT INTO txhook_migrations (version, name) VALUES (%d, '%s');", m.Version, m.Name)
		if !strings.Contains(m.Up, record) {
			t.Errorf("%s: up section lacks %s", m.Name, record)
		}
		forget := fmt.Sprintf("DELETE FROM txhook_migrations WHERE version = %d;", m.Version)
		if m.Version == 1 {
			forget = "DROP TABLE txhook_migrations;"
		}
		if !strings.Contains(m.Down, forget) {
			t.Errorf("%s: down section lacks %s", m.Name, forget)
		}
	}
}

// The library's packages import neither migration tool: only these tests
// do, so a team gets neither in its build by importing txhook.
func TestLibraryImportsNoMigrationTool(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/txhook/txhook/outbox/...", "github.com/txhook/txhook/dlq",
		"github.com/txhook/txhook/signer", "github.com/txhook/txhook/retry", "github.com/txhook/txhook/verify/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "github.com/txhook/txhook/outbox/migrations") {
		t.Fatalf("go list output lacks this package:\n%s", out)
	}
	for _, tool := range []string{"github.com/pressly/goose", "github.com/golang-migrate/migrate"} {
		if strings.Contains(string(out), tool) {
			t.Errorf("a library package imports %s", tool)
		}
	}
}

// Going down from version 8 keeps the attempt log: the first attempts that
// succeeded, recorded in their deliveries' rows since 8, become rows of
// txhook_attempts again.
func TestDownFrom8KeepsInlineAttempts(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		p := gooseProvider(t, db)
		if _, err := p.Up(ctx); err != nil {
			t.Fatal(err)
		}
		deliver(t, db)
		count := func(q string) int {
			t.Helper()
			var n int
			if err := db.DB.QueryRowContext(ctx, q).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		// The relay writes the outcome just after the receiver answered.
		deadline := time.Now().Add(30 * time.Second)
		for count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded'") != 1 {
			if time.Now().After(deadline) {
				t.Fatal("the delivery's outcome was not written")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if n, log := count("SELECT count(*) FROM txhook_attempts"), count("SELECT count(*) FROM txhook_attempt_log"); n != 0 || log != 1 {
			t.Fatalf("at version 8: %d attempt rows, %d in the log; want 0 and 1", n, log)
		}
		if _, err := p.DownTo(ctx, 7); err != nil {
			t.Fatal(err)
		}
		if n := count("SELECT count(*) FROM txhook_attempts WHERE attempt = 1 AND error = '' AND status = 200"); n != 1 {
			t.Fatalf("after going down from 8: %d attempt rows for the first attempt, want 1", n)
		}
		if _, err := p.Up(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
