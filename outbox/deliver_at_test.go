package outbox_test

import (
	"errors"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/clock"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// barrierEndpoint is the receiver of the barrier endpoint and the relay
// that delivers to it.
type barrierEndpoint struct {
	rc    *receiver
	relay *outbox.Relay
}

// barrier enqueues an event for the barrier endpoint and waits until its
// receiver got it and the relay has nothing under way: by then the relay
// has run a claim at the fake clock's current time (or earlier), after
// everything enqueued before, and finished what that claim took, so a
// clock moved next is seen by the relay's next claim, not by one still
// running.
func (b *bundle) barrier(bar barrierEndpoint) {
	b.t.Helper()
	id := b.enqueue(outbox.Event{Tenant: "barrier", Type: "barrier", Payload: []byte(`{}`)})
	deadline := time.After(waitFor)
	for received := false; !received; {
		select {
		case got := <-bar.rc.got:
			received = got.Header.Get("Webhook-Id") == id
		case <-deadline:
			b.t.Fatal("timed out waiting for the barrier event")
		}
	}
	b.eventually("the relay idle after the barrier", func() bool {
		s := bar.relay.Stats()
		return s.InFlight == 0 && s.Waiting == 0
	})
}

// ids returns the webhook IDs rc received so far, in order.
func (rc *receiver) ids() []string {
	var out []string
	for _, r := range rc.requests() {
		out = append(out, r.Header.Get("Webhook-Id"))
	}
	return out
}

// delayedSetup opens an outbox on a fake clock with a running relay, an
// endpoint of tenant "m" at rc and one of tenant "barrier" at bar.
func delayedSetup(t *testing.T, db *testdb.DB) (b *bundle, fake *clock.Fake, start time.Time, rc *receiver, ep outbox.Endpoint, bar barrierEndpoint) {
	start = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	fake = clock.NewFake(start)
	b = setup(t, db, outbox.Config{Clock: fake})
	rc, bar.rc = newReceiver(t, nil), newReceiver(t, nil)
	ep = b.endpoint("m", rc.URL)
	b.endpoint("barrier", bar.rc.URL)
	bar.relay = b.relay(roomy(outbox.RelayConfig{}))
	return b, fake, start, rc, ep, bar
}

func TestDeliverAtNothingBeforeItThenDelivered(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b, fake, start, rc, ep, bar := delayedSetup(t, db)

		hour := start.Add(time.Hour)
		single := b.enqueue(outbox.Event{Tenant: "m", Type: "payment.due", Payload: []byte(`{"n":1}`), DeliverAt: hour})
		res, err := b.many([]outbox.Event{
			{Tenant: "m", Type: "payment.due", Payload: []byte(`{"n":2}`), DeliverAt: hour.Add(time.Minute)},
			{Tenant: "m", Type: "payment.now", Payload: []byte(`{"n":3}`)},
			{Tenant: "m", Type: "payment.past", Payload: []byte(`{"n":4}`), DeliverAt: start.Add(-time.Hour)},
		})
		if err != nil {
			t.Fatal(err)
		}
		batched, now, past := res[0].ID, res[1].ID, res[2].ID

		b.barrier(bar)
		b.eventually("the due events delivered", func() bool { return len(rc.requests()) >= 2 })
		for _, id := range rc.ids() {
			if id != now && id != past {
				t.Fatalf("delivered %s before its DeliverAt", id)
			}
		}
		// The delayed deliveries wait, pending, due at DeliverAt.
		page, err := b.ob.EndpointDeliveries(b.ctx, ep.ID, "", 10)
		if err != nil {
			t.Fatal(err)
		}
		due := map[string]time.Time{single: hour, batched: hour.Add(time.Minute)}
		for _, d := range page.Deliveries {
			want, delayed := due[d.EventID]
			if !delayed {
				continue
			}
			if d.State != outbox.StatePending || d.Attempts != 0 || !d.NextAttemptAt.Equal(want) {
				t.Fatalf("delayed delivery %+v, want pending, no attempt, next at %v", d, want)
			}
			delete(due, d.EventID)
		}
		if len(due) != 0 {
			t.Fatalf("no delivery listed for %v", due)
		}

		// A microsecond early: still nothing.
		fake.Set(hour.Add(-time.Microsecond))
		b.barrier(bar)
		if n := len(rc.requests()); n != 2 {
			t.Fatalf("%d requests a microsecond before DeliverAt, want 2: %v", n, rc.ids())
		}
		fake.Set(hour)
		b.eventually("the first delayed event delivered", func() bool { return len(rc.requests()) == 3 })
		b.barrier(bar)
		if ids := rc.ids(); len(ids) != 3 || ids[2] != single {
			t.Fatalf("deliveries %v, want %s third and nothing more", ids, single)
		}
		fake.Set(hour.Add(time.Minute))
		b.eventually("the batched delayed event delivered", func() bool { return len(rc.requests()) == 4 })
		if ids := rc.ids(); ids[3] != batched {
			t.Fatalf("deliveries %v, want %s last", ids, batched)
		}
		b.eventually("the attempt recorded", func() bool {
			return b.count(`SELECT count(*) FROM txhook_attempt_log a
JOIN txhook_deliveries d ON d.id = a.delivery_id WHERE d.event_id = ?`, single) == 1
		})
		var started store_time
		if err := db.QueryRowContext(b.ctx, b.rebind(`SELECT a.started_at FROM txhook_attempt_log a
JOIN txhook_deliveries d ON d.id = a.delivery_id WHERE d.event_id = ?`), single).Scan(&started); err != nil {
			t.Fatal(err)
		}
		if started.Time.Before(hour) {
			t.Fatalf("first attempt at %v, before DeliverAt %v", started.Time, hour)
		}
	})
}

func TestDeliverAtWithOrderingKeys(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b, fake, start, rc, _, bar := delayedSetup(t, db)
		hour := start.Add(time.Hour)
		ev := func(key string, n int, at time.Time) outbox.Event {
			e := payEvent("m", n)
			e.OrderingKey, e.DeliverAt = key, at
			return e
		}
		// Key a: a delayed event first holds back the later one.
		// Key b: the delayed event comes second, behind one sent at once
		// (it is created blocked, and unblocking must not make it due
		// early). Key c: unaffected by the others.
		res, err := b.many([]outbox.Event{
			ev("a", 1, hour), ev("a", 2, time.Time{}),
			ev("b", 3, time.Time{}), ev("b", 4, hour),
			ev("c", 5, time.Time{}),
		})
		if err != nil {
			t.Fatal(err)
		}
		b.eventually("b1 and c delivered", func() bool { return len(rc.requests()) == 2 })
		b.barrier(bar)
		b.barrier(bar)
		got := map[string]bool{}
		for _, id := range rc.ids() {
			got[id] = true
		}
		if len(got) != 2 || !got[res[2].ID] || !got[res[4].ID] {
			t.Fatalf("before DeliverAt got %v, want only %s and %s", rc.ids(), res[2].ID, res[4].ID)
		}
		fake.Set(hour)
		b.eventually("the rest delivered", func() bool { return len(rc.requests()) == 5 })
		pos := map[string]int{}
		for i, id := range rc.ids() {
			pos[id] = i
		}
		if pos[res[0].ID] > pos[res[1].ID] {
			t.Fatalf("key a out of order: %v", rc.ids())
		}
	})
}

func TestDeliverAtBounds(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
		b := setup(t, db, outbox.Config{Clock: clock.NewFake(start)})
		tx, err := db.BeginTx(b.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		late := outbox.Event{Tenant: "m", Type: "t", Payload: []byte(`{}`), DeliverAt: start.Add(outbox.MaxDelay + time.Second)}
		if _, err := b.ob.Enqueue(b.ctx, tx, late); !errors.Is(err, outbox.ErrInvalidEvent) {
			t.Fatalf("DeliverAt past MaxDelay: %v, want ErrInvalidEvent", err)
		}
		var be *outbox.BatchError
		if _, err := b.ob.EnqueueMany(b.ctx, tx, []outbox.Event{payEvent("m", 1), late}); !errors.As(err, &be) || be.Index != 1 || !errors.Is(err, outbox.ErrInvalidEvent) {
			t.Fatalf("EnqueueMany with DeliverAt past MaxDelay: %v", err)
		}
		// At MaxDelay exactly, kept to the microsecond, rounded up.
		edge := outbox.Event{ID: "evt_edge", Tenant: "m", Type: "t", Payload: []byte(`{}`), DeliverAt: start.Add(outbox.MaxDelay - time.Nanosecond)}
		if _, err := b.ob.Enqueue(b.ctx, tx, edge); err != nil {
			t.Fatal(err)
		}
		var at store_time
		if err := tx.QueryRowContext(b.ctx, "SELECT deliver_at FROM txhook_events WHERE id = 'evt_edge'").Scan(&at); err != nil {
			t.Fatal(err)
		}
		if want := start.Add(outbox.MaxDelay); !at.Time.Equal(want) {
			t.Fatalf("stored deliver_at %v, want %v", at.Time, want)
		}
		// The same event again with another DeliverAt is a duplicate.
		edge.DeliverAt = start.Add(time.Hour)
		r, err := b.ob.EnqueueDetail(b.ctx, tx, edge)
		if err != nil || !r.Duplicate {
			t.Fatalf("repeat with another DeliverAt: %+v, %v", r, err)
		}
	})
}
