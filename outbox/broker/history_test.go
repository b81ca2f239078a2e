package broker_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txhook/txhook/dlq"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testob"
	"github.com/txhook/txhook/outbox"
)

// With Config.History on a database of its own, the payment database
// keeps only the events: endpoints, delivery rows, attempts and dead
// letters live in the history database, with copies of the events. There
// the operations work as in table mode: a dead letter replayed, and an
// endpoint's missed events recovered, reach the stream through the
// forwarder and are delivered.
func TestBrokerSeparateHistory(t *testing.T) {
	for _, be := range []testdb.Backend{testdb.SQLiteBackends[0], testdb.PGX, testdb.LibPQ} {
		t.Run(be.Name, func(t *testing.T) {
			t.Parallel()
			pay := setup(t, testdb.Open(t, be))
			histDB := testdb.Open(t, be)
			hist, _ := testob.NewOutboxWith(t, histDB, outbox.Config{Broker: true, Logger: logger(t)})
			pay.cfg.History = hist
			pay.cfg.Relay.Retry = fastRetry(2)

			var failing atomic.Bool
			failing.Store(true)
			var got atomic.Int64
			recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if failing.Load() {
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				got.Add(1)
			}))
			t.Cleanup(recv.Close)
			ep, err := hist.CreateEndpoint(pay.ctx, outbox.NewEndpoint{Tenant: "m", URL: recv.URL})
			if err != nil {
				t.Fatal(err)
			}
			ok := newReceiver(t, 0)
			other, err := hist.CreateEndpoint(pay.ctx, outbox.NewEndpoint{Tenant: "m", URL: ok.srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			pay.forwarder()
			pay.worker()
			ids := pay.enqueue("m", "payment.succeeded", 4)
			testob.Eventually(t, "the healthy endpoint's deliveries", func() bool { return ok.received(ids) })
			q := dlq.New(hist)
			testob.Eventually(t, "four dead letters in the history database", func() bool {
				n, err := q.Count(pay.ctx, dlq.Filter{EndpointID: ep.ID})
				return err == nil && n == 4
			})
			// Nothing of the delivery record is in the payment database.
			var rows int
			if err := pay.db.QueryRow(`SELECT (SELECT count(*) FROM txhook_deliveries) + (SELECT count(*) FROM txhook_attempts) + (SELECT count(*) FROM txhook_dead_letters)`).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			if rows != 0 {
				t.Errorf("%d delivery, attempt or dead-letter rows in the payment database", rows)
			}

			// Replay once the receiver is fixed.
			failing.Store(false)
			n, err := q.ReplayAll(pay.ctx, dlq.Filter{EndpointID: ep.ID})
			if err != nil || n != 4 {
				t.Fatalf("ReplayAll: %d, %v", n, err)
			}
			testob.Eventually(t, "the replayed deliveries", func() bool { return got.Load() == 4 })
			testob.Eventually(t, "no dead letter left", func() bool {
				n, err := q.Count(pay.ctx, dlq.Filter{EndpointID: ep.ID})
				return err == nil && n == 0
			})

			// Events enqueued while the other endpoint is disabled skip it;
			// Recover sends them once it is enabled again.
			if err := hist.DisableEndpoint(pay.ctx, other.ID, "maintenance"); err != nil {
				t.Fatal(err)
			}
			since := time.Now().Add(-time.Second)
			missed := pay.enqueue("m", "payment.succeeded", 3)
			testob.Eventually(t, "the enabled endpoint's deliveries, recorded", func() bool {
				if got.Load() != 7 {
					return false
				}
				var n int
				if err := histDB.QueryRow(rebind(histDB, `SELECT count(*) FROM txhook_deliveries WHERE endpoint_id = ? AND state = 'succeeded'`), ep.ID).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n == 7
			})
			if ok.received(missed[:1]) {
				t.Fatal("a disabled endpoint received an event")
			}
			if err := hist.EnableEndpoint(pay.ctx, other.ID); err != nil {
				t.Fatal(err)
			}
			rn, err := hist.Recover(pay.ctx, other.ID, since)
			if err != nil || rn != 3 {
				t.Fatalf("Recover: %d, %v", rn, err)
			}
			testob.Eventually(t, "the recovered events", func() bool { return ok.received(missed) })
		})
	}
}

// Two forwarders and three workers at once: one forwarder holds the cursor,
// the other stands by and takes over when it stops; every event arrives
// once.
func TestBrokerForwarderTakeover(t *testing.T) {
	testdb.EachPostgres(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db)
		r := newReceiver(t, 0)
		b.endpoint("m", r.srv.URL)
		f1 := b.forwarder()
		first := b.enqueue("m", "payment.succeeded", 5)
		f2 := b.forwarder()
		for range 3 {
			b.worker()
		}
		testob.Eventually(t, "the first events", func() bool { return r.received(first) })
		holder, standby := f1, f2
		if f2.Stats().HoldsCursor {
			holder, standby = f2, f1
		}
		if !holder.Stats().HoldsCursor || standby.Stats().HoldsCursor {
			t.Fatalf("cursor held by both or neither: %+v, %+v", f1.Stats(), f2.Stats())
		}
		if err := holder.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		second := b.enqueue("m", "payment.succeeded", 5)
		testob.Eventually(t, "the events forwarded by the standby", func() bool { return r.received(second) })
		if !standby.Stats().HoldsCursor {
			t.Errorf("standby did not take the cursor: %+v", standby.Stats())
		}
		for _, id := range append(first, second...) {
			if req, _ := r.count(id); req != 1 {
				t.Errorf("event %s: %d requests", id, req)
			}
		}
	})
}

// A payment database whose history lives elsewhere does not grow: the
// forwarder deletes the events it forwarded once they are older than the
// retention of succeeded work; their copies stay in the history database.
func TestBrokerPrunesPaymentDatabase(t *testing.T) {
	for _, be := range []testdb.Backend{testdb.SQLiteBackends[0], testdb.PGX} {
		t.Run(be.Name, func(t *testing.T) {
			t.Parallel()
			pay := setup(t, testdb.Open(t, be))
			histDB := testdb.Open(t, be)
			hist, _ := testob.NewOutboxWith(t, histDB, outbox.Config{Broker: true, Logger: logger(t)})
			pay.cfg.History = hist
			pay.cfg.Relay.Retention = outbox.Retention{Succeeded: time.Millisecond, Interval: 100 * time.Millisecond}
			r := newReceiver(t, 0)
			if _, err := hist.CreateEndpoint(pay.ctx, outbox.NewEndpoint{Tenant: "m", URL: r.srv.URL}); err != nil {
				t.Fatal(err)
			}
			pay.forwarder()
			pay.worker()
			ids := pay.enqueue("m", "payment.succeeded", 10)
			pay.enqueue("nobody", "payment.succeeded", 3) // unrouted
			testob.Eventually(t, "the deliveries", func() bool { return r.received(ids) })
			testob.Eventually(t, "the payment database pruned", func() bool {
				var n int
				if err := pay.db.QueryRow(`SELECT count(*) FROM txhook_events`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n == 0
			})
			var copies int
			if err := histDB.QueryRow(`SELECT count(*) FROM txhook_events`).Scan(&copies); err != nil {
				t.Fatal(err)
			}
			t.Logf("history database keeps %d event copies", copies)
		})
	}
}
