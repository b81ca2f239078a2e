package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/internal/testdb"
)

// skew is how far the clock of a misconfigured relay is off.
const skew = 20 * time.Second

// waitFor bounds polling: generous, as CI machines are small and busy.
const waitFor = 60 * time.Second

type clockBundle struct {
	t   *testing.T
	ctx context.Context
	st  *store.Store
}

func setupClock(t *testing.T, db *testdb.DB) *clockBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	d := store.SQLite
	if db.Backend.Postgres() {
		d = store.Postgres
	}
	st := store.New(db.DB, d)
	t.Cleanup(func() { st.Close() })
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	b := &clockBundle{t: t, ctx: ctx, st: st}
	now := time.Now()
	b.exec(`INSERT INTO txhook_endpoints (id, tenant, url, secrets, created_at, updated_at)
VALUES ('ep_1', 'm', 'https://example.com/hook', '[]', ?, ?)`, st.T(now), st.T(now))
	return b
}

func (b *clockBundle) exec(q string, args ...any) {
	b.t.Helper()
	if _, err := b.st.DB.ExecContext(b.ctx, b.st.Rebind(q), args...); err != nil {
		b.t.Fatalf("%s: %v", q, err)
	}
}

// event writes an event for the endpoint, undispatched, with an ordering
// key when key is not "".
func (b *clockBundle) event(id, key string) {
	b.t.Helper()
	var k any
	if key != "" {
		k = key
	}
	b.exec(`INSERT INTO txhook_events (id, tenant, type, payload, created_at, ordering_key)
VALUES (?, 'm', 'payment.succeeded', '{}', ?, ?)`, id, b.st.T(time.Now()), k)
}

// pending writes a dispatched event and its pending delivery, due at due.
func (b *clockBundle) pending(id string, due time.Time) {
	b.t.Helper()
	b.event(id, "")
	now := time.Now()
	b.exec(`UPDATE txhook_events SET dispatched_at = ? WHERE id = ?`, b.st.T(now), id)
	b.exec(`INSERT INTO txhook_deliveries (event_id, endpoint_id, state, next_attempt_at, created_at, updated_at)
VALUES (?, 'ep_1', 'pending', ?, ?, ?)`, id, b.st.T(due), b.st.T(now), b.st.T(now))
}

func (b *clockBundle) claim(owner string, now time.Time, lease time.Duration) []store.Claimed {
	b.t.Helper()
	got, err := b.st.Claim(b.ctx, owner, now, lease, 100)
	if err != nil {
		b.t.Fatalf("claim by %s: %v", owner, err)
	}
	return got
}

// leaseUntil reads the lease expiry the database stored for the one
// delivery.
func (b *clockBundle) leaseUntil() time.Time {
	b.t.Helper()
	var t store.Time
	if err := b.st.DB.QueryRowContext(b.ctx, "SELECT next_attempt_at FROM txhook_deliveries").Scan(&t); err != nil {
		b.t.Fatal(err)
	}
	return t.Time
}

// reclaim polls a claim by owner, whose clock reads real time plus offset,
// until it takes something.
func (b *clockBundle) reclaim(owner string, offset, lease time.Duration) []store.Claimed {
	b.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		if got := b.claim(owner, time.Now().Add(offset), lease); len(got) > 0 {
			return got
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%s never took over the expired lease", owner)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// mustTakeOverExpired checks a takeover of the one delivery: by owner, as
// a lapsed lease, and not before the lease that expired at until had
// expired by the database's clock. The new lease, also the database's,
// started when owner claimed, so the database's clock alone decides.
func (b *clockBundle) mustTakeOverExpired(got []store.Claimed, owner string, until time.Time, lease time.Duration) {
	b.t.Helper()
	if len(got) != 1 || !got[0].LeaseLapsed || got[0].Attempt != 2 {
		b.t.Fatalf("%s took %+v, want the one delivery as a lapsed lease, attempt 2", owner, got)
	}
	// SQLite's clock converts to microseconds within 40 µs.
	if claimedAt := b.leaseUntil().Add(-lease); claimedAt.Before(until.Add(-time.Millisecond)) {
		b.t.Fatalf("%s took the delivery over at %s by the database's clock, before its lease expired at %s", owner, claimedAt, until)
	}
}

// A relay whose clock runs ahead must not take over a delivery whose lease,
// timed by the database's clock, still runs; it takes it once that lease
// has expired by the database's clock.
func TestClaimLeaseTimedByDatabaseClock(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setupClock(t, db)
		const lease = 1500 * time.Millisecond
		b.pending("evt_1", time.Now().Add(-time.Second))

		if got := b.claim("A", time.Now(), lease); len(got) != 1 || got[0].LeaseLapsed {
			t.Fatalf("relay A took %+v, want the one pending delivery", got)
		}
		until := b.leaseUntil()
		if got := b.claim("fast", time.Now().Add(skew), lease); len(got) != 0 {
			t.Fatalf("relay with its clock %s ahead took over a lease still running: %+v", skew, got)
		}
		b.mustTakeOverExpired(b.reclaim("fast", skew, lease), "fast", until, lease)
	})
}

// A relay whose clock runs behind takes over a dead relay's delivery as
// soon as its lease has expired by the database's clock, not skew later.
func TestClaimLapsedLeaseBySlowClock(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setupClock(t, db)
		const lease = 500 * time.Millisecond
		b.pending("evt_1", time.Now().Add(-time.Second))
		leased := time.Now()
		if got := b.claim("A", time.Now(), lease); len(got) != 1 {
			t.Fatalf("relay A took %d deliveries, want 1", len(got))
		}
		until := b.leaseUntil()
		b.mustTakeOverExpired(b.reclaim("slow", -skew, lease), "slow", until, lease)
		if after := time.Since(leased); after > skew/2 {
			t.Fatalf("slow relay took the lapsed lease over only after %s", after)
		}
	})
}

// The leases Dispatch and DispatchKeyed give a new delivery are timed by
// the database's clock too: a dispatching relay whose clock runs behind
// must not hand a normal relay deliveries it is about to send.
func TestDispatchLeaseTimedByDatabaseClock(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setupClock(t, db)
		const lease = 5 * time.Second // shorter than the skew
		b.event("evt_plain", "")
		b.event("evt_keyed", "order-1")

		got, err := b.st.Dispatch(b.ctx, "slow", time.Now().Add(-skew), lease, 10)
		if err != nil || len(got) != 1 {
			t.Fatalf("Dispatch = %d deliveries, %v; want 1", len(got), err)
		}
		got, err = b.st.DispatchKeyed(b.ctx, "slow", time.Now().Add(-skew), lease, 10)
		if err != nil || len(got) != 1 {
			t.Fatalf("DispatchKeyed = %d deliveries, %v; want 1", len(got), err)
		}
		if got := b.claim("normal", time.Now(), lease); len(got) != 0 {
			t.Fatalf("a normal relay took over %d deliveries just dispatched by a relay %s behind", len(got), skew)
		}
		if got, err := b.st.Dispatch(b.ctx, "normal", time.Now(), lease, 10); err != nil || len(got) != 0 {
			t.Fatalf("a normal relay took over %d events just claimed by a relay %s behind (%v)", len(got), skew, err)
		}
		// The keyed event's delivery is a running row; the plain event's
		// first attempt is leased on the event (on PostgreSQL).
		var running, leased int
		if err := db.QueryRowContext(b.ctx, "SELECT count(*) FROM txhook_deliveries WHERE state = 'running' AND lease_owner = 'slow'").Scan(&running); err != nil {
			t.Fatal(err)
		}
		if b.st.Dialect == store.Postgres {
			if err := db.QueryRowContext(b.ctx, "SELECT count(*) FROM txhook_events WHERE lease_owner = 'slow' AND lease_until > now() AND dispatched_at IS NULL").Scan(&leased); err != nil {
				t.Fatal(err)
			}
		}
		if running+leased != 2 {
			t.Fatalf("%d deliveries and %d events leased to the dispatching relay, want 2 in all", running, leased)
		}
	})
}

// Pending deliveries (retries, postponed or released work) stay due by the
// claiming relay's clock, which is what scheduled them and what the fake
// clocks of tests move: neither clock alone decides.
func TestClaimPendingDueByRelayClock(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setupClock(t, db)
		now := time.Now()
		b.pending("evt_later", now.Add(skew/2))    // due by a clock skew ahead
		b.pending("evt_earlier", now.Add(-skew/2)) // due by the database's clock
		if got := b.claim("slow", time.Now().Add(-skew), time.Minute); len(got) != 0 {
			t.Fatalf("relay %s behind took %d deliveries not yet due by its clock", skew, len(got))
		}
		got := b.claim("fast", time.Now().Add(skew), time.Minute)
		if len(got) != 2 {
			t.Fatalf("relay %s ahead took %d deliveries, want both", skew, len(got))
		}
		for _, c := range got {
			if c.LeaseLapsed || c.Attempt != 1 {
				t.Errorf("claimed %s: %+v, want a first attempt", c.EventID, c)
			}
		}
	})
}

// DBNow reads the database's clock, which agrees with this machine's (on
// the test databases, it is this machine's) far better than to a second.
func TestDBNow(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setupClock(t, db)
		before := time.Now()
		got, err := b.st.DBNow(b.ctx)
		after := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		if got.Before(before.Add(-time.Second)) || got.After(after.Add(time.Second)) {
			t.Fatalf("DBNow = %s, want between %s and %s", got, before, after)
		}
	})
}
