package pgxoutbox_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/pgxoutbox"
	"github.com/txhook/txhook/outbox/pqlisten"
)

// waitFor bounds every wait: generous, as CI machines are small and busy.
const waitFor = 60 * time.Second

type env struct {
	ctx  context.Context
	dsn  string
	pool *pgxpool.Pool
	ob   *outbox.Outbox
}

// setup makes an Outbox with pgxoutbox.New on a pool on a fresh schema,
// migrated, with a payments table for the business writes.
func setup(t *testing.T, cfg outbox.Config) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	dsn, drop, err := testdb.NewSchema(testdb.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ob := newOutbox(t, ctx, pool, cfg, "payments")
	return &env{ctx: ctx, dsn: dsn, pool: pool, ob: ob}
}

// newOutbox makes a migrated Outbox with pgxoutbox.New on pool, allowing
// loopback receivers over http, and creates the business table payments.
func newOutbox(t *testing.T, ctx context.Context, pool *pgxpool.Pool, cfg outbox.Config, payments string) *outbox.Outbox {
	t.Helper()
	cfg.AllowHTTP, cfg.AllowPrivateTargets = true, true
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	ob, err := pgxoutbox.New(ctx, pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ob.Close()
		ob.DB().Close()
	})
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+payments+` (id text PRIMARY KEY, amount int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return ob
}

func (e *env) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(e.ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func event(key, payload string) outbox.Event {
	return outbox.Event{Tenant: "m", Type: "payment.succeeded", IdempotencyKey: key, Payload: []byte(payload)}
}

func TestEnqueueTxRollbackLeavesNothing(t *testing.T) {
	e := setup(t, outbox.Config{})
	watch := e.listen(t)
	tx, pid := e.pay(t)
	if _, err := pgxoutbox.Enqueue(e.ctx, e.ob, tx, event("pay_1", `{"id":"pay_1"}`)); err != nil {
		t.Fatal(err)
	}
	// Inside the transaction the event is there; outside it is not yet.
	var inside int
	if err := tx.QueryRow(e.ctx, `SELECT count(*) FROM txhook_events`).Scan(&inside); err != nil || inside != 1 {
		t.Fatalf("events seen inside the transaction: %d, %v; want 1", inside, err)
	}
	if n := e.count(t, "txhook_events"); n != 0 {
		t.Fatalf("%d events visible before commit", n)
	}
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	if n, p := e.count(t, "txhook_events"), e.count(t, "payments"); n != 0 || p != 0 {
		t.Fatalf("after rollback: %d events, %d payments; want none", n, p)
	}
	// No wake-up either. Notifications arrive in commit order, so one
	// committed after the rollback comes after any the transaction sent.
	var sentinel uint32
	if err := e.pool.QueryRow(e.ctx, `SELECT pg_backend_pid() FROM (SELECT pg_notify($1, 'sentinel')) n`, outbox.WakeChannel).Scan(&sentinel); err != nil {
		t.Fatal(err)
	}
	for {
		n := e.next(t, watch)
		if n.PID == pid && n.Payload != "sentinel" {
			t.Fatal("the rolled-back transaction woke the relays")
		}
		if n.Payload == "sentinel" && n.PID == sentinel {
			break
		}
	}
}

// listen returns a connection listening on the wake-up channel. The
// channel is database-wide and other tests' outboxes notify on it too:
// tests tell their notifications by the sender's process ID.
func (e *env) listen(t *testing.T) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(e.ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	if _, err := c.Exec(e.ctx, "LISTEN "+outbox.WakeChannel); err != nil {
		t.Fatal(err)
	}
	return c
}

// next waits for c's next notification.
func (e *env) next(t *testing.T, c *pgx.Conn) *pgconn.Notification {
	t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, waitFor)
	defer cancel()
	n, err := c.WaitForNotification(ctx)
	if err != nil {
		t.Fatalf("waiting for a notification: %v", err)
	}
	return n
}

// pay begins a transaction that records a payment, and returns it with
// the process ID of its connection, which its notifications carry.
func (e *env) pay(t *testing.T) (pgx.Tx, uint32) {
	t.Helper()
	tx, err := e.pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	var pid uint32
	if err := tx.QueryRow(e.ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(e.ctx, `INSERT INTO payments VALUES ('pay_1', 1200)`); err != nil {
		t.Fatal(err)
	}
	return tx, pid
}

// watched reports the wake-ups a Listener gives a relay.
type watched struct {
	inner outbox.Listener
	wakes chan struct{}
}

func (w *watched) Listen(ctx context.Context, db *sql.DB, channel string, wake func()) error {
	return w.inner.Listen(ctx, db, channel, func() {
		wake()
		select {
		case w.wakes <- struct{}{}:
		default:
		}
	})
}

func TestEnqueueTxCommitWakesRelayOnPool(t *testing.T) {
	lis := &watched{inner: pgxoutbox.Listener(), wakes: make(chan struct{}, 16)}
	e := setup(t, outbox.Config{Listener: lis})
	got := make(chan *http.Request, 10)
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r
	}))
	t.Cleanup(rc.Close)
	if _, err := e.ob.CreateEndpoint(e.ctx, outbox.NewEndpoint{Tenant: "m", URL: rc.URL}); err != nil {
		t.Fatal(err)
	}
	// An hour between polls: a delivery comes from a wake-up.
	startRelay(t, e.ctx, e.ob, outbox.RelayConfig{PollInterval: time.Hour})
	// The relay's listener wakes it once it listens; from then on every
	// commit's NOTIFY wakes it too.
	select {
	case <-lis.wakes:
	case <-time.After(waitFor):
		t.Fatal("the relay's listener never listened")
	}

	watch := e.listen(t)
	tx, pid := e.pay(t)
	id, err := pgxoutbox.Enqueue(e.ctx, e.ob, tx, event("pay_1", `{"id":"pay_1"}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	// The commit wakes the relays: its NOTIFY arrives.
	for e.next(t, watch).PID != pid {
	}
	select {
	case req := <-got:
		if h := req.Header.Get(outbox.HeaderEventID); h != id {
			t.Fatalf("delivered %q, want %q", h, id)
		}
	case <-time.After(waitFor):
		t.Fatal("event not delivered")
	}
}

// Enqueue through pgx refuses what the database/sql path refuses, with the
// same typed errors, and leaves the transaction usable.
func TestEnqueueTxErrorsAndDuplicates(t *testing.T) {
	e := setup(t, outbox.Config{})
	tx, err := e.pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(e.ctx)
	// Whitespace and key order kept: the stored payload is the caller's bytes.
	payload := `{"b": 1,  "a": [2, "é"]}`
	first, err := pgxoutbox.EnqueueDetail(e.ctx, e.ob, tx, event("pay_1", payload))
	if err != nil || first.Duplicate {
		t.Fatalf("first enqueue: %+v, %v", first, err)
	}
	again, err := pgxoutbox.EnqueueDetail(e.ctx, e.ob, tx, event("pay_1", payload))
	if err != nil || !again.Duplicate || again.ID != first.ID {
		t.Fatalf("same event again: %+v, %v; want duplicate of %s", again, err, first.ID)
	}
	cases := []struct {
		name string
		ev   outbox.Event
		want error
	}{
		{"key reused", event("pay_1", `{"b":1}`), outbox.ErrIdempotencyConflict},
		{"ID of another tenant's event", outbox.Event{ID: first.ID, Tenant: "other", Type: "payment.succeeded", Payload: []byte(payload)}, outbox.ErrEventConflict},
		{"NUL in payload", event("pay_2", `{"a":"\u0000"}`), outbox.ErrInvalidPayload},
		{"no tenant", outbox.Event{Type: "x", Payload: []byte(`{}`)}, outbox.ErrInvalidEvent},
	}
	for _, c := range cases {
		if _, err := pgxoutbox.Enqueue(e.ctx, e.ob, tx, c.ev); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// Still usable: the business write and the event commit.
	if _, err := tx.Exec(e.ctx, `INSERT INTO payments VALUES ('pay_1', 1200)`); err != nil {
		t.Fatalf("transaction unusable after refusals: %v", err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if n, p := e.count(t, "txhook_events"), e.count(t, "payments"); n != 1 || p != 1 {
		t.Fatalf("%d events, %d payments; want 1, 1", n, p)
	}
	// The database/sql path sees the pgx-written event as the same one.
	sqlTx, err := e.ob.DB().BeginTx(e.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sqlTx.Rollback()
	r, err := e.ob.EnqueueDetail(e.ctx, sqlTx, event("pay_1", payload))
	if err != nil || !r.Duplicate || r.ID != first.ID {
		t.Fatalf("database/sql enqueue of the same event: %+v, %v", r, err)
	}
}

func TestEnqueueRefusesSQLiteOutbox(t *testing.T) {
	db := testdb.SQLite(t)
	ob, err := outbox.New(context.Background(), db.DB, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	if _, err := pgxoutbox.Enqueue(context.Background(), ob, nil, event("k", `{}`)); !errors.Is(err, pgxoutbox.ErrNotPostgres) {
		t.Fatalf("got %v, want ErrNotPostgres", err)
	}
}

// The listener names what it needs when given another driver's database.
func TestListenerNeedsPgxDriver(t *testing.T) {
	db := testdb.Postgres(t, "postgres")
	err := pgxoutbox.Listener().Listen(context.Background(), db.DB, outbox.WakeChannel, func() {})
	if err == nil || !strings.Contains(err.Error(), "pgx's stdlib driver") {
		t.Fatalf("got %v", err)
	}
}

// pqlisten listens on lib/pq's own connection: it wakes once listening,
// then on notifications (the channel is database-wide, so other tests'
// may come first), and ends when its context does.
func TestPQListenWakesOnCommit(t *testing.T) {
	db := testdb.Postgres(t, "postgres")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ob, err := outbox.New(ctx, db.DB, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	wakes := make(chan struct{}, 16)
	done := make(chan error, 1)
	lctx, stop := context.WithCancel(ctx)
	go func() {
		done <- pqlisten.New(db.DSN).Listen(lctx, nil, outbox.WakeChannel, func() { wakes <- struct{}{} })
	}()
	select {
	case <-wakes:
	case err := <-done:
		t.Fatalf("listen: %v", err)
	case <-time.After(waitFor):
		t.Fatal("never listened")
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Enqueue(ctx, tx, event("k", `{}`)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wakes:
	case <-time.After(waitFor):
		t.Fatal("no notification after the commit")
	}
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("listen ended with %v, want context.Canceled", err)
	}
}

// EnqueueMany through pgx writes the batch in the caller's transaction,
// delayed events included: a refused event takes the batch back and leaves
// the transaction usable, a rollback leaves nothing, a commit keeps all.
func TestEnqueueManyTx(t *testing.T) {
	e := setup(t, outbox.Config{})
	later := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	batch := []outbox.Event{event("pay_1", `{"id":"pay_1"}`), event("pay_2", `{"id":"pay_2"}`),
		{Tenant: "m", Type: "payment.reminder", IdempotencyKey: "pay_1:remind", Payload: []byte(`{"id":"pay_1"}`), DeliverAt: later}}

	tx, _ := e.pay(t)
	bad := append(append([]outbox.Event{}, batch...), event("pay_3", `{"id":`))
	_, err := pgxoutbox.EnqueueMany(e.ctx, e.ob, tx, bad)
	var be *outbox.BatchError
	if !errors.As(err, &be) || be.Index != 3 || !errors.Is(err, outbox.ErrInvalidPayload) {
		t.Fatalf("invalid fourth event: %v, want a BatchError at index 3 matching ErrInvalidPayload", err)
	}
	res, err := pgxoutbox.EnqueueMany(e.ctx, e.ob, tx, batch)
	if err != nil || len(res) != 3 || res[0].Duplicate {
		t.Fatalf("EnqueueMany after a refusal: %+v, %v", res, err)
	}
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.count(t, "txhook_events"); n != 0 {
		t.Fatalf("after rollback: %d events, want none", n)
	}

	tx, _ = e.pay(t)
	res, err = pgxoutbox.EnqueueMany(e.ctx, e.ob, tx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	var at time.Time
	if err := e.pool.QueryRow(e.ctx, `SELECT deliver_at FROM txhook_events WHERE id = $1`, res[2].ID).Scan(&at); err != nil || !at.Equal(later) {
		t.Fatalf("delayed event's deliver_at %v (%v), want %v", at, err, later)
	}
	if n := e.count(t, "txhook_events"); n != 3 {
		t.Fatalf("after commit: %d events, want 3", n)
	}
	again, err := pgxoutbox.EnqueueMany(e.ctx, e.ob, e.pool, batch[:1])
	if err != nil || !again[0].Duplicate || again[0].ID != res[0].ID {
		t.Fatalf("enqueuing the first event again: %+v, %v; want a duplicate of %s", again, err, res[0].ID)
	}
}
