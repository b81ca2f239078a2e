package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/internal/testdb"
)

// TestFirstSuccessWritesNoAttemptRow: a first attempt that succeeds is
// recorded in its delivery's row (migration 008), not as a row of
// txhook_attempts, and every reader of the attempt log still sees it, in
// order with the attempts that are rows; any other attempt is a row.
func TestFirstSuccessWritesNoAttemptRow(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		st := openStore(t, db)
		now := time.Now().UTC().Truncate(time.Millisecond)
		first := running(t, st, "relay-1", "inline", now)  // succeeds at its first attempt
		second := running(t, st, "relay-1", "inline", now) // fails, then succeeds
		late := running(t, st, "relay-1", "inline", now)   // succeeds at its first attempt, an hour after it was created
		ok := store.AttemptRecord{Attempt: 1, StartedAt: now.Add(500 * time.Millisecond), Duration: 7 * time.Millisecond, Status: 204, Excerpt: "thanks"}
		delayed := store.AttemptRecord{Attempt: 1, StartedAt: now.Add(time.Hour), Duration: 7 * time.Millisecond, Status: 200}
		fail := store.AttemptRecord{Attempt: 1, StartedAt: now.Add(2 * time.Second), Duration: 3 * time.Millisecond, Status: 500, Error: "HTTP 500"}
		res, err := st.Complete(ctx, "relay-1", now, []store.Completion{
			{ID: first, Attempt: 1, CreatedAt: now, State: store.StateSucceeded, Attempts: 1, Record: true, Status: 204, Records: []store.AttemptRecord{ok}},
			{ID: second, Attempt: 1, CreatedAt: now, State: store.StatePending, Attempts: 1, NextAt: now, Record: true, Status: 500, Error: "HTTP 500", Records: []store.AttemptRecord{fail}},
			{ID: late, Attempt: 1, CreatedAt: now, State: store.StateSucceeded, Attempts: 1, Record: true, Status: 200, Records: []store.AttemptRecord{delayed}},
		})
		if err != nil || len(res.Applied) != 3 {
			t.Fatalf("complete: %+v, %v", res, err)
		}
		if n := count(t, st, `SELECT count(*) FROM txhook_attempts WHERE delivery_id = ?`, first); n != 0 {
			t.Fatalf("a first attempt that succeeded wrote %d attempt rows, want 0 (it lives in the delivery's row)", n)
		}
		if n := count(t, st, `SELECT count(*) FROM txhook_attempts WHERE delivery_id = ?`, second); n != 1 {
			t.Fatalf("a failed attempt wrote %d attempt rows, want 1", n)
		}
		// Started more than InlineSlack after its delivery was created: a
		// row, so that the attempt log by start time, which finds inline
		// attempts by their deliveries' created_at, still finds it.
		if n := count(t, st, `SELECT count(*) FROM txhook_attempts WHERE delivery_id = ?`, late); n != 1 {
			t.Fatalf("a first success an hour after its delivery was created wrote %d attempt rows, want 1", n)
		}
		if _, err := st.DB.ExecContext(ctx, st.Rebind(`DELETE FROM txhook_attempts WHERE delivery_id = ?`), late); err != nil {
			t.Fatal(err)
		}
		if _, err := st.DB.ExecContext(ctx, st.Rebind(`DELETE FROM txhook_deliveries WHERE id = ?`), late); err != nil {
			t.Fatal(err)
		}
		// The second delivery's retry succeeds: a row too (not a first attempt).
		if _, err := st.DB.ExecContext(ctx, st.Rebind(`UPDATE txhook_deliveries SET state = 'running', attempts = 2, lease_owner = 'relay-1' WHERE id = ?`), second); err != nil {
			t.Fatal(err)
		}
		retry := store.AttemptRecord{Attempt: 2, StartedAt: now.Add(3 * time.Second), Duration: 5 * time.Millisecond, Status: 200}
		if res, err := st.Complete(ctx, "relay-1", now, []store.Completion{
			{ID: second, Attempt: 2, State: store.StateSucceeded, Attempts: 2, Record: true, Status: 200, Records: []store.AttemptRecord{retry}},
		}); err != nil || len(res.Applied) != 1 {
			t.Fatalf("complete retry: %+v, %v", res, err)
		}
		if n := count(t, st, `SELECT count(*) FROM txhook_attempts WHERE delivery_id = ?`, second); n != 2 {
			t.Fatalf("second delivery: %d attempt rows, want 2", n)
		}

		got, err := st.Attempts(ctx, first)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Attempt != 1 || got[0].Status != 204 || got[0].Excerpt != "thanks" || got[0].Error != "" ||
			got[0].Duration != 7*time.Millisecond || !got[0].StartedAt.Equal(ok.StartedAt) || got[0].EndpointID != "ep_inline" {
			t.Fatalf("Attempts of the first delivery: %+v", got)
		}
		all, err := st.AttemptsOfDeliveries(ctx, []int64{first, second})
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != 3 || all[0].DeliveryID != first || all[1].Attempt != 1 || all[2].Attempt != 2 || all[1].Error != "HTTP 500" {
			t.Fatalf("AttemptsOfDeliveries: %+v", all)
		}

		h, err := st.EndpointHealth(ctx, "ep_inline", now, now.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if h.Attempts != 3 || h.Failed != 1 || h.LatencyN != 3 || h.Streak != 0 {
			t.Fatalf("health: %+v, want 3 attempts, 1 failed, 3 latencies, no failure streak", h)
		}
		if h.LastSuccess == nil || !h.LastSuccess.StartedAt.Equal(retry.StartedAt) {
			t.Fatalf("health: last success %+v, want the retry's", h.LastSuccess)
		}
		// Only the inline attempt in the window: found through the delivery.
		h, err = st.EndpointHealth(ctx, "ep_inline", ok.StartedAt, ok.StartedAt.Add(time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if h.Attempts != 1 || h.Failed != 0 || h.LatencyN != 1 || h.P50 != 7000 {
			t.Fatalf("health of the inline attempt's window: %+v", h)
		}

		// Pruning counts the inline attempt as an attempt pruned.
		d, a, _, err := st.PruneFinished(ctx, now.Add(time.Hour), 10, &store.PruneCursor{})
		if err != nil || d != 2 || a != 3 {
			t.Fatalf("prune: %d deliveries, %d attempts, %v; want 2, 3", d, a, err)
		}
		if n := count(t, st, `SELECT count(*) FROM txhook_attempt_log`); n != 0 {
			t.Fatalf("%d attempts left after pruning", n)
		}
	})
}

func count(t *testing.T, st *store.Store, q string, args ...any) int {
	t.Helper()
	var n int
	if err := st.DB.QueryRowContext(context.Background(), st.Rebind(q), args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
