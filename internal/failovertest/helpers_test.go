package failovertest

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testlisten"
	"github.com/txhook/txhook/outbox"
)

// waitFor is how long the tests wait for something asynchronous:
// generous, as CI machines are small and busy.
const waitFor = 60 * time.Second

type bundle struct {
	t   *testing.T
	db  *testdb.DB
	ob  *outbox.Outbox
	ctx context.Context
}

// setup opens a migrated outbox on db, woken by the driver's Listener.
func setup(t *testing.T, db *testdb.DB, cfg outbox.Config) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	cfg.AllowHTTP, cfg.AllowPrivateTargets = true, true
	cfg.Listener = testlisten.For(db.Backend.Driver, db.DSN)
	ob, err := outbox.New(ctx, db.DB, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close() })
	return &bundle{t: t, db: db, ob: ob, ctx: ctx}
}

func (b *bundle) endpoint(tenant, url string, types ...string) outbox.Endpoint {
	b.t.Helper()
	ep, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: tenant, URL: url, EventTypes: types})
	if err != nil {
		b.t.Fatal(err)
	}
	return ep
}

// relay starts a relay and stops it when the test ends.
func (b *bundle) relay(cfg outbox.RelayConfig) *outbox.Relay {
	b.t.Helper()
	r, err := b.ob.NewRelay(cfg)
	if err != nil {
		b.t.Fatal(err)
	}
	if err := r.Start(b.ctx); err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := r.Stop(ctx); err != nil {
			b.t.Errorf("relay stop: %v", err)
		}
	})
	return r
}

// count runs a COUNT query (PostgreSQL placeholders).
func (b *bundle) count(query string, args ...any) int {
	b.t.Helper()
	var n int
	if err := b.db.QueryRowContext(b.ctx, query, args...).Scan(&n); err != nil {
		b.t.Fatalf("%s: %v", query, err)
	}
	return n
}

// eventually polls cond until it holds or waitFor passes.
func (b *bundle) eventually(what string, cond func() bool) {
	b.t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			b.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// logBuffer collects a logger's output for the test to print on failure.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }
