package verify_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/txhook/txhook/signer"
	"github.com/txhook/txhook/verify"
	"github.com/txhook/txhook/verify/internal/storetest"
)

// bundle is a receiver under test: a verifier with a memory store and a
// fake clock behind a loopback server, and the handler's call count.
type bundle struct {
	secret string
	clk    *storetest.Clock
	v      *verify.Verifier
	srv    *httptest.Server
	calls  atomic.Int32
	logs   *syncBuffer
}

// setup builds a bundle; mod adjusts the config, h is the handler (nil
// answers 200).
func setup(t *testing.T, mod func(*verify.Config), h http.HandlerFunc) *bundle {
	t.Helper()
	secret, err := signer.GenerateSecret()
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{secret: secret, clk: storetest.NewClock(), logs: &syncBuffer{}}
	cfg := verify.Config{
		Secrets: []string{secret},
		Now:     b.clk.Now,
		Store:   verify.NewMemoryStore(verify.MemoryConfig{Now: b.clk.Now}),
		Logger:  slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if mod != nil {
		mod(&cfg)
	}
	b.v, err = verify.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.srv = httptest.NewServer(b.v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.calls.Add(1)
		if h != nil {
			h(w, r)
		}
	})))
	t.Cleanup(b.srv.Close)
	return b
}

// sign signs an envelope of typ for id at the bundle's clock.
func (b *bundle) sign(t *testing.T, id, typ string) storetest.Delivery {
	return storetest.Sign(t, b.secret, id, b.clk.Now(), storetest.Envelope(id, typ, `{"amount":100}`))
}

// post sends d and returns the status and the response body.
func (b *bundle) post(t *testing.T, d storetest.Delivery) (int, string) {
	t.Helper()
	return post(t, b.srv.URL, d.Header, bytes.NewReader(d.Body))
}

func post(t *testing.T, url string, h http.Header, body io.Reader) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), storetest.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, strings.TrimSpace(string(out))
}

// expect posts d and checks the status and the handler's call count.
func (b *bundle) expect(t *testing.T, d storetest.Delivery, status int, calls int32) string {
	t.Helper()
	code, text := b.post(t, d)
	if code != status {
		t.Fatalf("status %d (%q), want %d", code, text, status)
	}
	if got := b.calls.Load(); got != calls {
		t.Fatalf("handler ran %d times, want %d", got, calls)
	}
	return text
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
