package outbox_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testlisten"
	"github.com/txhook/txhook/outbox"
)

// waitFor is how long tests wait for something asynchronous: generous, as
// CI machines are small and busy. Waiting uses polling on real state, never
// a fixed sleep standing in for synchronisation.
const waitFor = 60 * time.Second

type bundle struct {
	t   *testing.T
	db  *testdb.DB
	ob  *outbox.Outbox
	ctx context.Context
}

// setup opens an outbox on db with its schema migrated. Receivers in tests
// live on loopback over http, so both are allowed.
func setup(t *testing.T, db *testdb.DB, cfg outbox.Config) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	cfg.AllowHTTP = true
	if cfg.AllowedTargets == nil {
		cfg.AllowPrivateTargets = true
	}
	if cfg.Listener == nil {
		cfg.Listener = testlisten.ForDB(db)
	}
	if db.Schema != "" && cfg.Schema == "" {
		cfg.Schema = db.Schema
	}
	if db.Backend.Bouncer {
		cfg.TransactionPooling = true
	}
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

// endpoint registers an endpoint of tenant for url.
func (b *bundle) endpoint(tenant, url string, types ...string) outbox.Endpoint {
	b.t.Helper()
	ep, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: tenant, URL: url, EventTypes: types})
	if err != nil {
		b.t.Fatal(err)
	}
	return ep
}

// enqueue writes one event in its own committed transaction.
func (b *bundle) enqueue(ev outbox.Event) string {
	b.t.Helper()
	tx, err := b.db.BeginTx(b.ctx, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	id, err := b.ob.Enqueue(b.ctx, tx, ev)
	if err != nil {
		tx.Rollback()
		b.t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		b.t.Fatal(err)
	}
	return id
}

// relay starts a relay and stops it when the test ends.
func (b *bundle) relay(cfg outbox.RelayConfig) *outbox.Relay {
	b.t.Helper()
	return b.startRelay(b.ob, cfg)
}

// roomy gives a relay in a test on a fake clock generous real-time bounds
// (request, connect, lease) where cfg leaves them unset. On a fake clock a
// failed attempt's retry waits for fake time the test never advances, so
// an attempt that merely ran out of the 5 s default on a loaded machine
// would hang the test instead of failing it.
func roomy(cfg outbox.RelayConfig) outbox.RelayConfig {
	if cfg.Timeout == 0 {
		cfg.Timeout = time.Minute
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = time.Minute
	}
	if cfg.Lease == 0 {
		cfg.Lease = 5 * time.Minute
	}
	return cfg
}

// startRelay starts a relay of ob and stops it when the test ends.
func (b *bundle) startRelay(ob *outbox.Outbox, cfg outbox.RelayConfig) *outbox.Relay {
	b.t.Helper()
	r, err := ob.NewRelay(cfg)
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

// count runs a COUNT query.
func (b *bundle) count(query string, args ...any) int {
	b.t.Helper()
	var n int
	if b.db.Schema == "" {
		if err := b.db.QueryRowContext(b.ctx, b.rebind(query), args...).Scan(&n); err != nil {
			b.t.Fatalf("%s: %v", query, err)
		}
		return n
	}
	// Through PgBouncer: the test's schema for this transaction only.
	tx, err := b.db.BeginTx(b.ctx, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(b.ctx, `SET LOCAL search_path TO "`+b.db.Schema+`"`); err != nil {
		b.t.Fatal(err)
	}
	if err := tx.QueryRowContext(b.ctx, b.rebind(query), args...).Scan(&n); err != nil {
		b.t.Fatalf("%s: %v", query, err)
	}
	return n
}

func (b *bundle) rebind(q string) string {
	if !b.db.Backend.Postgres() {
		return q
	}
	out := make([]byte, 0, len(q)+8)
	n := 0
	for i := 0; i < len(q); i++ {
		if q[i] == '?' {
			n++
			out = append(out, '$')
			out = append(out, []byte(itoa(n))...)
			continue
		}
		out = append(out, q[i])
	}
	return string(out)
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
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

// received is one request a test receiver got.
type received struct {
	Header http.Header
	Body   []byte
}

// receiver is a loopback HTTP server that records requests and answers
// with the status its handler picks.
type receiver struct {
	*httptest.Server
	mu     sync.Mutex
	reqs   []received
	status func(n int, r *http.Request) int // n is the 1-based request count
	got    chan received
}

// next returns the next request the receiver got, failing the test when
// none arrives within waitFor.
func (rc *receiver) next(t *testing.T) received {
	t.Helper()
	select {
	case got := <-rc.got:
		return got
	case <-time.After(waitFor):
		t.Fatal("no request reached the receiver")
	}
	return received{}
}

func newReceiver(t *testing.T, status func(n int, r *http.Request) int) *receiver {
	rc := &receiver{status: status, got: make(chan received, 100000)}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec := received{Header: r.Header.Clone(), Body: body}
		rc.mu.Lock()
		rc.reqs = append(rc.reqs, rec)
		n := len(rc.reqs)
		rc.mu.Unlock()
		code := http.StatusOK
		if rc.status != nil {
			code = rc.status(n, r)
		}
		w.WriteHeader(code)
		rc.got <- rec
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) requests() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.reqs...)
}

// store_time scans a time column of either dialect.
type store_time = store.Time

// logBuffer collects a logger's output for the test to read; wrote is set
// once anything was written.
type logBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	wrote atomic.Bool
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.wrote.Store(true)
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }
