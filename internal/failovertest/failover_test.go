package failovertest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/pgcluster"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// Failover bounds. The enqueuers stop once failoverAfter events have
// committed on the promoted replica; held is how many requests the receiver
// keeps open across the primary's death, so that deliveries are in flight
// when it dies and their outcomes must be written to the new primary.
const (
	failoverBefore    = 150 // events committed before the kill
	failoverAfter     = 150 // events committed after the promotion
	failoverHeld      = 6
	failoverEnqueuers = 4
)

// A primary and a synchronous streaming replica, relays and enqueuers on a
// multi-host DSN (target_session_attrs=read-write). The primary is killed
// with SIGKILL while requests are in flight and events are being enqueued,
// and the replica promoted. Without restarting anything, every event whose
// Enqueue transaction committed is delivered, the business rows and events
// committed together survive together, and no delivery is left running or
// pending. Duplicates (at-least-once) are counted and logged.
func TestFailoverToSynchronousReplica(t *testing.T) {
	for _, tc := range []struct {
		backend testdb.Backend
		dsn     func(db string, cs ...*pgcluster.Cluster) string
	}{
		{testdb.PGX, pgcluster.MultiHostDSN},
		{testdb.LibPQ, pgcluster.MultiHostKeywordDSN},
	} {
		t.Run(tc.backend.Name+"/kill", func(t *testing.T) {
			testFailover(t, tc.backend, tc.dsn, (*pgcluster.Cluster).Kill)
		})
	}
}

// TestFailoverFromHungPrimary is TestFailoverToSynchronousReplica with a
// primary that hangs instead of dying (SIGSTOP: a paused VM, a stalled
// disk): its connections stay open and nothing answers on them, so only
// the clients' own timeouts get them off it: the relay bounds each round of
// statements by a lease, pgxoutbox's listener pings a quiet connection, and
// the DSN carries connect_timeout, as docs/SCALING.md tells hosts to set.
//
// pgx only: lib/pq's context cancellation sends a cancel request and keeps
// waiting for the server's answer, so nothing gets a lib/pq connection off
// a server that hangs; docs/SCALING.md says what lib/pq users must do
// (fence the old primary, which closes its connections).
func TestFailoverFromHungPrimary(t *testing.T) {
	dsn := func(db string, cs ...*pgcluster.Cluster) string {
		return pgcluster.MultiHostDSN(db, cs...) + "&connect_timeout=5"
	}
	testFailover(t, testdb.PGX, dsn, (*pgcluster.Cluster).Freeze)
}

func testFailover(t *testing.T, backend testdb.Backend, dsnOf func(string, ...*pgcluster.Cluster) string,
	crash func(*pgcluster.Cluster) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	primary := pgcluster.ForTest(t, pgcluster.Options{Settings: pgcluster.Production()})
	if err := primary.CreateDatabase(ctx, "shop"); err != nil {
		t.Fatal(err)
	}
	replica := primary.ReplicaForTest(t, pgcluster.ReplicaOptions{Name: "standby", Synchronous: true})
	dsn := dsnOf("shop", primary, replica)
	t.Logf("DSN %s", dsn)

	db, err := sql.Open(backend.Driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	logs := &logBuffer{}
	b := setup(t, &testdb.DB{DB: db, Backend: backend, DSN: dsn}, outbox.Config{Logger: logs.logger()})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relay logs:\n%s", logs.String())
		}
	})
	if _, err := db.ExecContext(ctx, `CREATE TABLE payments (id text PRIMARY KEY, amount int NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	// The receiver records each event ID it gets; once failoverHeld
	// requests have arrived it holds the next failoverHeld open until
	// release is closed, so they are in flight across the failover.
	var (
		mu       sync.Mutex
		got      = map[string]int{}
		requests int
	)
	release := make(chan struct{})
	heldReady := make(chan struct{})
	var held atomic.Int32
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests++
		n := requests
		mu.Unlock()
		if n > failoverHeld && n <= 2*failoverHeld {
			if held.Add(1) == failoverHeld {
				close(heldReady)
			}
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		mu.Lock()
		got[r.Header.Get("Webhook-Id")]++
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(rc.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	b.endpoint("merchant_1", rc.URL, "payment.*")

	// Short lease so deliveries whose outcome was lost with the primary
	// are retried within the test's bounds.
	cfg := outbox.RelayConfig{Lease: 20 * time.Second, Timeout: 8 * time.Second, Concurrency: 8,
		PollInterval: 250 * time.Millisecond}
	relays := []*outbox.Relay{b.relay(cfg), b.relay(cfg)}

	// Enqueuers commit payments with their events until told to stop;
	// committed holds the events whose COMMIT returned nil.
	var (
		cmu            sync.Mutex
		committed      = map[string]string{} // payment ID -> event ID
		afterPromotion atomic.Int64
		failedTx       atomic.Int64
		seq            atomic.Int64
		promoted       atomic.Bool
	)
	stop := make(chan struct{})
	before := make(chan struct{})
	after := make(chan struct{})
	var beforeOnce, afterOnce sync.Once
	var wg sync.WaitGroup
	for range failoverEnqueuers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				payID := fmt.Sprintf("pay_%d", seq.Add(1))
				evID, err := enqueuePayment(ctx, b.ob, db, payID)
				if err != nil {
					failedTx.Add(1)
					continue
				}
				cmu.Lock()
				committed[payID] = evID
				n := len(committed)
				cmu.Unlock()
				if n >= failoverBefore {
					beforeOnce.Do(func() { close(before) })
				}
				if promoted.Load() && afterPromotion.Add(1) >= failoverAfter {
					afterOnce.Do(func() { close(after) })
				}
			}
		}()
	}
	stopEnqueuers := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopEnqueuers)

	wait := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(3 * waitFor):
			t.Fatalf("timed out waiting for %s", what)
		}
	}
	wait("events committed before the kill", before)
	wait("requests held open at the receiver", heldReady)

	if err := crash(primary); err != nil {
		t.Fatal(err)
	}
	cmu.Lock()
	atKill := len(committed)
	cmu.Unlock()
	if err := replica.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted.Store(true)
	close(release) // the held requests answer now; their outcomes go to the new primary
	wait("events committed on the promoted replica", after)
	stopEnqueuers()

	cmu.Lock()
	want := make(map[string]string, len(committed))
	for k, v := range committed {
		want[k] = v
	}
	cmu.Unlock()
	t.Logf("committed %d events (%d before the primary failed, %d after the promotion), %d transactions failed",
		len(want), atKill, afterPromotion.Load(), failedTx.Load())

	// Every committed event is delivered, with no restart of anything.
	deadline := time.Now().Add(3 * waitFor)
	var missing []string
	for {
		missing = missing[:0]
		mu.Lock()
		for _, ev := range want {
			if got[ev] == 0 {
				missing = append(missing, ev)
			}
		}
		mu.Unlock()
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d committed events never delivered, e.g. %s", len(missing), len(want), missing[0])
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Nothing stays running or pending: leases held by the relays at the
	// kill were recovered on the new primary.
	b.eventually("every delivery finished", func() bool {
		return b.count(`SELECT count(*) FROM txhook_deliveries WHERE state NOT IN ('succeeded', 'dead')`) == 0
	})
	// Each relay listens again, on the new primary (pqlisten's reconnection
	// or the relay's retry of pgxoutbox's listener): later events wake it
	// at commit instead of at its next poll. (A listening connection that
	// was quiet shows its keep-alive ping: lib/pq's is an empty query,
	// pgx's "-- ping".)
	b.eventually("both relays LISTENing on the new primary", func() bool {
		return b.count(`SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()
			AND (query LIKE 'LISTEN%' OR query IN ('', '-- ping'))`) >= len(relays)
	})
	// The business row and the event committed in one transaction: after
	// the failover each has the other (transactions whose COMMIT failed
	// included: either both survived or neither).
	if n := b.count(`SELECT count(*) FROM payments p WHERE NOT EXISTS
		(SELECT 1 FROM txhook_events e WHERE e.tenant = 'merchant_1' AND e.idempotency_key = p.id)`); n != 0 {
		t.Errorf("%d payments without their event", n)
	}
	if n := b.count(`SELECT count(*) FROM txhook_events e WHERE NOT EXISTS
		(SELECT 1 FROM payments p WHERE p.id = e.idempotency_key)`); n != 0 {
		t.Errorf("%d events without their payment", n)
	}
	if n := b.count(`SELECT count(*) FROM txhook_dead_letters`); n != 0 {
		t.Errorf("%d dead letters, want none (the receiver always answers 200)", n)
	}

	mu.Lock()
	total, dups := 0, 0
	for _, n := range got {
		total += n
		dups += n - 1
	}
	distinct := len(got)
	mu.Unlock()
	var lost uint64
	for _, r := range relays {
		s := r.Stats()
		lost += s.LeaseLost
	}
	t.Logf("receiver: %d requests, %d distinct events, %d duplicates; relays' outcomes lost with the primary (LeaseLost): %d",
		total, distinct, dups, lost)
}

// enqueuePayment commits a payment and its event in one transaction and
// returns the event's ID; any error means the commit is not known to have
// happened.
func enqueuePayment(ctx context.Context, ob *outbox.Outbox, db *sql.DB, payID string) (string, error) {
	tctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	tx, err := db.BeginTx(tctx, nil)
	if err != nil {
		return "", err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(tctx, `INSERT INTO payments (id, amount) VALUES ($1, 1200)`, payID); err != nil {
		return "", err
	}
	id, err := ob.Enqueue(tctx, tx, outbox.Event{
		Tenant:         "merchant_1",
		Type:           "payment.succeeded",
		IdempotencyKey: payID,
		Payload:        []byte(`{"payment_id":"` + payID + `"}`),
	})
	if err != nil {
		return "", err
	}
	if err := tx.Commit(); err != nil {
		return "", errors.Join(errors.New("commit"), err)
	}
	return id, nil
}
