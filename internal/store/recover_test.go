package store_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/internal/testdb"
)

// Recover's reads (RecoverNext, RecoverCandidates) must not grow with what
// other tenants store: beside 20,000 unrouted events of 100 other tenants,
// in the same window, they read about as many events as the recovering
// tenant has. On PostgreSQL the plans are run (EXPLAIN ANALYZE) and the
// rows they read from txhook_events counted; SQLite's plans must find the
// unrouted events through an index by tenant. Before migration 010 both
// read every other tenant's unrouted events of the window.
func TestRecoverReadsOnlyItsTenant(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		st := openStore(t, db)
		base := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
		for _, id := range []string{"ep_a", "ep_b"} {
			ep := store.EndpointRow{ID: id, Tenant: "m", URL: "https://example.com/" + id, EventTypes: []byte(`[]`),
				Secrets: []byte(`[]`), Versions: []byte(`{}`), Enabled: true, CreatedAt: base, UpdatedAt: base}
			if err := st.InsertEndpoint(ctx, st.DB, ep); err != nil {
				t.Fatal(err)
			}
		}
		// i milliseconds after base, in the dialect's time.
		var at string
		if st.Dialect == store.Postgres {
			at = "?::timestamptz + i * interval '1 millisecond'"
		} else {
			at = "? + i * 1000"
		}
		fill := func(n int, idExpr, tenantExpr, unrouted string) {
			t.Helper()
			q := `WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ?)
INSERT INTO txhook_events (id, tenant, type, payload, created_at, dispatched_at, unrouted)
SELECT ` + idExpr + `, ` + tenantExpr + `, 'payment.succeeded', '{}', ` + at + `, ` + at + `, ` + unrouted + ` FROM s`
			if _, err := st.DB.ExecContext(ctx, st.Rebind(q), n, st.T(base), st.T(base)); err != nil {
				t.Fatal(err)
			}
		}
		const others, mine = 20000, 100
		fill(others, "'evt_o' || i", "'t' || (i % 100)", "true")
		fill(mine/2, "'evt_m' || i", "'m'", "true")
		fill(mine/2, "'evt_d' || i", "'m'", "NULL")
		if _, err := st.DB.ExecContext(ctx, st.Rebind(`INSERT INTO txhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at, created_at, updated_at)
SELECT id, 'ep_b', 'succeeded', 1, created_at, created_at, created_at FROM txhook_events WHERE id LIKE 'evt_d%'`)); err != nil {
			t.Fatal(err)
		}
		analyze := "ANALYZE"
		if st.Dialect == store.Postgres {
			analyze = "ANALYZE txhook_events, txhook_deliveries, txhook_endpoints"
		}
		if _, err := st.DB.ExecContext(ctx, analyze); err != nil {
			t.Fatal(err)
		}

		from, to := base.Add(-time.Hour), base.Add(time.Hour)
		got, more, err := st.RecoverCandidates(ctx, "ep_a", base, from, to, 1000)
		if err != nil || more || len(got) != mine {
			t.Fatalf("RecoverCandidates: %d events (more %v, %v), want %d", len(got), more, err, mine)
		}
		first, ok, err := st.RecoverNext(ctx, "ep_a", from)
		if err != nil || !ok || !first.Equal(base.Add(time.Millisecond)) {
			t.Fatalf("RecoverNext = %v, %v, %v; want %v", first, ok, err, base.Add(time.Millisecond))
		}

		next, cand := st.RecoverStatements("ep_a", base, from, to, 1001)
		for _, x := range []struct {
			name string
			st   store.Statement
		}{{"RecoverNext", next}, {"RecoverCandidates", cand}} {
			if st.Dialect == store.Postgres {
				read, plan := pgRowsRead(t, st, x.st, "txhook_events")
				// The tenant's own events, each read a few times at most.
				if read > 10*mine {
					t.Errorf("%s read %d rows of txhook_events beside %d of other tenants (the tenant has %d):\n%s", x.name, read, others, mine, plan)
				}
				continue
			}
			plan := sqlitePlan(t, st, x.st)
			if !strings.Contains(plan, "txhook_events_unrouted_tenant (tenant=?") {
				t.Errorf("%s does not find unrouted events by tenant:\n%s", x.name, plan)
			}
		}
	})
}

// pgRowsRead runs EXPLAIN ANALYZE of q and returns how many rows its plan
// read from table (rows returned and removed by filters, times loops),
// and the plan.
func pgRowsRead(t *testing.T, st *store.Store, q store.Statement, table string) (int, string) {
	t.Helper()
	var raw string
	if err := st.DB.QueryRowContext(context.Background(), "EXPLAIN (ANALYZE, FORMAT JSON) "+q.SQL, q.Args...).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	var plans []struct{ Plan map[string]any }
	if err := json.Unmarshal([]byte(raw), &plans); err != nil || len(plans) != 1 {
		t.Fatalf("EXPLAIN output %q: %v", raw, err)
	}
	num := func(n map[string]any, k string) int {
		f, _ := n[k].(float64)
		return int(f)
	}
	total := 0
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if n["Relation Name"] == table {
			total += (num(n, "Actual Rows") + num(n, "Rows Removed by Filter") + num(n, "Rows Removed by Index Recheck")) * max(num(n, "Actual Loops"), 1)
		}
		kids, _ := n["Plans"].([]any)
		for _, k := range kids {
			if m, ok := k.(map[string]any); ok {
				walk(m)
			}
		}
	}
	walk(plans[0].Plan)
	return total, raw
}

// sqlitePlan returns EXPLAIN QUERY PLAN of q, one step a line.
func sqlitePlan(t *testing.T, st *store.Store, q store.Statement) string {
	t.Helper()
	rows, err := st.DB.QueryContext(context.Background(), "EXPLAIN QUERY PLAN "+q.SQL, q.Args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		b.WriteString(detail + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
