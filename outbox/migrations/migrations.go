// Package migrations holds txhook's schema as plain SQL migration files, for
// teams that apply migrations with their own tool instead of calling
// (*outbox.Outbox).Migrate. Migrate applies these same files.
//
// Postgres and SQLite are in pressly/goose's format: one NNN_name.sql file
// per migration, with an up section after "-- +goose Up" and a down
// section after "-- +goose Down". UpDown presents the same files the way
// golang-migrate reads them (NNN_name.up.sql and NNN_name.down.sql). The
// package imports neither tool.
//
// Every migration records itself in the table txhook_migrations, whichever
// tool applies it: relays check that table at start and refuse to run on a
// schema that lacks a migration they need (outbox.ErrNotMigrated). Pick one
// way to migrate a database and keep to it: a tool does not know what
// Migrate applied, and Migrate does not know the tool's own version table.
//
// With goose:
//
//	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations.Postgres)
//	_, err = provider.Up(ctx)
//
// With golang-migrate:
//
//	src, err := iofs.New(migrations.UpDown(migrations.Postgres), ".")
//	m, err := migrate.NewWithSourceInstance("iofs", src, databaseURL)
//	err = m.Up()
//
// The files name tables without a schema. To put them outside public,
// connect the tool with search_path set to that schema (for example
// "?search_path=webhooks" in the database URL) and give the Outbox the same
// name in outbox.Config.Schema.
package migrations

import (
	"embed"
	"io"
	"io/fs"
	"path"
	"strings"
	"time"

	"github.com/txhook/txhook/internal/migfile"
)

//go:embed postgres/*.sql sqlite/*.sql
var files embed.FS

// Postgres is the PostgreSQL schema, in goose's format.
var Postgres fs.FS = sub("postgres")

// SQLite is the SQLite schema (3.35 or newer), in goose's format.
var SQLite fs.FS = sub("sqlite")

func sub(dir string) fs.FS {
	f, err := fs.Sub(files, dir)
	if err != nil {
		panic(err) // cannot happen: dir is a literal embedded above
	}
	return f
}

// UpDown returns the migrations of fsys (Postgres or SQLite) as
// golang-migrate's iofs source reads them: each NNN_name.sql becomes
// NNN_name.up.sql and NNN_name.down.sql, split at the goose annotations.
// Nothing is written anywhere; the files are split when read.
func UpDown(fsys fs.FS) fs.FS { return upDown{fsys} }

type upDown struct{ src fs.FS }

func (u upDown) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	if name == "." {
		entries, err := u.ReadDir(".")
		if err != nil {
			return nil, &fs.PathError{Op: "open", Path: name, Err: err}
		}
		return &memDir{entries: entries}, nil
	}
	base, dir, err := u.split(name)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	b, err := fs.ReadFile(u.src, base+".sql")
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	up, down, err := migfile.Split(string(b))
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	text := up
	if dir == "down" {
		text = down
	}
	return &memFile{info: memInfo{name: name, size: int64(len(text))}, r: strings.NewReader(text)}, nil
}

// split parses "NNN_name.up.sql" into "NNN_name" and "up".
func (upDown) split(name string) (base, dir string, err error) {
	if strings.Contains(name, "/") {
		return "", "", fs.ErrNotExist
	}
	rest, ok := strings.CutSuffix(name, ".sql")
	if !ok {
		return "", "", fs.ErrNotExist
	}
	if base, ok = strings.CutSuffix(rest, ".up"); ok {
		return base, "up", nil
	}
	if base, ok = strings.CutSuffix(rest, ".down"); ok {
		return base, "down", nil
	}
	return "", "", fs.ErrNotExist
}

// ReadDir lists the up and down file of every migration; only "." exists.
func (u upDown) ReadDir(name string) ([]fs.DirEntry, error) {
	if name != "." {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrNotExist}
	}
	ms, err := migfile.List(u.src)
	if err != nil {
		return nil, err
	}
	var out []fs.DirEntry
	for _, m := range ms {
		for _, d := range []struct{ suffix, text string }{{".down.sql", m.Down}, {".up.sql", m.Up}} {
			out = append(out, fs.FileInfoToDirEntry(memInfo{name: m.Name + d.suffix, size: int64(len(d.text))}))
		}
	}
	return out, nil
}

type memInfo struct {
	name string
	size int64
	dir  bool
}

func (i memInfo) Name() string       { return path.Base(i.name) }
func (i memInfo) Size() int64        { return i.size }
func (i memInfo) ModTime() time.Time { return time.Time{} }
func (i memInfo) IsDir() bool        { return i.dir }
func (i memInfo) Sys() any           { return nil }
func (i memInfo) Mode() fs.FileMode {
	if i.dir {
		return fs.ModeDir | 0o555
	}
	return 0o444
}

type memFile struct {
	info memInfo
	r    *strings.Reader
}

func (f *memFile) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *memFile) Read(p []byte) (int, error) { return f.r.Read(p) }
func (f *memFile) Close() error               { return nil }

type memDir struct {
	entries []fs.DirEntry
	off     int
}

func (d *memDir) Stat() (fs.FileInfo, error) { return memInfo{name: ".", dir: true}, nil }
func (d *memDir) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: ".", Err: fs.ErrInvalid}
}
func (d *memDir) Close() error { return nil }

// ReadDir implements fs.ReadDirFile.
func (d *memDir) ReadDir(n int) ([]fs.DirEntry, error) {
	rest := d.entries[d.off:]
	if n <= 0 {
		d.off = len(d.entries)
		return rest, nil
	}
	if len(rest) == 0 {
		return nil, io.EOF
	}
	rest = rest[:min(n, len(rest))]
	d.off += len(rest)
	return rest, nil
}
