//go:build cgo

package main

import _ "github.com/mattn/go-sqlite3" // "sqlite3", the default with cgo

// drivers are the SQLite drivers of this build, the default first.
var drivers = []string{"sqlite3", "sqlite"}
