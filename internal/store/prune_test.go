package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/internal/testdb"
)

// PruneFinished walks the deliveries by ID, not through an index of finish
// times: one walk from the zero cursor prunes every delivery finished
// before the cut, whatever is kept between them (dead letters, unfinished
// work, deliveries created before the cut that finished after it), reads
// no further than the first window of deliveries created after the cut,
// and a second walk finds nothing more.
func TestPruneFinishedWalksByID(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		st := openStore(t, db)
		cut := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
		old, late := cut.Add(-48*time.Hour), cut.Add(time.Hour)
		insert := func(n int, state string, created, updated time.Time, dead bool) []int64 {
			t.Helper()
			var ids []int64
			for range n {
				ev := fmt.Sprintf("evt_%d", seq.Add(1))
				if _, err := st.DB.ExecContext(ctx, st.Rebind(`INSERT INTO txhook_events (id, tenant, type, payload, created_at, dispatched_at) VALUES (?, 'm', 't', '{}', ?, ?)`),
					ev, st.T(created), st.T(created)); err != nil {
					t.Fatal(err)
				}
				var id int64
				if err := st.DB.QueryRowContext(ctx, st.Rebind(`INSERT INTO txhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at, created_at, updated_at, ok_started_at)
VALUES (?, 'ep_m', ?, 1, ?, ?, ?, ?) RETURNING id`), ev, state, st.T(created), st.T(created), st.T(updated), st.T(created)).Scan(&id); err != nil {
					t.Fatal(err)
				}
				if dead {
					if _, err := st.DB.ExecContext(ctx, st.Rebind(`INSERT INTO txhook_dead_letters (delivery_id, event_id, endpoint_id, tenant, event_type, attempts, failed_at)
VALUES (?, ?, 'ep_m', 'm', 't', 1, ?)`), id, ev, st.T(updated)); err != nil {
						t.Fatal(err)
					}
				}
				ids = append(ids, id)
			}
			return ids
		}
		// Interleaved, in creation (ID) order, as a busy outbox has them.
		var prunable, kept int
		for range 4 {
			prunable += len(insert(5, store.StateSucceeded, old, old, false))
			kept += len(insert(2, store.StateDead, old, old, true))
			kept += len(insert(2, store.StatePaused, old, old, false))
			kept += len(insert(1, store.StateSucceeded, old, late, false)) // retried until after the cut
			prunable += len(insert(1, store.StateDead, old, old, false))   // its dead letter purged
		}
		newer := insert(40, store.StateSucceeded, late, late, false)
		kept += len(newer)

		var cur store.PruneCursor
		deliveries, attempts, events, calls := 0, 0, 0, 0
		for !cur.Done {
			d, a, e, err := st.PruneFinished(ctx, cut, 3, &cur)
			if err != nil {
				t.Fatal(err)
			}
			deliveries, attempts, events, calls = deliveries+d, attempts+a, events+e, calls+1
			if calls > 100 {
				t.Fatal("the walk does not end")
			}
		}
		if deliveries != prunable || attempts != prunable || events != prunable {
			t.Fatalf("pruned %d deliveries, %d attempts, %d events; want %d of each (the inline first attempts, the events with them)",
				deliveries, attempts, events, prunable)
		}
		if n := count(t, st, `SELECT count(*) FROM txhook_events`); n != kept {
			t.Fatalf("%d events left, want %d (one per delivery kept)", n, kept)
		}
		if n := count(t, st, `SELECT count(*) FROM txhook_deliveries`); n != kept {
			t.Fatalf("%d deliveries left, want %d", n, kept)
		}
		// It stopped at the first window (3×4 deliveries) of newer ones.
		if cur.After >= newer[len(newer)-1] || cur.After < newer[0] {
			t.Fatalf("the walk ended at delivery %d; the newer deliveries are %d..%d", cur.After, newer[0], newer[len(newer)-1])
		}
		again := store.PruneCursor{}
		for !again.Done {
			if d, _, _, err := st.PruneFinished(ctx, cut, 3, &again); err != nil || d != 0 {
				t.Fatalf("second walk pruned %d (%v)", d, err)
			}
		}
		// A day later the deliveries that finished after the cut go too.
		var next store.PruneCursor
		total := 0
		for !next.Done {
			d, _, _, err := st.PruneFinished(ctx, cut.Add(48*time.Hour), 1000, &next)
			if err != nil {
				t.Fatal(err)
			}
			total += d
		}
		if want := 4 + len(newer); total != want {
			t.Fatalf("later walk pruned %d, want %d", total, want)
		}
	})
}

// An event with no delivery is found by retention only if it is marked
// unrouted (dispatched to no endpoint): PruneEvents deletes those past the
// cut, and leaves undispatched events and events with deliveries to
// PruneFinished.
func TestPruneEventsTakesUnroutedOnes(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		st := openStore(t, db)
		cut := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
		ins := func(id string, dispatched time.Time, unrouted bool) {
			t.Helper()
			var u any
			if unrouted {
				u = true
			}
			var at any
			if !dispatched.IsZero() {
				at = st.T(dispatched)
			}
			if _, err := st.DB.ExecContext(ctx, st.Rebind(`INSERT INTO txhook_events (id, tenant, type, payload, created_at, dispatched_at, unrouted)
VALUES (?, 'm', 't', '{}', ?, ?, ?)`), id, st.T(cut.Add(-72*time.Hour)), at, u); err != nil {
				t.Fatal(err)
			}
		}
		ins("evt_old_unrouted", cut.Add(-48*time.Hour), true)
		ins("evt_new_unrouted", cut.Add(time.Hour), true)
		ins("evt_undispatched", time.Time{}, false)
		var walk store.EventsWalk
		n, err := st.PruneEvents(ctx, cut, 10, &walk)
		if err != nil || n != 1 {
			t.Fatalf("PruneEvents = %d, %v; want 1", n, err)
		}
		if got := count(t, st, `SELECT count(*) FROM txhook_events WHERE id = 'evt_old_unrouted'`); got != 0 {
			t.Fatal("the old unrouted event is still there")
		}
		if got := count(t, st, `SELECT count(*) FROM txhook_events`); got != 2 {
			t.Fatalf("%d events left, want 2", got)
		}
	})
}
