package outbox_test

import (
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// idReceiver answers with the status its mode picks and records, per event
// ID, what it answered, and the order of the IDs it accepted.
type idReceiver struct {
	*receiver
	mode     atomic.Int32 // an HTTP status
	mu       sync.Mutex
	answers  map[string][]int
	accepted []string
}

func newIDReceiver(t *testing.T) *idReceiver {
	ir := &idReceiver{answers: map[string][]int{}}
	ir.mode.Store(http.StatusOK)
	ir.receiver = newReceiver(t, func(_ int, r *http.Request) int {
		code := int(ir.mode.Load())
		id := r.Header.Get(outbox.HeaderEventID)
		ir.mu.Lock()
		ir.answers[id] = append(ir.answers[id], code)
		if code/100 == 2 {
			ir.accepted = append(ir.accepted, id)
		}
		ir.mu.Unlock()
		return code
	})
	return ir
}

// got returns how many requests for id it accepted and refused.
func (ir *idReceiver) got(id string) (ok, refused int) {
	ir.mu.Lock()
	defer ir.mu.Unlock()
	for _, c := range ir.answers[id] {
		if c/100 == 2 {
			ok++
		} else {
			refused++
		}
	}
	return ok, refused
}

func (ir *idReceiver) order() []string {
	ir.mu.Lock()
	defer ir.mu.Unlock()
	return append([]string(nil), ir.accepted...)
}

func (b *bundle) allDispatched() {
	b.t.Helper()
	b.eventually("events dispatched", func() bool {
		return b.count("SELECT count(*) FROM txhook_events WHERE dispatched_at IS NULL") == 0
	})
}

// Events enqueued while an endpoint is disabled (by an operator, by
// DisableAfter, by a 410 with DisableOnGone) are not queued for it, and its
// dead letters are not retried: Recover sends each of them once, with its
// own ID, keeping keyed events in order, and sends nothing that succeeded.
func TestRecoverSendsWhatADisabledEndpointMissed(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		since := time.Now().Add(-time.Minute)
		rc := newIDReceiver(t)
		ep := b.endpoint("m", rc.URL)
		other := b.endpoint("m", newReceiver(t, nil).URL) // takes every event meanwhile
		// One attempt per delivery, so failures are dead-lettered at once;
		// two failures a millisecond apart disable the endpoint.
		b.relay(outbox.RelayConfig{Retry: fastRetryAttempts(1), DisableAfter: time.Millisecond, DisableOnGone: true})
		send := func(key string) string {
			return b.enqueue(outbox.Event{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{}`), OrderingKey: key})
		}
		waitDisabled := func() {
			b.eventually("endpoint disabled", func() bool {
				got, err := b.ob.Endpoint(b.ctx, ep.ID)
				return err == nil && !got.Enabled
			})
		}
		delivered := func(ids ...string) {
			b.eventually("deliveries accepted", func() bool {
				for _, id := range ids {
					if ok, _ := rc.got(id); ok == 0 {
						return false
					}
				}
				return true
			})
			// And their outcomes written: a keyed delivery still running
			// holds its key's line, which the next steps depend on.
			b.eventually("outcomes written", func() bool {
				return b.count("SELECT count(*) FROM txhook_deliveries WHERE endpoint_id = ? AND state IN ('pending', 'running')", ep.ID) == 0
			})
		}
		recoverAll := func(want int) {
			t.Helper()
			n, err := b.ob.Recover(b.ctx, ep.ID, since)
			if err != nil || n != want {
				t.Fatalf("Recover queued %d (%v), want %d", n, err, want)
			}
		}

		// Delivered before any trouble: never sent again.
		s1, s2 := send(""), send("p1")
		delivered(s1, s2)

		// Auto-disable: two failures, both dead-lettered.
		rc.mode.Store(http.StatusInternalServerError)
		d1 := send("")
		b.eventually("first dead letter", func() bool { return b.count("SELECT count(*) FROM txhook_dead_letters") == 1 })
		d2 := send("p1")
		waitDisabled()
		b.eventually("second dead letter", func() bool { return b.count("SELECT count(*) FROM txhook_dead_letters") == 2 })
		x1, k1, k2, k3 := send(""), send("p1"), send("p1"), send("p1")
		b.allDispatched()
		if n := b.count("SELECT count(*) FROM txhook_deliveries WHERE endpoint_id = ?", ep.ID); n != 4 {
			t.Fatalf("%d deliveries to the disabled endpoint, want the 4 made before it was disabled", n)
		}
		rc.mode.Store(http.StatusOK)
		if err := b.ob.EnableEndpoint(b.ctx, ep.ID); err != nil {
			t.Fatal(err)
		}
		recoverAll(6)
		delivered(d1, d2, x1, k1, k2, k3)
		if n := b.count("SELECT count(*) FROM txhook_dead_letters"); n != 0 {
			t.Errorf("%d dead letters left after recovering them", n)
		}
		recoverAll(0)

		// Disabled by an operator, recovered before it is enabled again:
		// the deliveries wait, paused or blocked.
		if err := b.ob.DisableEndpoint(b.ctx, ep.ID, "maintenance"); err != nil {
			t.Fatal(err)
		}
		x2, k4, k5 := send(""), send("p1"), send("p1")
		b.allDispatched()
		recoverAll(3)
		if n := b.count("SELECT count(*) FROM txhook_deliveries WHERE endpoint_id = ? AND state = 'paused'", ep.ID); n != 2 {
			t.Errorf("%d paused deliveries to the disabled endpoint, want 2", n)
		}
		if n := b.count("SELECT count(*) FROM txhook_deliveries WHERE endpoint_id = ? AND state = 'blocked'", ep.ID); n != 1 {
			t.Errorf("%d blocked deliveries, want 1", n)
		}
		if err := b.ob.EnableEndpoint(b.ctx, ep.ID); err != nil {
			t.Fatal(err)
		}
		delivered(x2, k4, k5)

		// 410 Gone: the endpoint is disabled and that event dead-lettered.
		rc.mode.Store(http.StatusGone)
		g1 := send("p1")
		waitDisabled()
		x3, k6 := send(""), send("p1")
		b.allDispatched()
		rc.mode.Store(http.StatusOK)
		if err := b.ob.EnableEndpoint(b.ctx, ep.ID); err != nil {
			t.Fatal(err)
		}
		recoverAll(3)
		delivered(g1, x3, k6)
		recoverAll(0)

		// Every event accepted exactly once, with its own ID; the keyed ones
		// in the order they were enqueued.
		for _, id := range []string{s1, s2, d1, d2, x1, k1, k2, k3, x2, k4, k5, g1, x3, k6} {
			if ok, _ := rc.got(id); ok != 1 {
				t.Errorf("event %s accepted %d times", id, ok)
			}
		}
		for _, id := range []string{s1, s2} {
			if ok, refused := rc.got(id); ok+refused != 1 {
				t.Errorf("delivered event %s sent %d times", id, ok+refused)
			}
		}
		var keyed []string
		isKeyed := map[string]bool{s2: true, d2: true, k1: true, k2: true, k3: true, k4: true, k5: true, g1: true, k6: true}
		for _, id := range rc.order() {
			if isKeyed[id] {
				keyed = append(keyed, id)
			}
		}
		want := []string{s2, d2, k1, k2, k3, k4, k5, g1, k6}
		if len(keyed) != len(want) {
			t.Fatalf("keyed events accepted %v, want %v", keyed, want)
		}
		for i := range want {
			if keyed[i] != want[i] {
				t.Fatalf("keyed events accepted in order %v, want %v", keyed, want)
			}
		}
		if n := b.count("SELECT count(*) FROM txhook_dead_letters"); n != 0 {
			t.Errorf("%d dead letters left", n)
		}
		// The other endpoint, never disabled, got nothing twice.
		if n := b.count("SELECT count(*) FROM txhook_deliveries WHERE endpoint_id = ?", other.ID); n != 14 {
			t.Errorf("%d deliveries to the other endpoint, want 14", n)
		}
	})
}

func TestRecoverRefusesBadInput(t *testing.T) {
	b := setup(t, testdb.SQLite(t), outbox.Config{})
	ep := b.endpoint("m", "http://127.0.0.1:1/hook")
	for name, since := range map[string]time.Time{"zero": {}, "future": time.Now().Add(time.Hour)} {
		if n, err := b.ob.Recover(b.ctx, ep.ID, since); !errors.Is(err, outbox.ErrInvalidSince) || n != 0 {
			t.Errorf("%s since: %d, %v", name, n, err)
		}
	}
	if _, err := b.ob.Recover(b.ctx, "ep_nope", time.Now().Add(-time.Hour)); !errors.Is(err, outbox.ErrEndpointNotFound) {
		t.Errorf("unknown endpoint: %v", err)
	}
}

// Events no endpoint was sent (the tenant's only endpoint was disabled, or
// the endpoint they went to was deleted since) have no delivery to find
// them by: Recover finds them all the same, and only the tenant's, and
// retention prunes them once they are old enough.
func TestRecoverFindsEventsNoEndpointWasSent(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		since := time.Now().Add(-time.Minute)
		rc := newIDReceiver(t)
		solo := b.endpoint("solo", rc.URL)
		gone := b.endpoint("moved", rc.URL)
		b.endpoint("other", newReceiver(t, nil).URL)
		b.relay(outbox.RelayConfig{})
		if err := b.ob.DisableEndpoint(b.ctx, solo.ID, "maintenance"); err != nil {
			t.Fatal(err)
		}
		send := func(tenant, key string) string {
			return b.enqueue(outbox.Event{Tenant: tenant, Type: "payment.succeeded", Payload: []byte(`{}`), OrderingKey: key})
		}
		missed := []string{send("solo", ""), send("solo", "k"), send("solo", "k")}
		moved := []string{send("moved", ""), send("moved", "k")}
		send("other", "")
		b.allDispatched()
		b.eventually("the moved tenant's events delivered", func() bool {
			for _, id := range moved {
				if ok, _ := rc.got(id); ok == 0 {
					return false
				}
			}
			return true
		})
		if err := b.ob.DeleteEndpoint(b.ctx, gone.ID); err != nil {
			t.Fatal(err)
		}
		if n := b.count("SELECT count(*) FROM txhook_events WHERE unrouted"); n != len(missed)+len(moved) {
			t.Fatalf("%d events marked unrouted, want %d", n, len(missed)+len(moved))
		}

		if err := b.ob.EnableEndpoint(b.ctx, solo.ID); err != nil {
			t.Fatal(err)
		}
		if n, err := b.ob.Recover(b.ctx, solo.ID, since); err != nil || n != len(missed) {
			t.Fatalf("Recover queued %d (%v), want %d", n, err, len(missed))
		}
		// The moved tenant's new endpoint gets what the deleted one had.
		next := b.endpoint("moved", rc.URL)
		if n, err := b.ob.Recover(b.ctx, next.ID, since); err != nil || n != len(moved) {
			t.Fatalf("Recover to the new endpoint queued %d (%v), want %d", n, err, len(moved))
		}
		b.eventually("recovered events delivered", func() bool {
			for _, id := range missed {
				if ok, _ := rc.got(id); ok != 1 {
					return false
				}
			}
			for _, id := range moved {
				if ok, _ := rc.got(id); ok != 2 {
					return false
				}
			}
			return true
		})
		if ids := rc.order(); len(ids) != 2*len(moved)+len(missed) {
			t.Fatalf("receiver got %v", ids)
		}
	})
}
