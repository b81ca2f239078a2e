package outbox_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testlisten"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/retry"
)

// The test binary doubles as a relay process: with TXHOOK_TEST_CHILD=relay
// it runs a relay on the database named by the environment until it is
// killed or sent SIGTERM. Crash and multi-process tests start it.
func TestMain(m *testing.M) {
	if os.Getenv("TXHOOK_TEST_CHILD") == "relay" {
		os.Exit(runChildRelay())
	}
	os.Exit(m.Run())
}

func runChildRelay() int {
	driver, dsn := os.Getenv("TXHOOK_CHILD_DRIVER"), os.Getenv("TXHOOK_CHILD_DSN")
	lease, _ := time.ParseDuration(os.Getenv("TXHOOK_CHILD_LEASE"))
	timeout, _ := time.ParseDuration(os.Getenv("TXHOOK_CHILD_TIMEOUT"))
	conc, _ := strconv.Atoi(os.Getenv("TXHOOK_CHILD_CONCURRENCY"))
	db, err := sql.Open(driver, dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer db.Close()
	ctx := context.Background()
	level := slog.LevelError
	if os.Getenv("TXHOOK_CHILD_LOG_WARN") == "1" {
		level = slog.LevelWarn
	}
	cfg := outbox.Config{AllowHTTP: true, AllowPrivateTargets: true,
		Logger:           slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
		SyncRelayCommits: os.Getenv("TXHOOK_CHILD_SYNC_COMMITS") == "1"}
	cfg.Listener = testlisten.For(driver, dsn)
	// Through PgBouncer (see childEnv).
	if cfg.Schema = os.Getenv("TXHOOK_CHILD_SCHEMA"); os.Getenv("TXHOOK_CHILD_TX_POOLING") == "1" {
		cfg.TransactionPooling = true
		cfg.Listener = testlisten.ForDB(&testdb.DB{DirectDSN: os.Getenv("TXHOOK_CHILD_DIRECT_DSN"),
			Backend: testdb.Backend{Driver: driver, Bouncer: true}})
	}
	ob, err := outbox.New(ctx, db, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	id := os.Getenv("TXHOOK_CHILD_ID")
	rcfg := outbox.RelayConfig{Lease: lease, Timeout: timeout, Concurrency: conc,
		EndpointConcurrency: conc, ID: id,
		// Receivers of multi-process tests tell the relays apart by this.
		WrapTransport: func(rt http.RoundTripper) http.RoundTripper { return relayTag{rt, id} }}
	rcfg.BatchSize, _ = strconv.Atoi(os.Getenv("TXHOOK_CHILD_BATCH"))
	if os.Getenv("TXHOOK_CHILD_FAST_RETRY") == "1" {
		rcfg.Retry = fastRetry()
		rcfg.BreakerCooldown = 50 * time.Millisecond
	}
	if d, _ := time.ParseDuration(os.Getenv("TXHOOK_CHILD_COOLDOWN")); d > 0 {
		rcfg.BreakerCooldown = d
	}
	if n, _ := strconv.Atoi(os.Getenv("TXHOOK_CHILD_ATTEMPTS")); n > 0 {
		rcfg.Retry = fastRetryAttempts(n)
	}
	// A policy with real pauses, ±25% jitter, its breaker's cooldown as
	// short as its base.
	if base, _ := time.ParseDuration(os.Getenv("TXHOOK_CHILD_RETRY_BASE")); base > 0 {
		n, _ := strconv.Atoi(os.Getenv("TXHOOK_CHILD_ATTEMPTS"))
		rcfg.Retry = retry.Exponential{Base: base, Factor: 2, Cap: 8 * base, Attempts: max(n, 2), Jitter: 0.25}
		rcfg.BreakerCooldown = base
	}
	r, err := ob.NewRelay(rcfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := r.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println("READY")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	fmt.Println("STOPPING")
	stop, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := r.Stop(stop); err != nil {
		fmt.Fprintln(os.Stderr, "stop:", err)
		return 1
	}
	st := r.Stats()
	fmt.Printf("SUCCEEDED %d\n", st.Succeeded)
	return 0
}

// headerRelay names the relay process that sent a request.
const headerRelay = "X-Test-Relay"

// relayTag adds headerRelay to every request.
type relayTag struct {
	rt http.RoundTripper
	id string
}

func (t relayTag) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set(headerRelay, t.id)
	return t.rt.RoundTrip(req)
}

// childEnv is the environment of a relay process on db.
func childEnv(db *testdb.DB) []string {
	env := append(os.Environ(),
		"TXHOOK_TEST_CHILD=relay",
		"TXHOOK_CHILD_DRIVER="+db.Backend.Driver,
		"TXHOOK_CHILD_DSN="+db.DSN,
		"TXHOOK_CHILD_SCHEMA="+db.Schema,
	)
	if db.Backend.Bouncer {
		env = append(env, "TXHOOK_CHILD_TX_POOLING=1", "TXHOOK_CHILD_DIRECT_DSN="+db.DirectDSN)
	}
	return env
}

type child struct {
	cmd       *exec.Cmd
	succeeded chan int      // the SUCCEEDED count printed at a graceful exit
	stopping  chan struct{} // closed when the child got SIGTERM and begins to stop
}

// fastRetry retries every few milliseconds, for tests that fail on purpose.
func fastRetry() retry.Policy { return fastRetryAttempts(1000) }

func fastRetryAttempts(n int) retry.Policy {
	return retry.Exponential{Base: 5 * time.Millisecond, Factor: 2, Cap: 100 * time.Millisecond, Attempts: n}
}

// startRelayProcess starts a relay subprocess and waits until it runs.
func startRelayProcess(t *testing.T, db *testdb.DB, id string, lease, timeout time.Duration, conc int, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(childEnv(db), env...),
		"TXHOOK_CHILD_LEASE="+lease.String(),
		"TXHOOK_CHILD_TIMEOUT="+timeout.String(),
		"TXHOOK_CHILD_CONCURRENCY="+strconv.Itoa(conc),
		"TXHOOK_CHILD_ID="+id,
	)
	cmd.Stderr = &testWriter{t: t, prefix: id + ": "}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, succeeded: make(chan int, 1), stopping: make(chan struct{})}
	t.Cleanup(func() { c.kill() })
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && strings.TrimSpace(line) != "READY" {
			err = fmt.Errorf("unexpected first line %q", line)
		}
		ready <- err
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "STOPPING" {
				close(c.stopping)
			}
			if n, ok := strings.CutPrefix(sc.Text(), "SUCCEEDED "); ok {
				v, _ := strconv.Atoi(n)
				c.succeeded <- v
			}
		}
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("relay process %s: %v", id, err)
		}
	case <-time.After(waitFor):
		t.Fatalf("relay process %s did not start", id)
	}
	return c
}

func (c *child) kill() {
	if c.cmd.ProcessState == nil {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
	}
}

// succeededCount returns what the child reported at its graceful exit.
func (c *child) succeededCount(t *testing.T) int {
	t.Helper()
	select {
	case n := <-c.succeeded:
		return n
	case <-time.After(waitFor):
		t.Fatal("relay process reported no count")
		return 0
	}
}

// terminate asks the child to stop gracefully and waits for it.
func (c *child) terminate(t *testing.T) {
	t.Helper()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("relay process exit: %v", err)
		}
	case <-time.After(waitFor):
		c.kill()
		t.Errorf("relay process did not stop")
	}
}

type testWriter struct {
	t      *testing.T
	prefix string
	mu     sync.Mutex
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w.t.Log(w.prefix + l)
	}
	return len(p), nil
}

// ledger is a receiver that tracks, per event ID, how many requests are in
// flight at once and how many succeeded.
type ledger struct {
	mu          sync.Mutex
	inflight    map[string]int
	delivered   map[string]int
	overlaps    []string
	total       int
	allArrived  chan struct{}
	expected    int
	distinct    int
	hold        chan struct{} // when non-nil, requests block until it closes
	holding     int
	holdingSeen chan struct{}
	holdTarget  int
}

func newLedger(expected int) *ledger {
	return &ledger{inflight: map[string]int{}, delivered: map[string]int{}, expected: expected, allArrived: make(chan struct{})}
}

func (l *ledger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("Webhook-Id")
	io.Copy(io.Discard, r.Body)
	l.mu.Lock()
	l.inflight[id]++
	if l.inflight[id] > 1 {
		l.overlaps = append(l.overlaps, id)
	}
	hold := l.hold
	if hold != nil {
		l.holding++
		if l.holding == l.holdTarget {
			close(l.holdingSeen)
		}
	}
	l.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-r.Context().Done():
		}
		l.mu.Lock()
		l.inflight[id]--
		l.mu.Unlock()
		// The relay holding this request is gone; answer nothing useful.
		http.Error(w, "held", http.StatusServiceUnavailable)
		return
	}
	// A little work, so requests overlap as they would in production.
	time.Sleep(200 * time.Microsecond)
	l.mu.Lock()
	l.inflight[id]--
	l.delivered[id]++
	l.total++
	if l.delivered[id] == 1 {
		l.distinct++
		if l.distinct == l.expected {
			close(l.allArrived)
		}
	}
	l.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func TestRelayProcessKilledMidDeliveryLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts subprocesses")
	}
	testdb.Each(t, relayKilledMidDelivery)
}

// relayKilledMidDelivery SIGKILLs a relay process with requests in
// flight; a second one delivers every event.
func relayKilledMidDelivery(t *testing.T, db *testdb.DB) {
	b := setup(t, db, outbox.Config{Logger: quietLogger()})
	const events = 200
	l := newLedger(events)
	// The first relay's requests hang until it is killed.
	l.hold = make(chan struct{})
	l.holdingSeen = make(chan struct{})
	l.holdTarget = 4
	srv := httptest.NewServer(l)
	t.Cleanup(srv.Close)
	b.endpoint("m", srv.URL)
	ids := map[string]bool{}
	for i := 0; i < events; i++ {
		ids[b.enqueue(outbox.Event{Tenant: "m", Type: "payment.succeeded", Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))})] = true
	}

	first := startRelayProcess(t, db, "doomed", 3*time.Second, 1*time.Second, 4)
	select {
	case <-l.holdingSeen:
	case <-time.After(waitFor):
		t.Fatal("the first relay never had requests in flight")
	}
	// SIGKILL: no chance to release, complete or flush anything.
	first.kill()
	l.mu.Lock()
	close(l.hold)
	l.hold = nil
	l.mu.Unlock()

	second := startRelayProcess(t, db, "survivor", 3*time.Second, 1*time.Second, 8)
	select {
	case <-l.allArrived:
	case <-time.After(waitFor):
		l.mu.Lock()
		t.Fatalf("only %d of %d events delivered after the crash", l.distinct, events)
	}
	b.eventually("every delivery recorded as succeeded", func() bool {
		return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded'") == events
	})
	second.terminate(t)
	l.mu.Lock()
	defer l.mu.Unlock()
	for id := range ids {
		if l.delivered[id] == 0 {
			t.Errorf("event %s never delivered", id)
		}
	}
	if len(l.overlaps) > 0 {
		t.Errorf("deliveries in flight twice at once: %v", l.overlaps)
	}
	// The killed relay's attempts are on record as lapsed leases.
	if n := b.count("SELECT count(*) FROM txhook_attempt_log WHERE error LIKE 'lease expired%'"); n < 1 {
		t.Errorf("no lapsed-lease attempt recorded")
	}
	if n := b.count("SELECT count(*) FROM txhook_dead_letters"); n != 0 {
		t.Errorf("%d dead letters", n)
	}
}

func TestTwoRelayProcessesNeverOverlap(t *testing.T) {
	if testing.Short() {
		t.Skip("starts subprocesses")
	}
	for _, be := range testdb.PostgresBackends {
		t.Run(be.Name, func(t *testing.T) { twoRelayProcesses(t, testdb.Open(t, be)) })
	}
}

// twoRelayProcesses delivers events enqueued while two relay processes
// run, each exactly once.
func twoRelayProcesses(t *testing.T, db *testdb.DB) {
	b := setup(t, db, outbox.Config{Logger: quietLogger()})
	const events = 5000
	l := newLedger(events)
	srv := httptest.NewServer(l)
	t.Cleanup(srv.Close)
	b.endpoint("m", srv.URL)

	a := startRelayProcess(t, db, "relay-a", 30*time.Second, 5*time.Second, 16)
	c := startRelayProcess(t, db, "relay-b", 30*time.Second, 5*time.Second, 16)
	// Enqueue while both relays run, in transactions of 50.
	for i := 0; i < events; i += 50 {
		tx, err := db.BeginTx(b.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k := i; k < i+50; k++ {
			if _, err := b.ob.Enqueue(b.ctx, tx, outbox.Event{Tenant: "m", Type: "t", Payload: []byte(fmt.Sprintf(`{"k":%d}`, k))}); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-l.allArrived:
	case <-time.After(waitFor):
		l.mu.Lock()
		t.Fatalf("only %d of %d events delivered", l.distinct, events)
	}
	b.eventually("every delivery recorded as succeeded", func() bool {
		return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded'") == events
	})
	a.terminate(t)
	c.terminate(t)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.overlaps) > 0 {
		t.Fatalf("%d deliveries in flight twice at once, e.g. %s", len(l.overlaps), l.overlaps[0])
	}
	if l.total != events {
		t.Fatalf("receiver got %d requests for %d events: something was sent twice", l.total, events)
	}
	// Both relays did a share of the work.
	na, nc := a.succeededCount(t), c.succeededCount(t)
	if na == 0 || nc == 0 || na+nc != events {
		t.Fatalf("relay-a delivered %d, relay-b %d; want both > 0 and %d in all", na, nc, events)
	}
	t.Logf("relay-a delivered %d, relay-b %d", na, nc)
	if n := b.count("SELECT count(*) FROM txhook_attempt_log"); n != events {
		t.Fatalf("%d attempt records, want %d", n, events)
	}
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
