// Package testlisten picks the outbox.Listener for a test database's
// driver, so that tests on PostgreSQL are woken by NOTIFY as production
// relays are.
package testlisten

import (
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
