// Package testob holds what the tests of the packages built on outbox
// (outbox/metrics, outbox/otelmetrics) share: a migrated outbox on a test
// database, a loopback receiver, and waiting on a condition.
package testob

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testlisten"
	"github.com/txhook/txhook/outbox"
)

// WaitFor is how long tests wait for something asynchronous: generous, as
// CI machines are small and busy.
const WaitFor = 60 * time.Second

// NewOutbox opens a migrated outbox on db that allows loopback receivers
// over http, and a context that ends with the test.
func NewOutbox(t *testing.T, db *testdb.DB) (*outbox.Outbox, context.Context) {
	t.Helper()
	return NewOutboxWith(t, db, outbox.Config{})
}

// NewOutboxWith is NewOutbox with cfg: its Logger (quiet when nil) and
// the rest, with loopback receivers over http allowed and the Listener of
// db's driver.
func NewOutboxWith(t *testing.T, db *testdb.DB, cfg outbox.Config) (*outbox.Outbox, context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	cfg.AllowHTTP, cfg.AllowPrivateTargets = true, true
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	cfg.Listener = testlisten.For(db.Backend.Driver, db.DSN)
	ob, err := outbox.New(ctx, db.DB, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close() })
	return ob, ctx
}

// Receiver starts a loopback server that answers every request with
// status and returns its URL.
func Receiver(t *testing.T, status int) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// Eventually polls cond until it holds, or fails the test after WaitFor.
func Eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(WaitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// StartRelay starts a relay of ob under ctx and stops it, allowing 30 s
// for in-flight requests, when the test ends.
func StartRelay(t *testing.T, ctx context.Context, ob *outbox.Outbox, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	r, err := ob.NewRelay(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := r.Stop(sctx); err != nil {
			t.Errorf("relay stop: %v", err)
		}
	})
	return r
}
