package outbox_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// guarded is a receiver that records how hard it is pushed: requests in
// flight at once and arrival times once it is up.
type guarded struct {
	up        atomic.Bool
	mu        sync.Mutex
	inflight  int
	peak      int
	arrivals  []time.Time // successful ones
	seen      map[string]bool
	failures  int
	allIn     chan struct{}
	want      int
	closeOnce sync.Once
}

func (g *guarded) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	g.mu.Lock()
	g.inflight++
	g.peak = max(g.peak, g.inflight)
	g.mu.Unlock()
	// Some work, so concurrent requests overlap.
	time.Sleep(2 * time.Millisecond)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inflight--
	if !g.up.Load() {
		g.failures++
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	g.arrivals = append(g.arrivals, time.Now())
	g.seen[r.Header.Get("Webhook-Id")] = true
	if len(g.seen) == g.want {
		g.closeOnce.Do(func() { close(g.allIn) })
	}
	w.WriteHeader(http.StatusNoContent)
}

func TestRecoveringEndpointIsNeverFlooded(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		const n = 2000
		const rate, burst, inFlight = 1000.0, 20, 4
		g := &guarded{seen: map[string]bool{}, allIn: make(chan struct{}), want: n}
		srv := httptest.NewServer(g)
		t.Cleanup(srv.Close)
		if _, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m", URL: srv.URL,
			Limits: outbox.Limits{RatePerSecond: rate, Burst: burst, MaxInFlight: inFlight}}); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i += 200 {
			tx, err := db.BeginTx(b.ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			for k := i; k < i+200; k++ {
				if _, err := b.ob.Enqueue(b.ctx, tx, outbox.Event{Tenant: "m", Type: "a", Payload: []byte(strconv.Itoa(k))}); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		relay := b.relay(outbox.RelayConfig{Concurrency: 32, Retry: fastRetry(),
			BreakerThreshold: 5, BreakerCooldown: 50 * time.Millisecond, BreakerMaxCooldown: 200 * time.Millisecond})
		// Down for a while: the circuit opens and deliveries wait unspent.
		b.eventually("circuit opened", func() bool { return relay.Stats().Released > 100 })
		g.up.Store(true)
		// Wait while events keep arriving, however slowly a loaded machine
		// runs them; a stall of waitFor fails. (Fatal must not hold g.mu:
		// the server's Close would wait for handlers blocked on it.)
		last, lastAt := -1, time.Now()
	wait:
		for {
			select {
			case <-g.allIn:
				break wait
			case <-time.After(time.Second):
			}
			g.mu.Lock()
			got := len(g.seen)
			g.mu.Unlock()
			if got != last {
				last, lastAt = got, time.Now()
			} else if time.Since(lastAt) > waitFor {
				t.Fatalf("only %d of %d events arrived, none in the last %s", got, n, waitFor)
			}
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.peak > inFlight {
			t.Errorf("receiver saw %d requests at once, limit %d", g.peak, inFlight)
		}
		// No second-long window holds more than the rate plus the burst
		// (with 10% for timer granularity).
		arr := append([]time.Time(nil), g.arrivals...)
		sort.Slice(arr, func(i, j int) bool { return arr[i].Before(arr[j]) })
		worst := 0
		for i, j := 0, 0; i < len(arr); i++ {
			for j < len(arr) && arr[j].Sub(arr[i]) < time.Second {
				j++
			}
			worst = max(worst, j-i)
		}
		if limit := int(rate*1.1) + burst; worst > limit {
			t.Errorf("%d requests within one second, limit %d", worst, limit)
		}
		// While it was down, the breaker kept failed attempts to a few
		// probes instead of one per due delivery.
		if g.failures > 300 {
			t.Errorf("%d failed requests while the endpoint was down", g.failures)
		}
		t.Logf("peak in flight %d, busiest second %d, failed requests while down %d", g.peak, worst, g.failures)
	})
}

// keyedReceiver checks, per ordering key, that events arrive one at a
// time and in order, failing some requests at random to force retries.
type keyedReceiver struct {
	mu         sync.Mutex
	inflight   map[string]int
	next       map[string]int // next sequence number expected per key
	violations []string
	done       int
	want       int
	allDone    chan struct{}
	violated   chan struct{} // closed at the first violation
	failRate   float64
}

func (k *keyedReceiver) violate(format string, args ...any) {
	if len(k.violations) == 0 {
		close(k.violated)
	}
	k.violations = append(k.violations, fmt.Sprintf(format, args...))
}

func (k *keyedReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var env struct {
		Data struct {
			Key string `json:"key"`
			Seq int    `json:"seq"`
		} `json:"data"`
	}
	json.Unmarshal(body, &env)
	key, seq := env.Data.Key, env.Data.Seq
	k.mu.Lock()
	k.inflight[key]++
	if k.inflight[key] > 1 {
		k.violate("%s: two requests in flight", key)
	}
	if seq != k.next[key] {
		k.violate("%s: got %d, expected %d", key, seq, k.next[key])
	}
	fail := rand.Float64() < k.failRate
	k.mu.Unlock()
	time.Sleep(time.Millisecond)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.inflight[key]--
	if fail {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if seq == k.next[key] {
		k.next[key]++
		k.done++
		if k.done == k.want {
			close(k.allDone)
		}
	}
	w.WriteHeader(http.StatusOK)
}

// enqueueKeyed enqueues rounds events for each of keys keys, round by
// round, each in its own transaction.
func enqueueKeyed(b *bundle, keys, rounds int) {
	for seq := range rounds {
		for k := range keys {
			b.enqueue(outbox.Event{Tenant: "m", Type: "payment.updated", OrderingKey: fmt.Sprintf("pay_%d", k),
				Payload: []byte(fmt.Sprintf(`{"key":"pay_%d","seq":%d}`, k, seq))})
		}
	}
}

func newKeyedReceiver(t *testing.T, b *bundle, want int) *keyedReceiver {
	k := &keyedReceiver{inflight: map[string]int{}, next: map[string]int{}, want: want,
		allDone: make(chan struct{}), violated: make(chan struct{}), failRate: 0.2}
	srv := httptest.NewServer(k)
	t.Cleanup(srv.Close)
	b.endpoint("m", srv.URL)
	return k
}

func (k *keyedReceiver) wait(t *testing.T) {
	t.Helper()
	select {
	case <-k.allDone:
	case <-k.violated:
	case <-time.After(waitFor):
		k.mu.Lock()
		t.Fatalf("only %d of %d ordered events delivered", k.done, k.want)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.violations) > 0 {
		t.Fatalf("%d order violations, first: %s", len(k.violations), k.violations[0])
	}
}

func TestOrderedDeliveryPerKey(t *testing.T) {
	testdb.Each(t, orderedPerKey)
}

// orderedPerKey: two relays in one process deliver each key's events in
// order, one at a time.
func orderedPerKey(t *testing.T, db *testdb.DB) {
	b := setup(t, db, outbox.Config{})
	const keys, rounds = 8, 15
	k := newKeyedReceiver(t, b, keys*rounds)
	// Two relays in this process, and unkeyed traffic alongside.
	b.relay(outbox.RelayConfig{Retry: fastRetry(), BreakerThreshold: -1})
	b.relay(outbox.RelayConfig{Retry: fastRetry(), BreakerThreshold: -1})
	other := newReceiver(t, nil)
	b.endpoint("n", other.URL)
	for i := range 20 {
		b.enqueue(outbox.Event{Tenant: "n", Type: "x", Payload: []byte(strconv.Itoa(i))})
	}
	enqueueKeyed(b, keys, rounds)
	k.wait(t)
	b.eventually("unkeyed traffic delivered", func() bool { return len(other.requests()) == 20 })
	if n := b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'blocked'"); n != 0 {
		t.Fatalf("%d deliveries still blocked", n)
	}
}

func TestOrderedDeliveryAcrossRelayProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts subprocesses")
	}
	for _, be := range testdb.PostgresBackends {
		t.Run(be.Name, func(t *testing.T) { orderedAcrossProcesses(t, testdb.Open(t, be)) })
	}
}

// orderedAcrossProcesses: three relay processes deliver each key's events
// in order.
func orderedAcrossProcesses(t *testing.T, db *testdb.DB) {
	b := setup(t, db, outbox.Config{})
	const keys, rounds = 20, 30
	k := newKeyedReceiver(t, b, keys*rounds)
	for i := range 3 {
		startRelayProcess(t, db, fmt.Sprintf("ordered-%d", i), 30*time.Second, 5*time.Second, 8, "TXHOOK_CHILD_FAST_RETRY=1")
	}
	enqueueKeyed(b, keys, rounds)
	k.wait(t)
}

func TestDeadLetterUnblocksTheNextOfItsKey(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		var got []int
		var mu sync.Mutex
		poison := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var env struct {
				Data struct{ Seq int } `json:"data"`
			}
			json.NewDecoder(r.Body).Decode(&env)
			if env.Data.Seq == 1 {
				w.WriteHeader(http.StatusUnprocessableEntity) // this one never succeeds
				return
			}
			mu.Lock()
			got = append(got, env.Data.Seq)
			mu.Unlock()
		}))
		t.Cleanup(poison.Close)
		b.endpoint("m", poison.URL)
		b.relay(outbox.RelayConfig{Retry: fastRetryAttempts(3)})
		for seq := range 4 {
			b.enqueue(outbox.Event{Tenant: "m", Type: "a", OrderingKey: "k", Payload: []byte(fmt.Sprintf(`{"seq":%d}`, seq))})
		}
		b.eventually("all settled", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries WHERE state IN ('succeeded', 'dead')") == 4
		})
		mu.Lock()
		defer mu.Unlock()
		if fmt.Sprint(got) != "[0 2 3]" {
			t.Fatalf("received %v, want [0 2 3] (1 dead-lettered, the rest in order)", got)
		}
		if n := b.count("SELECT count(*) FROM txhook_dead_letters"); n != 1 {
			t.Fatalf("dead letters %d", n)
		}
	})
}

func TestPinnedVersionsAreConverted(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		cat := outbox.NewCatalog()
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		must(cat.Register(outbox.EventType{Name: "payment.succeeded", Description: "A payment went through.", Versions: []outbox.SchemaVersion{
			{Version: 1, Example: json.RawMessage(`{"amount_cents":1200}`)},
			{Version: 2, Description: "amount with its currency", Example: json.RawMessage(`{"amount":{"value":1200,"currency":"usd"}}`)},
		}}))
		must(cat.AddConverter("payment.succeeded", 2, 1, func(d json.RawMessage) (json.RawMessage, error) {
			var v struct{ Amount struct{ Value int } }
			if err := json.Unmarshal(d, &v); err != nil {
				return nil, err
			}
			return json.RawMessage(fmt.Sprintf(`{"amount_cents":%d}`, v.Amount.Value)), nil
		}))
		must(cat.Register(outbox.EventType{Name: "refund.created", Versions: []outbox.SchemaVersion{{Version: 1}, {Version: 2}}}))
		b := setup(t, db, outbox.Config{Catalog: cat})

		rc := newReceiver(t, nil)
		old, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m", URL: rc.URL + "/old", Versions: map[string]int{"payment.succeeded": 1, "refund.created": 1}})
		must(err)
		b.endpoint("m", rc.URL+"/new")
		if _, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m", URL: rc.URL, Versions: map[string]int{"payment.succeeded": 3}}); !errors.Is(err, outbox.ErrUnknownEventType) {
			t.Fatalf("pinning a version the catalog lacks: %v", err)
		}
		for _, ev := range []outbox.Event{
			{Tenant: "m", Type: "unknown.type", Payload: []byte(`{}`)},
			{Tenant: "m", Type: "payment.succeeded", Version: 3, Payload: []byte(`{}`)},
		} {
			tx, _ := db.BeginTx(b.ctx, nil)
			if _, err := b.ob.Enqueue(b.ctx, tx, ev); !errors.Is(err, outbox.ErrUnknownEventType) {
				t.Errorf("enqueue %s v%d: %v", ev.Type, ev.Version, err)
			}
			tx.Rollback()
		}
		if names := cat.Types(); len(names) != 2 || names[0].Name != "payment.succeeded" || len(names[0].Versions) != 2 {
			t.Fatalf("catalog types %+v", names)
		}

		b.relay(outbox.RelayConfig{Retry: fastRetryAttempts(2)})
		b.enqueue(outbox.Event{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"amount":{"value":1200,"currency":"usd"}}`)})
		bodies := map[string]received{}
		for range 2 {
			got := rc.next(t)
			var env struct{ Type string }
			json.Unmarshal(got.Body, &env)
			bodies[got.Header.Get(outbox.HeaderEventVersion)] = got
		}
		if v1 := string(bodies["1"].Body); !strings.Contains(v1, `"version":1`) || !strings.Contains(v1, `"data":{"amount_cents":1200}`) {
			t.Errorf("pinned endpoint got %s", v1)
		}
		if v2 := string(bodies["2"].Body); !strings.Contains(v2, `"version":2`) || !strings.Contains(v2, `"data":{"amount":{"value":1200,"currency":"usd"}}`) {
			t.Errorf("unpinned endpoint got %s", v2)
		}

		// No converter from refund.created 2 to 1: the pinned endpoint's
		// attempts fail with the reason, the other endpoint gets version 2.
		b.enqueue(outbox.Event{Tenant: "m", Type: "refund.created", Payload: []byte(`{"id":"re_1"}`)})
		<-rc.got
		b.eventually("conversion failure recorded", func() bool {
			return b.count("SELECT count(*) FROM txhook_dead_letters WHERE endpoint_id = ? AND last_error LIKE '%no converter%'", old.ID) == 1
		})
	})
}
