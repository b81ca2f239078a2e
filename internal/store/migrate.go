package store

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/txhook/txhook/internal/sqlitelock"
)

//go:embed migrations
var migrationFS embed.FS

// Migration is one versioned schema file.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations returns the dialect's migrations in order.
func Migrations(d Dialect) ([]Migration, error) {
	dir := path.Join("migrations", d.String())
	entries, err := fs.ReadDir(migrationFS, dir)
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".sql") {
			continue
		}
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("txhook: migration file %s has no version prefix", name)
		}
		b, err := migrationFS.ReadFile(path.Join(dir, name))
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: v, Name: strings.TrimSuffix(name, ".sql"), SQL: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// migrationLockKey is the advisory lock that serialises concurrent
// migrations on PostgreSQL ("txhook" in ASCII).
const migrationLockKey = 0x747868_6f6f6b

// Migrate applies the migrations the database does not have yet, each
// version recorded in txhook_migrations. It is idempotent, and two processes
// migrating at once are serialised: an advisory lock on PostgreSQL, the
// database write lock on SQLite. On SQLite, a lock error that did not wait
// on the busy handler (see package sqlitelock) rolls the transaction back
// and runs it again, within ctx.
func (s *Store) Migrate(ctx context.Context) (applied []int, err error) {
	ms, err := Migrations(s.Dialect)
	if err != nil {
		return nil, err
	}
	if s.Dialect == SQLite {
		err = sqlitelock.Retry(ctx, func() error {
			applied, err = s.migrate(ctx, ms)
			return err
		})
	} else {
		applied, err = s.migrate(ctx, ms)
	}
	if err != nil {
		return nil, err
	}
	return applied, nil
}

// migrate is one attempt of Migrate, in one transaction.
func (s *Store) migrate(ctx context.Context, ms []Migration) (applied []int, err error) {
	err = s.Tx(ctx, func(q Querier) error {
		if s.Dialect == Postgres {
			if _, err := q.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrationLockKey)); err != nil {
				return err
			}
		}
		create := `CREATE TABLE IF NOT EXISTS txhook_migrations (
			version    integer PRIMARY KEY,
			name       text    NOT NULL,
			applied_at ` + map[Dialect]string{Postgres: "timestamptz NOT NULL DEFAULT now()", SQLite: "INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER))"}[s.Dialect] + `
		)`
		if _, err := q.ExecContext(ctx, create); err != nil {
			return err
		}
		have := map[int]bool{}
		rows, err := q.QueryContext(ctx, "SELECT version FROM txhook_migrations")
		if err != nil {
			return err
		}
		for rows.Next() {
			var v int
			if err := rows.Scan(&v); err != nil {
				rows.Close()
				return err
			}
			have[v] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, m := range ms {
			if have[m.Version] {
				continue
			}
			if _, err := q.ExecContext(ctx, m.SQL); err != nil {
				return fmt.Errorf("txhook: migration %s: %w", m.Name, err)
			}
			if _, err := q.ExecContext(ctx, s.Rebind("INSERT INTO txhook_migrations (version, name) VALUES (?, ?)"), m.Version, m.Name); err != nil {
				return err
			}
			applied = append(applied, m.Version)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return applied, nil
}
