package pgxoutbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/pgxoutbox"
)

// bouncerEnv is an Outbox made by pgxoutbox.New on a pgxpool through
// PgBouncer in transaction mode, configured as docs/drivers.md says.
type bouncerEnv struct {
	ctx      context.Context
	db       *testdb.DB
	pool     *pgxpool.Pool
	ob       *outbox.Outbox
	payments string // the business table, in the test's schema
}

func bouncerSetup(t *testing.T, lis outbox.Listener) *bouncerEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	db := testdb.PgBouncer(t, "pgx") // its DSN has default_query_exec_mode=cache_describe
	pcfg, err := pgxpool.ParseConfig(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 32 // eight times PgBouncer's server connections
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e := &bouncerEnv{ctx: ctx, db: db, pool: pool, payments: `"` + db.Schema + `".payments`}
	e.ob = newOutbox(t, ctx, pool, outbox.Config{Schema: db.Schema, TransactionPooling: true, Listener: lis}, e.payments)
	return e
}

// startRelay starts a relay of ob and stops it when the test ends.
func startRelay(t *testing.T, ctx context.Context, ob *outbox.Outbox, cfg outbox.RelayConfig) {
	t.Helper()
	r, err := ob.NewRelay(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := r.Stop(stop); err != nil {
			t.Errorf("relay stop: %v", err)
		}
	})
}

// TestPgBouncerPoolRefusesCachedStatements: pgxoutbox.New with
// TransactionPooling refuses a pool in pgx's default exec mode, whose
// named statements PgBouncer before 1.21 loses between transactions.
func TestPgBouncerPoolRefusesCachedStatements(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.PgBouncerDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	_, err = pgxoutbox.New(ctx, pool, outbox.Config{TransactionPooling: true})
	if !errors.Is(err, outbox.ErrPoolerUnsafe) {
		t.Fatalf("New: %v, want ErrPoolerUnsafe", err)
	}
}

// TestPgBouncerDirectListenerHearsCommits: a NOTIFY committed through
// PgBouncer reaches DirectListener on its direct connection. (The pool's
// own Listener, LISTENing through PgBouncer, hears nothing: PgBouncer
// hands the server connection that holds the LISTEN to other clients.)
func TestPgBouncerDirectListenerHearsCommits(t *testing.T) {
	e := bouncerSetup(t, nil)
	// A channel of this test's own: relays of other tests share txhook's.
	channel := "txhook_test_" + e.db.Schema
	wakes := make(chan struct{}, 16)
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() {
		done <- pgxoutbox.DirectListener(e.db.DirectDSN).Listen(ctx, e.ob.DB(), channel, func() { wakes <- struct{}{} })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(waitFor):
			t.Error("Listen did not return when its context ended")
		}
	})
	select {
	case <-wakes: // listening
	case err := <-done:
		t.Fatalf("Listen: %v", err)
	case <-time.After(waitFor):
		t.Fatal("the listener never listened")
	}
	tx, err := e.pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(e.ctx)
	if _, err := tx.Exec(e.ctx, `SELECT pg_notify($1, '')`, channel); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wakes:
	case err := <-done:
		t.Fatalf("Listen: %v", err)
	case <-time.After(waitFor):
		t.Fatal("the commit's NOTIFY never arrived")
	}
}

// TestPgBouncerPoolDeliversInOrder: 16 goroutines commit or roll back
// {INSERT payment; pgxoutbox.Enqueue} on a 32-connection pgxpool through
// PgBouncer's 4 server connections while two relays of 16 workers run;
// every committed event arrives once, in order per ordering key, and no
// rolled-back one arrives.
func TestPgBouncerPoolDeliversInOrder(t *testing.T) {
	e := bouncerSetup(t, nil)
	const writers, each = 16, 20
	rc := newOrderedReceiver()
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	if _, err := e.ob.CreateEndpoint(e.ctx, outbox.NewEndpoint{Tenant: "m", URL: srv.URL}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		startRelay(t, e.ctx, e.ob, outbox.RelayConfig{Concurrency: 16})
	}
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	var mu sync.Mutex
	committed := map[string]bool{}
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seq := 0
			for i := range each {
				pay := fmt.Sprintf("pay_%d_%d", w, i)
				err := func() error {
					tx, err := e.pool.Begin(e.ctx)
					if err != nil {
						return err
					}
					defer tx.Rollback(e.ctx)
					if _, err := tx.Exec(e.ctx, `INSERT INTO `+e.payments+` (id, amount) VALUES ($1, $2)`, pay, i); err != nil {
						return err
					}
					ev := event(pay, fmt.Sprintf(`{"key":"k%d","seq":%d}`, w, seq))
					ev.OrderingKey = fmt.Sprintf("k%d", w)
					id, err := pgxoutbox.Enqueue(e.ctx, e.ob, tx, ev)
					if err != nil {
						return err
					}
					if i%3 == 2 {
						return tx.Rollback(e.ctx)
					}
					if err := tx.Commit(e.ctx); err != nil {
						return err
					}
					seq++
					mu.Lock()
					committed[id] = true
					mu.Unlock()
					return nil
				}()
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	deadline := time.After(waitFor)
	for {
		rc.mu.Lock()
		n, bad := len(rc.seen), rc.violations
		rc.mu.Unlock()
		if len(bad) > 0 {
			t.Fatalf("%d order violations, first: %s", len(bad), bad[0])
		}
		if n == len(committed) {
			break
		}
		select {
		case <-deadline:
			t.Fatalf("%d of %d events delivered", n, len(committed))
		case <-rc.arrived:
		}
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for id, times := range rc.seen {
		if !committed[id] {
			t.Errorf("event %s delivered, but its transaction rolled back", id)
		}
		if times != 1 {
			t.Errorf("event %s delivered %d times", id, times)
		}
	}
	var payments int
	if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM `+e.payments).Scan(&payments); err != nil {
		t.Fatal(err)
	}
	if payments != len(committed) {
		t.Fatalf("%d payments for %d committed transactions", payments, len(committed))
	}
}

// orderedReceiver counts deliveries per event ID and checks that each
// key's sequence numbers arrive in order.
type orderedReceiver struct {
	mu         sync.Mutex
	seen       map[string]int
	next       map[string]int
	violations []string
	arrived    chan struct{}
}

func newOrderedReceiver() *orderedReceiver {
	return &orderedReceiver{seen: map[string]int{}, next: map[string]int{}, arrived: make(chan struct{}, 1)}
}

func (o *orderedReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var env struct {
		Data struct {
			Key string `json:"key"`
			Seq int    `json:"seq"`
		} `json:"data"`
	}
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &env); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	o.seen[r.Header.Get(outbox.HeaderEventID)]++
	if env.Data.Seq != o.next[env.Data.Key] {
		o.violations = append(o.violations, fmt.Sprintf("%s: got %d, expected %d", env.Data.Key, env.Data.Seq, o.next[env.Data.Key]))
	} else {
		o.next[env.Data.Key]++
	}
	o.mu.Unlock()
	select {
	case o.arrived <- struct{}{}:
	default:
	}
	w.WriteHeader(http.StatusNoContent)
}
