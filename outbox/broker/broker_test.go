package broker_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txhook/txhook/internal/natstest"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testob"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/broker"
	"github.com/txhook/txhook/retry"
	"github.com/txhook/txhook/verify"
)

// bundle is a broker-mode outbox on a test database, an embedded JetStream
// server and the Config that joins them.
type bundle struct {
	t   *testing.T
	db  *testdb.DB
	ob  *outbox.Outbox
	ctx context.Context
	srv *natstest.Server
	js  jetstream.JetStream
	cfg broker.Config
}

func logger(t *testing.T) *slog.Logger {
	if os.Getenv("TXHOOK_TEST_VERBOSE") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func setup(t *testing.T, db *testdb.DB) *bundle {
	t.Helper()
	ob, ctx := testob.NewOutboxWith(t, db, outbox.Config{Broker: true, Logger: logger(t)})
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	return &bundle{t: t, db: db, ob: ob, ctx: ctx, srv: srv, js: js, cfg: broker.Config{
		JetStream: js,
		Relay:     outbox.RelayConfig{Retry: fastRetry(5), Timeout: 2 * time.Second, Lease: 15 * time.Second, BreakerThreshold: -1},
		Logger:    logger(t),
	}}
}

func fastRetry(attempts int) retry.Policy {
	return retry.Exponential{Base: 300 * time.Millisecond, Cap: time.Second, Attempts: attempts}
}

func (b *bundle) forwarder() *broker.Forwarder {
	b.t.Helper()
	f, err := broker.NewForwarder(b.ob, b.cfg)
	if err != nil {
		b.t.Fatal(err)
	}
	if err := f.Start(b.ctx); err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { _ = f.Stop(context.Background()) })
	return f
}

func (b *bundle) worker() *outbox.Relay {
	b.t.Helper()
	w, err := broker.NewWorker(b.ob, b.cfg)
	if err != nil {
		b.t.Fatal(err)
	}
	if err := w.Start(b.ctx); err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = w.Stop(ctx)
	})
	return w
}

func (b *bundle) endpoint(tenant, url string, types ...string) outbox.Endpoint {
	b.t.Helper()
	ep, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: tenant, URL: url, EventTypes: types})
	if err != nil {
		b.t.Fatal(err)
	}
	return ep
}

func (b *bundle) enqueue(tenant, typ string, n int) []string {
	b.t.Helper()
	var ids []string
	for i := 0; i < n; i++ {
		tx, err := b.db.BeginTx(b.ctx, nil)
		if err != nil {
			b.t.Fatal(err)
		}
		id, err := b.ob.Enqueue(b.ctx, tx, outbox.Event{Tenant: tenant, Type: typ, Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))})
		if err != nil {
			_ = tx.Rollback()
			b.t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			b.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// receiver verifies every request with the endpoint's secret and counts,
// per event ID, the requests and those answered 2xx; fail says how many
// first requests of each event fail with 500.
type receiver struct {
	mu       sync.Mutex
	requests map[string]int
	ok       map[string]int
	bad      int
	fail     int
	v        *verify.Verifier
	srv      *httptest.Server
}

func newReceiver(t *testing.T, fail int) *receiver {
	r := &receiver{requests: map[string]int{}, ok: map[string]int{}, fail: fail}
	r.srv = httptest.NewServer(r)
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) secret(t *testing.T, ep outbox.Endpoint) {
	v, err := verify.New(verify.Config{Secrets: []string{ep.Secrets[0].Value}})
	if err != nil {
		t.Fatal(err)
	}
	r.v = v
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	id := req.Header.Get("Webhook-Id")
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.v != nil {
		if _, err := r.v.Verify(req.Header, body); err != nil {
			r.bad++
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
	}
	r.requests[id]++
	if r.requests[id] <= r.fail {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	r.ok[id]++
	w.WriteHeader(http.StatusOK)
}

func (r *receiver) received(ids []string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		if r.ok[id] == 0 {
			return false
		}
	}
	return true
}

func (r *receiver) count(id string) (requests, ok int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests[id], r.ok[id]
}

// deliveryStates returns the state and attempts of each event's delivery
// to the endpoint.
func deliveryStates(t *testing.T, db *testdb.DB, endpointID string) map[string][2]any {
	t.Helper()
	rows, err := db.Query(rebind(db, `SELECT event_id, state, attempts FROM txhook_deliveries WHERE endpoint_id = ?`), endpointID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string][2]any{}
	for rows.Next() {
		var ev, state string
		var attempts int
		if err := rows.Scan(&ev, &state, &attempts); err != nil {
			t.Fatal(err)
		}
		if _, dup := out[ev]; dup {
			t.Errorf("two delivery rows for event %s", ev)
		}
		out[ev] = [2]any{state, attempts}
	}
	return out
}

func rebind(db *testdb.DB, q string) string {
	if !db.Backend.Postgres() {
		return q
	}
	n := 0
	var b strings.Builder
	for _, c := range q {
		if c == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

// Events enqueued in broker mode reach every subscribed endpoint through
// JetStream, signed as in table mode, and each delivery leaves one row
// with its outcome; a receiver that fails twice gets the event on the
// third attempt, each retry a scheduled message.
func TestBrokerDeliversAndRecords(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db)
		okRecv := newReceiver(t, 0)
		flaky := newReceiver(t, 2)
		epOK := b.endpoint("merchant_a", okRecv.srv.URL, "payment.*")
		okRecv.secret(t, epOK)
		epFlaky := b.endpoint("merchant_b", flaky.srv.URL)
		flaky.secret(t, epFlaky)
		b.endpoint("merchant_a", okRecv.srv.URL, "refund.*") // not subscribed to payment.*

		f := b.forwarder()
		b.worker()
		a := b.enqueue("merchant_a", "payment.succeeded", 20)
		bb := b.enqueue("merchant_b", "payment.succeeded", 5)
		unrouted := b.enqueue("merchant_c", "payment.succeeded", 2)

		testob.Eventually(t, "merchant_a's events", func() bool { return okRecv.received(a) })
		testob.Eventually(t, "merchant_b's events after two failures each", func() bool { return flaky.received(bb) })
		for _, id := range a {
			if req, ok := okRecv.count(id); req != 1 || ok != 1 {
				t.Errorf("event %s: %d requests, %d ok", id, req, ok)
			}
		}
		for _, id := range bb {
			if req, ok := flaky.count(id); req != 3 || ok != 1 {
				t.Errorf("event %s: %d requests, %d ok; want 3 and 1", id, req, ok)
			}
		}
		if okRecv.bad+flaky.bad > 0 {
			t.Errorf("%d requests failed verification", okRecv.bad+flaky.bad)
		}
		testob.Eventually(t, "the delivery rows", func() bool {
			states := deliveryStates(t, db, epFlaky.ID)
			n := 0
			for _, s := range states {
				if s[0] == "succeeded" && s[1] == 3 {
					n++
				}
			}
			return n == len(bb) && len(deliveryStates(t, db, epOK.ID)) == len(a)
		})
		// Each retry left an attempt record.
		var failed int
		if err := db.QueryRow(rebind(db, `SELECT count(*) FROM txhook_attempt_log WHERE endpoint_id = ? AND error <> ''`), epFlaky.ID).Scan(&failed); err != nil {
			t.Fatal(err)
		}
		if failed != 2*len(bb) {
			t.Errorf("%d failed attempts recorded, want %d", failed, 2*len(bb))
		}
		st := f.Stats()
		if st.Events < uint64(len(a)+len(bb)+len(unrouted)) || st.Unrouted < uint64(len(unrouted)) {
			t.Errorf("forwarder stats %+v", st)
		}
	})
}
