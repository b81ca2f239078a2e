package outbox_test

import (
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/clock"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testlisten"
	"github.com/txhook/txhook/outbox"
)

// skewedClock is the wall clock off by a fixed offset: a host whose NTP is
// broken, or a VM resumed from a snapshot.
type skewedClock struct{ offset time.Duration }

func (c skewedClock) Now() time.Time                        { return time.Now().Add(c.offset) }
func (c skewedClock) NewTimer(d time.Duration) outbox.Timer { return clock.Real{}.NewTimer(d) }

// overlapReceiver holds each request for a while, as a slow receiver
// does, and records, per Webhook-Id, requests that arrived while another
// for the same ID was still in flight.
type overlapReceiver struct {
	min, spread time.Duration

	mu        sync.Mutex
	inflight  map[string]int
	delivered map[string]int
	overlaps  []string
}

func newOverlapReceiver(min, spread time.Duration) *overlapReceiver {
	return &overlapReceiver{min: min, spread: spread, inflight: map[string]int{}, delivered: map[string]int{}}
}

// hold is how long the request for id takes: spread over [min, min+spread).
func (o *overlapReceiver) hold(id string) time.Duration {
	h := fnv.New32a()
	h.Write([]byte(id))
	return o.min + time.Duration(h.Sum32())%o.spread
}

func (o *overlapReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("Webhook-Id")
	_, _ = io.Copy(io.Discard, r.Body)
	o.mu.Lock()
	o.inflight[id]++
	if o.inflight[id] > 1 {
		o.overlaps = append(o.overlaps, id)
	}
	o.mu.Unlock()
	// The hold is the receiver's work, not synchronisation.
	t := time.NewTimer(o.hold(id))
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
	}
	o.mu.Lock()
	o.inflight[id]--
	if r.Context().Err() == nil {
		o.delivered[id]++
	}
	o.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// clockWarning is what a relay logs when its clock is beyond tolerance.
const clockWarning = "clock is off from the database's"

// Two relays share an outbox; one's clock runs 2 min ahead. Leases are
// timed by the database's clock, so the fast relay never takes over a
// delivery the other still has in flight (with its own clock it would
// think every lease of the other expired), nothing is sent twice at once,
// no lease is lost, and the fast relay says once that its clock is off.
func TestRelayWithClockAheadNeverSendsTwiceAtOnce(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		const skew = 2 * time.Minute
		var normalLog, fastLog logBuffer
		b := setup(t, db, outbox.Config{Logger: normalLog.logger()})
		fastCfg := outbox.Config{AllowHTTP: true, AllowPrivateTargets: true, Clock: skewedClock{skew}, Logger: fastLog.logger()}
		fastCfg.Listener = testlisten.For(db.Backend.Driver, db.DSN)
		fastOB, err := outbox.New(b.ctx, db.DB, fastCfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { fastOB.Close() })

		rcv := newOverlapReceiver(300*time.Millisecond, 400*time.Millisecond)
		srv := httptest.NewServer(rcv)
		t.Cleanup(srv.Close)
		const tenants, events = 6, 300
		for i := range tenants {
			b.endpoint(fmt.Sprintf("m%d", i), srv.URL)
		}

		// A lease shorter than the skew, so that with the fast relay's
		// clock every lease of the normal relay would look expired 90 s
		// before it is. Yet a long one: a relay writes an outcome within
		// a fifth of the lease after its request's timeout or not at all,
		// and on a loaded machine (SQLite's one writer shared by two relays
		// and the enqueuer) a 3 s lease, 0.6 s of slack, let real leases
		// lapse, which the other relay then rightly took over.
		rc := outbox.RelayConfig{Lease: 30 * time.Second, Timeout: 5 * time.Second, Concurrency: 16, BatchSize: 16}
		rc.ID = "normal"
		normal := b.relay(rc)

		ids := make([]string, 0, events)
		enqueue := func(from, to int) {
			for i := from; i < to; i++ {
				ids = append(ids, b.enqueue(outbox.Event{Tenant: fmt.Sprintf("m%d", i%tenants), Type: "payment.succeeded",
					Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))}))
			}
		}
		enqueue(0, events/2)
		// The fast relay joins once the normal one has delivered and has
		// requests in flight: with its clock ahead it would otherwise take
		// nearly everything (what either relay gives back to wait is due
		// two minutes earlier by its clock), and the test would not show
		// the two sharing the work.
		b.eventually("the normal relay delivering", func() bool {
			st := normal.Stats()
			return st.Succeeded > 0 && st.InFlight > 0
		})
		fastBundle := &bundle{t: t, db: db, ob: fastOB, ctx: b.ctx}
		rc.ID = "fast"
		fast := fastBundle.relay(rc)
		// The other half once both run: on a loaded machine the normal
		// relay could otherwise have claimed all of the first half
		// before the fast one's first claim.
		enqueue(events/2, events)
		b.eventually("every delivery succeeded", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded'") == events
		})

		rcv.mu.Lock()
		if len(rcv.overlaps) > 0 {
			t.Errorf("%d requests arrived while another for the same event was in flight, e.g. %s", len(rcv.overlaps), rcv.overlaps[0])
		}
		for _, id := range ids {
			if rcv.delivered[id] == 0 {
				t.Errorf("event %s never delivered", id)
			}
		}
		rcv.mu.Unlock()
		ns, fs := normal.Stats(), fast.Stats()
		t.Logf("normal relay %+v; fast relay %+v", ns, fs)
		if ns.LeaseLost != 0 || fs.LeaseLost != 0 {
			t.Errorf("leases lost with no relay down: normal %d, fast %d", ns.LeaseLost, fs.LeaseLost)
		}
		if ns.Succeeded == 0 || fs.Succeeded == 0 {
			t.Errorf("both relays must deliver for the test to mean anything: normal %d, fast %d", ns.Succeeded, fs.Succeeded)
		}
		if n := b.count("SELECT count(*) FROM txhook_attempt_log WHERE error LIKE 'lease expired%'"); n != 0 {
			t.Errorf("%d attempts recorded as lapsed leases", n)
		}
		if n := strings.Count(fastLog.String(), clockWarning); n != 1 {
			t.Errorf("fast relay logged %d clock warnings, want 1; log:\n%s", n, fastLog.String())
		}
		if n := strings.Count(normalLog.String(), clockWarning); n != 0 {
			t.Errorf("normal relay logged %d clock warnings, want none; log:\n%s", n, normalLog.String())
		}
	})
}
