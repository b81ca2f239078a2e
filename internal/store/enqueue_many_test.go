package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/internal/testdb"
)

func TestInsertEventsChunksAndNotifiesOnce(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		st := openStore(t, db)
		ctx := context.Background()
		now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
		big := strings.Repeat("x", store.MaxBatchBytes/3)
		var evs []store.NewEvent
		for i := range store.MaxBatchRows + 5 {
			p := `{}`
			if i < 4 {
				p = `"` + big + `"` // four of these need two statements
			}
			evs = append(evs, store.NewEvent{ID: fmt.Sprint("evt_", i), Tenant: "m", Type: "t", Payload: p, Version: 1, CreatedAt: now})
		}
		evs[1].DeliverAt = now.Add(time.Hour)
		chunks := store.BatchChunks(evs)
		if len(chunks) != 3 || len(chunks[0]) != 2 || len(chunks[1]) != store.MaxBatchRows || len(chunks[2]) != 3 {
			t.Fatalf("chunk sizes wrong: %d chunks", len(chunks))
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		inserted, notified, err := st.InsertEvents(ctx, st.SQLConn(tx), evs, true)
		if err != nil {
			t.Fatal(err)
		}
		if len(inserted) != len(evs) || notified != db.Backend.Postgres() {
			t.Fatalf("inserted %d of %d, notified %v", len(inserted), len(evs), notified)
		}
		// Everything again: nothing inserted, no wake-up queued.
		inserted, notified, err = st.InsertEvents(ctx, st.SQLConn(tx), evs, true)
		if err != nil || len(inserted) != 0 || notified {
			t.Fatalf("repeat: inserted %d, notified %v, %v", len(inserted), notified, err)
		}
		var at store.Time
		if err := tx.QueryRowContext(ctx, st.Rebind("SELECT deliver_at FROM txhook_events WHERE id = ?"), "evt_1").Scan(&at); err != nil {
			t.Fatal(err)
		}
		if !at.Time.Equal(now.Add(time.Hour)) {
			t.Fatalf("deliver_at %v", at.Time)
		}
		if err := st.DeleteEvents(ctx, st.SQLConn(tx), []string{"evt_0", "evt_1"}); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM txhook_events").Scan(&n); err != nil || n != len(evs)-2 {
			t.Fatalf("%d events after deleting 2 of %d (%v)", n, len(evs), err)
		}
	})
}
