// Package testlisten picks the outbox.Listener for a test database's
// driver, so that tests on PostgreSQL are woken by NOTIFY as production
// relays are.
package testlisten

import (
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/pgxoutbox"
	"github.com/txhook/txhook/outbox/pqlisten"
)

// For returns the Listener for a database opened through driver on dsn:
// pqlisten's for lib/pq ("postgres"), pgxoutbox's for pgx ("pgx"), nil for
// SQLite, which needs none.
func For(driver, dsn string) outbox.Listener {
	switch driver {
	case "postgres":
		return pqlisten.New(dsn)
	case "pgx":
		return pgxoutbox.Listener()
	}
	return nil
}

// ForDB returns the Listener for db: For its driver, except that through
// PgBouncer both drivers listen on a connection of their own to
// db.DirectDSN, as docs/drivers.md tells users to.
func ForDB(db *testdb.DB) outbox.Listener {
	if db.Backend.Bouncer {
		if db.Backend.Driver == "pgx" {
			return pgxoutbox.DirectListener(db.DirectDSN)
		}
		return pqlisten.New(db.DirectDSN)
	}
	return For(db.Backend.Driver, db.DSN)
}
