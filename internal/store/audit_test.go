package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/internal/testdb"
)

// The audit row a ctx carries commits with the first transaction that
// commits in it, and not at all with one that rolls back.
func TestWithAuditCommitsWithTheChange(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		s := store.New(db.DB, dialect(db))
		ctx := context.Background()
		if _, err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		count := func() int {
			var n int
			if err := db.QueryRowContext(ctx, `SELECT count(*) FROM txhook_audit`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		actx, written := store.WithAudit(ctx, store.AuditRow{At: time.Now(), Tenant: "m", Action: "x"})
		boom := errors.New("boom")
		if err := s.Tx(actx, func(store.Querier) error { return boom }); err != boom {
			t.Fatal(err)
		}
		if count() != 0 || written() {
			t.Fatalf("rolled back: %d rows, written %v", count(), written())
		}
		for range 2 {
			if err := s.Tx(actx, func(store.Querier) error { return nil }); err != nil {
				t.Fatal(err)
			}
		}
		if count() != 1 || !written() {
			t.Fatalf("committed twice: %d rows, written %v", count(), written())
		}
	})
}
