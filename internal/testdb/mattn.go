//go:build cgo

package testdb

import _ "github.com/mattn/go-sqlite3" // SQLite through cgo, "sqlite3"

// Under the race detector modernc.org/sqlite, which is SQLite's C
// translated to Go, runs every statement about eight times slower, enough
// to push tests that contend for SQLite's write lock past its busy timeout
// and leases past their end: failures that say nothing about txhook. Race
// builds test SQLite on mattn/go-sqlite3; modernc.org/sqlite is tested by
// builds without the race detector (CI: CGO_ENABLED=0 go test).
var sqliteBackends = func() []Backend {
	if raceEnabled {
		return []Backend{Mattn}
	}
	return []Backend{Mattn, Modernc}
}()
