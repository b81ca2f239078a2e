package store_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/internal/testdb"
)

// On PostgreSQL a new event's first attempts are claimed with the event
// (Claimed.ID 0): the lease is on the event, and each completion writes
// its delivery row once. These tests drive Dispatch and Complete the way a
// relay does, and a second relay the way it would after the first one
// died, on real PostgreSQL.

type freshBundle struct {
	t   *testing.T
	ctx context.Context
	st  *store.Store
	now time.Time
}

func setupFresh(t *testing.T, db *testdb.DB, tenant string, endpoints int) *freshBundle {
	t.Helper()
	b := &freshBundle{t: t, ctx: context.Background(), st: openStore(t, db), now: time.Now().UTC()}
	for i := range endpoints {
		ep := store.EndpointRow{ID: fmt.Sprintf("ep_%s_%d", tenant, i), Tenant: tenant, URL: "https://example.com/hook", EventTypes: []byte(`[]`),
			Secrets: []byte(`[{"secret":"whsec_x","expires_at":null}]`), Versions: []byte(`{}`), Enabled: true, CreatedAt: b.now, UpdatedAt: b.now}
		if err := b.st.InsertEndpoint(b.ctx, b.st.DB, ep); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func (b *freshBundle) event(id, tenant string) {
	b.t.Helper()
	if _, err := b.st.DB.ExecContext(b.ctx, `INSERT INTO txhook_events (id, tenant, type, payload, created_at) VALUES ($1, $2, 'payment.succeeded', '{}', $3)`,
		id, tenant, b.now); err != nil {
		b.t.Fatal(err)
	}
}

func (b *freshBundle) dispatch(owner string, lease time.Duration) []store.Claimed {
	b.t.Helper()
	got, err := b.st.Dispatch(b.ctx, owner, b.now, lease, 100)
	if err != nil {
		b.t.Fatal(err)
	}
	sort.Slice(got, func(i, j int) bool { return got[i].EndpointID < got[j].EndpointID })
	return got
}

// succeeded is c's completion after a first attempt answered 200.
func (b *freshBundle) succeeded(c store.Claimed, last bool) store.Completion {
	x := c.Completion(b.now, last)
	x.State, x.Attempts, x.Record, x.Status = store.StateSucceeded, c.Attempt, true, 200
	x.Records = []store.AttemptRecord{{Attempt: c.Attempt, StartedAt: b.now, Duration: time.Millisecond, Status: 200, Excerpt: "ok"}}
	return x
}

func (b *freshBundle) complete(owner string, cs ...store.Completion) store.Completed {
	b.t.Helper()
	res, err := b.st.Complete(b.ctx, owner, b.now, cs)
	if err != nil {
		b.t.Fatal(err)
	}
	return res
}

func (b *freshBundle) int(q string, args ...any) int {
	b.t.Helper()
	var n int
	if err := b.st.DB.QueryRowContext(b.ctx, q, args...).Scan(&n); err != nil {
		b.t.Fatal(err)
	}
	return n
}

// eventState is the event's dispatched flag and lease owner ("" for none).
func (b *freshBundle) eventState(id string) (dispatched bool, owner string) {
	b.t.Helper()
	var o *string
	if err := b.st.DB.QueryRowContext(b.ctx, `SELECT dispatched_at IS NOT NULL, lease_owner FROM txhook_events WHERE id = $1`, id).Scan(&dispatched, &o); err != nil {
		b.t.Fatal(err)
	}
	if o != nil {
		owner = *o
	}
	return dispatched, owner
}

// expire ends the event's lease now, as the database's clock passing it
// would.
func (b *freshBundle) expire(id string) {
	b.t.Helper()
	if _, err := b.st.DB.ExecContext(b.ctx, `UPDATE txhook_events SET lease_until = now() - interval '1 second' WHERE id = $1`, id); err != nil {
		b.t.Fatal(err)
	}
}

// An event fanned out to three endpoints is leased, not written: each
// completion inserts its own delivery row, the event stays leased until
// the last one, whose write marks it dispatched and ends the lease.
func TestFreshFanOutWritesEachDeliveryOnce(t *testing.T) {
	testdb.EachPostgres(t, func(t *testing.T, db *testdb.DB) {
		b := setupFresh(t, db, "m", 3)
		b.event("evt_fan", "m")
		cs := b.dispatch("relay-a", time.Minute)
		if len(cs) != 3 {
			t.Fatalf("claimed %d, want 3", len(cs))
		}
		for _, c := range cs {
			if c.ID != 0 || c.Attempt != 1 || c.LeaseLapsed || c.Lease.IsZero() || !c.Lease.Equal(cs[0].Lease) {
				t.Fatalf("claimed %+v: want a first attempt on the event's lease", c)
			}
		}
		if n := b.int(`SELECT count(*) FROM txhook_deliveries`); n != 0 {
			t.Fatalf("%d delivery rows written by the claim, want none", n)
		}
		if again := b.dispatch("relay-b", time.Minute); len(again) != 0 {
			t.Fatalf("another relay claimed %d of a leased event", len(again))
		}

		res := b.complete("relay-a", b.succeeded(cs[0], false))
		if len(res.Written) != 1 || res.Written[0] == 0 {
			t.Fatalf("first completion wrote %v", res.Written)
		}
		if d, owner := b.eventState("evt_fan"); d || owner != "relay-a" {
			t.Fatalf("after one of three: dispatched %v, lease %q; want leased to relay-a", d, owner)
		}
		// The last two in one batch: the second is the event's last.
		res = b.complete("relay-a", b.succeeded(cs[1], false), b.succeeded(cs[2], true))
		if len(res.Written) != 2 {
			t.Fatalf("last two completions wrote %v", res.Written)
		}
		if d, owner := b.eventState("evt_fan"); !d || owner != "" {
			t.Fatalf("after the last: dispatched %v, lease %q; want dispatched, no lease", d, owner)
		}
		if n := b.int(`SELECT count(*) FROM txhook_deliveries WHERE event_id = 'evt_fan' AND state = 'succeeded' AND attempts = 1 AND ok_started_at IS NOT NULL`); n != 3 {
			t.Fatalf("%d succeeded rows with their first attempt inline, want 3", n)
		}
		if n := b.int(`SELECT count(*) FROM txhook_attempts`); n != 0 {
			t.Fatalf("%d attempt rows for first attempts that succeeded, want 0", n)
		}
		if again := b.dispatch("relay-b", time.Minute); len(again) != 0 {
			t.Fatalf("a dispatched event claimed again: %d", len(again))
		}
	})
}

// A relay that dies with part of an event's fan-out written leaves the
// lease to expire; the relay that takes the event over attempts only the
// endpoints without a row, counting the lapsed attempt, and the dead
// relay's late outcome writes nothing.
func TestFreshLapsedLeaseTakenOverWritesOnlyWhatIsMissing(t *testing.T) {
	testdb.EachPostgres(t, func(t *testing.T, db *testdb.DB) {
		b := setupFresh(t, db, "m", 3)
		b.event("evt_lapse", "m")
		cs := b.dispatch("relay-a", time.Minute)
		if len(cs) != 3 {
			t.Fatalf("claimed %d, want 3", len(cs))
		}
		b.complete("relay-a", b.succeeded(cs[0], false))
		b.expire("evt_lapse")

		taken := b.dispatch("relay-b", time.Minute)
		if len(taken) != 2 || taken[0].EndpointID != cs[1].EndpointID || taken[1].EndpointID != cs[2].EndpointID {
			t.Fatalf("taken over %+v, want the two endpoints without a row", taken)
		}
		for _, c := range taken {
			if c.ID != 0 || c.Attempt != 2 || !c.LeaseLapsed || c.Lease.Equal(cs[0].Lease) {
				t.Fatalf("taken over %+v: want attempt 2 of a lapsed lease, on a new lease", c)
			}
		}
		// relay-a comes back and writes what it had: its lease is gone.
		res := b.complete("relay-a", b.succeeded(cs[1], false), b.succeeded(cs[2], true))
		if len(res.Written) != 0 {
			t.Fatalf("the old holder wrote %v after losing the lease", res.Written)
		}
		if d, owner := b.eventState("evt_lapse"); d || owner != "relay-b" {
			t.Fatalf("dispatched %v, lease %q; want leased to relay-b", d, owner)
		}
		// relay-b records the lapsed attempt and its own.
		var out []store.Completion
		for i, c := range taken {
			x := b.succeeded(c, i == len(taken)-1)
			x.Records = append([]store.AttemptRecord{{Attempt: 1, StartedAt: b.now, Error: "lease expired"}}, x.Records...)
			out = append(out, x)
		}
		if res := b.complete("relay-b", out...); len(res.Written) != 2 {
			t.Fatalf("the new holder wrote %v, want 2", res.Written)
		}
		if d, _ := b.eventState("evt_lapse"); !d {
			t.Fatal("event not dispatched after the new holder's last outcome")
		}
		if n := b.int(`SELECT count(*) FROM txhook_deliveries WHERE event_id = 'evt_lapse'`); n != 3 {
			t.Fatalf("%d delivery rows, want one per endpoint", n)
		}
		if n := b.int(`SELECT count(DISTINCT endpoint_id) FROM txhook_deliveries WHERE event_id = 'evt_lapse'`); n != 3 {
			t.Fatalf("%d endpoints with a row, want 3", n)
		}
		// The taken-over deliveries keep both attempts in the log.
		if n := b.int(`SELECT count(*) FROM txhook_attempt_log a JOIN txhook_deliveries d ON d.id = a.delivery_id
WHERE d.event_id = 'evt_lapse' AND d.attempts = 2`); n != 4 {
			t.Fatalf("%d attempts recorded for the two taken-over deliveries, want 4", n)
		}
	})
}

// A sibling the database refuses, even as its fallback, must not let the
// event be marked dispatched by the last one: the event stays leased, so
// that the relay taking it over when the lease lapses writes the missing
// delivery. Nothing is lost.
func TestFreshRefusedSiblingKeepsEventLeased(t *testing.T) {
	testdb.EachPostgres(t, func(t *testing.T, db *testdb.DB) {
		b := setupFresh(t, db, "m", 2)
		b.event("evt_refused", "m")
		cs := b.dispatch("relay-a", time.Minute)
		if len(cs) != 2 {
			t.Fatalf("claimed %d, want 2", len(cs))
		}
		bad := b.succeeded(cs[0], false)
		bad.State = "exploded" // refused by the CHECK constraint whatever its text
		res := b.complete("relay-a", bad, b.succeeded(cs[1], true))
		if len(res.Refused) != 1 || res.Refused[0] == nil || len(res.Written) != 1 || res.Written[1] == 0 {
			t.Fatalf("refused %v, written %v; want the first refused and the second written", res.Refused, res.Written)
		}
		if d, owner := b.eventState("evt_refused"); d || owner != "relay-a" {
			t.Fatalf("dispatched %v, lease %q; want still leased to relay-a", d, owner)
		}
		b.expire("evt_refused")
		taken := b.dispatch("relay-b", time.Minute)
		if len(taken) != 1 || taken[0].EndpointID != cs[0].EndpointID {
			t.Fatalf("taken over %+v, want the refused endpoint's attempt", taken)
		}
		if res := b.complete("relay-b", b.succeeded(taken[0], true)); len(res.Written) != 1 {
			t.Fatalf("wrote %v", res.Written)
		}
		if d, _ := b.eventState("evt_refused"); !d {
			t.Fatal("event not dispatched once every delivery is written")
		}
		if n := b.int(`SELECT count(*) FROM txhook_deliveries WHERE event_id = 'evt_refused'`); n != 2 {
			t.Fatalf("%d delivery rows, want 2", n)
		}
	})
}

// Outcomes that are not successes on a first attempt claimed with its
// event: a retry, a give-back that spends no attempt, and a dead letter
// each write their row once, with the attempt log and the dead-letter row
// in the same statement.
func TestFreshOutcomesOtherThanSuccess(t *testing.T) {
	testdb.EachPostgres(t, func(t *testing.T, db *testdb.DB) {
		b := setupFresh(t, db, "m", 1)
		for _, id := range []string{"evt_retry", "evt_back", "evt_dead"} {
			b.event(id, "m")
		}
		cs := b.dispatch("relay-a", time.Minute)
		if len(cs) != 3 {
			t.Fatalf("claimed %d, want 3", len(cs))
		}
		byEvent := map[string]store.Claimed{}
		for _, c := range cs {
			byEvent[c.EventID] = c
		}
		next := b.now.Add(10 * time.Second)
		fail := func(c store.Claimed, state string) store.Completion {
			x := c.Completion(b.now, true)
			x.State, x.Attempts, x.Record, x.Status, x.Error = state, 1, true, 500, "HTTP 500"
			if state == store.StatePending {
				x.NextAt = next
			}
			x.Records = []store.AttemptRecord{{Attempt: 1, StartedAt: b.now, Duration: time.Millisecond, Status: 500, Excerpt: "oops", Error: "HTTP 500"}}
			return x
		}
		back := byEvent["evt_back"].Completion(b.now, true)
		back.State, back.Attempts, back.NextAt = store.StatePending, 0, next
		res := b.complete("relay-a", fail(byEvent["evt_retry"], store.StatePending), back, fail(byEvent["evt_dead"], store.StateDead))
		if len(res.Written) != 3 {
			t.Fatalf("wrote %v, want 3", res.Written)
		}
		for id, want := range map[string]string{"evt_retry": "pending 1 500 1", "evt_back": "pending 0 0 0", "evt_dead": "dead 1 500 1"} {
			var state string
			var attempts, status, logged int
			if err := b.st.DB.QueryRowContext(b.ctx, `SELECT d.state, d.attempts, COALESCE(d.last_status, 0),
    (SELECT count(*) FROM txhook_attempt_log a WHERE a.delivery_id = d.id)
FROM txhook_deliveries d WHERE d.event_id = $1`, id).Scan(&state, &attempts, &status, &logged); err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprintf("%s %d %d %d", state, attempts, status, logged); got != want {
				t.Errorf("%s: state, attempts, status, attempts logged = %s; want %s", id, got, want)
			}
			if d, _ := b.eventState(id); !d {
				t.Errorf("%s not dispatched", id)
			}
		}
		if n := b.int(`SELECT count(*) FROM txhook_dead_letters dl JOIN txhook_deliveries d ON d.id = dl.delivery_id WHERE d.event_id = 'evt_dead'`); n != 1 {
			t.Fatalf("%d dead letters for the dead delivery, want 1", n)
		}
		// The retry and the given-back delivery are due as rows now.
		due, err := b.st.Claim(b.ctx, "relay-a", next, time.Minute, 10)
		if err != nil || len(due) != 2 {
			t.Fatalf("retry claim took %d (%v), want 2", len(due), err)
		}
	})
}

// An event nobody subscribes to, and a delayed one, are dispatched at the
// claim: the first with nothing to send, the second with its deliveries
// pending until its time, neither leased.
func TestFreshUnroutedAndDelayedEventsAreNotLeased(t *testing.T) {
	testdb.EachPostgres(t, func(t *testing.T, db *testdb.DB) {
		b := setupFresh(t, db, "m", 1)
		b.event("evt_nobody", "other")
		b.event("evt_later", "m")
		if _, err := b.st.DB.ExecContext(b.ctx, `UPDATE txhook_events SET deliver_at = $1 WHERE id = 'evt_later'`, b.now.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if got := b.dispatch("relay-a", time.Minute); len(got) != 0 {
			t.Fatalf("claimed %d, want none", len(got))
		}
		for _, id := range []string{"evt_nobody", "evt_later"} {
			if d, owner := b.eventState(id); !d || owner != "" {
				t.Errorf("%s: dispatched %v, lease %q; want dispatched, not leased", id, d, owner)
			}
		}
		if n := b.int(`SELECT count(*) FROM txhook_deliveries WHERE event_id = 'evt_later' AND state = 'pending' AND next_attempt_at = $1`, b.now.Add(time.Hour)); n != 1 {
			t.Fatalf("%d pending deliveries due at the delayed event's time, want 1", n)
		}
	})
}

// A relay that takes over its own lapsed lease can hand both leases'
// outcomes of a pair to one completion batch: only the later lease's is
// written, with its own attempt records, once.
func TestFreshBothLeasesOfAPairInOneBatch(t *testing.T) {
	testdb.EachPostgres(t, func(t *testing.T, db *testdb.DB) {
		b := setupFresh(t, db, "m", 1)
		b.event("evt_twice", "m")
		old := b.dispatch("relay-a", time.Minute)
		b.expire("evt_twice")
		cur := b.dispatch("relay-a", time.Minute)
		if len(old) != 1 || len(cur) != 1 || !cur[0].LeaseLapsed {
			t.Fatalf("claims %+v then %+v", old, cur)
		}
		stale := b.succeeded(old[0], true)
		stale.Records[0].Excerpt = "stale"
		fresh := b.succeeded(cur[0], true)
		fresh.Records = append([]store.AttemptRecord{{Attempt: 1, StartedAt: b.now, Error: "lease expired"}}, fresh.Records...)
		res := b.complete("relay-a", fresh, stale)
		if len(res.Written) != 1 || res.Written[0] == 0 {
			t.Fatalf("written %v, want the later lease's outcome (position 0) only", res.Written)
		}
		if n := b.int(`SELECT count(*) FROM txhook_deliveries WHERE event_id = 'evt_twice'`); n != 1 {
			t.Fatalf("%d delivery rows, want 1", n)
		}
		if n := b.int(`SELECT count(*) FROM txhook_attempts a JOIN txhook_deliveries d ON d.id = a.delivery_id WHERE d.event_id = 'evt_twice'`); n != 2 {
			t.Fatalf("%d attempt rows, want the later lease's 2", n)
		}
		if n := b.int(`SELECT count(*) FROM txhook_attempts WHERE response_excerpt = 'stale'`); n != 0 {
			t.Fatal("the stale lease's attempt was recorded")
		}
	})
}
