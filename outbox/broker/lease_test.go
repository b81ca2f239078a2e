package broker_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testob"
	"github.com/txhook/txhook/verify"
)

// A worker process SIGKILLed while its request is at the receiver (the
// receiver's handler blocks until the test lets it go, after the kill):
// JetStream hands the delivery to another worker once the first one's
// lease (Config.Relay.Lease, the consumer's AckWait) has run out; that
// worker records the dead one's attempt as "lease expired" and makes the
// next, which the receiver's dedup store answers as a duplicate (the first
// request was processed after all). The handler ran once; one delivery
// row, succeeded after two attempts.
func TestBrokerWorkerKilledMidAttempt(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills worker processes")
	}
	testdb.Each(t, workerKilledMidAttempt)
}

func workerKilledMidAttempt(t *testing.T, db *testdb.DB) {
	const lease, timeout = 8 * time.Second, 5 * time.Second
	b := setup(t, db)
	b.cfg.Relay.Lease, b.cfg.Relay.Timeout = lease, timeout

	var logs logBuffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("worker processes' log:\n%s", logs.tail(20000))
		}
	})
	// The receiver: the first request blocks until released, and says
	// whether its connection went away first (the sender died).
	entered := make(chan string, 1)
	release := make(chan struct{})
	var once sync.Once
	var recv atomic.Pointer[inbox]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { recv.Load().ServeHTTP(w, r) }))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	ep := b.endpoint("m", srv.URL)
	in := newInbox(t, "m", ep)
	var held, connGone atomic.Bool
	in.hold = func(r *http.Request, ev verify.Event) {
		if !held.CompareAndSwap(false, true) {
			return
		}
		entered <- r.Header.Get(headerWorker)
		<-release
		// The server notices the closed connection a moment later.
		select {
		case <-r.Context().Done():
			connGone.Store(true)
		case <-time.After(childWait):
		}
	}
	recv.Store(in)

	cfg := childConfig{Driver: childDriver(db, 0), DSN: db.DSN, NATS: []string{b.srv.URL()}, Replicas: 1,
		RelayLease: lease, Timeout: timeout, Attempts: 5, RetryBase: 300 * time.Millisecond, RetryCap: time.Second,
		Concurrency: 4, BatchSize: 4, ForwarderLease: 3 * time.Second, SaveInterval: 500 * time.Millisecond, LogLevel: os.Getenv("TXHOOK_CHILD_LOG")}
	b.forwarder()
	cfg.ID = "doomed"
	doomed, err := spawn("worker", cfg, &logs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(doomed.kill)
	ids := b.enqueue("m", "payment.succeeded", 1)

	var sentBy string
	select {
	case sentBy = <-entered:
	case <-time.After(childWait):
		t.Fatal("the worker's request never reached the receiver")
	}
	gotFirst := time.Now()
	if sentBy != "doomed" {
		t.Fatalf("first request sent by %q", sentBy)
	}
	doomed.kill()
	once.Do(func() { close(release) }) // the handler finishes: the event is processed
	cfg.ID, cfg.Driver = "survivor", childDriver(db, 1)
	survivor, err := spawn("worker", cfg, &logs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(survivor.kill)

	testob.Eventually(t, "the delivery recorded as succeeded", func() bool {
		s, ok := deliveryStates(t, db, ep.ID)[ids[0]]
		return ok && s[0] == "succeeded"
	})
	gap := time.Since(gotFirst)
	st := deliveryStates(t, db, ep.ID)
	if s := st[ids[0]]; len(st) != 1 || s[1] != 2 {
		t.Errorf("delivery rows %v; want one, succeeded after 2 attempts", st)
	}
	type attempt struct {
		n      int
		status *int
		err    string
	}
	var log []attempt
	rows, err := db.Query(rebind(db, `SELECT attempt, status, error FROM txhook_attempt_log WHERE endpoint_id = ? ORDER BY attempt`), ep.ID)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var a attempt
		if err := rows.Scan(&a.n, &a.status, &a.err); err != nil {
			t.Fatal(err)
		}
		log = append(log, a)
	}
	rows.Close()
	if len(log) != 2 || log[0].n != 1 || !strings.HasPrefix(log[0].err, "lease expired") ||
		log[1].n != 2 || log[1].err != "" || log[1].status == nil || *log[1].status != http.StatusOK {
		t.Errorf("attempt log %+v; want attempt 1 lease expired, attempt 2 answered 200", log)
	}
	c := in.counts()
	if runs := in.runs(ids[0]); runs != 1 {
		t.Errorf("the handler processed the event %d times", runs)
	}
	if c.dups != 1 || c.requests != 2 || c.bad != 0 {
		t.Errorf("receiver: %+v; want 2 requests, the second stopped by the dedup store", c)
	}
	if !connGone.Load() {
		t.Errorf("the blocked request's connection was still open after the worker's kill")
	}
	// JetStream never hands a message out again before its AckWait; the
	// first request came less than a lease after the delivery.
	if gap < lease/2 {
		t.Errorf("handed out again %s after the first request; the lease is %s", gap, lease)
	}
	t.Logf("handed out again %s after the first request (lease %s); receiver %+v", gap, lease, c)

	// The stream holds nothing more, and the survivor stops cleanly.
	st2, err := b.js.Stream(b.ctx, "TXHOOK")
	if err != nil {
		t.Fatal(err)
	}
	testob.Eventually(t, "the stream to be empty", func() bool {
		info, err := st2.Info(b.ctx)
		return err == nil && info.State.Msgs == 0
	})
	cons, err := st2.Consumer(b.ctx, "txhook-workers")
	if err != nil {
		t.Fatal(err)
	}
	testob.Eventually(t, "nothing pending on the consumer", func() bool {
		ci, err := cons.Info(b.ctx)
		return err == nil && ci.NumAckPending == 0 && ci.NumPending == 0
	})
	if err := survivor.terminate(); err != nil {
		t.Error(err)
	}
	if l := logs.String(); strings.Contains(l, "DATA RACE") || strings.Contains(l, "panic:") {
		t.Errorf("a worker process raced or panicked:\n%s", l)
	}
}
