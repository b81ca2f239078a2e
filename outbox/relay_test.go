package outbox_test

import (
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txhook/txhook/dlq"
	"github.com/txhook/txhook/internal/clock"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/retry"
)

// lockedRand is a seeded source safe for the relay's concurrent use.
func lockedRand(seed uint64) func() float64 {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, seed))
	return func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Float64()
	}
}

func TestFailingEndpointFollowsScheduleThenDeadLetterThenReplay(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
		fake := clock.NewFake(start)
		b := setup(t, db, outbox.Config{Clock: fake})
		var healthy atomic.Bool
		rc := newReceiver(t, func(n int, r *http.Request) int {
			if healthy.Load() {
				return http.StatusOK
			}
			return http.StatusInternalServerError
		})
		ep := b.endpoint("m", rc.URL)
		policy := retry.Default()
		policy.Rand = lockedRand(7)
		var deadNotices atomic.Int32
		relay := b.relay(outbox.RelayConfig{Retry: policy, OnDeadLetter: func(n outbox.DeadLetterNotice) {
			if n.EndpointID == ep.ID && n.Attempts == 9 && n.LastStatus == 500 {
				deadNotices.Add(1)
			}
		}})
		id := b.enqueue(outbox.Event{Tenant: "m", Type: "payment.failed", Payload: []byte(`{"n":1}`)})

		for attempt := 1; attempt <= 9; attempt++ {
			b.eventually("attempt recorded", func() bool {
				return b.count("SELECT count(*) FROM txhook_attempt_log") == attempt
			})
			if attempt == 9 {
				break
			}
			var state string
			var next store_time
			if err := db.QueryRowContext(b.ctx, "SELECT state, next_attempt_at FROM txhook_deliveries").Scan(&state, &next); err != nil {
				t.Fatal(err)
			}
			if state != "pending" {
				t.Fatalf("after attempt %d state = %s, want pending", attempt, state)
			}
			fake.Set(next.Time)
		}
		b.eventually("dead letter", func() bool {
			return b.count("SELECT count(*) FROM txhook_dead_letters") == 1
		})
		if n := b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'dead' AND attempts = 9"); n != 1 {
			t.Fatalf("dead deliveries with 9 attempts = %d", n)
		}
		b.eventually("dead-letter callback", func() bool { return deadNotices.Load() == 1 })

		// The gaps between attempt starts follow the schedule within ±25%.
		rows, err := db.QueryContext(b.ctx, "SELECT started_at FROM txhook_attempt_log ORDER BY attempt")
		if err != nil {
			t.Fatal(err)
		}
		var starts []time.Time
		for rows.Next() {
			var s store_time
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			starts = append(starts, s.Time)
		}
		rows.Close()
		offsets := retry.Default().Offsets
		if len(starts) != 9 {
			t.Fatalf("%d attempts", len(starts))
		}
		if !starts[0].Equal(start) {
			t.Fatalf("first attempt at %v, want T+0 (%v)", starts[0], start)
		}
		for i := 1; i < 9; i++ {
			gap := starts[i].Sub(starts[i-1])
			want := offsets[i] - offsets[i-1]
			if gap < want*3/4-time.Millisecond || gap > want*5/4+time.Millisecond {
				t.Errorf("gap before attempt %d = %v, want %v ±25%%", i+1, gap, want)
			}
		}
		reqs := rc.requests()
		if len(reqs) != 9 {
			t.Fatalf("receiver saw %d requests, want 9", len(reqs))
		}
		for _, r := range reqs {
			if r.Header.Get("Webhook-Id") != id {
				t.Fatalf("attempt carried id %q, want %q", r.Header.Get("Webhook-Id"), id)
			}
		}

		// The receiver recovers; an operator replays the dead letter.
		healthy.Store(true)
		q := dlq.New(b.ob)
		page, err := q.List(b.ctx, dlq.Filter{Tenant: "m"}, "", 10)
		if err != nil || len(page.Entries) != 1 {
			t.Fatalf("list: %v %+v", err, page)
		}
		e := page.Entries[0]
		if e.EventID != id || e.LastStatus != 500 || e.Attempts != 9 || e.EndpointID != ep.ID {
			t.Fatalf("dead letter %+v", e)
		}
		detail, err := q.Get(b.ctx, e.DeliveryID)
		if err != nil || len(detail.Attempts) != 9 || string(detail.Payload) != `{"n":1}` {
			t.Fatalf("detail %v %+v", err, detail)
		}
		if _, err := q.Replay(b.ctx, e.DeliveryID); err != nil {
			t.Fatal(err)
		}
		// The endpoint's circuit opened after its failures: the replay
		// waits, spending no attempt, until the cooldown is over. The
		// circuit is shared by the relays (its gate row, migration 012),
		// whose claims skip the endpoint's deliveries while it is open:
		// the replay stays due where it is, unclaimed, or if a claim took
		// it first, goes back behind the cooldown.
		if n := b.count("SELECT count(*) FROM txhook_endpoint_gates WHERE endpoint_id = ? AND open_until > ?", ep.ID, b.ts(fake.Now())); n != 1 {
			t.Fatal("the endpoint's shared circuit is not open after its failures")
		}
		polls := relay.Stats().Polls
		b.eventually("the relay looks for due deliveries twice after the replay", func() bool { return relay.Stats().Polls >= polls+2 })
		if n := b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'pending' AND attempts = 0"); n != 1 {
			t.Fatalf("%d replayed deliveries waiting unspent, want 1", n)
		}
		if n := len(rc.requests()); n != 9 {
			t.Fatalf("%d requests; the replay was sent through the open circuit", n)
		}
		fake.Advance(outbox.DefaultBreakerMaxCooldown)
		b.eventually("replayed delivery succeeded", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded'") == 1
		})
		reqs = rc.requests()
		if len(reqs) != 10 {
			rows, _ := db.QueryContext(b.ctx, "SELECT delivery_id, attempt, coalesce(status, 0), error FROM txhook_attempt_log ORDER BY id")
			for rows.Next() {
				var d, a, st int
				var e string
				rows.Scan(&d, &a, &st, &e)
				t.Logf("attempt d=%d a=%d status=%d err=%s", d, a, st, e)
			}
			rows.Close()
			ds, _ := b.ob.EventDeliveries(b.ctx, id)
			t.Logf("deliveries %+v", ds)
		}
		if len(reqs) != 10 || reqs[9].Header.Get("Webhook-Id") != id {
			t.Fatalf("replay: %d requests, last id %q, want %q", len(reqs), reqs[len(reqs)-1].Header.Get("Webhook-Id"), id)
		}
		if string(reqs[9].Body) != string(reqs[0].Body) {
			t.Fatalf("replayed body differs:\n%s\n%s", reqs[9].Body, reqs[0].Body)
		}
		if n, _ := q.Count(b.ctx, dlq.Filter{}); n != 0 {
			t.Fatalf("dead letters after replay = %d", n)
		}
	})
}

func TestRetryAfterIsHonouredWithinBounds(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
		fake := clock.NewFake(start)
		b := setup(t, db, outbox.Config{Clock: fake})
		rc := newReceiver(t, func(n int, r *http.Request) int { return http.StatusOK })
		hints := map[string]string{"/soon": "1", "/later": "120", "/forever": "99999999", "/date": start.Add(300 * time.Second).Format(http.TimeFormat)}
		statuses := map[string]int{"/soon": 429, "/later": 503, "/forever": 429, "/date": 503, "/ignored": 500}
		rc.status = func(n int, r *http.Request) int { return statuses[r.URL.Path] }
		hinted := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if h, ok := hints[r.URL.Path]; ok {
				w.Header().Set("Retry-After", h)
			}
			if r.URL.Path == "/ignored" {
				w.Header().Set("Retry-After", "600") // not 429 or 503: the policy decides
			}
			w.WriteHeader(statuses[r.URL.Path])
		}))
		t.Cleanup(hinted.Close)
		policy := retry.Default()
		policy.Jitter = 0
		b.relay(outbox.RelayConfig{Retry: policy, MaxRetryAfter: time.Hour})
		want := map[string]time.Duration{
			"/soon":    10 * time.Second,  // never sooner than the policy
			"/later":   120 * time.Second, // the receiver's wish
			"/forever": time.Hour,         // capped by MaxRetryAfter
			"/date":    300 * time.Second, // an HTTP-date works too
			"/ignored": 10 * time.Second,
		}
		eps := map[string]string{}
		for path := range want {
			tenant := strings.TrimPrefix(path, "/")
			eps[b.endpoint(tenant, hinted.URL+path).ID] = path
			b.enqueue(outbox.Event{Tenant: tenant, Type: "a", Payload: []byte(`{}`)})
		}
		b.eventually("first attempts recorded", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'pending' AND attempts = 1") == len(want)
		})
		rows, err := db.QueryContext(b.ctx, "SELECT endpoint_id, next_attempt_at FROM txhook_deliveries")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var id string
			var next store_time
			if err := rows.Scan(&id, &next); err != nil {
				t.Fatal(err)
			}
			if got := next.Sub(start); got != want[eps[id]] {
				t.Errorf("%s: next attempt after %v, want %v", eps[id], got, want[eps[id]])
			}
		}
	})
}
