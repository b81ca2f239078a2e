package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/clock"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/retry"
)

// What a spanReceiver does with a request.
const (
	answerHang = -1 // hold the request until the sender gives up on it
	answerDrop = -2 // close the connection without answering
)

// spanReceiver is a receiver that records, per delivery (the request's
// path, one per endpoint, with its webhook-id), when each request started
// and ended as its handler saw it: a request the sender cut ends when the
// handler observes its context cancelled. A request that starts while an
// earlier one of the same delivery is still open is an overlap: the one
// thing a lease and a retry schedule exist to prevent.
type spanReceiver struct {
	now func() time.Time
	// answer picks what to do with the n-th request (1-based) of a
	// delivery: an HTTP status, answerHang or answerDrop.
	answer func(r *http.Request, n int) int

	mu       sync.Mutex
	open     map[string]int
	spans    map[string][]reqSpan
	overlaps []string
	ended    int
	arrived  chan string // the key of every request, as it starts (if not nil)
}

type reqSpan struct {
	start, end time.Time
	relay      string // the sending relay process, when it says (headerRelay)
	answer     int
}

func newSpanReceiver(now func() time.Time, answer func(r *http.Request, n int) int) *spanReceiver {
	return &spanReceiver{now: now, answer: answer, open: map[string]int{}, spans: map[string][]reqSpan{}}
}

func (s *spanReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Path + " " + r.Header.Get(outbox.HeaderEventID)
	s.mu.Lock()
	start := s.now()
	s.open[key]++
	if s.open[key] > 1 {
		prev := s.spans[key][len(s.spans[key])-1]
		s.overlaps = append(s.overlaps, fmt.Sprintf("%s: a request from %q started while one from %q (started %s before) was open",
			key, r.Header.Get(headerRelay), prev.relay, start.Sub(prev.start)))
	}
	i := len(s.spans[key])
	s.spans[key] = append(s.spans[key], reqSpan{start: start, relay: r.Header.Get(headerRelay)})
	arrived := s.arrived
	s.mu.Unlock()
	if arrived != nil {
		arrived <- key
	}
	_, _ = io.Copy(io.Discard, r.Body)
	answer := s.answer(r, i+1)
	defer func() {
		s.mu.Lock()
		s.open[key]--
		s.spans[key][i].end, s.spans[key][i].answer = s.now(), answer
		s.ended++
		s.mu.Unlock()
	}()
	switch answer {
	case answerHang:
		<-r.Context().Done()
	case answerDrop:
		panic(http.ErrAbortHandler)
	default:
		w.WriteHeader(answer)
	}
}

// endedCount is how many requests have ended.
func (s *spanReceiver) endedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

// of returns the requests of the delivery with key, in order.
func (s *spanReceiver) of(key string) []reqSpan {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]reqSpan(nil), s.spans[key]...)
}

// check fails t on every overlap and on every request that started sooner
// than minGap after the previous one of its delivery ended; it returns
// the number of requests and the smallest gap seen (between two requests
// of a delivery).
func (s *spanReceiver) check(t *testing.T, minGap time.Duration) (int, time.Duration) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.overlaps {
		t.Errorf("in flight twice at once: %s", o)
	}
	keys := make([]string, 0, len(s.spans))
	for k := range s.spans {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	n, smallest, short := 0, time.Duration(-1), 0
	for _, k := range keys {
		sp := s.spans[k]
		n += len(sp)
		for i := 1; i < len(sp); i++ {
			gap := sp[i].start.Sub(sp[i-1].end)
			if smallest < 0 || gap < smallest {
				smallest = gap
			}
			if gap < minGap {
				if short++; short <= 10 {
					t.Errorf("%s: request %d (%q) started %v after request %d (%q, answered %d) ended, want at least %v",
						k, i+1, sp[i].relay, gap, i, sp[i-1].relay, sp[i-1].answer, minGap)
				}
			}
		}
	}
	if short > 10 {
		t.Errorf("… %d requests in all started too soon", short)
	}
	return n, smallest
}

func newHTTPServer(t *testing.T, h http.Handler) *httptest.Server {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// A receiver that works longer than the relay waits (here, 2 s of the
// fake clock, then it hangs until the relay's timeout cuts the request)
// gets the retry policy's whole delay from the end of each attempt, not
// from its start: counted from the start, every attempt that outlasts the
// next delay was retried at once, while the receiver might still be
// working on the request it had. A Retry-After hint still counts from the
// response.
func TestRetryDelayCountsFromTheAttemptsEnd(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		fake := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
		b := setup(t, db, outbox.Config{Clock: fake})
		const work = 2 * time.Second // of the fake clock, at every request
		rc := newSpanReceiver(fake.Now, func(r *http.Request, n int) int {
			fake.Advance(work)
			switch {
			case strings.HasSuffix(r.URL.Path, "/busy") && n == 3:
				return http.StatusServiceUnavailable // with Retry-After: 30
			case n <= 3:
				return answerHang
			}
			return http.StatusNoContent
		})
		srv := newHTTPServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/busy") {
				w.Header().Set("Retry-After", "30")
			}
			rc.ServeHTTP(w, r)
		}))
		policy := retry.Exponential{Base: 250 * time.Millisecond, Factor: 2, Attempts: 5}
		// The relay's timeout is real time: it cuts the hanging requests
		// quickly, while the fake clock says each took 2 s.
		b.relay(outbox.RelayConfig{Retry: policy, Timeout: 300 * time.Millisecond, ConnectTimeout: time.Minute,
			Lease: 5 * time.Minute, Concurrency: 1})

		for _, path := range []string{"/slow", "/busy"} {
			rc.mu.Lock()
			before := rc.ended
			rc.mu.Unlock()
			ep := b.endpoint(strings.TrimPrefix(path, "/"), srv.URL+path)
			id := b.enqueue(outbox.Event{Tenant: ep.Tenant, Type: "payment.succeeded", Payload: []byte(`{"n":1}`)})
			key := path + " " + id
			for attempt := 1; attempt <= 3; attempt++ {
				b.eventually(fmt.Sprintf("%s: attempt %d recorded", path, attempt), func() bool {
					return b.count("SELECT count(*) FROM txhook_attempt_log WHERE endpoint_id = ?", ep.ID) >= attempt &&
						rc.endedCount() >= before+attempt
				})
				var next store_time
				if err := db.QueryRowContext(b.ctx, b.rebind("SELECT next_attempt_at FROM txhook_deliveries WHERE endpoint_id = ? AND state = 'pending'"), ep.ID).Scan(&next); err != nil {
					t.Fatalf("%s: after attempt %d: %v (on the code before this test, the retry was due at once and already claimed)", path, attempt, err)
				}
				sp := rc.of(key)
				end := sp[len(sp)-1].end
				want, _ := policy.Next(attempt)
				if path == "/busy" && attempt == 3 {
					want = 30 * time.Second
				}
				if got := next.Sub(end); got != want {
					t.Errorf("%s: attempt %d ended at %v; next attempt %v later, want %v", path, attempt, end.Format(time.StampMilli), got, want)
				}
				fake.Set(next.Time)
			}
			b.eventually(path+": delivered", func() bool {
				return b.count("SELECT count(*) FROM txhook_deliveries WHERE endpoint_id = ? AND state = 'succeeded'", ep.ID) == 1
			})
		}
		// As the receiver saw it: never two requests of a delivery at once,
		// and between them at least the shortest delay of the policy.
		first, _ := policy.Next(1)
		if n, _ := rc.check(t, first); n != 8 {
			t.Errorf("the receiver saw %d requests, want 8", n)
		}
	})
}

// A relay whose worker stalls after the claim (a Catalog converter, or a
// Cipher asking a key service, that takes longer than the lease) must not
// send when it wakes: meanwhile the lease lapsed and another relay took
// the delivery over, and that relay's request is still open at the
// receiver. The request is checked again against the lease just before it
// is sent, and cut at the lease's safety margin whatever delayed it.
func TestStalledDeliveryIsNotSentAfterItsLease(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		stalled, release := make(chan struct{}), make(chan struct{})
		var stallOnce, releaseOnce sync.Once
		free := func() { releaseOnce.Do(func() { close(release) }) }
		cat := outbox.NewCatalog()
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		must(cat.Register(outbox.EventType{Name: "payment.succeeded", Versions: []outbox.SchemaVersion{{Version: 1}, {Version: 2}}}))
		must(cat.AddConverter("payment.succeeded", 1, 2, func(d json.RawMessage) (json.RawMessage, error) {
			first := false
			stallOnce.Do(func() { first = true })
			if first { // the first relay's first attempt
				close(stalled)
				<-release
			}
			return d, nil
		}))
		var logs logBuffer
		b := setup(t, db, outbox.Config{Catalog: cat, Logger: logs.logger()})
		rc := newSpanReceiver(time.Now, func(r *http.Request, n int) int {
			if n == 1 {
				return answerHang
			}
			return http.StatusNoContent
		})
		rc.arrived = make(chan string, 16)
		srv := newHTTPServer(t, rc)
		ep, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m", URL: srv.URL, Versions: map[string]int{"payment.succeeded": 2}})
		must(err)
		// Lease 8 s: a request starts within 4.4 s of its claim (room for a
		// loaded machine: with 4 s, and 1.2 s to start in, the test failed
		// once at load average 16) and is over by 6.4 s; the stalled
		// worker wakes after 8 s at the earliest.
		cfg := outbox.RelayConfig{Lease: 8 * time.Second, Timeout: 2 * time.Second, PollInterval: 20 * time.Millisecond,
			Retry: retry.Exponential{Base: 100 * time.Millisecond, Attempts: 5}}
		// The first relay claims once, when the enqueue wakes it, so that
		// the other takes the lapsed lease over.
		stallCfg := cfg
		stallCfg.ID, stallCfg.PollInterval = "stalls", time.Hour
		stalls, err := b.ob.NewRelay(stallCfg)
		must(err)
		outbox.SetPollFloor(stalls, time.Hour)
		must(stalls.Start(b.ctx))
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := stalls.Stop(ctx); err != nil {
				t.Errorf("relay stop: %v", err)
			}
		})
		t.Cleanup(free) // runs before the relays stop, should the test end early
		b.eventually("the first relay's first look", func() bool { return stalls.Stats().Polls > 0 })
		id := b.enqueue(outbox.Event{Tenant: "m", Type: "payment.succeeded", Version: 1, Payload: []byte(`{"n":1}`)})
		select {
		case <-stalled:
		case <-time.After(waitFor):
			t.Fatal("the relay never prepared the delivery")
		}
		// Once the lease lapses, the other relay takes the delivery over and
		// sends it; the receiver holds that request. Now the stalled worker
		// wakes.
		cfg.ID = "other"
		other := b.relay(cfg)
		select {
		case <-rc.arrived:
		case <-time.After(waitFor):
			t.Fatal("the lapsed lease was never taken over")
		}
		free()
		b.eventually("delivered", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries WHERE endpoint_id = ? AND state = 'succeeded'", ep.ID) == 1
		})
		rc.check(t, 0)
		if sp := rc.of("/ " + id); len(sp) != 2 {
			t.Errorf("the receiver saw %d requests, want 2 (the taken-over one, cut at its timeout, and its retry)", len(sp))
		}
		if !strings.Contains(logs.String(), "given back unsent") {
			t.Errorf("the stalled relay did not say why it gave the delivery back:\n%s", logs.String())
		}
		if a, o := stalls.Stats(), other.Stats(); a.Succeeded+o.Succeeded != 1 {
			t.Errorf("%d attempts succeeded, want 1:\n%+v\n%+v", a.Succeeded+o.Succeeded, a, o)
		}
	})
}
