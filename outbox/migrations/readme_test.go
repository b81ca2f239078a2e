package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/golang-migrate/migrate/v4"
	_ "github.com/golang-migrate/migrate/v4/database/postgres"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/pressly/goose/v3"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/migrations"
)

// readmeSnippet holds the snippet of docs/migrations.md between the marker
// comments, so that TestReadmeSnippet runs it; internal/readme checks that
// the page shows these lines (its marker: <!-- checked: runs in
// outbox/migrations/readme_test.go -->).
func readmeSnippet(ctx context.Context, db *sql.DB, databaseURL string, ob *outbox.Outbox) error {
	// README start
	// goose
	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations.Postgres)
	if err != nil {
		return err
	}
	if _, err := provider.Up(ctx); err != nil {
		return err
	}

	// or golang-migrate (with its database/postgres driver imported)
	src, err := iofs.New(migrations.UpDown(migrations.Postgres), ".")
	if err != nil {
		return err
	}
	m, err := migrate.NewWithSourceInstance("iofs", src, databaseURL)
	if err != nil {
		return err
	}
	defer m.Close()
	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return err
	}

	// at the service's start, instead of Migrate
	return ob.CheckSchema(ctx)
	// README end
}

func TestReadmeSnippet(t *testing.T) {
	// Run it: goose on one schema through the service's pool, golang-migrate
	// on another through its own connection.
	ctx := context.Background()
	db := testdb.Open(t, testdb.PostgresBackends[1])
	other := testdb.Open(t, testdb.PostgresBackends[0])
	ob, err := outbox.New(ctx, db.DB, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	if err := readmeSnippet(ctx, db.DB, other.DSN, ob); err != nil {
		t.Fatal(err)
	}
	ob2, err := outbox.New(ctx, other.DB, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ob2.Close()
	if err := ob2.CheckSchema(ctx); err != nil {
		t.Fatalf("after golang-migrate: %v", err)
	}
}
