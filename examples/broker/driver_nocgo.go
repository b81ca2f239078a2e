//go:build !cgo

package main

// drivers are the SQLite drivers of this build: without cgo,
// mattn/go-sqlite3 cannot work, modernc.org/sqlite can.
var drivers = []string{"sqlite"}
