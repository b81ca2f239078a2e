//go:build !cgo

package testdb

// Without cgo mattn/go-sqlite3 registers only a stub that fails to open.
var sqliteBackends = []Backend{Modernc}
