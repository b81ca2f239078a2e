package store_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/procstat"
	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/internal/testdb"
)

// BenchmarkPGDeliveryCost drives the relay's database path for first
// attempts that succeed (Dispatch a batch, Complete it in the completer's
// batch size) with no HTTP in between, on one connection, and reports the
// PostgreSQL backend's CPU per delivery (read from /proc, so only for a
// server on this machine) beside the wall time of each statement. It
// isolates what the database costs a delivery from the relay process and
// the receiver, which the drain in examples/bench measures together.
//
//	TXHOOK_TEST_POSTGRES_DSN=... go test -run '^$' -bench PGDeliveryCost -benchtime 20000x ./internal/store
//
// COST_BATCH sets the outcomes per completion statement (default 70),
// COST_SYNC=1 sets SyncRelayCommits, and COST_EXPLAIN=1 logs every
// statement's plan with auto_explain (in the server's log).
func BenchmarkPGDeliveryCost(b *testing.B) {
	db := testdb.Postgres(b, testdb.PGX.Driver)
	db.DB.SetMaxOpenConns(1)
	ctx := context.Background()
	st := openStore(b, db)
	now := time.Now().UTC()
	ep := store.EndpointRow{ID: "ep_cost", Tenant: "cost", URL: "https://example.com/hook", EventTypes: []byte(`[]`),
		Secrets: []byte(`[{"secret":"whsec_x","expires_at":null}]`), Versions: []byte(`{}`), Enabled: true, CreatedAt: now, UpdatedAt: now}
	if err := st.InsertEndpoint(ctx, st.DB, ep); err != nil {
		b.Fatal(err)
	}
	n := b.N
	payload := `{"payment_id":"pay_0123456789","amount":1200,"currency":"usd","customer":"cus_42","status":"succeeded"}`
	if _, err := st.DB.ExecContext(ctx, `INSERT INTO txhook_events (id, tenant, type, payload, created_at)
SELECT 'evt_' || lpad(i::text, 10, '0'), 'cost', 'payment.succeeded', $2::jsonb, $3::timestamptz + i * interval '1 microsecond'
FROM generate_series(1, $1::int) i`, n, payload, now.Add(-time.Hour)); err != nil {
		b.Fatal(err)
	}
	if _, err := st.DB.ExecContext(ctx, `ANALYZE`); err != nil {
		b.Fatal(err)
	}
	if err := st.Prepare(ctx, append(st.ClaimQueries(100), st.CompleteQueries()...)...); err != nil {
		b.Fatal(err)
	}
	var pid int
	if err := st.DB.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		b.Fatal(err)
	}
	st.SyncRelayCommits = os.Getenv("COST_SYNC") != ""
	if os.Getenv("COST_EXPLAIN") != "" {
		for _, q := range []string{"LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0", "SET auto_explain.log_analyze = on", "SET auto_explain.log_buffers = on"} {
			if _, err := st.DB.ExecContext(ctx, q); err != nil {
				b.Fatal(err)
			}
		}
	}
	completeBatch := 70 // what the completer gathers at 16 in flight (docs/BENCHMARKS.md)
	if v, err := strconv.Atoi(os.Getenv("COST_BATCH")); err == nil {
		completeBatch = v
	}
	var dispatchWall, completeWall time.Duration
	var dispatchCPU, completeCPU int64
	delivered := 0
	cpu0 := procstat.Ticks(pid)
	b.ResetTimer()
	for delivered < n {
		t0, c0 := time.Now(), procstat.Ticks(pid)
		cs, err := st.Dispatch(ctx, "relay-cost", now, 30*time.Second, 100)
		if err != nil {
			b.Fatal(err)
		}
		dispatchWall += time.Since(t0)
		dispatchCPU += procstat.Ticks(pid) - c0
		if len(cs) == 0 {
			b.Fatalf("nothing to dispatch after %d of %d", delivered, n)
		}
		for i := 0; i < len(cs); i += completeBatch {
			part := cs[i:min(len(cs), i+completeBatch)]
			comps := make([]store.Completion, len(part))
			for k, c := range part {
				x := c.Completion(now, true)
				x.State, x.Attempts, x.Record, x.Status = store.StateSucceeded, c.Attempt, true, 200
				x.Records = []store.AttemptRecord{{Attempt: c.Attempt, StartedAt: now, Duration: 3 * time.Millisecond, Status: 200, Excerpt: ""}}
				comps[k] = x
			}
			t1, c1 := time.Now(), procstat.Ticks(pid)
			res, err := st.Complete(ctx, "relay-cost", now, comps)
			if err != nil {
				b.Fatal(err)
			}
			completeWall += time.Since(t1)
			completeCPU += procstat.Ticks(pid) - c1
			if len(res.Written) != len(comps) {
				b.Fatalf("wrote %d of %d", len(res.Written), len(comps))
			}
		}
		delivered += len(cs)
	}
	b.StopTimer()
	if cpu := procstat.Ticks(pid); cpu >= 0 && cpu0 >= 0 {
		b.ReportMetric(float64(cpu-cpu0)*1e6/100/float64(delivered), "pg-µs/delivery")
	}
	b.ReportMetric(float64(dispatchWall.Microseconds())/float64(delivered), "dispatch-wall-µs/delivery")
	b.ReportMetric(float64(completeWall.Microseconds())/float64(delivered), "complete-wall-µs/delivery")
	b.ReportMetric(float64(dispatchCPU)*1e6/100/float64(delivered), "dispatch-pg-µs/delivery")
	b.ReportMetric(float64(completeCPU)*1e6/100/float64(delivered), "complete-pg-µs/delivery")
	var left int
	if err := st.DB.QueryRowContext(ctx, `SELECT count(*) FROM txhook_events WHERE dispatched_at IS NULL`).Scan(&left); err != nil {
		b.Fatal(err)
	}
	if left != 0 {
		b.Fatalf("%d events left undispatched", left)
	}
}
