package outbox_test

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// Issue 25 §1: an endpoint's limits and circuit hold for the endpoint
// across every relay process sharing the database, not per process.

// fleetReceiver counts, per path, the requests that arrive in each 100 ms
// and the requests it has under way at once.
type fleetReceiver struct {
	*httptest.Server
	delay map[string]time.Duration
	fail  map[string]func() bool // answer 503 when it returns true

	mu       sync.Mutex
	start    time.Time
	buckets  map[string]map[int]int // path → 100 ms slot since start → requests
	inflight map[string]int
	peak     map[string]int
	total    map[string]int
	arrivals map[string][]time.Time
}

func newFleetReceiver(t *testing.T) *fleetReceiver {
	f := &fleetReceiver{delay: map[string]time.Duration{}, fail: map[string]func() bool{}, start: time.Now(),
		buckets: map[string]map[int]int{}, inflight: map[string]int{}, peak: map[string]int{}, total: map[string]int{},
		arrivals: map[string][]time.Time{}}
	f.Server = httptest.NewServer(f)
	t.Cleanup(f.Close)
	return f
}

func (f *fleetReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	p := r.URL.Path
	now := time.Now()
	f.mu.Lock()
	if f.buckets[p] == nil {
		f.buckets[p] = map[int]int{}
	}
	f.buckets[p][int(now.Sub(f.start)/(100*time.Millisecond))]++
	f.inflight[p]++
	f.peak[p] = max(f.peak[p], f.inflight[p])
	f.total[p]++
	f.arrivals[p] = append(f.arrivals[p], now)
	d, fail := f.delay[p], f.fail[p]
	f.mu.Unlock()
	if d > 0 {
		time.Sleep(d)
	}
	f.mu.Lock()
	f.inflight[p]--
	f.mu.Unlock()
	if fail != nil && fail() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// maxPerSecond is the most requests to path in any ten consecutive
// 100 ms slots.
func (f *fleetReceiver) maxPerSecond(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.buckets[path]
	var slots []int
	for s := range b {
		slots = append(slots, s)
	}
	sort.Ints(slots)
	best := 0
	for _, s := range slots {
		n := 0
		for i := s; i < s+10; i++ {
			n += b[i]
		}
		best = max(best, n)
	}
	return best
}

func (f *fleetReceiver) stats(path string) (total, peak int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.total[path], f.peak[path]
}

// arrivalSlack is how many requests beyond rate + burst the receiver may
// count in one second. The gates hand out at most rate + burst tokens in
// any second (internal/store's gate tests check that exactly); the
// receiver counts arrivals, which the time between a relay's token and
// its request reaching the receiver can bunch: a relay process starved of
// CPU for a moment (the race detector, a load average of 8 in CI) sends
// the requests it was granted late, beside another relay's on time. CI
// saw 14 in a second once (2 relays); 3 allows 300 ms of such bunching at
// 10/s. Limits kept per relay process, as before, gave 18-26 with two
// relays and more with four, so the tests still fail on them.
const arrivalSlack = 3

// TestLimitsHoldAcrossRelayProcesses: one, two and four relay processes
// (real subprocesses) send to an endpoint limited to 10 requests/s with a
// burst of 2, and to one limited to 2 in flight that answers slowly.
// Over any second the first gets at most 12 requests (as the relays send
// them; see arrivalSlack), and the second
// never has more than 2 under way, however many relays send. Each relay
// claims 10 deliveries at a time, so that they share the backlog: with
// limits per relay process, each sent as much as the limit allows.
func TestLimitsHoldAcrossRelayProcesses(t *testing.T) {
	testdb.EachPostgres(t, func(t *testing.T, base *testdb.DB) {
		for _, n := range []int{1, 2, 4} {
			t.Run(fmt.Sprintf("%d-relays", n), func(t *testing.T) {
				db := testdb.Open(t, base.Backend) // a schema of its own
				b := setup(t, db, outbox.Config{})
				recv := newFleetReceiver(t)
				recv.delay["/slow"] = 100 * time.Millisecond
				const rate, burst, maxInFlight, events = 10, 2, 2, 50
				if _, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "rated", URL: recv.URL + "/rated",
					Limits: outbox.Limits{RatePerSecond: rate, Burst: burst}}); err != nil {
					t.Fatal(err)
				}
				if _, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "slow", URL: recv.URL + "/slow",
					Limits: outbox.Limits{MaxInFlight: maxInFlight}}); err != nil {
					t.Fatal(err)
				}
				var children []*child
				for i := range n {
					children = append(children, startRelayProcess(t, db, fmt.Sprintf("fleet-%d", i), 30*time.Second, 10*time.Second, 8, "TXHOOK_CHILD_BATCH=10"))
				}
				b.enqueueMany("rated", events)
				b.enqueueMany("slow", events)
				b.eventually("every delivery succeeded", func() bool {
					return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded'") == 2*events
				})
				for _, c := range children {
					c.terminate(t)
				}
				if got := recv.maxPerSecond("/rated"); got > rate+burst+arrivalSlack {
					t.Errorf("%d relays: %d requests in one second to an endpoint limited to %d/s with a burst of %d", n, got, rate, burst)
				}
				if total, peak := recv.stats("/slow"); peak > maxInFlight || total < events {
					t.Errorf("%d relays: %d requests in flight at once (of %d) to an endpoint limited to %d", n, peak, total, maxInFlight)
				}
				t.Logf("%d relays: most requests in a second %d (limit %d + burst %d); most in flight %d (cap %d)",
					n, recv.maxPerSecond("/rated"), rate, burst, func() int { _, p := recv.stats("/slow"); return p }(), maxInFlight)
			})
		}
	})
}

// TestLimitsHoldAcrossRelaysOnSQLite: SQLite serves one process; the
// relays it runs share the endpoint's limits through the same tables.
func TestLimitsHoldAcrossRelaysOnSQLite(t *testing.T) {
	db := testdb.SQLite(t)
	b := setup(t, db, outbox.Config{})
	recv := newFleetReceiver(t)
	recv.delay["/slow"] = 100 * time.Millisecond
	const rate, burst, maxInFlight, events = 10, 2, 2, 30
	if _, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "rated", URL: recv.URL + "/rated",
		Limits: outbox.Limits{RatePerSecond: rate, Burst: burst}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "slow", URL: recv.URL + "/slow",
		Limits: outbox.Limits{MaxInFlight: maxInFlight}}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		b.relay(outbox.RelayConfig{Concurrency: 8, EndpointConcurrency: 8, BatchSize: 10})
	}
	b.enqueueMany("rated", events)
	b.enqueueMany("slow", events)
	b.eventually("every delivery succeeded", func() bool {
		return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded'") == 2*events
	})
	if got := recv.maxPerSecond("/rated"); got > rate+burst+arrivalSlack {
		t.Errorf("%d requests in one second to an endpoint limited to %d/s with a burst of %d", got, rate, burst)
	}
	if _, peak := recv.stats("/slow"); peak > maxInFlight {
		t.Errorf("%d requests in flight at once to an endpoint limited to %d", peak, maxInFlight)
	}
}

// TestCircuitOpenedByOneRelayStopsTheOthers: a relay process opens the
// circuit of a receiver that is down (five faults in a row); relay
// processes that start afterwards, and new events for the receiver, send
// it nothing for the rest of the cooldown. With a breaker per relay, each
// new relay found out by failing five times itself.
func TestCircuitOpenedByOneRelayStopsTheOthers(t *testing.T) {
	testdb.EachPostgres(t, func(t *testing.T, db *testdb.DB) {
		const cooldown = 20 * time.Second
		b := setup(t, db, outbox.Config{})
		recv := newFleetReceiver(t)
		recv.fail["/down"] = func() bool { return true }
		if _, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "down", URL: recv.URL + "/down"}); err != nil {
			t.Fatal(err)
		}
		env := []string{"TXHOOK_CHILD_COOLDOWN=" + cooldown.String(), "TXHOOK_CHILD_RETRY_BASE=" + cooldown.String(), "TXHOOK_CHILD_ATTEMPTS=20"}
		first := startRelayProcess(t, db, "first", 30*time.Second, 10*time.Second, 4, env...)
		b.enqueueMany("down", outbox.DefaultBreakerThreshold)
		b.eventually("the first relay's faults", func() bool {
			n, _ := recv.stats("/down")
			return n >= outbox.DefaultBreakerThreshold
		})
		opened := time.Now() // at the latest: the fifth fault was being answered
		// The first relay's circuit is open now: the other relays start,
		// and new events come.
		var others []*child
		for _, id := range []string{"second", "third"} {
			others = append(others, startRelayProcess(t, db, id, 30*time.Second, 10*time.Second, 4, env...))
		}
		b.enqueueMany("down", 4)
		b.eventually("the new events dispatched", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries") == outbox.DefaultBreakerThreshold+4
		})
		end := opened.Add(cooldown - 2*time.Second)
		if time.Until(end) < 5*time.Second {
			t.Fatalf("the relays took %v to start; the test needs a cooldown longer than that", time.Since(opened))
		}
		for time.Now().Before(end) {
			if n, _ := recv.stats("/down"); n > outbox.DefaultBreakerThreshold {
				t.Fatalf("%d requests to a receiver whose circuit one relay opened %v ago, cooldown %v: the others did not stop",
					n, time.Since(opened).Round(time.Millisecond), cooldown)
			}
			time.Sleep(20 * time.Millisecond) // a negative check: it must watch for the window
		}
		for _, c := range append(others, first) {
			c.terminate(t)
		}
	})
}

// TestSharedCircuitToleratesRandomFailures: a receiver that fails one
// request in three, at random, through three relays sharing its circuit
// (50 ms cooldown, doubling up to the default 10 minutes while probes
// fail): the circuit opens now and then (five faults in a row across the
// relays), a probe closes it again, and every delivery arrives. A fault
// of a request that was not the probe must not reopen a half-open
// circuit: with relays that send without asking (no limits), the
// cooldown would double at each such fault and stall the endpoint for
// minutes.
func TestSharedCircuitToleratesRandomFailures(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		recv := newFleetReceiver(t)
		var mu sync.Mutex
		rng := rand.New(rand.NewPCG(1, 2))
		recv.fail["/flaky"] = func() bool {
			mu.Lock()
			defer mu.Unlock()
			return rng.IntN(3) == 0
		}
		if _, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "flaky", URL: recv.URL + "/flaky"}); err != nil {
			t.Fatal(err)
		}
		const events = 150
		var relays []*outbox.Relay
		for range 3 {
			relays = append(relays, b.relay(outbox.RelayConfig{Retry: fastRetry(), BreakerCooldown: 50 * time.Millisecond}))
		}
		b.enqueueMany("flaky", events)
		deadline := time.Now().Add(waitFor)
		for b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded'") != events {
			if time.Now().After(deadline) {
				var failures int
				var openUntil, blocked store_time
				_ = db.QueryRowContext(b.ctx, "SELECT failures, open_until, blocked_until FROM txhook_endpoint_gates").Scan(&failures, &openUntil, &blocked)
				rows, _ := db.QueryContext(b.ctx, "SELECT state, attempts, next_attempt_at, coalesce(lease_owner, '') FROM txhook_deliveries WHERE state <> 'succeeded'")
				for rows != nil && rows.Next() {
					var st, owner string
					var n int
					var next store_time
					rows.Scan(&st, &n, &next, &owner)
					t.Logf("left: %s, %d attempts, due %v, owner %s", st, n, next.Time, owner)
				}
				if rows != nil {
					rows.Close()
				}
				for i, r := range relays {
					t.Logf("relay %d: %+v", i, r.Stats())
				}
				total, _ := recv.stats("/flaky")
				t.Fatalf("%d of %d deliveries succeeded; %d requests; gate: %d faults, open until %v, blocked until %v (now %v); relays %+v, %+v, %+v",
					b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded'"), events, total, failures, openUntil.Time, blocked.Time, time.Now().UTC(),
					relays[0].Stats(), relays[1].Stats(), relays[2].Stats())
			}
			time.Sleep(5 * time.Millisecond)
		}
		total, _ := recv.stats("/flaky")
		t.Logf("%d requests for %d deliveries; relays %+v, %+v, %+v", total, events, relays[0].Stats(), relays[1].Stats(), relays[2].Stats())
	})
}

// TestBlockedEndpointsAreNotClaimedOverAndOver (issue 25 §5): a backlog
// for an endpoint whose requests hang is claimed once, and what cannot
// start is handed back once; claims then skip the endpoint until its
// request ends. Before, each hand-back came due again within
// milliseconds while the first request was out (the relay waits for an
// endpoint's first answer before it paces it), and was claimed and handed
// back again, round after round: a write each, paid by every tenant.
func TestBlockedEndpointsAreNotClaimedOverAndOver(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		release := make(chan struct{})
		started := make(chan struct{}, 100)
		hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			started <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}))
		t.Cleanup(hang.Close)
		b.endpoint("hanging", hang.URL)
		const backlog = 50
		b.enqueueMany("hanging", backlog)
		relay := b.relay(outbox.RelayConfig{Timeout: 20 * time.Second, Lease: time.Minute})
		t.Cleanup(func() { close(release) }) // first: the relay's Stop waits for the request
		select {
		case <-started:
		case <-time.After(waitFor):
			t.Fatal("no request reached the hanging receiver")
		}
		// Three seconds while the request hangs: the relay's first
		// hand-backs come due after 50 ms, 100 ms, 200 ms … (twice how
		// long the request has been out), so a relay that claims them
		// again does so several times within them.
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			if st := relay.Stats(); st.Released > backlog {
				t.Fatalf("%d hand-backs of a backlog of %d while its endpoint's first request hangs: claimed over and over (stats %+v)",
					st.Released, backlog, st)
			}
			time.Sleep(20 * time.Millisecond) // a negative check: it must watch for the window
		}
		t.Logf("stats after 3 s: %+v", relay.Stats())
	})
}
