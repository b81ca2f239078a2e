// Package storetest holds the tests every verify.Store must pass, and
// helpers to send signed deliveries. The SQL, memory and Redis stores run
// the same suite.
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txhook/txhook/signer"
	"github.com/txhook/txhook/verify"
)

// Timeout bounds every wait in these tests; generous, for slow CI machines.
const Timeout = 60 * time.Second

// Harness is one store under test.
type Harness struct {
	Store verify.Store
	// Lapse ends the lease of the live claim on id at once (by moving a
	// fake clock past it, or by expiring a Redis key).
	Lapse func(t *testing.T, id string)
}

// Clock is a settable clock for stores that take Now.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock reading the current time.
func NewClock() *Clock { return &Clock{t: time.Now()} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// Lease is the lease the suite claims with; Lapse must end it.
const Lease = time.Minute

// ID returns a fresh event ID, so tests sharing a Redis never collide.
func ID() string { return "evt_" + rand.Text() }

// Run runs the conformance suite; setup returns a fresh harness per subtest.
func Run(t *testing.T, setup func(t *testing.T) Harness) {
	ctx := context.Background()
	claim := func(t *testing.T, s verify.Store, id, token string, want verify.Status) {
		t.Helper()
		got, err := s.Claim(ctx, id, token, Lease)
		if err != nil {
			t.Fatalf("Claim(%s, %s): %v", id, token, err)
		}
		if got != want {
			t.Fatalf("Claim(%s, %s) = %v, want %v", id, token, got, want)
		}
	}
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	t.Run("lifecycle", func(t *testing.T) {
		t.Parallel()
		h, id := setup(t), ID()
		claim(t, h.Store, id, "a", verify.Acquired)
		claim(t, h.Store, id, "b", verify.InProgress)
		must(t, h.Store.Complete(ctx, id, "a"))
		claim(t, h.Store, id, "c", verify.Done)
		must(t, h.Store.Release(ctx, id, "a")) // too late: done stays done
		claim(t, h.Store, id, "d", verify.Done)
		must(t, h.Store.Complete(ctx, id, "a")) // twice is harmless
		claim(t, h.Store, id, "e", verify.Done)
	})
	t.Run("release", func(t *testing.T) {
		t.Parallel()
		h, id := setup(t), ID()
		claim(t, h.Store, id, "a", verify.Acquired)
		must(t, h.Store.Release(ctx, id, "b")) // not the holder
		claim(t, h.Store, id, "c", verify.InProgress)
		must(t, h.Store.Release(ctx, id, "a"))
		claim(t, h.Store, id, "d", verify.Acquired)
		must(t, h.Store.Release(ctx, ID(), "x")) // unknown id
	})
	t.Run("lapse", func(t *testing.T) {
		t.Parallel()
		h, id := setup(t), ID()
		claim(t, h.Store, id, "a", verify.Acquired)
		h.Lapse(t, id)
		claim(t, h.Store, id, "b", verify.Acquired)
		// The first holder wakes up late: its release must not free b's claim.
		must(t, h.Store.Release(ctx, id, "a"))
		claim(t, h.Store, id, "c", verify.InProgress)
		must(t, h.Store.Complete(ctx, id, "b"))
		claim(t, h.Store, id, "c", verify.Done)
	})
	t.Run("complete-unclaimed", func(t *testing.T) {
		t.Parallel()
		h, id := setup(t), ID()
		must(t, h.Store.Complete(ctx, id, "a"))
		claim(t, h.Store, id, "b", verify.Done)
	})
	t.Run("independent-ids", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		id1, id2 := ID(), ID()
		claim(t, h.Store, id1, "a", verify.Acquired)
		claim(t, h.Store, id2, "a", verify.Acquired)
		must(t, h.Store.Complete(ctx, id1, "a"))
		claim(t, h.Store, id2, "b", verify.InProgress)
	})
	t.Run("concurrent-claims", func(t *testing.T) {
		t.Parallel()
		h, id := setup(t), ID()
		const n = 50
		var acquired, inProgress atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				st, err := h.Store.Claim(ctx, id, fmt.Sprint("t", i), Lease)
				switch {
				case err != nil:
					t.Error(err)
				case st == verify.Acquired:
					acquired.Add(1)
				case st == verify.InProgress:
					inProgress.Add(1)
				default:
					t.Errorf("status %v", st)
				}
			})
		}
		close(start)
		wg.Wait()
		if acquired.Load() != 1 || inProgress.Load() != n-1 {
			t.Fatalf("acquired %d, in progress %d; want 1 and %d", acquired.Load(), inProgress.Load(), n-1)
		}
	})
	t.Run("middleware-50-concurrent", func(t *testing.T) {
		t.Parallel()
		Concurrent(t, setup(t).Store)
	})
}

// Concurrent sends 50 deliveries of one event at once through the
// middleware with st. The handler blocks until every other delivery has
// been answered, so they all overlap its run; it must run exactly once,
// and every other delivery must get 409 (in progress) or 200 (done).
func Concurrent(t *testing.T, st verify.Store) {
	const n = 50
	secret, err := signer.GenerateSecret()
	if err != nil {
		t.Fatal(err)
	}
	v, err := verify.New(verify.Config{Secrets: []string{secret}, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	var entered atomic.Int32
	prog := &progress{changed: make(chan struct{})}
	srv := httptest.NewServer(v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered.Add(1)
		prog.add()
		// With dedup broken, several handlers are in here and the count
		// still reaches n, so the test fails on the count, not a timeout.
		if !prog.wait(n, Timeout) {
			t.Errorf("handler: only %d deliveries answered or running after %s", prog.get(), Timeout)
		}
		io.WriteString(w, "processed")
	})))
	defer srv.Close()

	id := ID()
	body := Envelope(id, "payment.succeeded", `{"amount":100}`)
	codes := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			defer prog.add()
			codes[i] = Post(t, srv.Client(), srv.URL, Sign(t, secret, id, time.Now(), body))
		})
	}
	wg.Wait()
	count := map[int]int{}
	for _, c := range codes {
		count[c]++
	}
	if got := entered.Load(); got != 1 {
		t.Fatalf("handler ran %d times, want 1 (status counts %v)", got, count)
	}
	if count[http.StatusOK]+count[http.StatusConflict] != n || count[http.StatusOK] < 1 {
		t.Fatalf("status counts %v; want only 200 and 409, at least one 200", count)
	}
	// After the handler finished, a retry is a harmless duplicate.
	if c := Post(t, srv.Client(), srv.URL, Sign(t, secret, id, time.Now(), body)); c != http.StatusOK {
		t.Fatalf("retry after done: status %d, want 200", c)
	}
	if got := entered.Load(); got != 1 {
		t.Fatalf("handler ran %d times after the retry, want 1", got)
	}
}

// progress counts events and lets goroutines wait for a count.
type progress struct {
	mu      sync.Mutex
	n       int
	changed chan struct{}
}

func (p *progress) add() {
	p.mu.Lock()
	p.n++
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

func (p *progress) get() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

func (p *progress) wait(n int, timeout time.Duration) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		ok, ch := p.n >= n, p.changed
		p.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-deadline.C:
			return false
		}
	}
}

// Envelope returns the body txhook's sender sends.
func Envelope(id, typ, data string) []byte {
	return fmt.Appendf(nil, `{"id":%q,"type":%q,"timestamp":"2026-01-02T03:04:05.000000Z","data":%s}`, id, typ, data)
}

// Delivery is a signed request's headers and body.
type Delivery struct {
	Header http.Header
	Body   []byte
}

// Sign signs body as delivery id at ts with the Standard scheme.
func Sign(t testing.TB, secret, id string, ts time.Time, body []byte, more ...string) Delivery {
	t.Helper()
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Webhook-Event-Type", "payment.succeeded")
	if err := (signer.Standard{}).Sign(h, id, ts, body, append([]string{secret}, more...)); err != nil {
		t.Fatal(err)
	}
	return Delivery{Header: h, Body: body}
}

// Post sends d to url and returns the status (0 after a transport error,
// which it reports).
func Post(t testing.TB, c *http.Client, url string, d Delivery) int {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(d.Body))
	if err != nil {
		t.Error(err)
		return 0
	}
	for k, v := range d.Header {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Error(err)
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}
