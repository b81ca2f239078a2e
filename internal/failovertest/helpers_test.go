package failovertest

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testob"
	"github.com/txhook/txhook/outbox"
)

const waitFor = testob.WaitFor

type bundle struct {
	t   *testing.T
	db  *testdb.DB
	ob  *outbox.Outbox
	ctx context.Context
}

// setup opens a migrated outbox on db, woken by the driver's Listener.
func setup(t *testing.T, db *testdb.DB, cfg outbox.Config) *bundle {
	t.Helper()
	ob, ctx := testob.NewOutboxWith(t, db, cfg)
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
	return testob.StartRelay(b.t, b.ctx, b.ob, cfg)
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

func (b *bundle) eventually(what string, cond func() bool) {
	b.t.Helper()
	testob.Eventually(b.t, what, cond)
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
