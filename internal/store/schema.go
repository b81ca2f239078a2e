package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// ErrInvalidSchema is wrapped by the error for a PostgreSQL schema name
// txhook does not accept.
var ErrInvalidSchema = errors.New("txhook: invalid schema name")

// ErrNotMigrated means txhook's tables are missing, or lack a migration
// this version of txhook needs.
var ErrNotMigrated = errors.New("txhook: database schema not migrated: run (*outbox.Outbox).Migrate, or apply the files of github.com/txhook/txhook/outbox/migrations")

// CheckSchemaName accepts the names txhook can use unquoted in a
// search_path as well as quoted in its statements: lowercase letters,
// digits and underscores, not starting with a digit or "pg_", at most 63
// bytes. d must be Postgres; SQLite has no schemas.
func CheckSchemaName(d Dialect, name string) error {
	if d != Postgres {
		return fmt.Errorf("%w: %q: schemas are a PostgreSQL feature, leave Schema empty on %s", ErrInvalidSchema, name, d)
	}
	if name == "" || len(name) > 63 || strings.HasPrefix(name, "pg_") || name[0] >= '0' && name[0] <= '9' {
		return fmt.Errorf("%w: %q: want 1 to 63 lowercase letters, digits and underscores, not starting with a digit or pg_", ErrInvalidSchema, name)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return fmt.Errorf("%w: %q: want 1 to 63 lowercase letters, digits and underscores, not starting with a digit or pg_", ErrInvalidSchema, name)
		}
	}
	return nil
}

// SetSchema makes every statement name txhook's tables in schema (on
// PostgreSQL) instead of leaving them to the connection's search_path. It
// must be called before the Store is used.
func (s *Store) SetSchema(schema string) error {
	if err := CheckSchemaName(s.Dialect, schema); err != nil {
		return err
	}
	s.schema = schema
	s.prefix = `"` + schema + `".`
	return nil
}

// Schema returns the schema set with SetSchema; "" means the search_path.
func (s *Store) Schema() string { return s.schema }

// qualify writes q to b with every txhook table it names prefixed with the
// schema: each identifier starting with txhook_ outside a string literal,
// except the name a CREATE INDEX gives its index (an index always lives in
// its table's schema, and PostgreSQL refuses a qualified name there).
func (s *Store) qualify(b *strings.Builder, q string) {
	inString := false
	for i := 0; i < len(q); i++ {
		c := q[i]
		if c == '\'' {
			inString = !inString
		}
		if !inString && c == '-' && strings.HasPrefix(q[i:], "--") {
			end := strings.IndexByte(q[i:], '\n')
			if end < 0 {
				end = len(q) - i
			}
			b.WriteString(q[i : i+end])
			i += end - 1
			continue
		}
		if !inString && c == 't' && strings.HasPrefix(q[i:], "txhook_") && (i == 0 || !identByte(q[i-1]) && q[i-1] != '.' && q[i-1] != '"') && !namesNewIndex(q[:i]) {
			b.WriteString(s.prefix)
		}
		b.WriteByte(c)
	}
}

func identByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '$'
}

// namesNewIndex reports whether the identifier after before is the name in
// CREATE [UNIQUE] INDEX [CONCURRENTLY] [IF NOT EXISTS] name.
func namesNewIndex(before string) bool {
	// The longest prefix that matters is CREATE UNIQUE INDEX CONCURRENTLY
	// IF NOT EXISTS: a short tail of before is enough.
	words := strings.Fields(strings.ToUpper(before[max(0, len(before)-128):]))
	n := len(words)
	pop := func(w string) bool {
		if n > 0 && words[n-1] == w {
			n--
			return true
		}
		return false
	}
	if pop("EXISTS") && !(pop("NOT") && pop("IF")) {
		return false
	}
	pop("CONCURRENTLY")
	if !pop("INDEX") {
		return false
	}
	pop("UNIQUE")
	return pop("CREATE")
}

// tableExists reports whether txhook's table name exists where the Store's
// statements look for it.
func (s *Store) tableExists(ctx context.Context, q Querier, name string) (bool, error) {
	var ok bool
	var err error
	if s.Dialect == SQLite {
		err = q.QueryRowContext(ctx, `SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?`, name).Scan(&ok)
	} else {
		err = q.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.prefix+name).Scan(&ok)
	}
	return ok, err
}

// CheckSchema returns nil when every migration this version of txhook has
// is recorded in txhook_migrations, and otherwise an error wrapping
// ErrNotMigrated that says what is missing.
func (s *Store) CheckSchema(ctx context.Context) error {
	ms, err := Migrations(s.Dialect)
	if err != nil {
		return err
	}
	where := "the database"
	if s.Dialect == Postgres {
		where = "the search_path"
	}
	if s.schema != "" {
		where = "schema " + s.schema
	}
	ok, err := s.tableExists(ctx, s.DB, "txhook_migrations")
	if err != nil {
		return err
	}
	if !ok {
		if ok, err = s.tableExists(ctx, s.DB, "txhook_events"); err != nil {
			return err
		}
		if ok {
			return fmt.Errorf("%w: txhook_events exists in %s but txhook_migrations does not; record the migrations applied as outbox/migrations/README.md (Baseline) shows", ErrNotMigrated, where)
		}
		return fmt.Errorf("%w: no txhook tables in %s", ErrNotMigrated, where)
	}
	have, err := s.versions(ctx, s.DB)
	if err != nil {
		return err
	}
	var missing []string
	for _, m := range ms {
		if !have[m.Version] {
			missing = append(missing, m.Name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s lacks %s", ErrNotMigrated, where, strings.Join(missing, ", "))
	}
	return nil
}

// versions reads the migrations recorded in txhook_migrations.
func (s *Store) versions(ctx context.Context, q Querier) (map[int]bool, error) {
	rows, err := q.QueryContext(ctx, s.Rebind("SELECT version FROM txhook_migrations"))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	have := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		have[v] = true
	}
	return have, rows.Err()
}

// NotMigrated wraps err with ErrNotMigrated when it says a table or column
// txhook uses does not exist: SQLite's "no such table/column", PostgreSQL's
// SQLSTATE 42P01 and 42703 (lib/pq and pgx both report SQLState).
func NotMigrated(err error) error {
	if err == nil || errors.Is(err, ErrNotMigrated) {
		return err
	}
	var pg interface{ SQLState() string }
	undefined := false
	if errors.As(err, &pg) {
		undefined = pg.SQLState() == "42P01" || pg.SQLState() == "42703"
	} else {
		m := err.Error()
		undefined = strings.Contains(m, "no such table: txhook_") || strings.Contains(m, "no such column") || strings.Contains(m, "has no column named")
	}
	if undefined {
		return fmt.Errorf("%w: %w", ErrNotMigrated, err)
	}
	return err
}
