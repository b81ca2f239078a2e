package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/pgxoutbox"
	"github.com/txhook/txhook/outbox/pqlisten"
)

// benchPayload is the payload of every event: a typical small payment
// notification.
var benchPayload = []byte(`{"payment_id":"pay_0123456789","amount":1200,"currency":"usd","customer":"cus_42","status":"succeeded"}`)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// pgSchema is a fresh PostgreSQL schema, migrated, with a pool on it.
type pgSchema struct {
	name string
	dsn  string // opens pools on this schema
	db   *sql.DB
	ob   *outbox.Outbox
	base string
}

// newSchema creates a schema, opens a pool of at most conns connections on
// it through driver ("postgres" for lib/pq, "pgx") and migrates it. obCfg
// configures the Outbox; its Logger defaults to a silent one and its
// Listener to the driver's (pqlisten on the schema's DSN, or pgxoutbox's).
func newSchema(ctx context.Context, base, driver string, conns int, obCfg outbox.Config) (*pgSchema, error) {
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	name := "txhook_bench_" + hex.EncodeToString(rnd[:])
	admin, err := sql.Open("pgx", base)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+name); err != nil {
		return nil, fmt.Errorf("create schema: %w", err)
	}
	s := &pgSchema{name: name, base: base}
	if s.dsn, err = withParams(base, map[string]string{"search_path": name, "application_name": name}); err != nil {
		s.drop()
		return nil, err
	}
	if s.db, err = sql.Open(driver, s.dsn); err != nil {
		s.drop()
		return nil, err
	}
	s.db.SetMaxOpenConns(conns)
	s.db.SetMaxIdleConns(conns)
	if obCfg.Logger == nil {
		obCfg.Logger = quiet()
	}
	if obCfg.Listener == nil {
		if driver == "postgres" {
			obCfg.Listener = pqlisten.New(s.dsn)
		} else {
			obCfg.Listener = pgxoutbox.Listener()
		}
	}
	if s.ob, err = outbox.New(ctx, s.db, obCfg); err != nil {
		s.drop()
		return nil, err
	}
	if err := s.ob.Migrate(ctx); err != nil {
		s.drop()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	return s, nil
}

// drop closes the pool and drops the schema.
func (s *pgSchema) drop() {
	if s.ob != nil {
		s.ob.Close()
	}
	if s.db != nil {
		s.db.Close()
	}
	admin, err := sql.Open("pgx", s.base)
	if err != nil {
		return
	}
	defer admin.Close()
	_, _ = admin.ExecContext(context.Background(), "DROP SCHEMA "+s.name+" CASCADE")
}

// withParams adds run-time parameters (search_path, application_name) to a
// URL or key=value DSN; lib/pq and pgx both pass them to the server.
func withParams(dsn string, params map[string]string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("bad DSN: %w", err)
		}
		q := u.Query()
		for k, v := range params {
			q.Set(k, v)
		}
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	for k, v := range params {
		dsn += " " + k + "=" + v
	}
	return dsn, nil
}

// sqliteDB is a fresh SQLite file, migrated.
type sqliteDB struct {
	dir string
	db  *sql.DB
	ob  *outbox.Outbox
}

func newSQLite(ctx context.Context, obCfg outbox.Config) (*sqliteDB, error) {
	dir, err := os.MkdirTemp("", "txhook-bench-")
	if err != nil {
		return nil, err
	}
	s := &sqliteDB{dir: dir}
	if s.db, err = sql.Open("sqlite3", outbox.SQLiteDSN(filepath.Join(dir, "txhook.db"))); err != nil {
		s.drop()
		return nil, err
	}
	if obCfg.Logger == nil {
		obCfg.Logger = quiet()
	}
	if s.ob, err = outbox.New(ctx, s.db, obCfg); err != nil {
		s.drop()
		return nil, err
	}
	if err := s.ob.Migrate(ctx); err != nil {
		s.drop()
		return nil, err
	}
	return s, nil
}

func (s *sqliteDB) drop() {
	if s.ob != nil {
		s.ob.Close()
	}
	if s.db != nil {
		s.db.Close()
	}
	os.RemoveAll(s.dir)
}

// localOutbox is the Outbox configuration for delivering to the local
// receiver: plain HTTP to loopback has to be allowed; everything else is
// the default.
func localOutbox() outbox.Config {
	return outbox.Config{AllowHTTP: true, AllowPrivateTargets: true}
}

// fillByEnqueue enqueues n events for tenant through the real Enqueue, in
// transactions of 500.
func fillByEnqueue(ctx context.Context, db *sql.DB, ob *outbox.Outbox, tenant string, n int) error {
	for i := 0; i < n; i += 500 {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		for k := i; k < min(n, i+500); k++ {
			if _, err := ob.Enqueue(ctx, tx, outbox.Event{Tenant: tenant, Type: "payment.succeeded", Payload: benchPayload}); err != nil {
				tx.Rollback()
				return err
			}
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}
