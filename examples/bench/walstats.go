package main

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"
	"time"
)

// writeMeter measures what a phase wrote to PostgreSQL: WAL bytes, by the
// difference of pg_current_wal_lsn() around it (the whole cluster's WAL,
// autovacuum and checkpoints included: run it on a cluster of its own), and
// rows inserted, updated (HOT or not) and deleted in one schema's tables,
// from pg_stat_user_tables.
type writeMeter struct {
	db     *sql.DB
	schema string
	lsn    string
	tups   map[string]tupCounts
}

// tupCounts are a table's row counters from pg_stat_user_tables.
type tupCounts struct{ ins, upd, hot, del int64 }

func (a tupCounts) sub(b tupCounts) tupCounts {
	return tupCounts{a.ins - b.ins, a.upd - b.upd, a.hot - b.hot, a.del - b.del}
}

// writes is what a writeMeter measured.
type writes struct {
	wal    int64
	tables map[string]tupCounts // deltas by table
	// records is the WAL by record type ("Heap/INSERT"), when the
	// server has pg_walinspect (PostgreSQL 15+; the bench's own cluster
	// creates it): bytes and records.
	records map[string][2]int64
}

// byRecord renders the WAL per event by record type, largest first, down
// to the types that make up 99% of it.
func (w writes) byRecord(n int) string {
	type rec struct {
		k    string
		b, c int64
	}
	var rs []rec
	var total int64
	for k, v := range w.records {
		rs = append(rs, rec{k, v[0], v[1]})
		total += v[0]
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].b > rs[j].b })
	var b strings.Builder
	var sum int64
	for _, r := range rs {
		if sum >= total*99/100 {
			break
		}
		sum += r.b
		fmt.Fprintf(&b, "%s %.0f B (%.2f); ", r.k, float64(r.b)/float64(n), float64(r.c)/float64(n))
	}
	return strings.TrimSuffix(b.String(), "; ")
}

// total adds up the tables' counters.
func (w writes) total() tupCounts {
	var t tupCounts
	for _, c := range w.tables {
		t.ins, t.upd, t.hot, t.del = t.ins+c.ins, t.upd+c.upd, t.hot+c.hot, t.del+c.del
	}
	return t
}

// perTable renders the deltas per event, table by table.
func (w writes) perTable(n int) string {
	names := make([]string, 0, len(w.tables))
	for k, c := range w.tables {
		if c != (tupCounts{}) {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	var b strings.Builder
	for _, k := range names {
		c := w.tables[k]
		fmt.Fprintf(&b, "%s ins %.2f upd %.2f (hot %.2f) del %.2f; ", strings.TrimPrefix(k, "txhook_"),
			float64(c.ins)/float64(n), float64(c.upd)/float64(n), float64(c.hot)/float64(n), float64(c.del)/float64(n))
	}
	return strings.TrimSuffix(b.String(), "; ")
}

func startWrites(ctx context.Context, db *sql.DB, schema string) (*writeMeter, error) {
	m := &writeMeter{db: db, schema: schema}
	var err error
	if m.tups, err = m.read(ctx); err != nil {
		return nil, err
	}
	if err := db.QueryRowContext(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&m.lsn); err != nil {
		return nil, err
	}
	return m, nil
}

// stop returns what was written since startWrites. A backend reports its
// row counters to pg_stat_user_tables at most once a second, and an idle
// one up to 10 s later, but always when it exits: stop closes the pool's
// idle connections (the pool opens new ones as needed) and waits until two
// readings agree.
func (m *writeMeter) stop(ctx context.Context) (writes, error) {
	var w writes
	var end string
	if err := m.db.QueryRowContext(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
		return w, err
	}
	if err := m.db.QueryRowContext(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint`, end, m.lsn).Scan(&w.wal); err != nil {
		return w, err
	}
	w.records = m.walRecords(ctx, end)
	idle := m.db.Stats().MaxOpenConnections
	m.db.SetMaxIdleConns(0)
	m.db.SetMaxIdleConns(max(idle, 2))
	prev, err := m.read(ctx)
	if err != nil {
		return w, err
	}
	for range 30 {
		time.Sleep(500 * time.Millisecond)
		cur, err := m.read(ctx)
		if err != nil {
			return w, err
		}
		same := len(cur) == len(prev)
		for k, v := range cur {
			same = same && prev[k] == v
		}
		prev = cur
		if same {
			break
		}
	}
	w.tables = map[string]tupCounts{}
	for k, v := range prev {
		w.tables[k] = v.sub(m.tups[k])
	}
	return w, nil
}

func (m *writeMeter) read(ctx context.Context) (map[string]tupCounts, error) {
	rows, err := m.db.QueryContext(ctx, `SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del
FROM pg_stat_user_tables WHERE schemaname = $1`, m.schema)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]tupCounts{}
	for rows.Next() {
		var k string
		var c tupCounts
		if err := rows.Scan(&k, &c.ins, &c.upd, &c.hot, &c.del); err != nil {
			return nil, err
		}
		out[k] = c
	}
	return out, rows.Err()
}

// walRecords returns the WAL from the meter's start to end by record type,
// or nil without pg_walinspect.
func (m *writeMeter) walRecords(ctx context.Context, end string) map[string][2]int64 {
	var nsp string
	if err := m.db.QueryRowContext(ctx, `SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
WHERE e.extname = 'pg_walinspect'`).Scan(&nsp); err != nil {
		return nil
	}
	rows, err := m.db.QueryContext(ctx, `SELECT "resource_manager/record_type", combined_size, count
FROM "`+nsp+`".pg_get_wal_stats($1::pg_lsn, $2::pg_lsn, true) WHERE count > 0`, m.lsn, end)
	if err != nil {
		return nil
	}
	defer rows.Close()
	out := map[string][2]int64{}
	for rows.Next() {
		var k string
		var b, c int64
		if rows.Scan(&k, &b, &c) != nil {
			return nil
		}
		out[k] = [2]int64{b, c}
	}
	if rows.Err() != nil {
		return nil
	}
	return out
}
