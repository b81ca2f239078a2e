package migrations_test

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"

	"github.com/golang-migrate/migrate/v4"
	_ "github.com/golang-migrate/migrate/v4/database/postgres"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/pressly/goose/v3"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/migrations"
)

// readmeSnippet holds the README's Migrations snippet, between the marker
// comments, so that it compiles; TestReadmeSnippet runs it and checks the
// README shows the same lines.
func readmeSnippet(ctx context.Context, db *sql.DB, databaseURL string, ob *outbox.Outbox) error {
	// README start
	// goose
	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations.Postgres)
	_, err = provider.Up(ctx)

	// or golang-migrate (with its database/postgres driver imported)
	src, err := iofs.New(migrations.UpDown(migrations.Postgres), ".")
	m, err := migrate.NewWithSourceInstance("iofs", src, databaseURL)
	err = m.Up()

	// at the service's start, instead of Migrate
	err = ob.CheckSchema(ctx)
	// README end
	m.Close()
	return err
}

func TestReadmeSnippet(t *testing.T) {
	own, err := os.ReadFile("readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, code, _ := strings.Cut(string(own), "\t// README start\n")
	code, _, _ = strings.Cut(code, "\t// README end\n")
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Migrations\n")
	_, block, ok2 := strings.Cut(section, "```go\n")
	block, _, ok3 := strings.Cut(block, "```\n")
	if !ok || !ok2 || !ok3 {
		t.Fatal("README has no go block under ## Migrations")
	}
	if want := strings.ReplaceAll(code, "\n\t", "\n"); strings.TrimPrefix(want, "\t") != block {
		t.Fatalf("README snippet differs from readmeSnippet:\n%s\n--- readmeSnippet ---\n%s", block, want)
	}

	// Run it: goose on one schema through the service's pool, golang-migrate
	// on another through its own connection.
	ctx := context.Background()
	db := testdb.Open(t, testdb.Backends[2])
	other := testdb.Open(t, testdb.Backends[1])
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
