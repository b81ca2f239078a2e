package broker_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testob"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/broker"
	"github.com/txhook/txhook/retry"
)

// A hostile tenant with a backlog for a receiver that hangs past the
// timeout, one limited to 1 request/s and one that always fails, beside a
// calm tenant: the calm tenant's events all arrive while the throttled
// endpoint has had few of its requests, the hanging receiver never has
// more requests at once than its share, and the consumer's unacknowledged
// messages stay within what the worker can hold (deliveries that must
// wait go back to the stream as scheduled messages).
func TestBrokerIsolation(t *testing.T) {
	testdb.EachPostgres(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db)
		b.cfg.Relay = outbox.RelayConfig{Concurrency: 8, BatchSize: 20, Timeout: time.Second, Lease: 10 * time.Second,
			Retry: retry.Exponential{Base: time.Minute, Attempts: 3}}

		var hangNow, hangMax atomic.Int64
		hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// The server notices the client hanging up only once the body
			// is read.
			_, _ = io.Copy(io.Discard, r.Body)
			n := hangNow.Add(1)
			defer hangNow.Add(-1)
			for {
				m := hangMax.Load()
				if n <= m || hangMax.CompareAndSwap(m, n) {
					break
				}
			}
			<-r.Context().Done()
		}))
		t.Cleanup(hang.Close)
		var throttled atomic.Int64
		slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { throttled.Add(1) }))
		t.Cleanup(slow.Close)
		failing := testob.Receiver(t, http.StatusInternalServerError)
		calm := newReceiver(t, 0)

		b.endpoint("evil", hang.URL, "hang.*")
		if _, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "evil", URL: slow.URL, EventTypes: []string{"slow.*"},
			Limits: outbox.Limits{RatePerSecond: 1, Burst: 1}}); err != nil {
			t.Fatal(err)
		}
		b.endpoint("evil", failing, "fail.*")
		b.endpoint("calm", calm.srv.URL)

		b.enqueueMany("evil", "hang.x", 100)
		b.enqueueMany("evil", "slow.x", 100)
		b.enqueueMany("evil", "fail.x", 100)
		b.forwarder()
		w := b.worker()

		stop := make(chan struct{})
		var maxPending atomic.Int64
		var sampler sync.WaitGroup
		sampler.Add(1)
		go func() {
			defer sampler.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				st, err := b.js.Stream(context.Background(), broker.DefaultStream)
				if err != nil {
					continue
				}
				c, err := st.Consumer(context.Background(), "txhook-workers")
				if err != nil {
					continue
				}
				if n := int64(c.CachedInfo().NumAckPending); n > maxPending.Load() {
					maxPending.Store(n)
				}
			}
		}()
		var calmIDs []string
		for i := 0; i < 5; i++ {
			calmIDs = append(calmIDs, b.enqueue("calm", "payment.succeeded", 10)...)
			time.Sleep(100 * time.Millisecond)
		}
		testob.Eventually(t, "the calm tenant's events", func() bool { return calm.received(calmIDs) })
		close(stop)
		sampler.Wait()
		n := throttled.Load()
		t.Logf("calm tenant done: throttled endpoint had %d requests, hanging receiver at most %d at once, consumer ack pending at most %d; worker %+v",
			n, hangMax.Load(), maxPending.Load(), w.Stats())
		if n > 30 {
			t.Errorf("the calm tenant waited for %d requests of the endpoint limited to 1/s", n)
		}
		if hangMax.Load() > 4 {
			t.Errorf("%d requests at once to the hanging receiver; slow endpoints share half of 8 slots", hangMax.Load())
		}
		if limit := int64(8 + 20 + 20); maxPending.Load() > limit {
			t.Errorf("consumer had %d unacknowledged messages; the worker holds at most %d", maxPending.Load(), limit)
		}
	})
}

// enqueueMany enqueues n events of one type in one transaction.
func (b *bundle) enqueueMany(tenant, typ string, n int) {
	b.t.Helper()
	tx, err := b.db.BeginTx(b.ctx, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	evs := make([]outbox.Event, n)
	for i := range evs {
		evs[i] = outbox.Event{Tenant: tenant, Type: typ, Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))}
	}
	if _, err := b.ob.EnqueueMany(b.ctx, tx, evs); err != nil {
		b.t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		b.t.Fatal(err)
	}
}
