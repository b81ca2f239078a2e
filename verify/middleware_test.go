package verify_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/signer"
	"github.com/txhook/txhook/verify"
	"github.com/txhook/txhook/verify/internal/storetest"
)

// Every malformed request gets its status and a short reason, and never
// reaches the handler; neither responses nor logs show a secret or the
// signatures.
func TestMiddlewareRejects(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *verify.Config) { c.MaxBodyBytes = 1000 }, nil)
	otherSecret, _ := signer.GenerateSecret()
	body := storetest.Envelope("evt_1", "payment.succeeded", `{"amount":100}`)

	cases := []struct {
		name   string
		make   func() (http.Header, io.Reader)
		status int
		reason string
	}{
		{"missing webhook-id", mod(t, b, body, func(h http.Header) { h.Del("Webhook-Id") }), 401, "missing signature header"},
		{"missing webhook-timestamp", mod(t, b, body, func(h http.Header) { h.Del("Webhook-Timestamp") }), 401, "missing signature header"},
		{"missing webhook-signature", mod(t, b, body, func(h http.Header) { h.Del("Webhook-Signature") }), 401, "missing signature header"},
		{"no headers at all", func() (http.Header, io.Reader) { return nil, bytes.NewReader(body) }, 401, "missing signature header"},
		{"signature without version", mod(t, b, body, func(h http.Header) { h.Set("Webhook-Signature", "garbage") }), 401, "malformed signature header"},
		{"timestamp not a number", mod(t, b, body, func(h http.Header) { h.Set("Webhook-Timestamp", "1e9") }), 401, "malformed signature header"},
		{"two ids", mod(t, b, body, func(h http.Header) { h.Add("Webhook-Id", "evt_2") }), 401, "malformed signature header"},
		{"id with a dot", mod(t, b, body, func(h http.Header) { h.Set("Webhook-Id", "evt.1") }), 401, "malformed signature header"},
		{"undecodable signature", mod(t, b, body, func(h http.Header) { h.Set("Webhook-Signature", "v1,!!!!") }), 401, "no matching signature"},
		{"wrong secret", func() (http.Header, io.Reader) {
			d := storetest.Sign(t, otherSecret, "evt_1", b.clk.Now(), body)
			return d.Header, bytes.NewReader(body)
		}, 401, "no matching signature"},
		{"tampered body", func() (http.Header, io.Reader) {
			d := b.sign(t, "evt_1", "payment.succeeded")
			return d.Header, bytes.NewReader(bytes.Replace(d.Body, []byte("100"), []byte("900"), 1))
		}, 401, "no matching signature"},
		{"stale", func() (http.Header, io.Reader) {
			d := storetest.Sign(t, b.secret, "evt_1", b.clk.Now().Add(-6*time.Minute), body)
			return d.Header, bytes.NewReader(body)
		}, 401, "timestamp too old"},
		{"from the future", func() (http.Header, io.Reader) {
			d := storetest.Sign(t, b.secret, "evt_1", b.clk.Now().Add(6*time.Minute), body)
			return d.Header, bytes.NewReader(body)
		}, 401, "timestamp too new"},
		{"non-JSON body, signed", signed(t, b, []byte("amount=100")), 400, "body is not a webhook event"},
		{"non-JSON body, unsigned", func() (http.Header, io.Reader) {
			d := b.sign(t, "evt_1", "payment.succeeded")
			return d.Header, strings.NewReader("amount=100")
		}, 401, "no matching signature"},
		{"empty body, signed", signed(t, b, nil), 400, "body is not a webhook event"},
		{"JSON without a type", signed(t, b, []byte(`{"id":"evt_1","data":{}}`)), 400, "body is not a webhook event"},
		{"oversized", signed(t, b, storetest.Envelope("evt_1", "t", `"`+strings.Repeat("x", 1000)+`"`)), 413, "body too large"},
		{"oversized without Content-Length", func() (http.Header, io.Reader) {
			h, r := signed(t, b, storetest.Envelope("evt_1", "t", `"`+strings.Repeat("x", 1000)+`"`))()
			return h, io.MultiReader(r) // hides the length: chunked
		}, 413, "body too large"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, r := c.make()
			sig := h.Get("Webhook-Signature")
			code, text := post(t, b.srv.URL, h, r)
			if code != c.status || text != c.reason {
				t.Errorf("%d %q, want %d %q", code, text, c.status, c.reason)
			}
			if strings.Contains(text, b.secret) || (len(sig) > 4 && strings.Contains(text, sig[3:])) {
				t.Errorf("response shows a secret or signature: %q", text)
			}
		})
	}
	if n := b.calls.Load(); n != 0 {
		t.Fatalf("handler ran %d times", n)
	}
	// The control: the same receiver takes a good request.
	b.expect(t, b.sign(t, "evt_ok", "payment.succeeded"), 200, 1)

	logs := b.logs.String()
	if !strings.Contains(logs, "timestamp too old") {
		t.Errorf("rejections not logged:\n%s", logs)
	}
	if strings.Contains(logs, b.secret) || strings.Contains(logs, strings.TrimPrefix(b.secret, "whsec_")) ||
		strings.Contains(logs, "v1,") {
		t.Errorf("logs show a secret or signature:\n%s", logs)
	}
}

// mod returns a request maker: body signed by b, then headers changed by f.
func mod(t *testing.T, b *bundle, body []byte, f func(http.Header)) func() (http.Header, io.Reader) {
	return func() (http.Header, io.Reader) {
		d := storetest.Sign(t, b.secret, "evt_1", b.clk.Now(), body)
		f(d.Header)
		return d.Header, bytes.NewReader(body)
	}
}

// signed returns a request maker for body signed by b.
func signed(t *testing.T, b *bundle, body []byte) func() (http.Header, io.Reader) {
	return func() (http.Header, io.Reader) {
		d := storetest.Sign(t, b.secret, "evt_1", b.clk.Now(), body)
		return d.Header, bytes.NewReader(body)
	}
}

// The handler sees the verified event and can read the body again.
func TestMiddlewareEvent(t *testing.T) {
	t.Parallel()
	var got verify.Event
	var read []byte
	b := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
		var ok bool
		if got, ok = verify.EventFrom(r.Context()); !ok {
			t.Error("no event in the context")
		}
		read, _ = io.ReadAll(r.Body)
	})
	d := b.sign(t, "evt_42", "payment.refunded")
	b.expect(t, d, 200, 1)
	if got.ID != "evt_42" || got.Type != "payment.refunded" || string(got.Data) != `{"amount":100}` ||
		!bytes.Equal(got.Body, d.Body) || got.Timestamp.IsZero() || got.SignedAt.Unix() != b.clk.Now().Unix() {
		t.Fatalf("event %+v", got)
	}
	if !bytes.Equal(read, d.Body) {
		t.Fatalf("r.Body = %q", read)
	}
	if _, ok := verify.EventFrom(t.Context()); ok {
		t.Fatal("EventFrom outside the middleware")
	}
}

// A replay inside the tolerance is a harmless duplicate; outside it is
// rejected.
func TestMiddlewareReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	d := b.sign(t, "evt_1", "payment.succeeded")
	b.expect(t, d, 200, 1)
	b.clk.Advance(4*time.Minute + 59*time.Second)
	if text := b.expect(t, d, 200, 1); text != "duplicate" {
		t.Fatalf("replay within the tolerance: %q", text)
	}
	b.clk.Advance(2 * time.Second)
	if text := b.expect(t, d, 401, 1); text != "timestamp too old" {
		t.Fatalf("replay after the tolerance: %q", text)
	}
}

// Types outside Config.Types get 200 and leave no trace in the store.
func TestMiddlewareTypes(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *verify.Config) { c.Types = []string{"payment.succeeded", "payment.failed"} }, nil)
	if text := b.expect(t, b.sign(t, "evt_1", "refund.created"), 200, 0); text != "ignored" {
		t.Fatalf("%q", text)
	}
	b.expect(t, b.sign(t, "evt_2", "payment.failed"), 200, 1)
	// Types are filtered only after verification.
	d := b.sign(t, "evt_3", "refund.created")
	d.Header.Set("Webhook-Timestamp", "1")
	b.expect(t, d, 401, 1)
}

// A handler that answers non-2xx releases the claim: the retry processes
// the event.
func TestMiddlewareHandlerFailure(t *testing.T) {
	t.Parallel()
	statuses := []int{500, 503, 400, 200, 200}
	var b *bundle
	b = setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(statuses[b.calls.Load()-1])
	})
	d := b.sign(t, "evt_1", "payment.succeeded")
	b.expect(t, d, 500, 1)
	b.expect(t, d, 503, 2)
	b.expect(t, d, 400, 3)
	b.expect(t, d, 200, 4)
	b.expect(t, d, 200, 4) // duplicate
	if !strings.Contains(b.logs.String(), "claim released") {
		t.Errorf("release not logged:\n%s", b.logs.String())
	}
}

// A panicking handler releases the claim, and the panic goes on to
// net/http as before.
func TestMiddlewarePanic(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	panics := true
	h := b.v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.calls.Add(1)
		if panics {
			panic(http.ErrAbortHandler)
		}
	}))
	d := b.sign(t, "evt_1", "payment.succeeded")
	serve := func() (code int, p any) {
		defer func() { p = recover() }()
		req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(d.Body))
		req.Header = d.Header.Clone()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, nil
	}
	if _, p := serve(); p != http.ErrAbortHandler {
		t.Fatalf("recovered %v, want the handler's panic", p)
	}
	panics = false
	if code, _ := serve(); code != 200 || b.calls.Load() != 2 {
		t.Fatalf("retry after panic: %d, %d calls", code, b.calls.Load())
	}
	if code, _ := serve(); code != 200 || b.calls.Load() != 2 {
		t.Fatalf("duplicate: %d, %d calls", code, b.calls.Load())
	}
}

// Asynchronous handlers: 202 at once; retries get 409 until the work ends;
// done(err) lets a retry in again, done(nil) makes it a duplicate.
func TestMiddlewareAsync(t *testing.T) {
	t.Parallel()
	dones := make(chan func(error), 10)
	b := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
		dones <- verify.Async(r.Context())
	})
	d := b.sign(t, "evt_1", "payment.succeeded")
	b.expect(t, d, 202, 1)
	done := <-dones
	if text := b.expect(t, d, 409, 1); text != "in progress" {
		t.Fatalf("%q", text)
	}
	done(errors.New("worker failed"))
	b.expect(t, d, 202, 2)
	done2 := <-dones
	done2(nil)
	done2(errors.New("ignored: done counts once"))
	done(nil) // the first delivery's done, called again: no effect
	if text := b.expect(t, d, 200, 2); text != "duplicate" {
		t.Fatalf("%q", text)
	}
	verify.Async(t.Context())(nil) // outside the middleware: a no-op
}

// An async handler may write its own status; and a handler that panics
// after Async releases the claim.
func TestMiddlewareAsyncStatus(t *testing.T) {
	t.Parallel()
	dones := make(chan func(error), 10)
	b := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
		dones <- verify.Async(r.Context())
		w.WriteHeader(http.StatusOK)
	})
	d := b.sign(t, "evt_1", "payment.succeeded")
	b.expect(t, d, 200, 1)
	b.expect(t, d, 409, 1) // the 200 did not complete the claim: done decides
	(<-dones)(nil)
	b.expect(t, d, 200, 1)

	h := b.v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dones <- verify.Async(r.Context())
		panic("boom")
	}))
	d = b.sign(t, "evt_2", "payment.succeeded")
	req := func() *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(d.Body))
		r.Header = d.Header.Clone()
		return r
	}
	func() {
		defer func() { recover() }()
		h.ServeHTTP(httptest.NewRecorder(), req())
	}()
	done := <-dones
	done(nil) // too late: the panic released the claim
	rec := httptest.NewRecorder()
	b.v.Middleware(http.NotFoundHandler()).ServeHTTP(rec, req())
	if rec.Code != http.StatusNotFound {
		t.Fatalf("after a panic the event must be processed again: %d", rec.Code)
	}
}

// Without a store the middleware verifies only; Async still answers 202.
func TestMiddlewareNoStore(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *verify.Config) { c.Store = nil }, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Async") != "" {
			verify.Async(r.Context())(nil)
		}
	})
	d := b.sign(t, "evt_1", "payment.succeeded")
	b.expect(t, d, 200, 1)
	b.expect(t, d, 200, 2)
	d.Header.Set("X-Async", "1")
	b.expect(t, d, 202, 3)
}

// A failing store makes the middleware answer 503, so the sender retries.
func TestMiddlewareStoreDown(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *verify.Config) { c.Store = brokenStore{} }, nil)
	if text := b.expect(t, b.sign(t, "evt_1", "payment.succeeded"), 503, 0); text != "dedup store unavailable" {
		t.Fatalf("%q", text)
	}
}

type brokenStore struct{}

func (brokenStore) Claim(context.Context, string, string, time.Duration) (verify.Status, error) {
	return 0, errors.New("connection refused")
}
func (brokenStore) Complete(context.Context, string, string) error { return nil }
func (brokenStore) Release(context.Context, string, string) error  { return nil }

// The claim's lease comes from Config.Lease.
func TestMiddlewareLease(t *testing.T) {
	t.Parallel()
	dones := make(chan func(error), 10)
	b := setup(t, func(c *verify.Config) { c.Lease = time.Minute }, func(w http.ResponseWriter, r *http.Request) {
		dones <- verify.Async(r.Context())
	})
	d := b.sign(t, "evt_1", "payment.succeeded")
	b.expect(t, d, 202, 1)
	b.clk.Advance(59 * time.Second)
	b.expect(t, d, 409, 1)
	b.clk.Advance(time.Second) // the worker died: its lease ends
	b.expect(t, d, 202, 2)
}
