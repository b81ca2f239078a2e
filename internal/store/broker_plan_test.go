package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/txhook/txhook/internal/testdb"
)

// TestBrokerLookupsProbeTheEventIndex: a broker worker's statements on
// the history database look a delivery up by its row or its event, and
// must read about as many index entries as they look up, however many
// deliveries the endpoint has, with the plan PostgreSQL caches for a
// prepared statement (generic, forced here) on tables without statistics
// yet. Before, the row lookups hash-joined their keys against a
// sequential scan of txhook_deliveries, and the completion's duplicate
// check read every delivery of the endpoint for each outcome.
func TestBrokerLookupsProbeTheEventIndex(t *testing.T) {
	testdb.EachPostgres(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		st := openStore(t, db)
		conn, err := db.DB.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		exec := func(q string, args ...any) {
			t.Helper()
			if _, err := conn.ExecContext(ctx, q, args...); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		const n = 3000
		exec(st.Rebind(`INSERT INTO txhook_events (id, tenant, type, payload, created_at)
SELECT 'ev_' || g, 'm', 't', '{}', now() FROM generate_series(1, ?::int) g`), n+20)
		exec(st.Rebind(`INSERT INTO txhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at, created_at, updated_at)
SELECT 'ev_' || g, 'ep_a', 'succeeded', 1, now(), now(), now() FROM generate_series(1, ?::int) g`), n)
		exec(`SET plan_cache_mode = force_generic_plan`)

		// read returns the rows the plan of EXECUTE read from
		// txhook_deliveries and its indexes (rows times loops).
		read := func(name, q, args string) (int, string) {
			t.Helper()
			exec(`PREPARE ` + name + ` AS ` + q)
			var raw string
			if err := conn.QueryRowContext(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE `+name+`(`+args+`)`).Scan(&raw); err != nil {
				t.Fatal(err)
			}
			var plans []struct{ Plan map[string]any }
			if err := json.Unmarshal([]byte(raw), &plans); err != nil || len(plans) != 1 {
				t.Fatalf("EXPLAIN output %q: %v", raw, err)
			}
			total := rowsRead(plans[0].Plan, func(n map[string]any) bool {
				rel, _ := n["Relation Name"].(string)
				idx, _ := n["Index Name"].(string)
				return rel == "txhook_deliveries" || strings.HasPrefix(idx, "txhook_deliveries")
			})
			return total, raw
		}
		quote := func(v any) string {
			b, _ := json.Marshal(v)
			return "'" + strings.ReplaceAll(string(b), "'", "''") + "'"
		}
		keys := []string{"ev_1", "ev_2", "ev_3", fmt.Sprint("ev_", n+1), fmt.Sprint("ev_", n+2)}
		qs := st.BrokerRowsQueries()
		for i, c := range []struct {
			name, q, args string
		}{
			{"by_id", qs[0], quote([]string{"1", "2", "3", "999999"})},
			{"by_event", qs[1], quote(keys)},
		} {
			got, plan := read(c.name, c.q, c.args)
			if got > 20 {
				t.Errorf("lookup %d (%s) read %d rows of txhook_deliveries beside %d deliveries:\n%s", i, c.name, got, n, plan)
			}
		}

		// The completion's first outcomes of 10 deliveries, in a
		// transaction rolled back.
		var batch, atts []map[string]any
		for k := range 10 {
			batch = append(batch, map[string]any{"i": k, "id": 0, "base": 0, "event_id": fmt.Sprint("ev_", n+1+k), "endpoint_id": "ep_a",
				"state": "succeeded", "attempts": 1, "record": true, "status": 200, "created_at": "2026-12-07T00:00:00Z"})
			atts = append(atts, map[string]any{"i": k, "attempt": 1, "started_at": "2026-12-07T00:00:00Z", "duration_us": 100, "status": 200})
		}
		exec(`BEGIN`)
		defer exec(`ROLLBACK`)
		got, plan := read("complete", st.BrokerCompleteQueries()[0], quote(batch)+`, now(), 'broker:X', `+quote(atts))
		if got > 100 {
			t.Errorf("a completion of 10 outcomes read %d rows of txhook_deliveries beside %d deliveries:\n%s", got, n, plan)
		}
	})
}

// TestForwardFirstReadsOnlyNewEvents: a forwarder's round reads the
// events past its cursor through the index on forward_xid, not the events
// it forwarded before, even with a transaction running since before them
// (the first form of ForwardFirst, an OR of the cursor's two ranges,
// scanned the whole index under a generic plan; the second, one range from
// the cursor's xmin, read every event since the oldest running
// transaction).
func TestForwardFirstReadsOnlyNewEvents(t *testing.T) {
	testdb.EachPostgres(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		st := openStore(t, db)
		conn, err := db.DB.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		const n = 3000
		// A transaction that runs across it all (a long report, a stuck
		// session) holds the cursor's xmin back.
		long, err := db.DB.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer long.Rollback()
		if _, err := long.ExecContext(ctx, `SELECT pg_current_xact_id()`); err != nil {
			t.Fatal(err)
		}
		// Forwarded already: written by one transaction the cursor is past.
		if _, err := conn.ExecContext(ctx, st.Rebind(`INSERT INTO txhook_events (id, tenant, type, payload, created_at, forward_xid)
SELECT 'ev_' || g, 'm', 't', '{}', now(), pg_current_xact_id() FROM generate_series(1, ?::int) g`), n); err != nil {
			t.Fatal(err)
		}
		cursor, err := st.CurrentSnapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.ExecContext(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.ExecContext(ctx, `PREPARE ff AS `+st.Rebind(st.ForwardQueries()[0])); err != nil {
			t.Fatal(err)
		}
		var raw string
		if err := conn.QueryRowContext(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE ff('`+cursor.String()+`', 500)`).Scan(&raw); err != nil {
			t.Fatal(err)
		}
		var plans []struct{ Plan map[string]any }
		if err := json.Unmarshal([]byte(raw), &plans); err != nil || len(plans) != 1 {
			t.Fatalf("EXPLAIN output %q: %v", raw, err)
		}
		total := rowsRead(plans[0].Plan, func(n map[string]any) bool { return n["Relation Name"] == "txhook_events" })
		if total > 10 {
			t.Errorf("a round past %d forwarded events read %d of them:\n%s", n, total, raw)
		}
	})
}

// rowsRead is how many rows the plan nodes that match read (returned,
// or removed by a filter or a recheck), over all their loops, in an
// EXPLAIN (ANALYZE, FORMAT JSON) plan.
func rowsRead(plan map[string]any, match func(map[string]any) bool) int {
	total := 0
	if match(plan) {
		f := func(k string) int { v, _ := plan[k].(float64); return int(v) }
		total += (f("Actual Rows") + f("Rows Removed by Filter") + f("Rows Removed by Index Recheck")) * max(f("Actual Loops"), 1)
	}
	kids, _ := plan["Plans"].([]any)
	for _, k := range kids {
		if m, ok := k.(map[string]any); ok {
			total += rowsRead(m, match)
		}
	}
	return total
}
