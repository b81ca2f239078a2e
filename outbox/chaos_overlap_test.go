package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/pgcluster"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// envChaosLong, set to 1, makes TestChaosNoDeliveryInFlightTwice the run
// that found the overlaps: 200 s of load, 35 relay kills, PostgreSQL
// restarted three times and killed twice.
const envChaosLong = "TXHOOK_CHAOS_LONG"

// chaosPlan bounds one run of TestChaosNoDeliveryInFlightTwice.
type chaosPlan struct {
	load     time.Duration // enqueue for this long at most
	events   int           // or this many events
	kills    int           // SIGKILL a relay every 1–2 s, at most this often
	restarts int           // restart PostgreSQL (fast shutdown) this often, spread over the load
	crashes  int           // kill PostgreSQL (SIGKILL, crash recovery) this often
}

// Three relay processes (two on pgx, one on lib/pq) on a PostgreSQL
// cluster of the test's own, relays killed with SIGKILL at random and
// started again, PostgreSQL restarted under load, and receivers that
// answer 500, close the connection, or hang until the relay's timeout cuts
// the request. The receiver counts, per delivery (event and endpoint),
// the requests open at once, a request ending when its handler observes
// the connection closed: no delivery may ever have two. And between the
// end of one request of a delivery and the start of the next, at least
// about the retry policy's shortest delay passes (the lease's safety
// margin, after a relay was killed, is longer).
//
// A request that starts before the receiver noticed that the previous one
// was cut, what the fleet saw, came from retries counted from the
// attempt's start (an attempt that outlasted the delay was retried at
// once) and leases without a margin enforced on the request itself.
//
// A fast shutdown of PostgreSQL keeps every commit. When the plan kills it
// too, relays commit their own writes synchronously
// (Config.SyncRelayCommits): a crash that forgot a claim would forget its
// lease with it, and the delivery could be sent again while the first
// request is open (see outbox/lease.go). One long run with asynchronous
// relay commits and two crashes saw no overlap; the gap is narrow, not
// closed.
func TestChaosNoDeliveryInFlightTwice(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster and kills relay processes")
	}
	plan := chaosPlan{load: 12 * time.Second, events: 300, kills: 8, restarts: 1}
	if os.Getenv(envChaosLong) == "1" {
		plan = chaosPlan{load: 200 * time.Second, events: 6000, kills: 35, restarts: 3, crashes: 2}
	}
	cluster := pgcluster.ForTest(t, pgcluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), plan.load+10*time.Minute)
	defer cancel()
	if err := cluster.CreateDatabase(ctx, "chaos"); err != nil {
		t.Fatal(err)
	}
	dsn := cluster.DSN("chaos")
	pool, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	dbs := map[string]*testdb.DB{
		"pgx":    {DB: pool, Backend: testdb.PGX, DSN: dsn},
		"lib/pq": {Backend: testdb.LibPQ, DSN: cluster.KeywordDSN("chaos")},
	}
	b := setup(t, dbs["pgx"], outbox.Config{})
	b.ctx = ctx

	// The retry policy of the relays: exponential from 250 ms, ±25%.
	const base = 250 * time.Millisecond
	minGap := base * 3 / 4 / 2 // half the shortest jittered delay: the rest is the receiver's slack in noticing a cut
	rc := newSpanReceiver(time.Now, func(r *http.Request, n int) int {
		switch x := rand.IntN(100); {
		case x < 15:
			return http.StatusInternalServerError
		case x < 25:
			return answerDrop
		case x < 35:
			return answerHang // until the relay's 1 s timeout
		}
		return http.StatusNoContent
	})
	srv := newHTTPServer(t, rc)
	type sub struct {
		tenant string
		types  []string
	}
	subs := []sub{{"t0", nil}, {"t0", []string{"payment.*"}}, {"t1", nil}, {"t2", []string{"refund.*"}}, {"t2", nil}}
	paths := map[string]string{} // endpoint ID → path
	for i, s := range subs {
		ep := b.endpoint(s.tenant, srv.URL+"/ep"+strconv.Itoa(i), s.types...)
		paths[ep.ID] = "/ep" + strconv.Itoa(i)
	}

	var stderr logBuffer
	env := []string{"TXHOOK_CHILD_RETRY_BASE=" + base.String(), "TXHOOK_CHILD_ATTEMPTS=5", "TXHOOK_CHILD_LOG_WARN=1"}
	if plan.crashes > 0 {
		env = append(env, "TXHOOK_CHILD_SYNC_COMMITS=1")
	}
	drivers := []string{"pgx", "pgx", "lib/pq"}
	var relaysMu sync.Mutex
	relays := make([]*child, len(drivers))
	t.Cleanup(func() {
		relaysMu.Lock()
		defer relaysMu.Unlock()
		for _, c := range relays {
			if c != nil {
				c.kill()
			}
		}
	})
	generation := 0
	start := func(i int) error {
		generation++
		id := fmt.Sprintf("relay-%d-%d-%s", i, generation, drivers[i])
		c, err := spawnRelay(dbs[drivers[i]], id, &stderr, env...)
		// A relay started while PostgreSQL restarts cannot check the
		// schema and exits: start it again.
		for try := 0; err != nil && try < 20; try++ {
			time.Sleep(500 * time.Millisecond)
			c, err = spawnRelay(dbs[drivers[i]], id, &stderr, env...)
		}
		if err != nil {
			return err
		}
		relaysMu.Lock()
		relays[i] = c
		relaysMu.Unlock()
		return nil
	}
	for i := range relays {
		if err := start(i); err != nil {
			t.Fatal(err)
		}
	}

	// The killer: SIGKILL a random relay every one to two seconds and
	// start it again; PostgreSQL restarted (or killed) at even intervals
	// of the load. Both stop with the load.
	stop := make(chan struct{})
	var chaosWG sync.WaitGroup
	var chaosErr error
	var chaosMu sync.Mutex
	fail := func(err error) {
		chaosMu.Lock()
		defer chaosMu.Unlock()
		if chaosErr == nil {
			chaosErr = err
		}
	}
	kills := 0
	chaosWG.Add(2)
	go func() {
		defer chaosWG.Done()
		for kills < plan.kills {
			select {
			case <-stop:
				return
			case <-time.After(time.Second + rand.N(time.Second)):
			}
			i := rand.IntN(len(relays))
			relaysMu.Lock()
			c := relays[i]
			relaysMu.Unlock()
			c.kill()
			kills++
			if err := start(i); err != nil {
				fail(err)
				return
			}
		}
	}()
	var dbEvents []string
	go func() {
		defer chaosWG.Done()
		n := plan.restarts + plan.crashes
		for k := range n {
			select {
			case <-stop:
				return
			case <-time.After(plan.load / time.Duration(n+1)):
			}
			what := "restart"
			if k%2 == 1 && plan.crashes > 0 && k/2 < plan.crashes {
				what = "crash"
				if err := cluster.Kill(); err != nil {
					fail(err)
					return
				}
			}
			began := time.Now()
			err := cluster.Restart(ctx)
			// Killed backends may hold the shared memory a moment after
			// the postmaster is gone ("pre-existing shared memory block is
			// still in use"): try again.
			for try := 0; err != nil && what == "crash" && try < 20; try++ {
				time.Sleep(250 * time.Millisecond)
				err = cluster.Restart(ctx)
			}
			if err != nil {
				fail(fmt.Errorf("PostgreSQL %s: %w", what, err))
				return
			}
			dbEvents = append(dbEvents, fmt.Sprintf("%s (%v)", what, time.Since(began).Round(time.Millisecond)))
		}
	}()

	// The load: events of three types, a quarter of them keyed, committed
	// one by one; an event whose commit failed (the database restarting)
	// is not counted as committed.
	types := []string{"payment.succeeded", "refund.created", "order.updated"}
	type sent struct{ id, tenant, typ string }
	var committed []sent
	failed := 0
	deadline := time.Now().Add(plan.load)
	tick := time.NewTicker(plan.load / time.Duration(plan.events))
	for len(committed)+failed < plan.events && time.Now().Before(deadline) {
		<-tick.C
		ev := outbox.Event{Tenant: "t" + strconv.Itoa(rand.IntN(3)), Type: types[rand.IntN(len(types))], Payload: []byte(`{"n":1}`)}
		if rand.IntN(4) == 0 {
			ev.OrderingKey = "k" + strconv.Itoa(rand.IntN(10))
		}
		id, err := enqueueOnce(b, ev)
		if err != nil {
			failed++
			continue
		}
		committed = append(committed, sent{id, ev.Tenant, ev.Type})
	}
	tick.Stop()
	close(stop)
	chaosWG.Wait()
	if chaosErr != nil {
		t.Fatal(chaosErr)
	}
	t.Logf("%d events committed (%d enqueues failed while PostgreSQL was down), %d relays killed, PostgreSQL: %s",
		len(committed), failed, kills, strings.Join(dbEvents, ", "))

	// Quiescence: everything dispatched and finished.
	for quiet := time.Now().Add(3 * waitFor); ; time.Sleep(50 * time.Millisecond) {
		n := b.count("SELECT count(*) FROM txhook_events WHERE dispatched_at IS NULL") +
			b.count("SELECT count(*) FROM txhook_deliveries WHERE state IN ('pending', 'running', 'paused', 'blocked')")
		if n == 0 {
			break
		}
		if time.Now().After(quiet) {
			t.Fatalf("%d events or deliveries still unfinished", n)
		}
	}
	relaysMu.Lock()
	for _, c := range relays {
		c.terminate(t)
	}
	relaysMu.Unlock()

	// What the receiver saw: never a delivery in flight twice, and the
	// pause between two requests of a delivery.
	requests, smallest := rc.check(t, minGap)
	t.Logf("%d requests; smallest pause between two requests of a delivery %v (want ≥ %v)", requests, smallest, minGap)

	// Nothing lost: every committed event reached every endpoint that
	// subscribes to it, accepted by the receiver, or the dead-letter table.
	type pair struct{ event, endpoint string }
	state := map[pair]string{}
	rows, err := pool.QueryContext(b.ctx, `SELECT d.event_id, d.endpoint_id, d.state, EXISTS (SELECT 1 FROM txhook_dead_letters dl WHERE dl.delivery_id = d.id)
FROM txhook_deliveries d`)
	if err != nil {
		t.Fatal(err)
	}
	dead := 0
	for rows.Next() {
		var p pair
		var st string
		var lettered bool
		if err := rows.Scan(&p.event, &p.endpoint, &st, &lettered); err != nil {
			t.Fatal(err)
		}
		if _, dup := state[p]; dup {
			t.Errorf("event %s has more than one delivery to %s", p.event, p.endpoint)
		}
		switch st {
		case "dead":
			dead++
			if !lettered {
				t.Errorf("dead delivery of %s to %s has no dead letter", p.event, p.endpoint)
			}
		case "succeeded":
			accepted := false
			for _, sp := range rc.of(paths[p.endpoint] + " " + p.event) {
				accepted = accepted || sp.answer == http.StatusNoContent
			}
			if !accepted {
				t.Errorf("event %s recorded as delivered to %s, which never accepted it", p.event, p.endpoint)
			}
		}
		state[p] = st
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, e := range committed {
		for epID, path := range paths {
			i, _ := strconv.Atoi(strings.TrimPrefix(path, "/ep"))
			if s := subs[i]; s.tenant != e.tenant || !subscribes(s.types, e.typ) {
				continue
			}
			want++
			if st := state[pair{e.id, epID}]; st != "succeeded" && st != "dead" {
				t.Errorf("committed event %s (%s, %s) to %s: %q", e.id, e.tenant, e.typ, path, st)
			}
		}
	}
	t.Logf("%d deliveries of committed events, %d in all, %d dead-lettered", want, len(state), dead)
	if logs := stderr.String(); strings.Contains(strings.ToLower(logs), "deadlock") {
		i := strings.Index(strings.ToLower(logs), "deadlock")
		t.Errorf("a relay logged a deadlock: %s", logs[max(0, i-300):min(len(logs), i+200)])
	}
}

// subscribes reports whether an endpoint subscribed to types (none: all)
// takes an event of type typ.
func subscribes(types []string, typ string) bool {
	if len(types) == 0 {
		return true
	}
	for _, p := range types {
		if p == typ || strings.HasSuffix(p, "*") && strings.HasPrefix(typ, strings.TrimSuffix(p, "*")) {
			return true
		}
	}
	return false
}

// enqueueOnce writes one event in its own transaction and reports whether
// it committed; errors (the database restarting) are returned, not fatal.
func enqueueOnce(b *bundle, ev outbox.Event) (string, error) {
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	id, err := b.ob.Enqueue(ctx, tx, ev)
	if err != nil {
		tx.Rollback()
		return "", err
	}
	return id, tx.Commit()
}
