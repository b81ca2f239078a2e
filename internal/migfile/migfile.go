// Package migfile reads txhook's migration files: NNN_name.sql, each an up
// and a down section in the format pressly/goose reads. Package
// outbox/migrations publishes the files, internal/store applies them.
package migfile

import (
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
)

// Migration is one file, split into its sections.
type Migration struct {
	Version int
	Name    string // the file name without .sql, e.g. "001_init"
	Up      string
	Down    string
}

// ErrFormat is wrapped by every error about a malformed file.
var ErrFormat = errors.New("txhook: malformed migration file")

// List reads every NNN_name.sql file at the root of fsys, in version order.
func List(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, err
	}
	var out []Migration
	seen := map[int]string{}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".sql")
		if e.IsDir() || !ok {
			continue
		}
		v, err := Version(name)
		if err != nil {
			return nil, err
		}
		if other, dup := seen[v]; dup {
			return nil, fmt.Errorf("%w: %s and %s have the same version", ErrFormat, other, name)
		}
		seen[v] = name
		b, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, err
		}
		up, down, err := Split(string(b))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: v, Name: name, Up: up, Down: down})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Version parses the number before the first underscore of name.
func Version(name string) (int, error) {
	num, _, ok := strings.Cut(name, "_")
	v, err := strconv.Atoi(num)
	if !ok || err != nil || v < 1 {
		return 0, fmt.Errorf("%w: %s has no version prefix (NNN_name.sql)", ErrFormat, name)
	}
	return v, nil
}

// Split returns a file's up and down sections: the lines after
// "-- +goose Up" and after "-- +goose Down". Before "-- +goose Up" there
// may be only comments and blank lines. goose's StatementBegin and
// StatementEnd pass through as comments; NO TRANSACTION is refused, since
// Migrate applies every migration in a transaction.
func Split(text string) (up, down string, err error) {
	var sec [2]strings.Builder
	cur := -1 // -1 before Up, 0 in Up, 1 in Down
	for i, line := range strings.SplitAfter(text, "\n") {
		t := strings.TrimSpace(line)
		if a, ok := strings.CutPrefix(t, "-- +goose "); ok {
			switch strings.TrimSpace(a) {
			case "Up":
				if cur != -1 {
					return "", "", fmt.Errorf("%w: line %d: a second -- +goose Up", ErrFormat, i+1)
				}
				cur = 0
				continue
			case "Down":
				if cur != 0 {
					return "", "", fmt.Errorf("%w: line %d: -- +goose Down without an Up section before it", ErrFormat, i+1)
				}
				cur = 1
				continue
			case "StatementBegin", "StatementEnd":
			default:
				return "", "", fmt.Errorf("%w: line %d: unsupported annotation %q", ErrFormat, i+1, t)
			}
		}
		if cur == -1 {
			if t != "" && !strings.HasPrefix(t, "--") {
				return "", "", fmt.Errorf("%w: line %d: SQL before -- +goose Up", ErrFormat, i+1)
			}
			continue
		}
		sec[cur].WriteString(line)
	}
	if cur != 1 {
		return "", "", fmt.Errorf("%w: needs a -- +goose Up and a -- +goose Down section", ErrFormat)
	}
	up, down = strings.TrimSpace(sec[0].String()), strings.TrimSpace(sec[1].String())
	if up == "" {
		return "", "", fmt.Errorf("%w: empty up section", ErrFormat)
	}
	return up + "\n", down + "\n", nil
}
