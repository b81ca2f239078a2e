package store_test

import (
	"context"
	"database/sql"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/internal/testdb"
)

// refuseExcerpts makes the database itself refuse attempt rows whose
// excerpt contains "poison", as it would refuse text it cannot store: a
// real refusal, surviving the cleaning, without a mock. code is the
// SQLSTATE PostgreSQL raises; SQLite raises a constraint error.
func refuseExcerpts(t *testing.T, st *store.Store, code string) {
	t.Helper()
	ctx := context.Background()
	stmts := []string{`CREATE TRIGGER txhook_test_refuse BEFORE INSERT ON txhook_attempts
WHEN NEW.response_excerpt LIKE '%poison%'
BEGIN SELECT RAISE(ABORT, 'refused by the test trigger'); END`}
	if st.Dialect == store.Postgres {
		stmts = []string{
			`CREATE SEQUENCE txhook_test_refusals`,
			`CREATE FUNCTION txhook_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.response_excerpt LIKE '%poison%' THEN
        PERFORM nextval('txhook_test_refusals');
        RAISE EXCEPTION 'refused by the test trigger' USING ERRCODE = '` + code + `';
    END IF;
    RETURN NEW;
END $$`,
			`CREATE TRIGGER txhook_test_refuse BEFORE INSERT ON txhook_attempts
FOR EACH ROW EXECUTE FUNCTION txhook_test_refuse()`,
		}
	}
	for _, q := range stmts {
		if _, err := st.DB.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCompleteIsolatesRefusedRows: one completion the database refuses
// for its text, and one it refuses outright, do not keep the other
// tenants' outcomes from being written.
func TestCompleteIsolatesRefusedRows(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		st := openStore(t, db)
		now := time.Now().UTC().Truncate(time.Second)
		refuseExcerpts(t, st, "22P05")

		var ids []int64
		for _, tenant := range []string{"a", "b", "c", "d", "e", "f", "g"} {
			ids = append(ids, running(t, st, "relay-1", tenant, now))
		}
		next := now.Add(time.Minute)
		rec := func(status int, excerpt, msg string) []store.AttemptRecord {
			return []store.AttemptRecord{{Attempt: 1, StartedAt: now, Duration: time.Millisecond, Status: status, Excerpt: excerpt, Error: msg}}
		}
		ok := func(i int) store.Completion {
			return store.Completion{ID: ids[i], Attempt: 1, State: store.StateSucceeded, Attempts: 1, Record: true, Status: 200, Records: rec(200, "ok", "")}
		}
		cs := []store.Completion{
			ok(0),
			{ID: ids[1], Attempt: 1, State: store.StatePending, Attempts: 1, NextAt: next, Record: true, Status: 500, Error: "HTTP 500", Records: rec(500, "oops", "HTTP 500")},
			// Refused for its text: written as its fallback.
			{ID: ids[2], Attempt: 1, State: store.StatePending, Attempts: 1, NextAt: next, Record: true, Status: 502, Error: "HTTP 502 \x00", Records: rec(502, "poison\x00", "HTTP 502 \x00")},
			{ID: ids[3], Attempt: 1, State: store.StateDead, Attempts: 1, Record: true, Status: 410, Error: "HTTP 410", Records: rec(410, "", "HTTP 410")},
			// Refused whatever its text: a state the CHECK constraint refuses.
			{ID: ids[4], Attempt: 1, State: "exploded", Attempts: 1, Record: true, Status: 500, Error: "HTTP 500", Records: rec(500, "", "HTTP 500")},
			ok(5),
			// Dead and refused for its text: still dead-lettered.
			{ID: ids[6], Attempt: 1, State: store.StateDead, Attempts: 1, Record: true, Status: 500, Error: "HTTP 500", Records: rec(500, "more poison", "HTTP 500")},
		}
		res, err := st.Complete(ctx, "relay-1", now, cs)
		if err != nil {
			t.Fatalf("Complete: %v", err)
		}
		want := []int64{ids[0], ids[1], ids[2], ids[3], ids[5], ids[6]}
		got := slices.Sorted(slices.Values(res.Applied))
		if !slices.Equal(got, want) {
			t.Fatalf("applied %v, want %v", got, want)
		}
		if len(res.Substituted) != 2 || res.Substituted[2] == nil || res.Substituted[6] == nil {
			t.Fatalf("substituted %v, want rows 2 and 6", res.Substituted)
		}
		if len(res.Refused) != 1 || res.Refused[4] == nil || len(res.Unwritten) != 0 {
			t.Fatalf("refused %v, unwritten %v; want row 4 refused", res.Refused, res.Unwritten)
		}

		states := map[int]string{0: "succeeded", 1: "pending", 2: "pending", 3: "dead", 4: "running", 5: "succeeded", 6: "dead"}
		for i, state := range states {
			d, err := st.Delivery(ctx, ids[i])
			if err != nil {
				t.Fatal(err)
			}
			if d.State != state {
				t.Errorf("delivery %d: state %s, want %s", i, d.State, state)
			}
			checkClean(t, "last_error", d.LastError, store.MaxErrorBytes)
		}
		fallback := "outcome could not be stored: SQLSTATE 22P05"
		if !db.Backend.Postgres() {
			fallback = "outcome could not be stored: SQLite error 19/1811" // SQLITE_CONSTRAINT_TRIGGER
		}
		for _, i := range []int{2, 6} {
			d, _ := st.Delivery(ctx, ids[i])
			if d.LastError != fallback || d.LastStatus != cs[i].Status || d.Attempts != 1 {
				t.Errorf("delivery %d: %+v, want the fallback %q with status %d", i, d, fallback, cs[i].Status)
			}
			atts, err := st.Attempts(ctx, ids[i])
			if err != nil {
				t.Fatal(err)
			}
			if len(atts) != 1 || atts[0].Excerpt != "" || atts[0].Error != fallback || atts[0].Status != cs[i].Status {
				t.Errorf("delivery %d: attempts %+v", i, atts)
			}
		}
		if d, _ := st.Delivery(ctx, ids[2]); !d.NextAttemptAt.Equal(next) {
			t.Errorf("fallback's next attempt %v, want %v", d.NextAttemptAt, next)
		}
		dead, err := st.ListDead(ctx, store.DeadFilter{}, nil, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(dead) != 2 {
			t.Fatalf("dead letters %+v, want deliveries 3 and 6", dead)
		}
		for _, dl := range dead {
			if dl.DeliveryID == ids[6] && dl.LastError != fallback {
				t.Errorf("dead letter of the refused row: %+v", dl)
			}
		}
		if a, _ := st.Attempts(ctx, ids[1]); len(a) != 1 || a[0].Excerpt != "oops" {
			t.Errorf("healthy failure's attempts: %+v", a)
		}
	})
}

// TestCompleteStopsOnTransientFailure: a failure that is not about the
// rows (here a serialization failure) is returned at once, with every row
// unwritten, instead of splitting the batch into single rows.
func TestCompleteStopsOnTransientFailure(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		st := openStore(t, db)
		now := time.Now().UTC().Truncate(time.Second)
		var cs []store.Completion
		for range 8 {
			id := running(t, st, "relay-1", "a", now)
			cs = append(cs, store.Completion{ID: id, Attempt: 1, State: store.StatePending, Attempts: 1, NextAt: now, Record: true, Status: 503,
				Error: "HTTP 503", Records: []store.AttemptRecord{{Attempt: 1, StartedAt: now, Status: 503, Excerpt: "poison", Error: "HTTP 503"}}})
		}
		if db.Backend.Postgres() {
			refuseExcerpts(t, st, "40001")
		} else {
			// SQLite has no transient error a trigger can raise; a busy
			// database is one: another connection holds the write lock.
			conn, err := db.DB.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
				t.Fatal(err)
			}
			defer conn.ExecContext(ctx, "ROLLBACK")
		}
		writer := st
		if !db.Backend.Postgres() {
			// A pool that waits for the lock 100 ms, not testdb's 10 s.
			impatient, err := sql.Open(db.Backend.Driver, strings.Replace(db.DSN, "_busy_timeout=10000", "_busy_timeout=100", 1))
			if err != nil {
				t.Fatal(err)
			}
			defer impatient.Close()
			writer = store.New(impatient, store.SQLite)
		}
		res, err := writer.Complete(ctx, "relay-1", now, cs)
		if err == nil || store.Refusal(err) {
			t.Fatalf("Complete error %v, want a transient one", err)
		}
		if len(res.Applied) != 0 || len(res.Unwritten) != len(cs) || len(res.Substituted) != 0 || len(res.Refused) != 0 {
			t.Fatalf("result %+v, want every row unwritten", res)
		}
		if db.Backend.Postgres() {
			var calls int
			if err := db.QueryRowContext(ctx, "SELECT last_value FROM txhook_test_refusals").Scan(&calls); err != nil {
				t.Fatal(err)
			}
			if calls != 1 {
				t.Fatalf("the batch was tried %d times, want once (no splitting on a transient failure)", calls)
			}
			if !strings.Contains(store.ErrorClass(err), "40001") {
				t.Fatalf("class %q", store.ErrorClass(err))
			}
		} else if store.ErrorClass(err) != "SQLite error 5/5" { // SQLITE_BUSY
			t.Fatalf("SQLite error %v, class %s; want SQLITE_BUSY", err, store.ErrorClass(err))
		}
	})
}
