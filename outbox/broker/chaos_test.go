package broker_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txhook/txhook/internal/natscluster"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testob"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/broker"
	"github.com/txhook/txhook/verify"
)

// Chaos bounds: events are enqueued for at most chaosLoad or until
// chaosEvents; meanwhile a forwarder or worker process is SIGKILLed and
// restarted every one to three seconds (at most chaosKills times), and a
// cluster node at chaosNodeKills[i] after the load began (the stream's
// leader first, then the consumer's, then another).
const (
	chaosLoad       = 25 * time.Second
	chaosEvents     = 1200
	chaosKills      = 10
	chaosForwarders = 2
	chaosWorkers    = 3
	// chaosHangs bounds the events for the hanging receiver, enqueued in
	// the first third of the load: each of their attempts takes the whole
	// Timeout, and a worker sends one at a time to an endpoint that slow.
	chaosHangs = 4
	// quiesceWait bounds the wait for every delivery to end once the chaos
	// is over: the hostile tenant's last deliveries take their attempts'
	// timeouts and backoffs, a killed worker's leases run out.
	quiesceWait = 3 * time.Minute
)

var chaosNodeKills = []time.Duration{3 * time.Second, 10 * time.Second, 17 * time.Second}

// The worker and forwarder processes' settings: leases short enough that
// a killed process's work comes back within seconds, a retry policy short
// enough that the hostile tenant's deliveries die within the run.
var chaosChild = childConfig{
	Replicas: 3, RelayLease: 6 * time.Second, Timeout: 2 * time.Second,
	Attempts: 6, RetryBase: 100 * time.Millisecond, RetryCap: 500 * time.Millisecond,
	Concurrency: 16, BatchSize: 20,
	ForwarderLease: 3 * time.Second, SaveInterval: 500 * time.Millisecond, PollInterval: 100 * time.Millisecond,
}

// chaosSub is an endpoint of the chaos test: its tenant, the types it
// subscribes to (nil: all) and how its receiver behaves.
type chaosSub struct {
	tenant string
	types  []string
	kind   string // "inbox" (verify + dedup), or the hostile "hang", "fail", "close"
}

var chaosSubs = []chaosSub{
	{"t0", nil, "inbox"},
	{"t0", []string{"payment.*"}, "inbox"},
	{"t1", nil, "inbox"},
	{"t1", []string{"refund.*", "order.updated"}, "inbox"},
	{"t2", []string{"payment.succeeded"}, "inbox"},
	{"t2", []string{"order.*"}, "inbox"}, // t2's refund.created and audit.logged go nowhere
	{"evil", []string{"hang.*"}, "hang"},
	{"evil", []string{"fail.*", "payment.*"}, "fail"},
	{"evil", []string{"close.*", "payment.*"}, "close"},
}

var chaosTypes = map[string][]string{
	"t0":   {"payment.succeeded", "refund.created", "order.updated"},
	"t1":   {"payment.succeeded", "refund.created", "order.updated"},
	"t2":   {"payment.succeeded", "refund.created", "order.updated", "audit.logged"},
	"evil": {"payment.succeeded", "fail.x", "close.x", "hang.x"},
}

func (s chaosSub) subscribes(typ string) bool {
	if len(s.types) == 0 {
		return true
	}
	for _, p := range s.types {
		if p == typ || strings.HasSuffix(p, "*") && strings.HasPrefix(typ, strings.TrimSuffix(p, "*")) {
			return true
		}
	}
	return false
}

// pick says, deterministically, whether an event is one of the tenth of
// an endpoint's events that its receiver treats in a given way.
func pick(eventID, endpoint string, which uint32) bool {
	h := fnv.New32a()
	h.Write([]byte(eventID + "/" + endpoint))
	return h.Sum32()%10 == which
}

// Broker mode through a bad day: a three-node JetStream cluster (the
// stream with three replicas), two forwarder and three worker processes on
// PostgreSQL (lib/pq and pgx), each connected to its own node first;
// events enqueued continuously for three calm tenants and a hostile one
// whose receivers hang past the timeout, answer 500 or close the
// connection; calm receivers that fail an event's first processing, or
// process it and drop the connection (so the sender retries what was
// done). Meanwhile cluster nodes are SIGKILLed and restarted (the
// stream's leader, the consumer's leader, another), and forwarder and
// worker processes are SIGKILLed at random (the forwarder holding the
// cursor among them) and restarted.
//
// Afterwards: every event reached every endpoint subscribed to it (the
// hostile ones: the dead-letter table), the receivers' handlers ran at
// most once per event (duplicates stopped by verify's dedup store, and
// counted), one delivery row per (event, endpoint), final, with an
// attempt log that numbers its attempts 1..n once each, and the stream
// and its consumer hold nothing.
func TestBrokerChaosCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a JetStream cluster and kills its nodes, forwarders and workers for a minute")
	}
	begin := time.Now()
	db := testdb.Open(t, testdb.PGX)
	cl := natscluster.ForTest(t, natscluster.Options{})
	_, js := cl.JetStream(t)
	ob, ctx := testob.NewOutboxWith(t, db, outbox.Config{Broker: true, Logger: logger(t)})
	t.Logf("cluster and database ready in %s", time.Since(begin).Round(time.Millisecond))

	// Receivers: one server, a path per endpoint.
	closing := make(chan struct{})
	var hostile [3]atomic.Int64 // requests to the hang, fail and close endpoints
	inboxes := make([]*inbox, len(chaosSubs))
	var handlers sync.Map // path → http.Handler
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, ok := handlers.Load(r.URL.Path)
		if !ok {
			http.NotFound(w, r)
			return
		}
		h.(http.Handler).ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(closing) }) // before srv.Close: hanging handlers return
	type evInfo struct{ tenant, typ string }
	var evMu sync.Mutex
	known := map[string]evInfo{} // every event enqueued, by ID (before its commit)
	eps := make([]outbox.Endpoint, len(chaosSubs))
	for i, s := range chaosSubs {
		path := "/ep/" + strconv.Itoa(i)
		ep, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: s.tenant, URL: srv.URL + path, EventTypes: s.types})
		if err != nil {
			t.Fatal(err)
		}
		eps[i] = ep
		var h http.Handler
		switch s.kind {
		case "inbox":
			in := newInbox(t, ep.ID, ep)
			in.failFirst = func(id string) bool { return pick(id, ep.ID, 0) }
			in.lie = func(id string) bool { return pick(id, ep.ID, 1) }
			in.check = func(ev verify.Event) error {
				evMu.Lock()
				info, ok := known[ev.ID]
				evMu.Unlock()
				switch {
				case !ok:
					return errors.New("never enqueued")
				case info.tenant != s.tenant:
					return fmt.Errorf("an event of tenant %s", info.tenant)
				case !s.subscribes(info.typ) || info.typ != ev.Type:
					return fmt.Errorf("type %s (signed %s) not subscribed", info.typ, ev.Type)
				}
				return nil
			}
			inboxes[i], h = in, in
		case "hang":
			h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hostile[0].Add(1)
				// The server notices the sender hanging up only once the
				// body is read.
				_, _ = io.Copy(io.Discard, r.Body)
				select {
				case <-r.Context().Done():
				case <-closing:
				}
			})
		case "fail":
			h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hostile[1].Add(1)
				w.WriteHeader(http.StatusInternalServerError)
			})
		case "close":
			h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hostile[2].Add(1)
				panic(http.ErrAbortHandler)
			})
		}
		handlers.Store(path, h)
	}

	// The stream, three replicas.
	bcfg := broker.Config{JetStream: js, Replicas: 3, Relay: outbox.RelayConfig{Lease: chaosChild.RelayLease}}
	// A cluster that just started may not count every peer online yet:
	// JetStream refuses the placement ("no suitable peers") for a moment.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		err := broker.Setup(ctx, bcfg)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		t.Logf("creating the stream: %v; retrying", err)
	}
	if _, err := cl.WaitStream(ctx, broker.DefaultStream); err != nil {
		t.Fatal(err)
	}

	// The processes: slot i of each role prefers node i (mod 3) and uses
	// lib/pq or pgx by the slot's parity.
	var logs logBuffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("forwarder and worker processes' log (end):\n%s", logs.tail(60000))
		}
	})
	type slot struct {
		role string
		n    int
		gen  int
		p    *proc
	}
	var slotsMu sync.Mutex
	var slots []*slot
	for i := range chaosForwarders {
		slots = append(slots, &slot{role: "forwarder", n: i})
	}
	for i := range chaosWorkers {
		slots = append(slots, &slot{role: "worker", n: i})
	}
	t.Cleanup(func() {
		slotsMu.Lock()
		defer slotsMu.Unlock()
		for _, s := range slots {
			if s.p != nil {
				s.p.kill()
			}
		}
	})
	start := func(s *slot) error {
		slotsMu.Lock()
		s.gen++
		cfg := chaosChild
		cfg.ID = fmt.Sprintf("%s-%d.%d", s.role[:3], s.n, s.gen)
		slotsMu.Unlock()
		urls := cl.URLs()
		k := s.n % len(urls)
		cfg.NATS = append(urls[k:], urls[:k]...)
		cfg.Driver, cfg.DSN = childDriver(db, s.n), db.DSN
		if s.role == "forwarder" {
			cfg.LogLevel = "INFO" // cursor takeovers
		}
		p, err := spawn(s.role, cfg, &logs)
		if err != nil {
			return err
		}
		slotsMu.Lock()
		s.p = p
		slotsMu.Unlock()
		return nil
	}
	{
		errs := make(chan error, len(slots))
		for _, s := range slots {
			go func() { errs <- start(s) }()
		}
		for range slots {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("%d forwarders and %d workers running after %s", chaosForwarders, chaosWorkers, time.Since(begin).Round(time.Millisecond))

	// The process killer: SIGKILL a forwarder or a worker (the forwarder
	// holding the cursor every third kill) every one to three seconds, and
	// start it again.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var chaosErr sync.Map // goroutine name → error
	var killed []string
	wg.Add(1)
	go func() {
		defer wg.Done()
		for k := 0; k < chaosKills; k++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Second + rand.N(2*time.Second)):
			}
			var s *slot
			switch k % 3 {
			case 0, 2:
				s = slots[chaosForwarders+rand.IntN(chaosWorkers)]
			case 1:
				s = slots[rand.IntN(chaosForwarders)]
				if pid := cursorHolder(ctx, db.DB); pid != 0 {
					slotsMu.Lock()
					for _, f := range slots[:chaosForwarders] {
						if f.p.cmd.Process.Pid == pid {
							s = f
						}
					}
					slotsMu.Unlock()
				}
			}
			slotsMu.Lock()
			p := s.p
			slotsMu.Unlock()
			what := p.id
			if s.role == "forwarder" && p.cmd.Process.Pid == cursorHolder(ctx, db.DB) {
				what += " (cursor)"
			}
			p.kill()
			killed = append(killed, what)
			if err := start(s); err != nil {
				chaosErr.Store("process killer", err)
				return
			}
		}
	}()

	// The node killer: the stream's leader, then the consumer's, then one
	// of the others; each restarted after a moment without it.
	var nodeKills []string
	wg.Add(1)
	go func() {
		defer wg.Done()
		t0 := time.Now()
		for k, at := range chaosNodeKills {
			select {
			case <-stop:
				return
			case <-time.After(time.Until(t0.Add(at))):
			}
			i, what, err := chaosVictim(ctx, cl, js, k)
			if err != nil {
				chaosErr.Store("node killer", err)
				return
			}
			if err := cl.Kill(i); err != nil {
				chaosErr.Store("node killer", err)
				return
			}
			nodeKills = append(nodeKills, cl.Name(i)+" ("+what+")")
			time.Sleep(2 * time.Second) // the cluster runs without it for a moment, under load
			if err := cl.Restart(ctx, i); err != nil {
				chaosErr.Store("node killer", err)
				return
			}
			if _, err := cl.WaitStream(ctx, broker.DefaultStream); err != nil {
				chaosErr.Store("node killer", err)
				return
			}
		}
	}()

	// The load: transactions of one to three events, every 50 ms; one in
	// twelve of the hostile tenant; every fifth through EnqueueMany.
	type sent struct{ id, tenant, typ string }
	var events []sent
	loadStart := time.Now()
	hangs := 0
	tick := time.NewTicker(50 * time.Millisecond)
	for n := 0; len(events) < chaosEvents && time.Since(loadStart) < chaosLoad; n++ {
		<-tick.C
		var evs []outbox.Event
		for range 1 + rand.IntN(3) {
			tenant := "t" + strconv.Itoa(rand.IntN(3))
			if rand.IntN(12) == 0 {
				tenant = "evil"
			}
			types := chaosTypes[tenant]
			if tenant == "evil" && (hangs >= chaosHangs || time.Since(loadStart) > chaosLoad/3) {
				types = types[:3] // no more for the hanging receiver
			}
			typ := types[rand.IntN(len(types))]
			if typ == "hang.x" {
				hangs++
			}
			evs = append(evs, outbox.Event{Tenant: tenant, Type: typ, Payload: []byte(fmt.Sprintf(`{"n":%d}`, len(events)))})
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		if n%5 == 0 {
			var res []outbox.Enqueued
			res, err = ob.EnqueueMany(ctx, tx, evs)
			for _, r := range res {
				ids = append(ids, r.ID)
			}
		} else {
			for _, ev := range evs {
				var id string
				if id, err = ob.Enqueue(ctx, tx, ev); err != nil {
					break
				}
				ids = append(ids, id)
			}
		}
		if err != nil {
			_ = tx.Rollback()
			t.Fatal(err)
		}
		evMu.Lock()
		for i, id := range ids {
			known[id] = evInfo{evs[i].Tenant, evs[i].Type}
		}
		evMu.Unlock()
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			events = append(events, sent{id, evs[i].Tenant, evs[i].Type})
		}
	}
	tick.Stop()
	close(stop)
	wg.Wait()
	chaosErr.Range(func(k, v any) bool {
		t.Errorf("%s: %v", k, v)
		return true
	})
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("load: %d events in %s; processes killed: %v; nodes killed: %v", len(events),
		time.Since(loadStart).Round(time.Millisecond), killed, nodeKills)

	// Quiesce: every node up and the stream ready (the killers restarted
	// what they killed), then every delivery ended.
	for i := range cl.Size() {
		if !cl.Running(i) {
			if err := cl.Restart(ctx, i); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := cl.WaitStream(ctx, broker.DefaultStream); err != nil {
		t.Fatal(err)
	}
	type pair struct{ event, endpoint string }
	want := map[pair]int{} // → index of the endpoint
	for _, e := range events {
		for i, s := range chaosSubs {
			if s.tenant == e.tenant && s.subscribes(e.typ) {
				want[pair{e.id, eps[i].ID}] = i
			}
		}
	}
	quiesceStart := time.Now()
	lastReport := quiesceStart
	var final, total int
	for {
		if err := db.QueryRowContext(ctx, `SELECT count(*) FILTER (WHERE state IN ('succeeded', 'dead')), count(*) FROM txhook_deliveries`).Scan(&final, &total); err != nil {
			t.Fatal(err)
		}
		if final == total && total >= len(want) {
			break
		}
		if time.Since(quiesceStart) > quiesceWait {
			t.Fatalf("after %s, %d of %d deliveries ended, %d rows in all", quiesceWait, final, len(want), total)
		}
		if time.Since(lastReport) > 5*time.Second {
			lastReport = time.Now()
			t.Logf("quiescing: %d of %d deliveries ended, %d rows; %s", final, len(want), total, chaosProgress(ctx, db.DB, js))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("every delivery ended %s after the load", time.Since(quiesceStart).Round(time.Millisecond))
	stream, err := js.Stream(ctx, broker.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.Consumer(ctx, "txhook-workers")
	if err != nil {
		t.Fatal(err)
	}
	var left string
	drained := func() bool {
		si, err := stream.Info(ctx)
		if err != nil {
			left = err.Error()
			return false
		}
		ci, err := cons.Info(ctx)
		if err != nil {
			left = err.Error()
			return false
		}
		left = fmt.Sprintf("stream %d messages, consumer %d pending, %d unacknowledged", si.State.Msgs, ci.NumPending, ci.NumAckPending)
		return si.State.Msgs == 0 && ci.NumPending == 0 && ci.NumAckPending == 0
	}
	for deadline := time.Now().Add(quiesceWait); !drained(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the stream still holds work: %s", left)
		}
	}
	slotsMu.Lock()
	for _, s := range slots {
		if err := s.p.terminate(); err != nil {
			t.Error(err)
		}
	}
	slotsMu.Unlock()

	// One row per (event, endpoint) subscribed, final: succeeded and
	// processed by the receiver's handler, or (the hostile tenant's) dead
	// with its dead letter.
	rows, err := db.QueryContext(ctx, `SELECT d.id, d.event_id, d.endpoint_id, d.state, d.attempts,
    EXISTS (SELECT 1 FROM txhook_dead_letters dl WHERE dl.delivery_id = d.id)
FROM txhook_deliveries d`)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[pair]bool{}
	var succeeded, dead, attempts int
	var errs []string
	bad := func(format string, args ...any) {
		if len(errs) < 50 {
			errs = append(errs, fmt.Sprintf(format, args...))
		}
	}
	for rows.Next() {
		var id int64
		var p pair
		var state string
		var n int
		var lettered bool
		if err := rows.Scan(&id, &p.event, &p.endpoint, &state, &n, &lettered); err != nil {
			t.Fatal(err)
		}
		attempts += n
		i, ok := want[p]
		switch {
		case !ok:
			bad("delivery %d of event %s to %s, which does not subscribe to it", id, p.event, p.endpoint)
			continue
		case seen[p]:
			bad("a second delivery row (%d) of event %s to %s", id, p.event, p.endpoint)
			continue
		}
		seen[p] = true
		switch hostileKind := chaosSubs[i].kind != "inbox"; {
		case state == "succeeded" && !hostileKind:
			succeeded++
			if runs := inboxes[i].runs(p.event); runs != 1 {
				bad("event %s to %s: succeeded, and the receiver's handler ran %d times", p.event, p.endpoint, runs)
			}
		case state == "dead" && hostileKind:
			dead++
			if !lettered {
				bad("dead delivery %d has no dead letter", id)
			}
			if n < chaosChild.Attempts {
				// (More, when holders of its last attempt died: each
				// lapsed lease counts.)
				bad("dead delivery %d after %d attempts, the policy allows %d", id, n, chaosChild.Attempts)
			}
		default:
			bad("delivery %d of event %s to %s (%s): %s after %d attempts", id, p.event, p.endpoint, chaosSubs[i].kind, state, n)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for p := range want {
		if !seen[p] {
			bad("event %s never reached %s", p.event, p.endpoint)
		}
	}
	// The handlers ran once per event they were sent, no more, and for
	// nothing else.
	var c inboxCounts
	for i, in := range inboxes {
		if in == nil {
			continue
		}
		in.mu.Lock()
		for id, runs := range in.processed {
			if _, ok := want[pair{id, eps[i].ID}]; !ok || runs != 1 {
				bad("receiver %s processed event %s %d times (subscribed: %v)", eps[i].ID, id, runs, ok)
			}
		}
		errs = append(errs, in.wrong...)
		in.mu.Unlock()
		ic := in.counts()
		c.requests += ic.requests
		c.dups += ic.dups
		c.busy += ic.busy
		c.bad += ic.bad
		c.lies += ic.lies
	}
	if c.bad > 0 {
		bad("%d requests failed verification", c.bad)
	}
	// Each lie (processed, connection dropped) made the sender retry what
	// the dedup store knew done.
	if c.dups < c.lies {
		bad("%d duplicates stopped by the dedup store, fewer than the %d lies that called for one", c.dups, c.lies)
	}
	// A request the dedup store stopped normally follows a failed attempt
	// of its delivery on record (the connection dropped after processing,
	// a timeout, a worker that died or stalled mid-request): the sender had
	// cause to send again. One without is a copy of a delivery's message
	// that JetStream stored twice (its duplicate window forgets delivered
	// messages when a restarted node comes to lead the stream) and that a
	// worker sent while the first copy's outcome was not yet recorded;
	// once it is, workers send no copy (TestBrokerCopyOfDoneDeliveryNotSent).
	// Such copies are legitimate at-least-once duplicates, stopped by the
	// receiver's dedup, so they are counted and shown, not failed on.
	failedBy := map[pair]int{}
	rows, err = db.QueryContext(ctx, `SELECT d.event_id, d.endpoint_id, count(*)
FROM txhook_deliveries d JOIN txhook_attempt_log a ON a.delivery_id = d.id
WHERE a.error <> '' AND a.status IS DISTINCT FROM 500 GROUP BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var p pair
		var n int
		if err := rows.Scan(&p.event, &p.endpoint, &n); err != nil {
			t.Fatal(err)
		}
		failedBy[p] = n
	}
	rows.Close()
	unexplained := 0
	for i, in := range inboxes {
		if in == nil {
			continue
		}
		in.mu.Lock()
		for id, n := range in.dupsBy {
			if f := failedBy[pair{id, eps[i].ID}]; n > f {
				if unexplained < 5 {
					t.Logf("event %s to %s: %d requests stopped by the dedup store after %d failed attempts on record", id, eps[i].ID, n, f)
				}
				unexplained += n - f
			}
		}
		in.mu.Unlock()
	}
	// The attempt log numbers each delivery's attempts 1..n, once each.
	var logRows, dupAttempts, gaps, lapsed int
	if err := db.QueryRowContext(ctx, `SELECT
    (SELECT count(*) FROM txhook_attempt_log),
    (SELECT count(*) FROM (SELECT delivery_id, attempt FROM txhook_attempt_log GROUP BY 1, 2 HAVING count(*) > 1) x),
    (SELECT count(*) FROM txhook_deliveries d WHERE d.attempts <> (SELECT count(DISTINCT a.attempt) FROM txhook_attempt_log a
        WHERE a.delivery_id = d.id AND a.attempt BETWEEN 1 AND d.attempts)),
    (SELECT count(*) FROM txhook_attempt_log WHERE error LIKE 'lease expired%')`).Scan(&logRows, &dupAttempts, &gaps, &lapsed); err != nil {
		t.Fatal(err)
	}
	if dupAttempts > 0 {
		bad("%d attempts recorded twice", dupAttempts)
	}
	if gaps > 0 || logRows != attempts {
		bad("attempt log: %d records for %d attempts; %d deliveries whose attempts are not numbered 1..n", logRows, attempts, gaps)
	}
	for _, e := range errs {
		t.Error(e)
	}
	if l := logs.String(); strings.Contains(l, "DATA RACE") || strings.Contains(l, "panic:") {
		i := max(strings.Index(l, "DATA RACE"), strings.Index(l, "panic:"))
		t.Errorf("a process raced or panicked:\n%s", l[max(0, i-2000):min(len(l), i+8000)])
	}
	t.Logf("%d events, %d deliveries: %d succeeded, %d dead-lettered (hostile); %d attempts (%d recorded as lease expired)",
		len(events), len(want), succeeded, dead, attempts, lapsed)
	t.Logf("receivers: %d requests; %d duplicates stopped by verify's dedup (%d after a receiver dropped the connection having processed the event, %d without a failed attempt on record), %d answered 409 in progress; hostile: %d hanging, %d 500, %d closed",
		c.requests, c.dups, c.lies, unexplained, c.busy, hostile[0].Load(), hostile[1].Load(), hostile[2].Load())
	t.Logf("forwarders took the cursor %d times", strings.Count(logs.String(), "forwarder took the stream's cursor"))
	t.Logf("total %s", time.Since(begin).Round(time.Millisecond))
}

// cursorHolder returns the process ID of the forwarder holding the
// stream's cursor, or 0.
func cursorHolder(ctx context.Context, db *sql.DB) int {
	var owner sql.NullString
	err := db.QueryRowContext(ctx, `SELECT lease_owner FROM txhook_forwarders WHERE name = $1 AND lease_until > now()`, broker.DefaultStream).Scan(&owner)
	if err != nil {
		return 0
	}
	m := ownerPID.FindStringSubmatch(owner.String)
	if m == nil {
		return 0
	}
	pid, _ := strconv.Atoi(m[1])
	return pid
}

var ownerPID = regexp.MustCompile(`^forwarder:[^/]*/(\d+)/`)

// chaosVictim returns the node to kill the k-th time: the stream's leader,
// then the consumer's leader, then a node leading neither (any, if each
// leads something).
func chaosVictim(ctx context.Context, cl *natscluster.Cluster, js jetstream.JetStream, k int) (int, string, error) {
	var last error
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		st, err := js.Stream(ctx, broker.DefaultStream)
		if err != nil {
			last = err
			continue
		}
		sl := -1
		if ci := st.CachedInfo().Cluster; ci != nil {
			sl = cl.Index(ci.Leader)
		}
		cons, err := st.Consumer(ctx, "txhook-workers")
		if err != nil {
			last = err
			continue
		}
		clead := -1
		if ci := cons.CachedInfo().Cluster; ci != nil {
			clead = cl.Index(ci.Leader)
		}
		if sl < 0 || clead < 0 {
			last = errors.New("no leader")
			continue
		}
		switch k {
		case 0:
			return sl, "stream leader", nil
		case 1:
			what := "consumer leader"
			if clead == sl {
				what += " and stream leader"
			}
			return clead, what, nil
		default:
			for i := range cl.Size() {
				if i != sl && i != clead {
					return i, "replica", nil
				}
			}
			return (sl + 1) % cl.Size(), "replica", nil
		}
	}
	return -1, "", fmt.Errorf("no stream or consumer leader to kill: %w", last)
}

// chaosProgress describes what is left while the test waits: unfinished
// rows by endpoint and state, and what the stream holds.
func chaosProgress(ctx context.Context, db *sql.DB, js jetstream.JetStream) string {
	var b strings.Builder
	rows, err := db.QueryContext(ctx, `SELECT endpoint_id, state, count(*), max(attempts) FROM txhook_deliveries
WHERE state NOT IN ('succeeded', 'dead') GROUP BY 1, 2 ORDER BY 1, 2`)
	if err == nil {
		for rows.Next() {
			var ep, state string
			var n, a int
			if rows.Scan(&ep, &state, &n, &a) == nil {
				fmt.Fprintf(&b, "%s %s %d (attempts ≤ %d); ", ep, state, n, a)
			}
		}
		rows.Close()
	}
	if st, err := js.Stream(ctx, broker.DefaultStream); err == nil {
		if si, err := st.Info(ctx, jetstream.WithSubjectFilter(">")); err == nil {
			fmt.Fprintf(&b, "stream %d messages", si.State.Msgs)
			q, s := 0, 0
			for subj, n := range si.State.Subjects {
				if strings.Contains(subj, ".s.") {
					s += int(n)
				} else {
					q += int(n)
				}
			}
			fmt.Fprintf(&b, " (%d queued, %d scheduled)", q, s)
		}
		if c, err := st.Consumer(ctx, "txhook-workers"); err == nil {
			ci := c.CachedInfo()
			fmt.Fprintf(&b, ", consumer %d pending, %d unacknowledged, %d waiting pulls", ci.NumPending, ci.NumAckPending, ci.NumWaiting)
		}
	}
	return b.String()
}
