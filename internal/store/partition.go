package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"encoding/json"
)

// Partitioned tables (PostgreSQL only).
//
// Partition converts txhook_events, txhook_deliveries and txhook_attempts,
// while they are empty, into tables partitioned by RANGE on a time column,
// one partition per Interval plus a DEFAULT partition for rows no range
// partition covers. The new tables are derived from the current ones
// through the catalog, not from DDL written here: columns, defaults, checks
// and identity columns by CREATE TABLE … LIKE, indexes by pg_get_indexdef.
// So whatever indexes the migrations define when Partition runs, the
// partitioned tables have them.
//
// PostgreSQL requires every unique index of a partitioned table to include
// the partition key. A unique index over an identity column (the IDs of
// deliveries and attempts come from a sequence) simply gets the partition
// column appended. Any other (the event ID and the idempotency key, which
// callers choose) would lose its meaning that way, so its uniqueness moves
// to a small unpartitioned table, <table>_keys, kept by triggers: a BEFORE
// INSERT trigger inserts the row's keys there and skips the row when they
// are taken (what INSERT … ON CONFLICT DO NOTHING does, and every txhook
// insert into these tables is one), an AFTER DELETE trigger removes them.
// The partitioned table keeps a plain index with the same columns for
// lookups.

// ErrPartitionUnsupported is returned for partitioned tables on SQLite.
var ErrPartitionUnsupported = errors.New("txhook: partitioned tables need PostgreSQL; SQLite keeps one table each")

// ErrNotEmpty is returned by Partition when a table to convert holds rows.
var ErrNotEmpty = errors.New("txhook: partition: table is not empty; partition a new database, before any event is enqueued")

// PartitionKeys names each partitioned table's partition column, in the
// order retention handles them: deliveries first, whose survival decides
// that of their attempts and events.
var PartitionKeys = []struct{ Table, Column string }{
	{"txhook_deliveries", "created_at"},
	{"txhook_attempts", "started_at"},
	{"txhook_events", "created_at"},
}

// PartitionedTable is one row of txhook_partitions: how a table is
// partitioned.
type PartitionedTable struct {
	Table, Column string
	Interval      time.Duration
	Ahead         int
	// RelOptions are the storage parameters of the table before it was
	// partitioned (autovacuum settings); PostgreSQL refuses them on a
	// partitioned table, so each partition gets them.
	RelOptions []string
	// KeyColumns are the columns of <table>_keys, "" when the table has none;
	// MatchColumns identify a row there (its primary key's columns).
	KeyColumns, MatchColumns []string
}

// partitionName is the name of t's partition starting at start.
func partitionName(table string, start time.Time) string {
	return table + "_p" + start.UTC().Format("20060102t1504")
}

// PartitionStart parses the start of a partition from its name; ok is
// false for a name partitionName did not make (the DEFAULT partition).
func PartitionStart(table, name string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(name, table+"_p")
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse("20060102t1504", rest)
	return t, err == nil
}

// floorTime is the start of the interval iv that holds t, counted from
// the Unix epoch (midnight UTC for daily partitions).
func floorTime(t time.Time, iv time.Duration) time.Time {
	s := int64(iv / time.Second)
	u := t.Unix()
	f := u - ((u%s)+s)%s
	return time.Unix(f, 0).UTC()
}

const partitionsTable = `CREATE TABLE IF NOT EXISTS txhook_partitions (
    table_name       text    PRIMARY KEY,
    column_name      text    NOT NULL,
    interval_seconds bigint  NOT NULL,
    ahead            integer NOT NULL,
    reloptions       text[]  NOT NULL DEFAULT '{}',
    key_columns      text[]  NOT NULL DEFAULT '{}',
    match_columns    text[]  NOT NULL DEFAULT '{}'
)`

// Partitioning returns how txhook's tables are partitioned: nil when they
// are not (or on SQLite).
func (s *Store) Partitioning(ctx context.Context) ([]PartitionedTable, error) {
	if s.Dialect != Postgres {
		return nil, nil
	}
	return s.partitioning(ctx, s.DB)
}

func (s *Store) partitioning(ctx context.Context, q Querier) ([]PartitionedTable, error) {
	ok, err := s.tableExists(ctx, q, "txhook_partitions")
	if err != nil || !ok {
		return nil, err
	}
	rows, err := q.QueryContext(ctx, s.Rebind(`SELECT table_name, column_name, interval_seconds, ahead,
       to_jsonb(reloptions)::text, to_jsonb(key_columns)::text, to_jsonb(match_columns)::text
FROM txhook_partitions`))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	byName := map[string]PartitionedTable{}
	for rows.Next() {
		var p PartitionedTable
		var secs int64
		var relopts, keys, match string
		if err := rows.Scan(&p.Table, &p.Column, &secs, &p.Ahead, &relopts, &keys, &match); err != nil {
			return nil, err
		}
		for _, a := range []struct {
			s string
			v *[]string
		}{{relopts, &p.RelOptions}, {keys, &p.KeyColumns}, {match, &p.MatchColumns}} {
			if err := json.Unmarshal([]byte(a.s), a.v); err != nil {
				return nil, err
			}
		}
		p.Interval = time.Duration(secs) * time.Second
		byName[p.Table] = p
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var out []PartitionedTable
	for _, k := range PartitionKeys {
		if p, ok := byName[k.Table]; ok {
			out = append(out, p)
		}
	}
	return out, nil
}

// Partition converts the empty tables of PartitionKeys into partitioned
// ones (see the comment at the top of this file) and creates the
// partitions from the one holding now to ahead intervals later. Tables
// already partitioned are left as they are, so it is idempotent; a table
// holding rows makes it fail with ErrNotEmpty, changing nothing.
func (s *Store) Partition(ctx context.Context, iv time.Duration, ahead int, now time.Time) error {
	if s.Dialect != Postgres {
		return ErrPartitionUnsupported
	}
	return s.Tx(ctx, func(q Querier) error {
		if _, err := q.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrationLockKey)); err != nil {
			return err
		}
		if _, err := q.ExecContext(ctx, s.Rebind(partitionsTable)); err != nil {
			return err
		}
		views, err := s.dropDependentViews(ctx, q)
		if err != nil {
			return fmt.Errorf("txhook: partition: %w", err)
		}
		for _, k := range PartitionKeys {
			if err := s.partitionTable(ctx, q, k.Table, k.Column, iv, ahead); err != nil {
				return fmt.Errorf("txhook: partition %s: %w", k.Table, err)
			}
		}
		for _, v := range views {
			if _, err := q.ExecContext(ctx, `CREATE VIEW `+v[0]+` AS `+v[1]); err != nil {
				return fmt.Errorf("txhook: partition: recreate view %s: %w", v[0], err)
			}
		}
		_, err = s.ensurePartitions(ctx, q, now)
		return err
	})
}

// dropDependentViews drops the views that read the tables of
// PartitionKeys (txhook_attempt_log, since migration 008, and any of the
// host's own) and returns each one's name and definition, to be created
// again on the partitioned tables of the same names: a table a view reads
// cannot be dropped, and a view follows its table through a rename. Views
// on views are not expected; their owner and grants are not kept.
func (s *Store) dropDependentViews(ctx context.Context, q Querier) ([][2]string, error) {
	var tables []string
	for _, k := range PartitionKeys {
		tables = append(tables, s.prefix+k.Table)
	}
	rows, err := q.QueryContext(ctx, `SELECT DISTINCT v.oid::regclass::text, pg_get_viewdef(v.oid)
FROM pg_depend d
JOIN pg_rewrite r ON r.oid = d.objid
JOIN pg_class v ON v.oid = r.ev_class
WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass
  AND v.relkind = 'v' AND v.oid <> d.refobjid
  AND d.refobjid IN (SELECT to_regclass(t) FROM unnest($1::text[]) t)`, "{"+strings.Join(quoteArray(tables), ",")+"}")
	if err != nil {
		return nil, err
	}
	var views [][2]string
	for rows.Next() {
		var v [2]string
		if err := rows.Scan(&v[0], &v[1]); err != nil {
			rows.Close()
			return nil, err
		}
		views = append(views, v)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, v := range views {
		if _, err := q.ExecContext(ctx, `DROP VIEW `+v[0]); err != nil {
			return nil, err
		}
	}
	return views, nil
}

// quoteArray quotes each element for a PostgreSQL array literal.
func quoteArray(xs []string) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(x) + `"`
	}
	return out
}

// indexDef is one index of a table as the catalog describes it.
type indexDef struct {
	name, def, constraint string
	primary, unique       bool
	columns               []string // key columns; "" for an expression
	identity              bool     // every key column is an identity column
}

func (s *Store) partitionTable(ctx context.Context, q Querier, table, col string, iv time.Duration, ahead int) error {
	qt := s.prefix + table
	var kind string
	if err := q.QueryRowContext(ctx, `SELECT relkind::text FROM pg_class WHERE oid = $1::regclass`, qt).Scan(&kind); err != nil {
		return err
	}
	if kind == "p" {
		return nil
	}
	var nonEmpty bool
	if err := q.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM `+qt+`)`).Scan(&nonEmpty); err != nil {
		return err
	}
	if nonEmpty {
		return ErrNotEmpty
	}
	var relopts []string
	var reloptsJSON string
	if err := q.QueryRowContext(ctx, `SELECT to_jsonb(COALESCE(reloptions, '{}'))::text FROM pg_class WHERE oid = $1::regclass`, qt).Scan(&reloptsJSON); err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(reloptsJSON), &relopts); err != nil {
		return err
	}
	idx, err := s.indexDefs(ctx, q, qt)
	if err != nil {
		return err
	}
	// The identity sequence goes with the old table; the new one continues
	// where it stopped, so IDs never repeat (dead letters keep theirs).
	seqs, err := s.identitySequences(ctx, q, qt)
	if err != nil {
		return err
	}
	tmp := table + "_partitioned"
	if _, err := q.ExecContext(ctx, `CREATE TABLE `+s.prefix+tmp+` (LIKE `+qt+` INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY INCLUDING GENERATED INCLUDING STORAGE INCLUDING COMPRESSION INCLUDING COMMENTS)
PARTITION BY RANGE (`+quoteIdent(col)+`)`); err != nil {
		return err
	}
	if _, err := q.ExecContext(ctx, `DROP TABLE `+qt); err != nil {
		return err
	}
	if _, err := q.ExecContext(ctx, `ALTER TABLE `+s.prefix+tmp+` RENAME TO `+table); err != nil {
		return err
	}
	for column, last := range seqs {
		var seq string
		if err := q.QueryRowContext(ctx, `SELECT pg_get_serial_sequence($1, $2)`, qt, column).Scan(&seq); err != nil {
			return err
		}
		if last > 0 {
			if _, err := q.ExecContext(ctx, `SELECT setval($1, $2)`, seq, last); err != nil {
				return err
			}
		}
		// The name the old table's sequence had.
		if _, err := q.ExecContext(ctx, `ALTER SEQUENCE `+seq+` RENAME TO `+quoteIdent(table+"_"+column+"_seq")); err != nil {
			return err
		}
	}
	var keyCols, match []string
	var keyIdx []indexDef
	for _, ix := range idx {
		hasCol := false
		for _, c := range ix.columns {
			hasCol = hasCol || c == col
		}
		switch {
		case ix.unique && !hasCol && !ix.identity:
			// Uniqueness callers rely on: kept in <table>_keys.
			for _, c := range ix.columns {
				if c == "" {
					return fmt.Errorf("unique index %s has an expression; txhook cannot keep it unique across partitions", ix.name)
				}
				if !contains(keyCols, c) {
					keyCols = append(keyCols, c)
				}
			}
			if ix.primary {
				match = ix.columns
			}
			keyIdx = append(keyIdx, ix)
			if ix.primary {
				// Lookups by ID find the row through the primary key,
				// which now holds the partition column too.
				if _, err := q.ExecContext(ctx, `ALTER TABLE `+qt+` ADD CONSTRAINT `+quoteIdent(ix.constraint)+
					` PRIMARY KEY (`+quoteList(append(append([]string(nil), ix.columns...), col))+`)`); err != nil {
					return err
				}
			} else {
				// A plain index for lookups; the _keys table enforces.
				def, err := withPartitionColumn(strings.Replace(ix.def, "CREATE UNIQUE INDEX", "CREATE INDEX", 1), "")
				if err != nil {
					return err
				}
				if _, err := q.ExecContext(ctx, def); err != nil {
					return err
				}
			}
		case ix.primary:
			if _, err := q.ExecContext(ctx, `ALTER TABLE `+qt+` ADD CONSTRAINT `+quoteIdent(ix.constraint)+
				` PRIMARY KEY (`+quoteList(append(append([]string(nil), ix.columns...), col))+`)`); err != nil {
				return err
			}
		case ix.unique && !hasCol:
			def, err := withPartitionColumn(ix.def, col)
			if err != nil {
				return err
			}
			if _, err := q.ExecContext(ctx, def); err != nil {
				return err
			}
		default:
			if _, err := q.ExecContext(ctx, ix.def); err != nil {
				return err
			}
		}
	}
	if len(keyCols) > 0 {
		if len(match) == 0 {
			return fmt.Errorf("table has unique indexes without %s but no primary key to match their rows", col)
		}
		if err := s.createKeys(ctx, q, table, col, keyCols, match, keyIdx); err != nil {
			return err
		}
		keyCols = append(keyCols, col)
	}
	def := table + "_default"
	if _, err := q.ExecContext(ctx, `CREATE TABLE `+s.prefix+def+` PARTITION OF `+qt+` DEFAULT`+withOptions(relopts)); err != nil {
		return err
	}
	_, err = q.ExecContext(ctx, s.Rebind(`INSERT INTO txhook_partitions (table_name, column_name, interval_seconds, ahead, reloptions, key_columns, match_columns)
VALUES (?, ?, ?, ?, `+textArray+`, `+textArray+`, `+textArray+`)`), table, col, int64(iv/time.Second), ahead, jsonStrings(relopts), jsonStrings(keyCols), jsonStrings(match))
	return err
}

// createKeys makes <table>_keys with the columns of the unique indexes
// that do not include the partition column, and the partition column, and
// the triggers that keep it.
func (s *Store) createKeys(ctx context.Context, q Querier, table, col string, keyCols, match []string, idx []indexDef) error {
	qt := s.prefix + table
	keys := table + "_keys"
	qk := s.prefix + keys
	var colDefs []string
	for _, c := range append(append([]string(nil), keyCols...), col) {
		var typ string
		if err := q.QueryRowContext(ctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = $1::regclass AND attname = $2`, qt, c).Scan(&typ); err != nil {
			return err
		}
		colDefs = append(colDefs, quoteIdent(c)+" "+typ)
	}
	if _, err := q.ExecContext(ctx, `CREATE TABLE `+qk+` (`+strings.Join(colDefs, ", ")+`)`); err != nil {
		return err
	}
	for _, ix := range idx {
		def := ix.def
		if ix.primary {
			def = `CREATE UNIQUE INDEX ` + ix.name + ` ON ` + qt + ` USING btree (` + quoteList(ix.columns) + `)`
		}
		// Same definition, on the keys table, under the name <index>_key.
		on := strings.Index(def, " ON ")
		using := strings.Index(def, " USING ")
		if on < 0 || using < on {
			return fmt.Errorf("cannot read the definition of index %s: %s", ix.name, def)
		}
		def = "CREATE UNIQUE INDEX " + quoteIdent(strings.Trim(ix.name, `"`)+"_key") + " ON " + qk + def[using:]
		if _, err := q.ExecContext(ctx, def); err != nil {
			return fmt.Errorf("index %s on %s: %w", ix.name, keys, err)
		}
	}
	if _, err := q.ExecContext(ctx, `CREATE INDEX `+quoteIdent(keys+"_"+col)+` ON `+qk+` (`+quoteIdent(col)+`)`); err != nil {
		return err
	}
	all := append(append([]string(nil), keyCols...), col)
	newCols := make([]string, len(all))
	for i, c := range all {
		newCols[i] = "NEW." + quoteIdent(c)
	}
	var cond []string
	for _, c := range match {
		cond = append(cond, quoteIdent(c)+" = OLD."+quoteIdent(c))
	}
	cond = append(cond, quoteIdent(col)+" = OLD."+quoteIdent(col))
	// txhook.moving is set (SET LOCAL) by partition maintenance while it
	// moves rows between partitions: their keys stay as they are.
	stmts := []string{
		`CREATE FUNCTION ` + qk + `_insert() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF current_setting('txhook.moving', true) = 'on' THEN
        RETURN NEW;
    END IF;
    INSERT INTO ` + qk + ` (` + quoteList(all) + `) VALUES (` + strings.Join(newCols, ", ") + `) ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END $f$`,
		`CREATE FUNCTION ` + qk + `_delete() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF current_setting('txhook.moving', true) = 'on' THEN
        RETURN NULL;
    END IF;
    DELETE FROM ` + qk + ` WHERE ` + strings.Join(cond, " AND ") + `;
    RETURN NULL;
END $f$`,
		`CREATE TRIGGER ` + keys + `_insert BEFORE INSERT ON ` + qt + ` FOR EACH ROW EXECUTE FUNCTION ` + qk + `_insert()`,
		`CREATE TRIGGER ` + keys + `_delete AFTER DELETE ON ` + qt + ` FOR EACH ROW EXECUTE FUNCTION ` + qk + `_delete()`,
		// txhook never changes these columns; refuse what would leave the
		// keys table wrong.
		`CREATE FUNCTION ` + qk + `_update() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    RAISE EXCEPTION 'txhook: the key columns of ` + table + ` cannot change on a partitioned table';
END $f$`,
		`CREATE TRIGGER ` + keys + `_update BEFORE UPDATE OF ` + quoteList(all) + ` ON ` + qt + ` FOR EACH ROW EXECUTE FUNCTION ` + qk + `_update()`,
	}
	for _, st := range stmts {
		if _, err := q.ExecContext(ctx, st); err != nil {
			return err
		}
	}
	return nil
}

// indexDefs reads the indexes of table qt.
func (s *Store) indexDefs(ctx context.Context, q Querier, qt string) ([]indexDef, error) {
	rows, err := q.QueryContext(ctx, `SELECT c.relname, pg_get_indexdef(i.indexrelid), COALESCE(con.conname, ''), i.indisprimary, i.indisunique,
       to_jsonb(ARRAY(SELECT COALESCE(a.attname::text, '') FROM unnest(i.indkey[0:i.indnkeyatts - 1]) WITH ORDINALITY k(n, o)
             LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n ORDER BY k.o))::text,
       NOT EXISTS (SELECT 1 FROM unnest(i.indkey[0:i.indnkeyatts - 1]) k(n)
                   LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n
                   WHERE a.attidentity IS DISTINCT FROM 'd' AND a.attidentity IS DISTINCT FROM 'a')
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
LEFT JOIN pg_constraint con ON con.conindid = i.indexrelid AND con.conrelid = i.indrelid AND con.contype IN ('p', 'u')
WHERE i.indrelid = $1::regclass
ORDER BY c.relname`, qt)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []indexDef
	for rows.Next() {
		var d indexDef
		var cols string
		if err := rows.Scan(&d.name, &d.def, &d.constraint, &d.primary, &d.unique, &cols, &d.identity); err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(cols), &d.columns); err != nil {
			return nil, err
		}
		if d.constraint != "" && !d.primary {
			// A UNIQUE constraint: recreated as a unique index of the same
			// name, which is what the partitioned table can hold.
			d.constraint = ""
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// identitySequences returns each identity column of qt with its
// sequence's last value (0 when never used).
func (s *Store) identitySequences(ctx context.Context, q Querier, qt string) (map[string]int64, error) {
	rows, err := q.QueryContext(ctx, `SELECT a.attname, pg_get_serial_sequence($1, a.attname)
FROM pg_attribute a WHERE a.attrelid = $1::regclass AND a.attidentity <> '' AND NOT a.attisdropped`, qt)
	if err != nil {
		return nil, err
	}
	seqs := map[string]string{}
	for rows.Next() {
		var col, seq string
		if err := rows.Scan(&col, &seq); err != nil {
			rows.Close()
			return nil, err
		}
		seqs[col] = seq
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for col, seq := range seqs {
		var last sql.NullInt64
		if err := q.QueryRowContext(ctx, `SELECT CASE WHEN is_called THEN last_value END FROM `+seq).Scan(&last); err != nil {
			return nil, err
		}
		out[col] = last.Int64
	}
	return out, nil
}

// withPartitionColumn appends col to the key columns of a CREATE INDEX
// statement from pg_get_indexdef ("… USING btree (a, b) INCLUDE (c) WHERE
// …"); col "" returns def unchanged once checked.
func withPartitionColumn(def, col string) (string, error) {
	using := strings.Index(def, " USING ")
	if using < 0 {
		return "", fmt.Errorf("cannot read index definition %q", def)
	}
	open := strings.IndexByte(def[using:], '(')
	if open < 0 {
		return "", fmt.Errorf("cannot read index definition %q", def)
	}
	open += using
	depth := 0
	for i := open; i < len(def); i++ {
		switch def[i] {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				if col == "" {
					return def, nil
				}
				return def[:i] + ", " + quoteIdent(col) + def[i:], nil
			}
		}
	}
	return "", fmt.Errorf("cannot read index definition %q", def)
}

// textArray turns a JSON array of strings parameter into a text[].
const textArray = `ARRAY(SELECT jsonb_array_elements_text(?::jsonb))`

// quoteIdent quotes a PostgreSQL identifier.
func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func quoteList(cols []string) string {
	q := make([]string, len(cols))
	for i, c := range cols {
		q[i] = quoteIdent(c)
	}
	return strings.Join(q, ", ")
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func withOptions(relopts []string) string {
	if len(relopts) == 0 {
		return ""
	}
	return " WITH (" + strings.Join(relopts, ", ") + ")"
}

// EnsurePartitions creates, for every partitioned table, the partitions
// from the one holding now to Ahead intervals later that are missing, and
// returns how many it created. Rows the DEFAULT partition holds in a new
// partition's range move into it.
func (s *Store) EnsurePartitions(ctx context.Context, now time.Time) (created int, err error) {
	if s.Dialect != Postgres {
		return 0, ErrPartitionUnsupported
	}
	pts, err := s.Partitioning(ctx)
	if err != nil || len(pts) == 0 {
		return 0, err
	}
	for _, p := range pts {
		for i := 0; i <= p.Ahead; i++ {
			start := floorTime(now, p.Interval).Add(time.Duration(i) * p.Interval)
			var ok bool
			if err := s.DB.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.prefix+partitionName(p.Table, start)).Scan(&ok); err != nil {
				return created, err
			}
			if ok {
				continue
			}
			err := s.Tx(ctx, func(q Querier) error {
				if _, err := q.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrationLockKey)); err != nil {
					return err
				}
				n, err := s.createPartition(ctx, q, p, start)
				created += n
				return err
			})
			if err != nil {
				return created, fmt.Errorf("txhook: create partition of %s at %s: %w", p.Table, start.Format(time.RFC3339), err)
			}
		}
	}
	return created, nil
}

func (s *Store) ensurePartitions(ctx context.Context, q Querier, now time.Time) (int, error) {
	pts, err := s.partitioning(ctx, q)
	if err != nil {
		return 0, err
	}
	created := 0
	for _, p := range pts {
		for i := 0; i <= p.Ahead; i++ {
			n, err := s.createPartition(ctx, q, p, floorTime(now, p.Interval).Add(time.Duration(i)*p.Interval))
			created += n
			if err != nil {
				return created, err
			}
		}
	}
	return created, nil
}

// createPartition creates p's partition starting at start unless it
// exists. It is made apart and then attached, which locks the parent table
// in SHARE UPDATE EXCLUSIVE mode only: claims and completions go on.
func (s *Store) createPartition(ctx context.Context, q Querier, p PartitionedTable, start time.Time) (int, error) {
	name := partitionName(p.Table, start)
	if ok, err := s.relExists(ctx, q, name); err != nil || ok {
		return 0, err
	}
	qt, qp, qd := s.prefix+p.Table, s.prefix+name, s.prefix+p.Table+"_default"
	col := quoteIdent(p.Column)
	end := start.Add(p.Interval)
	if _, err := q.ExecContext(ctx, `CREATE TABLE `+qp+` (LIKE `+qt+` INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION)`+withOptions(p.RelOptions)); err != nil {
		return 0, err
	}
	// Rows enqueued past the last partition went to DEFAULT; the range
	// cannot be attached while DEFAULT holds rows in it, so they move.
	if _, err := q.ExecContext(ctx, `SET LOCAL txhook.moving = 'on'`); err != nil {
		return 0, err
	}
	if _, err := q.ExecContext(ctx, `WITH m AS (DELETE FROM `+qd+` WHERE `+col+` >= $1 AND `+col+` < $2 RETURNING *)
INSERT INTO `+qp+` SELECT * FROM m`, start, end); err != nil {
		return 0, err
	}
	if _, err := q.ExecContext(ctx, `SET LOCAL txhook.moving = 'off'`); err != nil {
		return 0, err
	}
	if _, err := q.ExecContext(ctx, `ALTER TABLE `+qt+` ATTACH PARTITION `+qp+` FOR VALUES FROM ('`+start.Format(time.RFC3339)+`') TO ('`+end.Format(time.RFC3339)+`')`); err != nil {
		return 0, err
	}
	return 1, nil
}

// relExists reports whether txhook's relation name exists. It reads
// pg_class with the statement's snapshot: to_regclass could answer from a
// catalog cache that predates the advisory lock another relay just
// released after creating or dropping it.
func (s *Store) relExists(ctx context.Context, q Querier, name string) (bool, error) {
	var ok bool
	err := q.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_class WHERE relname = $1
    AND relnamespace = COALESCE(to_regnamespace(NULLIF($2, '')), (SELECT oid FROM pg_namespace WHERE nspname = current_schema())))`, name, s.schema).Scan(&ok)
	return ok, err
}

// Partition is one range partition of a table.
type Partition struct {
	Table, Name string
	Start, End  time.Time
}

// Partitions lists the range partitions of the partitioned tables, oldest
// first per table.
func (s *Store) Partitions(ctx context.Context) ([]Partition, error) {
	if s.Dialect != Postgres {
		return nil, ErrPartitionUnsupported
	}
	pts, err := s.Partitioning(ctx)
	if err != nil {
		return nil, err
	}
	var out []Partition
	for _, p := range pts {
		rows, err := s.DB.QueryContext(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass ORDER BY c.relname`, s.prefix+p.Table)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var name string
			if err := rows.Scan(&name); err != nil {
				rows.Close()
				return nil, err
			}
			if start, ok := PartitionStart(p.Table, name); ok {
				out = append(out, Partition{Table: p.Table, Name: name, Start: start, End: start.Add(p.Interval)})
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// survivors is, for each partitioned table, the condition on a row x of
// one of its partitions that keeps it past retention cut ($1): the
// negation of what PruneFinished and PruneEvents delete. An attempt is
// kept while its delivery is; its $1 is the end of the partition plus a
// margin, as an attempt starts after its delivery is created (give or take
// the relays' clock skew), which spares probing every partition.
var survivors = map[string]string{
	"txhook_deliveries": `NOT (x.state IN ('succeeded', 'dead') AND x.updated_at < $1
    AND (x.state = 'succeeded' OR NOT EXISTS (SELECT 1 FROM txhook_dead_letters dl WHERE dl.delivery_id = x.id)))`,
	"txhook_attempts": `EXISTS (SELECT 1 FROM txhook_deliveries d WHERE d.id = x.delivery_id AND d.created_at < $1)`,
	"txhook_events": `(x.dispatched_at IS NULL OR x.dispatched_at >= $1
    OR EXISTS (SELECT 1 FROM txhook_deliveries d WHERE d.event_id = x.id)
    OR EXISTS (SELECT 1 FROM txhook_dead_letters dl WHERE dl.event_id = x.id))`,
}

// survivorArgs is the parameter survivors[table] uses.
func survivorArgs(table string, cut, margin time.Time) []any {
	if table == "txhook_attempts" {
		return []any{margin.UTC()}
	}
	return []any{cut.UTC()}
}

// DroppedPartitions is what DropPartitions did.
type DroppedPartitions struct {
	// Dropped are the partitions dropped.
	Dropped []string
	// Moved counts rows that had to be kept (unfinished deliveries,
	// undispatched events, what a dead letter refers to) and moved to the
	// DEFAULT partition before their partition was dropped.
	Moved int
	// Kept are partitions past retention left in place because more than
	// maxMove of their rows must be kept, or because a lock was not granted
	// in time; row-by-row pruning deletes what it can of them.
	Kept []string
	// Rows dropped with the partitions, per table, as counted before the
	// partition was locked.
	Deliveries, Attempts, Events int
	// Keys deleted from <table>_keys for the rows dropped.
	Keys int
	// MaxLockHeld is the longest a drop held its table's lock (from the
	// DETACH to the commit): how long statements on it waited at most.
	MaxLockHeld time.Duration
}

// errGone: another relay dropped the partition first, or is dropping
// partitions now.
var errGone = errors.New("partition already dropped")

// dropLockKey, with the schema's name, serialises partition drops across
// relays ("txhk" in ASCII).
const dropLockKey = 0x7478686b

// errLockTimeout marks a partition drop given up because it waited too
// long for its lock; the next round tries again.
var errLockTimeout = errors.New("lock not granted in time")

// DropPartitions drops the range partitions that end at or before cut
// (deliveries, then attempts, then events). The rows of a partition that
// retention would keep are moved to the DEFAULT partition first, in the
// same transaction; a partition with more than maxMove of them is kept
// instead. Each drop waits at most lockWait for its table's lock.
func (s *Store) DropPartitions(ctx context.Context, cut time.Time, maxMove int, lockWait time.Duration) (DroppedPartitions, error) {
	var out DroppedPartitions
	if s.Dialect != Postgres {
		return out, ErrPartitionUnsupported
	}
	pts, err := s.Partitioning(ctx)
	if err != nil || len(pts) == 0 {
		return out, err
	}
	parts, err := s.Partitions(ctx)
	if err != nil {
		return out, err
	}
	byTable := map[string]PartitionedTable{}
	for _, p := range pts {
		byTable[p.Table] = p
	}
	for _, k := range PartitionKeys {
		pt, ok := byTable[k.Table]
		if !ok {
			continue
		}
		for _, part := range parts {
			if part.Table != k.Table || part.End.After(cut) {
				continue
			}
			margin := part.End.Add(pt.Interval + time.Hour)
			// Count first, with no lock: a partition whose keepers are too
			// many is never locked at all.
			// A delivery row may hold its first attempt (migration 008):
			// those of the rows dropped count as attempts dropped.
			inline := "false"
			if k.Table == "txhook_deliveries" {
				inline = "x.ok_started_at IS NOT NULL"
			}
			var total, n, inlineDropped int
			if err := s.DB.QueryRowContext(ctx, s.Rebind(`SELECT count(*), count(*) FILTER (WHERE keep), count(*) FILTER (WHERE inline AND NOT keep)
FROM (SELECT (`+survivors[k.Table]+`) IS TRUE AS keep, `+inline+` AS inline FROM `+part.Name+` x) y`), survivorArgs(k.Table, cut, margin)...).Scan(&total, &n, &inlineDropped); err != nil {
				if strings.Contains(err.Error(), "does not exist") {
					continue // another relay dropped it
				}
				return out, err
			}
			if n > maxMove {
				out.Kept = append(out.Kept, part.Name)
				continue
			}
			moved, held, err := s.dropPartition(ctx, pt, part, cut, margin, maxMove, lockWait)
			out.MaxLockHeld = max(out.MaxLockHeld, held)
			switch {
			case errors.Is(err, errGone):
				continue
			case errors.Is(err, errLockTimeout) || errors.Is(err, errTooMany):
				out.Kept = append(out.Kept, part.Name)
				continue
			case err != nil:
				return out, fmt.Errorf("txhook: drop partition %s: %w", part.Name, err)
			}
			out.Moved += moved
			out.Dropped = append(out.Dropped, part.Name)
			switch k.Table {
			case "txhook_deliveries":
				out.Deliveries += max(0, total-moved)
				out.Attempts += inlineDropped
			case "txhook_attempts":
				out.Attempts += max(0, total-moved)
			case "txhook_events":
				out.Events += max(0, total-moved)
			}
		}
		if len(pt.KeyColumns) > 0 {
			// Every round, so that keys a crash left behind go too. Only
			// keys older than every range partition can have lost their
			// row: those rows are gone or in DEFAULT.
			oldest := time.Time{}
			rest, err := s.Partitions(ctx)
			if err != nil {
				return out, err
			}
			for _, r := range rest {
				if r.Table == pt.Table && (oldest.IsZero() || r.Start.Before(oldest)) {
					oldest = r.Start
				}
			}
			if oldest.IsZero() {
				oldest = cut
			}
			n, err := s.pruneKeys(ctx, pt, oldest)
			out.Keys += n
			if err != nil {
				return out, fmt.Errorf("txhook: delete keys of dropped rows: %w", err)
			}
		}
	}
	return out, nil
}

// errTooMany rolls back a drop whose keepers grew past maxMove between the
// count and the lock.
var errTooMany = errors.New("too many rows to keep")

func (s *Store) dropPartition(ctx context.Context, pt PartitionedTable, part Partition, cut, margin time.Time, maxMove int, lockWait time.Duration) (moved int, held time.Duration, err error) {
	var locked time.Time
	err = s.Tx(ctx, func(q Querier) error {
		if _, err := q.ExecContext(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, max(1, lockWait.Milliseconds()))); err != nil {
			return err
		}
		var mine bool
		if err := q.QueryRowContext(ctx, `SELECT pg_try_advisory_xact_lock($1, hashtext(COALESCE(NULLIF($2, ''), current_schema())))`,
			dropLockKey, s.schema).Scan(&mine); err != nil {
			return err
		}
		if !mine {
			return errGone // another relay is dropping partitions of these tables
		}
		if ok, err := s.relExists(ctx, q, part.Name); err != nil || !ok {
			if err == nil {
				err = errGone
			}
			return err
		}
		qt, qp := s.prefix+pt.Table, s.prefix+part.Name
		// DETACH locks the table (ACCESS EXCLUSIVE) until commit: nothing
		// can change, claim or complete a row of it meanwhile, so what is
		// moved below is exactly what must be kept.
		if _, err := q.ExecContext(ctx, `ALTER TABLE `+qt+` DETACH PARTITION `+qp); err != nil {
			if strings.Contains(err.Error(), "lock timeout") || strings.Contains(err.Error(), "55P03") {
				return errLockTimeout
			}
			return err
		}
		locked = time.Now()
		if _, err := q.ExecContext(ctx, `SET LOCAL txhook.moving = 'on'`); err != nil {
			return err
		}
		// The range is no longer covered: the rows go to DEFAULT.
		res, err := q.ExecContext(ctx, s.Rebind(`INSERT INTO `+pt.Table+` SELECT x.* FROM `+part.Name+` x WHERE `+survivors[pt.Table]), survivorArgs(pt.Table, cut, margin)...)
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		moved = int(n)
		if moved > maxMove {
			return errTooMany
		}
		// The keys of the rows dropped go afterwards, in batches and
		// without this lock (PruneKeys): they only keep IDs taken a little
		// longer.
		if _, err := q.ExecContext(ctx, `DROP TABLE `+qp); err != nil {
			return err
		}
		held = time.Since(locked)
		return nil
	})
	return moved, held, err
}

// keysBatch bounds one transaction of pruneKeys.
const keysBatch = 10000

// pruneKeys deletes, in transactions of keysBatch, the rows of
// <table>_keys older than before whose row is gone (dropped with its
// partition), and returns how many.
func (s *Store) pruneKeys(ctx context.Context, pt PartitionedTable, before time.Time) (int, error) {
	qt := s.prefix + pt.Table
	col := quoteIdent(pt.Column)
	on := []string{"e." + col + " = k." + col}
	for _, c := range pt.MatchColumns {
		on = append(on, "e."+quoteIdent(c)+" = k."+quoteIdent(c))
	}
	// Equal partition columns let each probe visit one partition.
	q := `DELETE FROM ` + qt + `_keys WHERE ctid IN (
    SELECT k.ctid FROM ` + qt + `_keys k
    WHERE k.` + col + ` < $1 AND NOT EXISTS (SELECT 1 FROM ` + qt + ` e WHERE ` + strings.Join(on, " AND ") + `)
    LIMIT ` + fmt.Sprint(keysBatch) + `)`
	total := 0
	for {
		res, err := s.DB.ExecContext(ctx, q, before.UTC())
		if err != nil {
			return total, err
		}
		n, _ := res.RowsAffected()
		total += int(n)
		if n < keysBatch {
			return total, nil
		}
	}
}
