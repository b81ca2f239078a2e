package otelmetrics_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/txhook/txhook/dlq"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testob"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/otelmetrics"
	"github.com/txhook/txhook/retry"
)

// reader is a ManualReader and what it collects, by instrument name and
// attribute set ("k=v,k=v", sorted): sums' and gauges' values,
// histograms' counts.
type reader struct {
	t *testing.T
	*sdkmetric.ManualReader
}

func (r reader) collect() map[string]map[string]int64 {
	r.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		r.t.Fatal(err)
	}
	key := func(s attribute.Set) string {
		var kv []string
		for _, a := range s.ToSlice() {
			kv = append(kv, string(a.Key)+"="+a.Value.String())
		}
		sort.Strings(kv)
		return strings.Join(kv, ",")
	}
	out := map[string]map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			vals := map[string]int64{}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					vals[key(p.Attributes)] = p.Value
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					vals[key(p.Attributes)] = p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					vals[key(p.Attributes)] = int64(p.Count)
				}
			default:
				r.t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
			}
			out[m.Name] = vals
		}
	}
	return out
}

func newMetrics(t *testing.T, ob *outbox.Outbox) (*otelmetrics.Metrics, reader) {
	t.Helper()
	rd := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	m, err := otelmetrics.New(ob, otelmetrics.Options{MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, reader{t, rd}
}

func startRelay(t *testing.T, ctx context.Context, ob *outbox.Outbox, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	r, err := ob.NewRelay(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}

func stopRelay(t *testing.T, ctx context.Context, r *outbox.Relay) {
	t.Helper()
	stop, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := r.Stop(stop); err != nil {
		t.Fatal(err)
	}
}

// fromDB reads what the gauges should say, straight from the tables.
func fromDB(t *testing.T, ctx context.Context, db *testdb.DB) (backlog, dead map[string]int64, undispatched int64) {
	t.Helper()
	backlog, dead = map[string]int64{}, map[string]int64{}
	rows, err := db.QueryContext(ctx, `SELECT endpoint_id, state, count(*) FROM txhook_deliveries
WHERE state NOT IN ('succeeded', 'dead') GROUP BY endpoint_id, state`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var ep, st string
		var n int64
		if err := rows.Scan(&ep, &st, &n); err != nil {
			t.Fatal(err)
		}
		backlog["txhook.delivery.state="+st+",txhook.endpoint.id="+ep] = n
	}
	rows.Close()
	rows, err = db.QueryContext(ctx, `SELECT endpoint_id, count(*) FROM txhook_dead_letters GROUP BY endpoint_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var ep string
		var n int64
		if err := rows.Scan(&ep, &n); err != nil {
			t.Fatal(err)
		}
		dead["txhook.endpoint.id="+ep] = n
	}
	rows.Close()
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM txhook_events WHERE dispatched_at IS NULL`).Scan(&undispatched); err != nil {
		t.Fatal(err)
	}
	return backlog, dead, undispatched
}

func enqueue(t *testing.T, ctx context.Context, ob *outbox.Outbox, ev outbox.Event) {
	t.Helper()
	if _, err := ob.Enqueue(ctx, ob.DB(), ev); err != nil {
		t.Fatal(err)
	}
}

// Attempts and latencies as the relay observes them; backlog, dead letters
// and undispatched events as the database has them, in every state the
// real path produces.
func TestMetricsMatchTheDatabase(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ob, ctx := testob.NewOutbox(t, db)
		m, rd := newMetrics(t, ob)
		good, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "m", URL: testob.Receiver(t, 200)})
		if err != nil {
			t.Fatal(err)
		}
		bad, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "m", URL: testob.Receiver(t, 500)})
		if err != nil {
			t.Fatal(err)
		}

		// One attempt each: the bad endpoint's three dead-letter at once.
		r := startRelay(t, ctx, ob, outbox.RelayConfig{Retry: retry.Intervals(), OnAttempt: m.Observe, BreakerThreshold: -1})
		for i := range 3 {
			enqueue(t, ctx, ob, outbox.Event{Tenant: "m", Type: "payment.succeeded", Payload: fmt.Appendf(nil, `{"n":%d}`, i)})
		}
		want := map[string]int64{
			"txhook.attempt.outcome=succeeded,txhook.endpoint.id=" + good.ID:    3,
			"txhook.attempt.outcome=dead_lettered,txhook.endpoint.id=" + bad.ID: 3,
		}
		testob.Eventually(t, "every attempt counted", func() bool { return fmt.Sprint(rd.collect()["txhook.attempts"]) == fmt.Sprint(want) })
		stopRelay(t, ctx, r)

		// Retries an hour apart: two keyed events leave the bad endpoint
		// one delivery pending and one blocked behind it.
		r = startRelay(t, ctx, ob, outbox.RelayConfig{Retry: retry.Intervals(time.Hour), OnAttempt: m.Observe, BreakerThreshold: -1})
		m.AddRelay(r)
		for i := range 2 {
			enqueue(t, ctx, ob, outbox.Event{Tenant: "m", Type: "payment.refunded", OrderingKey: "pay_1", Payload: fmt.Appendf(nil, `{"k":%d}`, i)})
		}
		testob.Eventually(t, "the keyed events' attempts", func() bool {
			a := rd.collect()["txhook.attempts"]
			return a["txhook.attempt.outcome=retry,txhook.endpoint.id="+bad.ID] == 1 &&
				a["txhook.attempt.outcome=succeeded,txhook.endpoint.id="+good.ID] == 5
		})
		stopRelay(t, ctx, r)
		for i := range 2 { // no relay runs: these wait undispatched
			enqueue(t, ctx, ob, outbox.Event{Tenant: "m", Type: "payment.captured", Payload: fmt.Appendf(nil, `{"u":%d}`, i)})
		}

		// Series seen while the relays ran (running deliveries) read 0 at
		// the next collection, then are gone.
		got := rd.collect()
		for k, v := range got["txhook.backlog"] {
			if v == 0 {
				delete(got["txhook.backlog"], k)
			}
		}
		backlog, dead, undispatched := fromDB(t, ctx, db)
		if again := rd.collect()["txhook.backlog"]; fmt.Sprint(again) != fmt.Sprint(backlog) {
			t.Errorf("backlog at the next collection\n got %v\nwant %v", again, backlog)
		}
		if backlog["txhook.delivery.state=pending,txhook.endpoint.id="+bad.ID] != 1 ||
			backlog["txhook.delivery.state=blocked,txhook.endpoint.id="+bad.ID] != 1 ||
			dead["txhook.endpoint.id="+bad.ID] != 3 || undispatched != 2 {
			t.Fatalf("the scenario did not produce its backlog: %v %v %d", backlog, dead, undispatched)
		}
		if fmt.Sprint(got["txhook.backlog"]) != fmt.Sprint(backlog) {
			t.Errorf("backlog\n got %v\nwant %v", got["txhook.backlog"], backlog)
		}
		if fmt.Sprint(got["txhook.dead_letters"]) != fmt.Sprint(dead) {
			t.Errorf("dead letters\n got %v\nwant %v", got["txhook.dead_letters"], dead)
		}
		if u := got["txhook.undispatched"]; len(u) != 1 || u[""] != undispatched {
			t.Errorf("undispatched %v, want %d", u, undispatched)
		}
		lat := got["txhook.attempt.duration"]
		if lat["txhook.endpoint.id="+good.ID] != 5 || lat["txhook.endpoint.id="+bad.ID] != 4 {
			t.Errorf("latency counts: %v", lat)
		}
		if rel := got["txhook.relay.in_flight"]; len(rel) != 1 || rel["txhook.relay.id="+r.ID()] != 0 {
			t.Errorf("in flight of a stopped relay: %v", rel)
		}

		// A drained series reads 0 once, then is gone.
		if _, err := dlq.New(ob).PurgeAll(ctx, dlq.Filter{}); err != nil {
			t.Fatal(err)
		}
		if d := rd.collect()["txhook.dead_letters"]; len(d) != 1 || d["txhook.endpoint.id="+bad.ID] != 0 {
			t.Errorf("dead letters after the purge: %v", d)
		}
		if d := rd.collect()["txhook.dead_letters"]; len(d) != 0 {
			t.Errorf("dead letters at the next collection: %v", d)
		}
	})
}

// A relay's requests in flight are reported while they are.
func TestMetricsRelayInFlight(t *testing.T) {
	ob, ctx := testob.NewOutbox(t, testdb.SQLite(t))
	m, rd := newMetrics(t, ob)
	arrived, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
	}))
	t.Cleanup(srv.Close)
	if _, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "m", URL: srv.URL}); err != nil {
		t.Fatal(err)
	}
	r := startRelay(t, ctx, ob, outbox.RelayConfig{OnAttempt: m.Observe})
	defer stopRelay(t, ctx, r)
	m.AddRelay(r)
	enqueue(t, ctx, ob, outbox.Event{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{}`)})
	select {
	case <-arrived:
	case <-time.After(testob.WaitFor):
		t.Fatal("no request")
	}
	id := "txhook.relay.id=" + r.ID()
	if n := rd.collect()["txhook.relay.in_flight"][id]; n != 1 {
		t.Errorf("in flight during the request: %d", n)
	}
	close(release)
	testob.Eventually(t, "the request to finish", func() bool { return rd.collect()["txhook.relay.in_flight"][id] == 0 })
}
