package metrics_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testob"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/metrics"
	"github.com/txhook/txhook/retry"
)

// gather returns the samples of one metric family by label set
// ("endpoint=ep_1,outcome=retry"): values of counters and gauges, sample
// counts of histograms.
func gather(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(ls)
			k := strings.Join(ls, ",")
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[k] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[k] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[k] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

func TestCollectorFollowsARelay(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ob, ctx := testob.NewOutbox(t, db)
		good, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "m", URL: testob.Receiver(t, 200)})
		if err != nil {
			t.Fatal(err)
		}
		bad, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "m", URL: testob.Receiver(t, 500)})
		if err != nil {
			t.Fatal(err)
		}
		c := metrics.New(ob, metrics.Options{})
		reg := prometheus.NewRegistry()
		reg.MustRegister(c)

		relay, err := ob.NewRelay(outbox.RelayConfig{Retry: retry.Intervals(10 * time.Millisecond), OnAttempt: c.Observe, BreakerThreshold: -1})
		if err != nil {
			t.Fatal(err)
		}
		if err := relay.Start(ctx); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ob.Enqueue(ctx, tx, outbox.Event{Tenant: "m", Type: "payment.succeeded", Payload: fmt.Appendf(nil, `{"n":%d}`, i)}); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		attempts := func() map[string]float64 { return gather(t, reg, "txhook_attempts_total") }
		testob.Eventually(t, "every attempt observed", func() bool {
			a := attempts()
			return a["endpoint="+good.ID+",outcome=succeeded"] == 3 && a["endpoint="+bad.ID+",outcome=dead_lettered"] == 3
		})
		stop, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := relay.Stop(stop); err != nil {
			t.Fatal(err)
		}

		want := map[string]float64{
			"endpoint=" + good.ID + ",outcome=succeeded":             3,
			"endpoint=" + good.ID + ",outcome=retry":                 0,
			"endpoint=" + good.ID + ",outcome=dead_lettered":         0,
			"endpoint=" + good.ID + ",outcome=dead_lettered_refused": 0,
			"endpoint=" + bad.ID + ",outcome=succeeded":              0,
			"endpoint=" + bad.ID + ",outcome=retry":                  3,
			"endpoint=" + bad.ID + ",outcome=dead_lettered":          3,
			"endpoint=" + bad.ID + ",outcome=dead_lettered_refused":  0,
		}
		if got := attempts(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("attempts\n got %v\nwant %v", got, want)
		}
		lat := gather(t, reg, "txhook_attempt_duration_seconds")
		if lat["endpoint="+good.ID] != 3 || lat["endpoint="+bad.ID] != 6 {
			t.Errorf("latency sample counts: %v", lat)
		}

		// Gauges come from the database at scrape time: a paused backlog
		// for a disabled endpoint, and the dead letters.
		if err := ob.DisableEndpoint(ctx, good.ID, "test"); err != nil {
			t.Fatal(err)
		}
		q := `INSERT INTO txhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at, created_at, updated_at)
VALUES ('evt_x', ?, ?, 0, ?, ?, ?)`
		now := time.Now().UTC()
		var ts any = now
		if !db.Backend.Postgres() {
			ts = now.UnixMicro()
		} else {
			q = strings.NewReplacer("?, ?, 0, ?, ?, ?", "$1, $2, 0, $3, $4, $5").Replace(q)
		}
		for _, st := range []string{"paused", "paused", "pending"} {
			if _, err := db.ExecContext(ctx, q, good.ID, st, ts, ts, ts); err != nil {
				t.Fatal(err)
			}
		}
		backlog := gather(t, reg, "txhook_backlog_deliveries")
		if backlog["endpoint="+good.ID+",state=paused"] != 2 || backlog["endpoint="+good.ID+",state=pending"] != 1 ||
			backlog["endpoint="+bad.ID+",state=pending"] != 0 || len(backlog) != 6 {
			t.Errorf("backlog: %v", backlog)
		}
		dead := gather(t, reg, "txhook_dead_letters")
		if dead["endpoint="+bad.ID] != 3 || dead["endpoint="+good.ID] != 0 || len(dead) != 2 {
			t.Errorf("dead letters: %v", dead)
		}
		if refused := gather(t, reg, "txhook_dead_letters_refused"); refused["endpoint="+bad.ID] != 0 || len(refused) != 2 {
			t.Errorf("refused dead letters: %v", refused)
		}
		// With the relay stopped, new events wait undispatched.
		if u := gather(t, reg, "txhook_undispatched_events"); u[""] != 0 {
			t.Errorf("undispatched before: %v", u)
		}
		for i := range 2 {
			if _, err := ob.Enqueue(ctx, db.DB, outbox.Event{Tenant: "m", Type: "payment.succeeded", Payload: fmt.Appendf(nil, `{"late":%d}`, i)}); err != nil {
				t.Fatal(err)
			}
		}
		if u := gather(t, reg, "txhook_undispatched_events"); u[""] != 2 || len(u) != 1 {
			t.Errorf("undispatched: %v", u)
		}
		if err := prometheus.NewPedanticRegistry().Register(metrics.New(ob, metrics.Options{})); err != nil {
			t.Errorf("pedantic registry: %v", err)
		}
	})
}

func TestCollectorBoundsEndpointLabels(t *testing.T) {
	ob, ctx := testob.NewOutbox(t, testdb.SQLite(t))
	db := ob.DB()
	c := metrics.New(ob, metrics.Options{MaxEndpoints: 5, Namespace: "pay", ConstLabels: prometheus.Labels{"service": "api"}})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)

	observed := 0
	for i := range 40 {
		for range i%3 + 1 {
			c.Observe(outbox.AttemptNotice{EndpointID: fmt.Sprintf("ep_%02d", i), Outcome: outbox.OutcomeSucceeded, Duration: time.Millisecond})
			observed++
		}
	}
	c.Observe(outbox.AttemptNotice{EndpointID: "ep_00", Outcome: outbox.OutcomeRetry}) // no request made: no latency
	// Dead letters of 20 endpoints never observed.
	for i := range 20 {
		if _, err := db.ExecContext(ctx, `INSERT INTO txhook_dead_letters
(delivery_id, event_id, endpoint_id, tenant, event_type, attempts, last_status, last_error, failed_at) VALUES (?, 'e', ?, 't', 'x', 1, 500, '', 0)`,
			i+1, fmt.Sprintf("ep_dead_%02d", i)); err != nil {
			t.Fatal(err)
		}
	}

	labels := func(m map[string]float64) map[string]bool {
		out := map[string]bool{}
		for k := range m {
			for _, l := range strings.Split(k, ",") {
				if v, ok := strings.CutPrefix(l, "endpoint="); ok {
					out[v] = true
				}
			}
		}
		return out
	}
	sum := func(m map[string]float64) (s float64) {
		for _, v := range m {
			s += v
		}
		return s
	}
	attempts := gather(t, reg, "pay_attempts_total")
	lat := gather(t, reg, "pay_attempt_duration_seconds")
	dead := gather(t, reg, "pay_dead_letters")
	for name, m := range map[string]map[string]float64{"attempts": attempts, "latency": lat, "dead letters": dead} {
		if ls := labels(m); len(ls) > 6 || !ls[metrics.Other] {
			t.Errorf("%s: %d endpoint label values %v, want at most 6 with %q", name, len(ls), ls, metrics.Other)
		}
	}
	// First come, first served: the first five endpoints observed.
	for i := range 5 {
		if !labels(attempts)[fmt.Sprintf("ep_%02d", i)] {
			t.Errorf("ep_%02d has no label value of its own", i)
		}
	}
	if sum(attempts) != float64(observed+1) || sum(lat) != float64(observed) || sum(dead) != 20 {
		t.Errorf("totals: attempts %v (want %d), latencies %v (want %d), dead letters %v (want 20)", sum(attempts), observed+1, sum(lat), observed, sum(dead))
	}
	if dead["endpoint=other,service=api"] != 20 {
		t.Errorf("dead letters of unlabelled endpoints: %v", dead)
	}
}
