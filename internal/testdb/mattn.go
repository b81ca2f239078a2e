//go:build cgo

package testdb

import _ "github.com/mattn/go-sqlite3" // SQLite through cgo, "sqlite3"

var sqliteBackends = []Backend{Mattn, Modernc}
