package outbox_test

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// Chaos bounds: load for at most chaosLoad or chaosEvents events, with a
// relay killed every one to three seconds meanwhile, at most chaosKills
// times.
const (
	chaosLoad   = 20 * time.Second
	chaosEvents = 1500
	chaosKills  = 12
	chaosRelays = 3
)

// spawnRelay starts a relay subprocess whose stderr goes to stderr, and
// waits until it runs; unlike startRelayProcess it may be called from any
// goroutine.
func spawnRelay(db *testdb.DB, id string, stderr io.Writer, env ...string) (*child, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(childEnv(db), env...),
		"TXHOOK_CHILD_LEASE=3s",
		"TXHOOK_CHILD_TIMEOUT=1s",
		"TXHOOK_CHILD_CONCURRENCY=8",
		"TXHOOK_CHILD_ID="+id,
	)
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, succeeded: make(chan int, 1)}
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && strings.TrimSpace(line) != "READY" {
			err = fmt.Errorf("unexpected first line %q", line)
		}
		ready <- err
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case err := <-ready:
		if err != nil {
			c.kill()
			return nil, fmt.Errorf("relay process %s: %w", id, err)
		}
	case <-time.After(waitFor):
		c.kill()
		return nil, fmt.Errorf("relay process %s did not start", id)
	}
	return c, nil
}

// Three relay processes on PostgreSQL, receivers that fail 30% of requests,
// relays killed with SIGKILL at random and restarted. At quiescence every
// committed event reached every endpoint subscribed to it or the
// dead-letter table, nothing is left in flight, every endpoint's recorded
// health matches its attempt log, and no relay logged a deadlock.
func TestChaosRelaysKilledUnderFailingReceivers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills relay processes for a minute")
	}
	db := testdb.Open(t, testdb.PGX)
	b := setup(t, db, outbox.Config{})

	// Receivers: one server, one path per endpoint; 20% of requests get a
	// 500, 10% a dropped connection.
	var accepted sync.Map // "endpoint path event ID" → *atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		switch n := rand.IntN(10); {
		case n < 2:
			w.WriteHeader(http.StatusInternalServerError)
			return
		case n < 3:
			panic(http.ErrAbortHandler)
		}
		v, _ := accepted.LoadOrStore(r.URL.Path+" "+r.Header.Get(outbox.HeaderEventID), new(atomic.Int32))
		v.(*atomic.Int32).Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)

	type sub struct {
		tenant string
		types  []string
	}
	subs := []sub{
		{"t0", nil}, {"t0", []string{"payment.*"}},
		{"t1", nil}, {"t1", []string{"refund.*"}},
		{"t2", nil}, {"t2", []string{"order.updated"}},
	}
	eps := make([]outbox.Endpoint, len(subs))
	for i, s := range subs {
		eps[i] = b.endpoint(s.tenant, srv.URL+"/ep"+strconv.Itoa(i), s.types...)
	}

	var stderr logBuffer // the relays' stderr
	env := []string{"TXHOOK_CHILD_FAST_RETRY=1", "TXHOOK_CHILD_ATTEMPTS=4", "TXHOOK_CHILD_LOG_WARN=1", "TXHOOK_CHILD_HEALTH_SWEEP=1s"}
	var relaysMu sync.Mutex
	relays := make([]*child, chaosRelays)
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
		c, err := spawnRelay(db, fmt.Sprintf("relay-%d-%d", i, generation), &stderr, env...)
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

	// The killer: SIGKILL a random relay every one to three seconds and
	// start it again, until the load ends.
	stopKilling := make(chan struct{})
	killerDone := make(chan error, 1)
	var kills int
	go func() {
		for kills < chaosKills {
			select {
			case <-stopKilling:
				killerDone <- nil
				return
			case <-time.After(time.Second + rand.N(2*time.Second)):
			}
			i := rand.IntN(len(relays))
			relaysMu.Lock()
			c := relays[i]
			relaysMu.Unlock()
			c.kill()
			kills++
			if err := start(i); err != nil {
				killerDone <- err
				return
			}
		}
		killerDone <- nil
	}()

	// The load: events of three types, a third of them keyed.
	types := []string{"payment.succeeded", "refund.created", "order.updated"}
	type sent struct{ id, tenant, typ string }
	var events []sent
	deadline := time.Now().Add(chaosLoad)
	tick := time.NewTicker(10 * time.Millisecond)
	for len(events) < chaosEvents && time.Now().Before(deadline) {
		<-tick.C
		ev := outbox.Event{Tenant: "t" + strconv.Itoa(rand.IntN(3)), Type: types[rand.IntN(len(types))], Payload: []byte(`{"n":1}`)}
		if rand.IntN(3) == 0 {
			ev.OrderingKey = "k" + strconv.Itoa(rand.IntN(10))
		}
		events = append(events, sent{b.enqueue(ev), ev.Tenant, ev.Type})
	}
	tick.Stop()
	close(stopKilling)
	if err := <-killerDone; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d events enqueued, %d relays killed", len(events), kills)

	// Quiescence: everything dispatched and finished.
	deadline = time.Now().Add(3 * waitFor)
	for {
		pending := b.count("SELECT count(*) FROM txhook_events WHERE dispatched_at IS NULL") +
			b.count("SELECT count(*) FROM txhook_deliveries WHERE state IN ('pending', 'running', 'paused', 'blocked')")
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d events or deliveries still unfinished", pending)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Every committed event reached every endpoint subscribed to it, or
	// the dead-letter table: one delivery per pair, succeeded (and accepted
	// by the receiver) or dead with its dead letter.
	type pair struct{ event, endpoint string }
	state := map[pair]string{}
	rows, err := db.QueryContext(b.ctx, `SELECT d.event_id, d.endpoint_id, d.state, EXISTS (SELECT 1 FROM txhook_dead_letters dl WHERE dl.delivery_id = d.id)
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
		if st == "dead" {
			dead++
			if !lettered {
				t.Errorf("dead delivery of %s to %s has no dead letter", p.event, p.endpoint)
			}
		}
		state[p] = st
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, e := range events {
		for i, s := range subs {
			if s.tenant != e.tenant || !subscribes(s.types, e.typ) {
				continue
			}
			want++
			switch st := state[pair{e.id, eps[i].ID}]; st {
			case "succeeded":
				if v, ok := accepted.Load("/ep" + strconv.Itoa(i) + " " + e.id); !ok || v.(*atomic.Int32).Load() == 0 {
					t.Errorf("event %s recorded as delivered to %s, which never accepted it", e.id, eps[i].ID)
				}
			case "dead":
			default:
				t.Errorf("event %s (%s, %s) to %s: %q", e.id, e.tenant, e.typ, eps[i].ID, st)
			}
		}
	}
	if len(state) != want {
		t.Errorf("%d deliveries, want %d (one per event and subscribed endpoint)", len(state), want)
	}
	t.Logf("%d deliveries, %d dead-lettered", want, dead)

	// Every endpoint's recorded health matches its attempt log, once the
	// relays' health sweep has repaired what killed relays never recorded.
	const truth = `SELECT ep.id,
    ep.failing_since IS NOT DISTINCT FROM t.fs AND ep.last_success_at IS NOT DISTINCT FROM t.ok
        AND ep.last_failure_at IS NOT DISTINCT FROM t.failed,
    concat_ws(' | ', ep.failing_since, ep.last_success_at, ep.last_failure_at),
    concat_ws(' | ', t.fs, t.ok, t.failed)
FROM txhook_endpoints ep, LATERAL (
    SELECT h.ok, h.failed, CASE WHEN h.failed IS NULL OR h.ok >= h.failed THEN NULL ELSE (
        SELECT min(a.started_at) FROM txhook_attempt_log a
        WHERE a.endpoint_id = ep.id AND a.error <> '' AND (h.ok IS NULL OR a.started_at > h.ok)) END AS fs
    FROM (SELECT (SELECT max(started_at) FROM txhook_attempt_log WHERE endpoint_id = ep.id AND error = '') AS ok,
                 (SELECT max(started_at) FROM txhook_attempt_log WHERE endpoint_id = ep.id AND error <> '') AS failed) h
) t ORDER BY ep.id`
	var mismatch []string
	healthy := func() bool {
		mismatch = mismatch[:0]
		rows, err := db.QueryContext(b.ctx, truth)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var id, got, exp string
			var ok bool
			if err := rows.Scan(&id, &ok, &got, &exp); err != nil {
				t.Fatal(err)
			}
			if !ok {
				mismatch = append(mismatch, fmt.Sprintf("%s: recorded %s, attempt log %s", id, got, exp))
			}
		}
		return len(mismatch) == 0
	}
	deadline = time.Now().Add(waitFor)
	for !healthy() {
		if time.Now().After(deadline) {
			t.Fatalf("endpoint health (failing since | last success | last failure) differs from the attempt log:\n%s", strings.Join(mismatch, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := b.count("SELECT count(*) FROM txhook_endpoints WHERE NOT enabled"); n != 0 {
		t.Errorf("%d endpoints disabled", n)
	}

	relaysMu.Lock()
	for _, c := range relays {
		c.terminate(t)
	}
	relaysMu.Unlock()
	logs := stderr.String()
	if i := strings.Index(strings.ToLower(logs), "deadlock"); i >= 0 {
		t.Errorf("a relay logged a deadlock: %s", logs[max(0, i-300):min(len(logs), i+200)])
	}
	if i := strings.Index(logs, "recording endpoint health failed"); i >= 0 {
		t.Errorf("a relay failed to record endpoint health: %.1000s", logs[i:])
	}
}
