package store

import (
	"context"
	"fmt"

	"github.com/txhook/txhook/internal/migfile"
	"github.com/txhook/txhook/internal/sqlitelock"
	"github.com/txhook/txhook/outbox/migrations"
)

// Migration is one versioned schema file of package outbox/migrations.
type Migration = migfile.Migration

// Migrations returns the dialect's migrations in order: the files of
// package outbox/migrations, which goose and golang-migrate apply too.
func Migrations(d Dialect) ([]Migration, error) {
	switch d {
	case Postgres:
		return migfile.List(migrations.Postgres)
	case SQLite:
		return migfile.List(migrations.SQLite)
	}
	return nil, fmt.Errorf("txhook: no migrations for dialect %s", d)
}

// migrationLockKey is the advisory lock that serialises concurrent
// migrations on PostgreSQL ("txhook" in ASCII).
const migrationLockKey = 0x747868_6f6f6b

// Migrate applies the up sections of the migrations that txhook_migrations
// does not record yet, in one transaction; each migration records itself in
// that table. It is idempotent, and two processes migrating at once are
// serialised: an advisory lock on PostgreSQL, the database write lock on
// SQLite. With a schema set (SetSchema) it creates the schema if needed and
// applies the files there, through a search_path local to its transaction.
// On SQLite, a lock error that did not wait on the busy handler (see
// package sqlitelock) rolls the transaction back and runs it again, within
// ctx.
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
			if s.schema != "" {
				if _, err := q.ExecContext(ctx, `CREATE SCHEMA IF NOT EXISTS "`+s.schema+`"`); err != nil {
					return err
				}
				if _, err := q.ExecContext(ctx, `SET LOCAL search_path TO "`+s.schema+`"`); err != nil {
					return err
				}
			}
		}
		have := map[int]bool{}
		ok, err := s.tableExists(ctx, q, "txhook_migrations")
		if err != nil {
			return err
		}
		if ok {
			if have, err = s.versions(ctx, q); err != nil {
				return err
			}
		} else if ok, err = s.tableExists(ctx, q, "txhook_events"); err != nil {
			return err
		} else if ok {
			return fmt.Errorf("txhook: migrate: txhook_events exists but txhook_migrations does not, so which migrations were applied is unknown; record them as outbox/migrations/README.md (Baseline) shows")
		}
		for _, m := range ms {
			if have[m.Version] {
				continue
			}
			if _, err := q.ExecContext(ctx, m.Up); err != nil {
				return fmt.Errorf("txhook: migration %s: %w", m.Name, err)
			}
			if have, err = s.versions(ctx, q); err != nil {
				return err
			}
			if !have[m.Version] {
				return fmt.Errorf("txhook: migration %s did not record version %d in txhook_migrations", m.Name, m.Version)
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
