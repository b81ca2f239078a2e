package store_test

import (
	"context"
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/internal/testdb"
)

// indexColumns maps each index of table (parent only) to its definition
// with the table and index names taken out.
func indexColumns(t *testing.T, db *testdb.DB, table string) map[string]string {
	t.Helper()
	rows, err := db.Query(`SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = to_regclass($1)`, table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name, def string
		if err := rows.Scan(&name, &def); err != nil {
			t.Fatal(err)
		}
		out[name] = def[strings.Index(def, " USING "):]
	}
	return out
}

// Partition derives the partitioned tables from whatever the migrations
// (and the host) defined: an index added after the migrations is there,
// primary keys gain the partition column, and the caller-chosen unique keys
// stay unique across partitions.
func TestPartitionDerivesTablesFromTheCatalog(t *testing.T) {
	eachPostgres(t, func(t *testing.T, db *testdb.DB, st *store.Store) {
		ctx := context.Background()
		// Stands for an index a later migration adds, or a host's own.
		if _, err := db.Exec(`CREATE INDEX txhook_deliveries_host_extra ON txhook_deliveries (last_status, updated_at) WHERE last_status >= 500`); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(`SELECT setval(pg_get_serial_sequence('txhook_deliveries', 'id'), 41)`); err != nil {
			t.Fatal(err)
		}
		before := map[string]map[string]string{}
		for _, k := range store.PartitionKeys {
			before[k.Table] = indexColumns(t, db, k.Table)
		}
		now := time.Date(2026, 12, 1, 10, 30, 0, 0, time.UTC)
		if err := st.Partition(ctx, 24*time.Hour, 2, now); err != nil {
			t.Fatal(err)
		}
		if err := st.Partition(ctx, 24*time.Hour, 2, now); err != nil {
			t.Fatalf("second Partition: %v", err)
		}
		for _, k := range store.PartitionKeys {
			var kind string
			if err := db.QueryRow(`SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)`, k.Table).Scan(&kind); err != nil || kind != "p" {
				t.Fatalf("%s relkind %q, %v", k.Table, kind, err)
			}
			after := indexColumns(t, db, k.Table)
			for name, def := range before[k.Table] {
				got, ok := after[name]
				if !ok {
					t.Errorf("%s: index %s missing after Partition", k.Table, name)
					continue
				}
				if got != def && !strings.Contains(got, k.Column) {
					t.Errorf("%s: index %s is %s, was %s", k.Table, name, got, def)
				}
			}
			if len(after) != len(before[k.Table]) {
				t.Errorf("%s: indexes %v, was %v", k.Table, keys(after), keys(before[k.Table]))
			}
		}
		if got := indexColumns(t, db, "txhook_deliveries")["txhook_deliveries_pkey"]; got != " USING btree (id, created_at)" {
			t.Errorf("deliveries primary key %s", got)
		}
		if got := indexColumns(t, db, "txhook_deliveries")["txhook_deliveries_host_extra"]; !strings.Contains(got, "WHERE (last_status >= 500)") {
			t.Errorf("host index %s", got)
		}
		// Partitions: the one holding now and two ahead, plus DEFAULT,
		// with the tables' autovacuum settings.
		parts, err := st.Partitions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(parts) != 9 || parts[0].Name != "txhook_deliveries_p20261201t0000" || parts[2].Name != "txhook_deliveries_p20261203t0000" {
			t.Fatalf("partitions %+v", parts)
		}
		var opts string
		if err := db.QueryRow(`SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = to_regclass('txhook_deliveries_p20261202t0000')`).Scan(&opts); err != nil || !strings.Contains(opts, "autovacuum_vacuum_scale_factor=0.01") {
			t.Errorf("partition reloptions %q, %v", opts, err)
		}
		// The identity sequence continues where the old one stopped.
		var id int64
		if err := db.QueryRow(`INSERT INTO txhook_deliveries (event_id, endpoint_id, state, next_attempt_at, created_at, updated_at)
VALUES ('e', 'ep', 'pending', now(), $1, $1) RETURNING id`, now).Scan(&id); err != nil || id != 42 {
			t.Fatalf("first delivery id %d, %v", id, err)
		}

		// Event IDs and idempotency keys stay unique across partitions.
		ins := func(id, key string, at time.Time) int64 {
			t.Helper()
			var k any
			if key != "" {
				k = key
			}
			res, err := db.Exec(`INSERT INTO txhook_events (id, tenant, type, payload, idempotency_key, created_at) VALUES ($1, 'm', 't', '{}', $2, $3) ON CONFLICT DO NOTHING`, id, k, at)
			if err != nil {
				t.Fatal(err)
			}
			n, _ := res.RowsAffected()
			return n
		}
		if n := ins("evt_1", "k1", now); n != 1 {
			t.Fatalf("first insert %d", n)
		}
		if n := ins("evt_1", "", now.Add(24*time.Hour)); n != 0 {
			t.Errorf("same ID in the next partition inserted %d", n)
		}
		if n := ins("evt_1", "", now.Add(-365*24*time.Hour)); n != 0 {
			t.Errorf("same ID in DEFAULT inserted %d", n)
		}
		if n := ins("evt_2", "k1", now.Add(48*time.Hour)); n != 0 {
			t.Errorf("same idempotency key in another partition inserted %d", n)
		}
		if n := ins("evt_3", "", now); n != 1 {
			t.Errorf("NULL key insert %d", n)
		}
		if n := ins("evt_4", "", now.Add(time.Hour)); n != 1 {
			t.Errorf("second NULL key insert %d", n)
		}
		if _, err := db.Exec(`UPDATE txhook_events SET id = 'evt_9' WHERE id = 'evt_1'`); err == nil {
			t.Error("changing a key column was allowed")
		}
		// Deleting an event frees its keys.
		if _, err := db.Exec(`DELETE FROM txhook_events WHERE id = 'evt_1'`); err != nil {
			t.Fatal(err)
		}
		if n := ins("evt_2", "k1", now.Add(48*time.Hour)); n != 1 {
			t.Errorf("key of a deleted event still taken")
		}
	})
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestPartitionRefusesSQLiteAndTablesWithRows(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		st := openStore(t, db)
		if st.Dialect == store.SQLite {
			if err := st.Partition(ctx, time.Hour, 1, time.Now()); !errors.Is(err, store.ErrPartitionUnsupported) {
				t.Fatalf("SQLite Partition: %v", err)
			}
			return
		}
		running(t, st, "relay", "m", time.Now())
		err := st.Partition(ctx, time.Hour, 1, time.Now())
		if !errors.Is(err, store.ErrNotEmpty) {
			t.Fatalf("Partition with rows: %v", err)
		}
		var kind string
		if err := db.QueryRow(`SELECT relkind::text FROM pg_class WHERE oid = to_regclass('txhook_deliveries')`).Scan(&kind); err != nil || kind != "r" {
			t.Fatalf("deliveries relkind %q after a refused Partition, %v", kind, err)
		}
	})
}

// A partition drop waits for its lock at most lockWait: a long transaction
// on the table makes it keep the partition for the next round, with no
// error, rather than queue every claim behind it.
func TestDropPartitionGivesUpOnABusyLock(t *testing.T) {
	eachPostgres(t, func(t *testing.T, db *testdb.DB, st *store.Store) {
		ctx := context.Background()
		day0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
		if err := st.Partition(ctx, 24*time.Hour, 0, day0); err != nil {
			t.Fatal(err)
		}
		id := running(t, st, "relay", "m", day0)
		if _, err := db.Exec(`UPDATE txhook_deliveries SET state = 'succeeded', updated_at = $1 WHERE id = $2`, day0, id); err != nil {
			t.Fatal(err)
		}
		// A relay's transaction still open on the table, on a pool of
		// its own.
		other := testdb.Reopen(t, db)
		tx, err := other.Begin()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tx.Rollback() })
		if _, err := tx.Exec(`SELECT 1 FROM txhook_deliveries WHERE id = $1 FOR UPDATE`, id); err != nil {
			t.Fatal(err)
		}
		cut := day0.Add(30 * 24 * time.Hour)
		d, err := st.DropPartitions(ctx, cut, 100, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		// The deliveries' partition is kept; the attempts' (empty) and
		// the events' go, the event moved to DEFAULT as its delivery
		// still refers to it.
		if len(d.Kept) != 1 || d.Kept[0] != "txhook_deliveries_p20261130t0000" || len(d.Dropped) != 2 || d.Moved != 1 {
			t.Fatalf("with the table busy: %+v", d)
		}
		tx.Rollback()
		d, err = st.DropPartitions(ctx, cut, 100, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Dropped) != 1 || d.Deliveries != 1 || d.Moved != 0 || len(d.Kept) != 0 {
			t.Fatalf("after: %+v", d)
		}
	})
}

// eachPostgres runs fn in a parallel subtest per PostgreSQL driver, on a
// fresh migrated database.
func eachPostgres(t *testing.T, fn func(t *testing.T, db *testdb.DB, st *store.Store)) {
	for _, b := range testdb.Backends {
		if !b.Postgres() {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			db := testdb.Open(t, b)
			fn(t, db, openStore(t, db))
		})
	}
}
