package outbox_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/retry"
)

// Hostile tenants for the isolation tests: receivers that hang, and
// backlogs that limits hold back. A calm tenant beside them must not
// notice.

// hangingReceiver accepts requests and answers none until released (or
// until the relay gives up on them).
type hangingReceiver struct {
	*httptest.Server
	release  chan struct{}
	once     sync.Once
	started  atomic.Int64
	finished atomic.Int64
}

func newHangingReceiver(t *testing.T) *hangingReceiver {
	h := &hangingReceiver{release: make(chan struct{})}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read the body first: only then does the server notice a client
		// that gives up (the request's context ends).
		io.Copy(io.Discard, r.Body)
		h.started.Add(1)
		defer h.finished.Add(1)
		select {
		case <-h.release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(h.Server.Close)
	t.Cleanup(h.Release)
	return h
}

// Release lets every request, present and future, finish.
func (h *hangingReceiver) Release() { h.once.Do(func() { close(h.release) }) }

// enqueueMany enqueues n events of tenant in one transaction.
func (b *bundle) enqueueMany(tenant string, n int) {
	b.t.Helper()
	tx, err := b.db.BeginTx(b.ctx, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	for i := range n {
		if _, err := b.ob.Enqueue(b.ctx, tx, outbox.Event{Tenant: tenant, Type: "payment.succeeded",
			Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}); err != nil {
			tx.Rollback()
			b.t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.t.Fatal(err)
	}
}

// Issue 9, item 2: two endpoints limited to 0.01 requests/s with 80 events
// each used to hold 160 jobs in the relay, more than its claim capacity, so
// it stopped claiming and another tenant's event was never dispatched.
func TestRateLimitedBacklogLeavesClaimCapacity(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		throttled := newReceiver(t, nil)
		var limited []string
		for _, tenant := range []string{"thr_a", "thr_b"} {
			ep, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: tenant, URL: throttled.URL,
				Limits: outbox.Limits{RatePerSecond: 0.01}})
			if err != nil {
				t.Fatal(err)
			}
			limited = append(limited, ep.ID)
			b.enqueueMany(tenant, 80)
		}
		calm := newReceiver(t, nil)
		b.endpoint("calm", calm.URL)
		relay := b.relay(outbox.RelayConfig{})
		b.eventually("throttled backlog dispatched", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries") == 160
		})
		// Every throttled delivery went back to the database unspent.
		b.eventually("throttled deliveries back in the database", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'pending' AND attempts = 0") == 160
		})
		for range 3 {
			id := b.enqueue(outbox.Event{Tenant: "calm", Type: "payment.succeeded", Payload: []byte(`{}`)})
			select {
			case r := <-calm.got:
				if got := r.Header.Get("Webhook-Id"); got != id {
					t.Fatalf("calm receiver got %q, want %q", got, id)
				}
			case <-time.After(waitFor):
				t.Fatalf("calm tenant's event not delivered beside the throttled backlog (relay stats %+v)", relay.Stats())
			}
		}
		if n := len(throttled.requests()); n != 0 {
			t.Fatalf("throttled endpoints got %d requests; the limit allows none yet", n)
		}
		// They come due at the endpoint's pace, one slot (100 s) apart, not
		// all at once: the first three 100 s apart (the relay postpones at
		// most 10 minutes ahead and spreads what is left over the second
		// half of that window, to be paced again when it comes due).
		now := time.Now()
		for _, ep := range limited {
			rows, err := db.QueryContext(b.ctx, b.rebind("SELECT next_attempt_at FROM txhook_deliveries WHERE endpoint_id = ? ORDER BY next_attempt_at"), ep)
			if err != nil {
				t.Fatal(err)
			}
			var due []time.Time
			for rows.Next() {
				var at store_time
				if err := rows.Scan(&at); err != nil {
					t.Fatal(err)
				}
				due = append(due, at.Time)
			}
			rows.Close()
			if len(due) != 80 {
				t.Fatalf("%d deliveries for %s", len(due), ep)
			}
			for i := 1; i < 3; i++ {
				if gap := due[i].Sub(due[i-1]); gap < 99*time.Second {
					t.Fatalf("deliveries %d and %d of %s due %v apart at 0.01/s", i-1, i, ep, gap)
				}
			}
			if last := due[len(due)-1]; last.After(now.Add(11 * time.Minute)) {
				t.Fatalf("a delivery due %v from now; the relay postpones at most 10 min", last.Sub(now))
			}
		}
	})
}

// Issue 9, item 3: one tenant's endpoints that hang used to fill the
// shared queue and every worker, so another tenant's event waited until
// the hanging requests timed out.
func TestHangingReceiversDoNotDelayOtherTenants(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		hang := newHangingReceiver(t)
		for i := range 12 {
			if _, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "evil", URL: fmt.Sprintf("%s/%d", hang.URL, i)}); err != nil {
				t.Fatal(err)
			}
		}
		b.enqueueMany("evil", 100)
		calm := newReceiver(t, nil)
		b.endpoint("calm", calm.URL)
		// Default settings but a long timeout: a hanging request that ends
		// before the calm events arrive would mean they waited for it.
		b.relay(outbox.RelayConfig{Timeout: 40 * time.Second, Lease: 2 * time.Minute})
		b.eventually("hanging requests in flight", func() bool { return hang.started.Load() > 0 })

		const events = 20
		sent := map[string]bool{}
		for range events {
			sent[b.enqueue(outbox.Event{Tenant: "calm", Type: "payment.succeeded", Payload: []byte(`{}`)})] = true
		}
		for len(sent) > 0 {
			select {
			case r := <-calm.got:
				delete(sent, r.Header.Get("Webhook-Id"))
			case <-time.After(waitFor):
				t.Fatalf("%d calm events not delivered beside hanging receivers", len(sent))
			}
		}
		if n := hang.finished.Load(); n != 0 {
			t.Fatalf("calm events arrived only after %d hanging requests ended", n)
		}
		if n := hang.started.Load(); n > int64(outbox.DefaultConcurrency/2) {
			t.Errorf("%d requests to hanging endpoints at once; slow endpoints share at most half the slots", n)
		}
		hang.Release()
	})
}

// A circuit that opens on a failing endpoint sends its backlog back to the
// database; the calm tenant's events keep flowing meanwhile.
func TestOpenCircuitBacklogDoesNotDelayOtherTenants(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		failing := newReceiver(t, func(int, *http.Request) int { return http.StatusInternalServerError })
		b.endpoint("down", failing.URL)
		b.enqueueMany("down", 300)
		calm := newReceiver(t, nil)
		b.endpoint("calm", calm.URL)
		relay := b.relay(outbox.RelayConfig{Retry: fastRetry()})
		b.eventually("circuit opened", func() bool { return relay.Stats().Released > 100 })
		var lat []time.Duration
		for range 20 {
			start := time.Now()
			b.enqueue(outbox.Event{Tenant: "calm", Type: "payment.succeeded", Payload: []byte(`{}`)})
			select {
			case <-calm.got:
				lat = append(lat, time.Since(start))
			case <-time.After(waitFor):
				t.Fatal("calm event not delivered beside an open circuit's backlog")
			}
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		t.Logf("calm commit→receipt: median %v, max %v", lat[len(lat)/2], lat[len(lat)-1])
		if f := len(failing.requests()); f > 100 {
			t.Errorf("%d requests to the failing endpoint; the breaker should have kept them to a few", f)
		}
	})
}

// A tenant's backlog of new events does not hold back other tenants'
// retries or ordered events: the relay keeps them a share of its claims,
// instead of claiming them only once the backlog is gone.
func TestBacklogOfNewEventsLeavesRoomForRetriesAndOrderedEvents(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		const backlog = 1000
		var flooded atomic.Int64
		flood := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			flooded.Add(1)
		}))
		t.Cleanup(flood.Close)
		// The retrying tenant's receiver fails until the backlog is in
		// place; the ordered tenant's answers at once. Each notes how
		// much of the backlog had arrived when its event did.
		var open, failed atomic.Bool
		seen := func() (*httptest.Server, chan int64) {
			at := make(chan int64, 100)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				if !open.Load() {
					failed.Store(true)
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				at <- flooded.Load()
			}))
			t.Cleanup(srv.Close)
			return srv, at
		}
		retrying, retried := seen()
		ordered, orderedAt := seen()
		b.endpoint("flood", flood.URL)
		retryEP := b.endpoint("retrying", retrying.URL)
		b.endpoint("ordered", ordered.URL)

		// The retrying tenant's delivery fails while the outbox is quiet,
		// and waits for its next attempt.
		often := retry.Exponential{Base: 100 * time.Millisecond, Cap: 100 * time.Millisecond, Attempts: 1000}
		first, err := b.ob.NewRelay(outbox.RelayConfig{Retry: often})
		if err != nil {
			t.Fatal(err)
		}
		if err := first.Start(b.ctx); err != nil {
			t.Fatal(err)
		}
		b.enqueue(outbox.Event{Tenant: "retrying", Type: "payment.succeeded", Payload: []byte(`{}`)})
		var due time.Time
		b.eventually("a failed attempt recorded", func() bool {
			page, err := b.ob.EndpointDeliveries(b.ctx, retryEP.ID, "", 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(page.Deliveries) == 1 && page.Deliveries[0].State == outbox.StatePending && page.Deliveries[0].Attempts >= 1 {
				due = page.Deliveries[0].NextAttemptAt
				return true
			}
			return false
		})
		if err := first.Stop(b.ctx); err != nil {
			t.Fatal(err)
		}
		if !failed.Load() {
			t.Fatal("the retrying receiver was never called")
		}

		// A backlog of new events, then an ordered event, are waiting
		// when the retry is due.
		for i := 0; i < backlog; i += 250 {
			evs := make([]outbox.Event, 250)
			for j := range evs {
				evs[j] = payEvent("flood", i+j)
			}
			if _, err := b.many(evs); err != nil {
				t.Fatal(err)
			}
		}
		b.enqueue(outbox.Event{Tenant: "ordered", Type: "payment.succeeded", Payload: []byte(`{}`), OrderingKey: "order-1"})
		b.eventually("the retry due", func() bool { return time.Now().After(due) })
		open.Store(true)

		b.relay(outbox.RelayConfig{BatchSize: 16, Concurrency: 4, Retry: often})
		wait := func(what string, at chan int64) int64 {
			select {
			case n := <-at:
				return n
			case <-time.After(waitFor):
				t.Fatalf("the %s never arrived (%d of the backlog did)", what, flooded.Load())
			}
			return 0
		}
		if n := wait("retry", retried); n >= backlog/2 {
			t.Errorf("the retry arrived after %d of the %d backlogged events", n, backlog)
		}
		if n := wait("ordered event", orderedAt); n >= backlog/2 {
			t.Errorf("the ordered event arrived after %d of the %d backlogged events", n, backlog)
		}
		b.eventually("the whole backlog delivered", func() bool { return flooded.Load() >= backlog })
	})
}
