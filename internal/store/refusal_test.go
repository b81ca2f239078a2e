package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/internal/testdb"
)

// A refusal (Completion.Refused) hands the delivery back, starts its
// refusal by the database's clock and keeps it across refusals, writes a
// lapsed lease's record like any completion, and dead-letters the
// delivery (reason refused) once the refusal is older than the limit and
// the endpoint had no attempt meanwhile; an attempt ends the refusal.
func TestCompleteRefused(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		st := openStore(t, db)
		now := time.Now().UTC()
		id := running(t, st, "r1", "m", now)
		rerun := func(attempts int) {
			t.Helper()
			if _, err := st.DB.ExecContext(ctx, st.Rebind(`UPDATE txhook_deliveries SET state = 'running', lease_owner = 'r1', attempts = ? WHERE id = ?`), attempts, id); err != nil {
				t.Fatal(err)
			}
		}
		refuse := func(attempt int, limit time.Duration, recs ...store.AttemptRecord) store.Completed {
			t.Helper()
			res, err := st.Complete(ctx, "r1", now, []store.Completion{{ID: id, Attempt: attempt, State: store.StatePending,
				Attempts: attempt - 1, NextAt: now.Add(time.Minute), Record: true, Error: "refused by the rules",
				Refused: true, RefusedLimit: limit, Records: recs}})
			if err != nil || len(res.Written) != 1 {
				t.Fatalf("Complete: %+v, %v", res, err)
			}
			return res
		}
		since := func() store.Time {
			t.Helper()
			var s store.Time
			if err := st.DB.QueryRowContext(ctx, st.Rebind(`SELECT refused_since FROM txhook_deliveries WHERE id = ?`), id).Scan(&s); err != nil {
				t.Fatal(err)
			}
			return s
		}

		// The first refusal, by a relay that took over a lapsed lease.
		rerun(2)
		res := refuse(2, time.Hour, store.AttemptRecord{Attempt: 1, StartedAt: now, Error: "lease expired"})
		first := since()
		if first.IsZero() || res.RefusedDead[0] || count(t, st, `SELECT count(*) FROM txhook_attempts WHERE delivery_id = ?`, id) != 1 ||
			count(t, st, `SELECT count(*) FROM txhook_deliveries WHERE id = ? AND state = 'pending' AND attempts = 1`, id) != 1 {
			t.Fatalf("after the first refusal: refused since %v, %+v", first, res)
		}
		// Again, within the limit: the start stays.
		rerun(2)
		if res := refuse(2, time.Hour); res.RefusedDead[0] || !since().Equal(first.Time) {
			t.Fatalf("second refusal: %+v, refused since %v (was %v)", res, since(), first)
		}
		// Older than the limit, and no attempt to the endpoint: dead.
		back := `UPDATE txhook_deliveries SET refused_since = refused_since - 7200000000 WHERE id = ?`
		if db.Backend.Postgres() {
			back = `UPDATE txhook_deliveries SET refused_since = refused_since - interval '2 hours' WHERE id = ?`
		}
		if _, err := st.DB.ExecContext(ctx, st.Rebind(back), id); err != nil {
			t.Fatal(err)
		}
		rerun(2)
		if res := refuse(2, 0); res.RefusedDead[0] {
			t.Fatal("a refusal without a limit dead-lettered")
		}
		rerun(2)
		if res := refuse(2, time.Hour); !res.RefusedDead[0] {
			t.Fatalf("refused for 2h, limit 1h: %+v", res)
		}
		if n := count(t, st, `SELECT count(*) FROM txhook_dead_letters WHERE delivery_id = ? AND reason = 'refused' AND attempts = 1`, id); n != 1 {
			t.Fatalf("%d refused dead letters", n)
		}
		if since().IsZero() {
			t.Fatal("the dead delivery lost its refused_since")
		}

		// An attempt ends a refusal.
		id = running(t, st, "r1", "m", now)
		rerun(1)
		refuse(1, time.Hour)
		rerun(1)
		if _, err := st.Complete(ctx, "r1", now, []store.Completion{{ID: id, Attempt: 1, State: store.StatePending, Attempts: 1,
			NextAt: now.Add(time.Minute), Record: true, Status: 500, Error: "HTTP 500",
			Records: []store.AttemptRecord{{Attempt: 1, StartedAt: now, Status: 500, Error: "HTTP 500"}}}}); err != nil {
			t.Fatal(err)
		}
		if s := since(); !s.IsZero() {
			t.Fatalf("refused since %v after an attempt", s)
		}
	})
}
