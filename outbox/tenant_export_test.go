package outbox_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// seedExport writes n events of tenant "m", each with one succeeded
// delivery, straight into the tables (SQLite), created from base on.
func seedExport(tb testing.TB, db *testdb.DB, n int, base time.Time) {
	tb.Helper()
	us := base.UnixMicro()
	if _, err := db.Exec(`INSERT INTO txhook_events (id, tenant, type, payload, created_at, dispatched_at)
WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ?)
SELECT printf('evt_%08d', i), 'm', 'payment.succeeded', '{"amount":1200,"currency":"EUR"}', ? + i, ? + i FROM s`, n, us, us); err != nil {
		tb.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO txhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at, last_status, created_at, updated_at)
SELECT id, 'ep_x', 'succeeded', 1, created_at, 200, created_at, created_at + 1000 FROM txhook_events WHERE tenant = 'm'`); err != nil {
		tb.Fatal(err)
	}
}

// Export reads row by row: exporting 100,000 rows keeps the live heap
// flat (sampled after a collection every 10,000 rows).
func TestTenantExportStreamsWithFlatMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("100,000 rows")
	}
	for _, be := range testdb.SQLiteBackends {
		t.Run(be.Name, func(t *testing.T) {
			db := testdb.Open(t, be)
			b := setup(t, db, outbox.Config{})
			base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
			const n = 100_000
			seedExport(t, db, n, base)
			var ms runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&ms)
			start := ms.HeapAlloc
			var peak uint64
			rows := 0
			err := b.ob.Tenant("m").Export(b.ctx, outbox.ExportFilter{Since: base}, func(r outbox.ExportRow) error {
				rows++
				if rows%10_000 == 0 {
					runtime.GC()
					runtime.ReadMemStats(&ms)
					peak = max(peak, ms.HeapAlloc)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if rows != n {
				t.Fatalf("%d rows", rows)
			}
			// 100,000 rows held in memory would take well over 10 MB.
			if growth := int64(peak) - int64(start); growth > 4<<20 {
				t.Fatalf("live heap grew %d bytes during the export", growth)
			}
			t.Logf("live heap growth during export: %d bytes (start %d)", int64(peak)-int64(start), start)
		})
	}
}

// BenchmarkTenantExport measures export throughput and allocations per row
// (SQLite, 100,000 rows).
func BenchmarkTenantExport(bm *testing.B) {
	db := testdb.Open(bm, testdb.SQLiteBackends[0])
	b := setupB(bm, db)
	base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	const n = 100_000
	seedExport(bm, db, n, base)
	bm.ResetTimer()
	bm.ReportAllocs()
	for range bm.N {
		rows := 0
		if err := b.Tenant("m").Export(bm.Context(), outbox.ExportFilter{Since: base}, func(outbox.ExportRow) error { rows++; return nil }); err != nil || rows != n {
			bm.Fatal(rows, err)
		}
	}
	bm.ReportMetric(float64(bm.Elapsed().Nanoseconds())/float64(bm.N*n), "ns/row")
}

func setupB(bm *testing.B, db *testdb.DB) *outbox.Outbox {
	ob, err := outbox.New(bm.Context(), db.DB, outbox.Config{Logger: quietLogger()})
	if err != nil {
		bm.Fatal(err)
	}
	if err := ob.Migrate(bm.Context()); err != nil {
		bm.Fatal(err)
	}
	bm.Cleanup(func() { ob.Close() })
	return ob
}
