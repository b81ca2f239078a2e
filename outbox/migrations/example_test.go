package migrations_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/golang-migrate/migrate/v4"
	msqlite "github.com/golang-migrate/migrate/v4/database/sqlite3"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/pressly/goose/v3"

	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/migrations"

	_ "modernc.org/sqlite" // pure Go; mattn/go-sqlite3 ("sqlite3") works the same
)

// openExample opens a fresh SQLite database and returns it with a function
// that removes it.
func openExample() (*sql.DB, func()) {
	dir, err := os.MkdirTemp("", "txhook-migrations-")
	if err != nil {
		panic(err)
	}
	db, err := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	if err != nil {
		panic(err)
	}
	return db, func() { db.Close(); os.RemoveAll(dir) }
}

// Apply txhook's schema with goose, then check it from the service instead
// of calling Migrate. On PostgreSQL: goose.DialectPostgres and
// migrations.Postgres.
func Example_goose() {
	ctx := context.Background()
	db, cleanup := openExample()
	defer cleanup()

	provider, err := goose.NewProvider(goose.DialectSQLite3, db, migrations.SQLite)
	if err != nil {
		panic(err)
	}
	results, err := provider.Up(ctx)
	if err != nil {
		panic(err)
	}
	files, _ := fs.Glob(migrations.SQLite, "*.sql")
	fmt.Println(results[0].Direction, results[0].Source.Path, "…", len(results) == len(files))

	ob, err := outbox.New(ctx, db, outbox.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	fmt.Println("schema check:", ob.CheckSchema(ctx))
	// Output:
	// up 001_init.sql … true
	// schema check: <nil>
}

// Apply txhook's schema with golang-migrate: UpDown splits the files into
// the .up.sql and .down.sql files its iofs source reads. On PostgreSQL:
// migrations.UpDown(migrations.Postgres) and a postgres:// database URL.
func Example_golangMigrate() {
	ctx := context.Background()
	db, cleanup := openExample()
	defer cleanup()

	src, err := iofs.New(migrations.UpDown(migrations.SQLite), ".")
	if err != nil {
		panic(err)
	}
	driver, err := msqlite.WithInstance(db, &msqlite.Config{})
	if err != nil {
		panic(err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "sqlite3", driver)
	if err != nil {
		panic(err)
	}
	if err := m.Up(); err != nil {
		panic(err)
	}
	version, dirty, err := m.Version()
	files, _ := fs.Glob(migrations.SQLite, "*.sql")
	fmt.Println("at the last version:", int(version) == len(files), "dirty:", dirty, err)

	ob, err := outbox.New(ctx, db, outbox.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	fmt.Println("schema check:", ob.CheckSchema(ctx))

	// Down undoes every migration; the outbox then says to migrate.
	if err := m.Down(); err != nil {
		panic(err)
	}
	fmt.Println(ob.CheckSchema(ctx))
	// Output:
	// at the last version: true dirty: false <nil>
	// schema check: <nil>
	// txhook: database schema not migrated: run (*outbox.Outbox).Migrate, or apply the files of github.com/txhook/txhook/outbox/migrations: no txhook tables in the database
}
