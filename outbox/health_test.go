package outbox_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/clock"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// ts renders t as the backend's time column value.
func (b *bundle) ts(t time.Time) any {
	if b.db.Backend.Postgres() {
		return t.UTC()
	}
	return t.UnixMicro()
}

// attemptRow is a crafted row of the attempt log.
type attemptRow struct {
	at     time.Time
	dur    time.Duration
	status int // 0: no response
	err    string
}

func (b *bundle) insertAttempts(endpointID string, rows ...attemptRow) {
	b.t.Helper()
	tx, err := b.db.BeginTx(b.ctx, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	defer tx.Rollback()
	for i, r := range rows {
		var status any
		if r.status != 0 {
			status = r.status
		}
		if _, err := tx.ExecContext(b.ctx, b.rebind(`INSERT INTO txhook_attempts
(delivery_id, endpoint_id, attempt, started_at, duration_us, status, response_excerpt, error) VALUES (?, ?, ?, ?, ?, ?, '', ?)`),
			1000+i, endpointID, 1, b.ts(r.at), r.dur.Microseconds(), status, r.err); err != nil {
			b.t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.t.Fatal(err)
	}
}

func (b *bundle) insertDelivery(endpointID, state string, at time.Time) {
	b.t.Helper()
	if _, err := b.db.ExecContext(b.ctx, b.rebind(`INSERT INTO txhook_deliveries
(event_id, endpoint_id, state, attempts, next_attempt_at, created_at, updated_at) VALUES (?, ?, ?, 1, ?, ?, ?)`),
		"evt_"+state, endpointID, state, b.ts(at), b.ts(at), b.ts(at)); err != nil {
		b.t.Fatal(err)
	}
}

func (b *bundle) insertDeadLetter(id int64, endpointID, tenant string, at time.Time) {
	b.t.Helper()
	if _, err := b.db.ExecContext(b.ctx, b.rebind(`INSERT INTO txhook_dead_letters
(delivery_id, event_id, endpoint_id, tenant, event_type, attempts, last_status, last_error, failed_at) VALUES (?, ?, ?, ?, 'payment.failed', 9, 500, 'HTTP 500', ?)`),
		id, "evt_dead", endpointID, tenant, b.ts(at)); err != nil {
		b.t.Fatal(err)
	}
}

func TestEndpointHealthOfCraftedHistory(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
		fake := clock.NewFake(now)
		b := setup(t, db, outbox.Config{Clock: fake})
		a := b.endpoint("m", "http://127.0.0.1:1/a")
		idle := b.endpoint("m", "http://127.0.0.1:1/idle")
		other := b.endpoint("someone-else", "http://127.0.0.1:1/c")

		ms := time.Millisecond
		b.insertAttempts(a.ID,
			attemptRow{at: now.Add(-30 * time.Hour), dur: 1 * ms, status: 200}, // before the window
			attemptRow{at: now.Add(-5 * time.Hour), dur: 10 * ms, status: 200},
			attemptRow{at: now.Add(-4 * time.Hour), dur: 20 * ms, status: 204},
			attemptRow{at: now.Add(-3 * time.Hour), dur: 30 * ms, status: 200},
			attemptRow{at: now.Add(-2 * time.Hour), dur: 100 * ms, status: 500, err: "HTTP 500"},
			attemptRow{at: now.Add(-90 * time.Minute), dur: 40 * ms, status: 200},
			attemptRow{at: now.Add(-60 * time.Minute), dur: 200 * ms, status: 503, err: "HTTP 503"},
			attemptRow{at: now.Add(-30 * time.Minute), dur: 5000 * ms, err: "timeout after 5s"},
			// Made no request: counts as a failed attempt, not as a latency.
			attemptRow{at: now.Add(-10 * time.Minute), err: "lease expired"},
		)
		b.insertAttempts(other.ID, attemptRow{at: now.Add(-time.Minute), dur: ms, status: 500, err: "HTTP 500"})
		for _, s := range []string{"pending", "pending", "running", "paused", "succeeded", "succeeded", "dead"} {
			b.insertDelivery(a.ID, s, now.Add(-time.Hour))
		}
		b.insertDelivery(other.ID, "pending", now)
		b.insertDeadLetter(1, a.ID, "m", now.Add(-48*time.Hour))
		b.insertDeadLetter(2, a.ID, "m", now.Add(-time.Hour))
		b.insertDeadLetter(3, other.ID, "someone-else", now.Add(-time.Hour))
		failingSince := now.Add(-time.Hour)
		if _, err := db.ExecContext(b.ctx, b.rebind(`UPDATE txhook_endpoints SET failing_since = ? WHERE id = ?`), b.ts(failingSince), a.ID); err != nil {
			t.Fatal(err)
		}

		h, err := b.ob.EndpointHealth(b.ctx, a.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		want := outbox.Health{
			EndpointID: a.ID, Tenant: "m", URL: a.URL, Enabled: true,
			Since: now.Add(-24 * time.Hour), Until: now,
			Attempts: 8, Succeeded: 4, Failed: 4, SuccessRate: 0.5,
			// Sorted latencies 10 20 30 40 100 200 5000 ms: the median is
			// the 4th; p95 sits 0.7 of the way from 200 to 5000.
			LatencyP50: 40 * ms, LatencyP95: 3560 * ms,
			ConsecutiveFailures: 3, FailingSince: failingSince,
			Backlog: 4, DeadLetters: 2,
		}
		checkHealth(t, h, want)
		if h.LastSuccess == nil || !h.LastSuccess.StartedAt.Equal(now.Add(-90*time.Minute)) || h.LastSuccess.Status != 200 || h.LastSuccess.Duration != 40*ms {
			t.Errorf("last success = %+v", h.LastSuccess)
		}
		if h.LastFailure == nil || !h.LastFailure.StartedAt.Equal(now.Add(-10*time.Minute)) || h.LastFailure.Error != "lease expired" || h.LastFailure.Status != 0 {
			t.Errorf("last failure = %+v", h.LastFailure)
		}

		// A one-hour window holds the last three attempts (its start is
		// inclusive), all failed.
		h, err = b.ob.EndpointHealth(b.ctx, a.ID, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		want.Since, want.Attempts, want.Succeeded, want.Failed, want.SuccessRate = now.Add(-time.Hour), 3, 0, 3, 0
		want.LatencyP50, want.LatencyP95 = 2600*ms, 4760*ms
		checkHealth(t, h, want)

		// Two hours later the one-hour window is empty; the run of failures,
		// the last attempts, backlog and dead letters do not depend on it.
		fake.Advance(2 * time.Hour)
		h, err = b.ob.EndpointHealth(b.ctx, a.ID, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		want.Since, want.Until = now.Add(time.Hour), now.Add(2*time.Hour)
		want.Attempts, want.Failed, want.LatencyP50, want.LatencyP95 = 0, 0, 0, 0
		checkHealth(t, h, want)
		if h.LastSuccess == nil || h.LastFailure == nil {
			t.Errorf("last attempts lost: %+v %+v", h.LastSuccess, h.LastFailure)
		}

		// An endpoint without history.
		h, err = b.ob.EndpointHealth(b.ctx, idle.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		checkHealth(t, h, outbox.Health{EndpointID: idle.ID, Tenant: "m", URL: idle.URL, Enabled: true,
			Since: now.Add(2*time.Hour - 24*time.Hour), Until: now.Add(2 * time.Hour)})
		if h.LastSuccess != nil || h.LastFailure != nil {
			t.Errorf("idle endpoint has last attempts: %+v %+v", h.LastSuccess, h.LastFailure)
		}

		// The tenant's endpoints, and only those.
		hs, err := b.ob.TenantHealth(b.ctx, "m", 0)
		if err != nil {
			t.Fatal(err)
		}
		ids := []string{a.ID, idle.ID}
		slices.Sort(ids)
		if len(hs) != 2 || hs[0].EndpointID != ids[0] || hs[1].EndpointID != ids[1] {
			t.Fatalf("tenant health = %+v, want endpoints %v", hs, ids)
		}
		for _, tenant := range []string{"", "nobody"} {
			if hs, err := b.ob.TenantHealth(b.ctx, tenant, 0); err != nil || len(hs) != 0 {
				t.Errorf("TenantHealth(%q) = %v, %v; want none", tenant, hs, err)
			}
		}
		if _, err := b.ob.EndpointHealth(b.ctx, "ep_missing", 0); !errors.Is(err, outbox.ErrEndpointNotFound) {
			t.Errorf("unknown endpoint: %v", err)
		}
	})
}

func checkHealth(t *testing.T, got, want outbox.Health) {
	t.Helper()
	got.LastSuccess, got.LastFailure = nil, nil
	if !got.Since.Equal(want.Since) || !got.Until.Equal(want.Until) || !got.FailingSince.Equal(want.FailingSince) {
		t.Errorf("times: got since %v until %v failing %v; want %v %v %v", got.Since, got.Until, got.FailingSince, want.Since, want.Until, want.FailingSince)
	}
	got.Since, got.Until, got.FailingSince = want.Since, want.Until, want.FailingSince
	if got != want {
		t.Errorf("health\n got %+v\nwant %+v", got, want)
	}
}

func TestHealthRunOfFailuresIsBounded(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
		b := setup(t, db, outbox.Config{Clock: clock.NewFake(now)})
		ep := b.endpoint("m", "http://127.0.0.1:1/a")
		rows := []attemptRow{{at: now.Add(-48 * time.Hour), dur: time.Millisecond, status: 200}}
		for i := range 1005 {
			rows = append(rows, attemptRow{at: now.Add(-time.Duration(1005-i) * time.Second), dur: time.Millisecond, status: 502, err: "HTTP 502"})
		}
		b.insertAttempts(ep.ID, rows...)
		h, err := b.ob.EndpointHealth(b.ctx, ep.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		if h.ConsecutiveFailures != 1000 || h.LastSuccess != nil || h.Attempts != 1005 || h.Failed != 1005 {
			t.Errorf("got run %d, last success %v, attempts %d, failed %d; want 1000, nil, 1005, 1005",
				h.ConsecutiveFailures, h.LastSuccess, h.Attempts, h.Failed)
		}
		if h.LastFailure == nil || !h.LastFailure.StartedAt.Equal(now.Add(-time.Second)) {
			t.Errorf("last failure = %+v", h.LastFailure)
		}
	})
}

func TestHealthCountsRelayAttempts(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		rc := newReceiver(t, nil)
		ep := b.endpoint("m", rc.URL)
		b.relay(roomy(outbox.RelayConfig{}))
		b.enqueue(outbox.Event{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{}`)})
		b.eventually("delivery", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded'") == 1
		})
		h, err := b.ob.EndpointHealth(b.ctx, ep.ID, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if h.Attempts != 1 || h.Succeeded != 1 || h.SuccessRate != 1 || h.LatencyP50 <= 0 || h.LastSuccess == nil ||
			h.LastSuccess.Status != 200 || h.LastFailure != nil || h.Backlog != 0 {
			t.Errorf("health after one delivery = %+v", h)
		}
	})
}

func TestHealthHandlerShowsOnlyTheTenantsEndpoints(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		mine := []string{b.endpoint("m", "http://127.0.0.1:1/a").ID, b.endpoint("m", "http://127.0.0.1:1/b").ID}
		theirs := b.endpoint("x", "http://127.0.0.1:1/secret-partner-url")
		b.insertAttempts(theirs.ID, attemptRow{at: time.Now().Add(-time.Minute), dur: time.Millisecond, status: 500, err: "HTTP 500 from x"})
		slices.Sort(mine)

		srv := httptest.NewServer(outbox.HealthHandler(b.ob, func(r *http.Request) (string, bool) {
			t := r.Header.Get("X-Tenant")
			return t, t != "" && t != "banned"
		}))
		t.Cleanup(srv.Close)
		get := func(method, tenant, query string) (int, string) {
			t.Helper()
			req, _ := http.NewRequest(method, srv.URL+"/health"+query, nil)
			if tenant != "" {
				req.Header.Set("X-Tenant", tenant)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			body, _ := io.ReadAll(res.Body)
			if res.Header.Get("Cache-Control") != "no-store" {
				t.Errorf("Cache-Control = %q", res.Header.Get("Cache-Control"))
			}
			return res.StatusCode, string(body)
		}

		for _, tenant := range []string{"", "banned"} {
			for _, m := range []string{"GET", "POST", "DELETE"} {
				if code, body := get(m, tenant, ""); code != http.StatusForbidden || strings.Contains(body, "endpoint") {
					t.Errorf("%s as %q: %d %s", m, tenant, code, body)
				}
			}
		}

		code, body := get("GET", "m", "")
		if code != http.StatusOK {
			t.Fatalf("GET as m: %d %s", code, body)
		}
		var doc struct {
			Tenant    string `json:"tenant"`
			Window    string `json:"window"`
			Endpoints []struct {
				EndpointID string `json:"endpoint_id"`
				Tenant     string `json:"tenant"`
			} `json:"endpoints"`
		}
		if err := json.Unmarshal([]byte(body), &doc); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range doc.Endpoints {
			got = append(got, e.EndpointID)
			if e.Tenant != "m" {
				t.Errorf("endpoint of tenant %q shown to m", e.Tenant)
			}
		}
		if doc.Tenant != "m" || doc.Window != "24h0m0s" || !slices.Equal(got, mine) {
			t.Errorf("GET as m = %s; want endpoints %v", body, mine)
		}
		for _, leak := range []string{theirs.ID, "secret-partner-url", "from x", "whsec_"} {
			if strings.Contains(body, leak) {
				t.Errorf("m's health shows %q: %s", leak, body)
			}
		}

		// Another tenant's endpoint cannot be named, nor told apart from a
		// missing one.
		if code, body := get("GET", "m", "?endpoint="+theirs.ID); code != http.StatusNotFound || strings.Contains(body, "secret-partner-url") {
			t.Errorf("m asking for x's endpoint: %d %s", code, body)
		}
		if code, _ := get("GET", "m", "?endpoint=ep_missing"); code != http.StatusNotFound {
			t.Errorf("missing endpoint: %d", code)
		}
		if code, body := get("GET", "m", "?endpoint="+mine[1]+"&window=1h"); code != http.StatusOK || !strings.Contains(body, mine[1]) || strings.Contains(body, mine[0]) || !strings.Contains(body, `"window":"1h0m0s"`) {
			t.Errorf("one endpoint: %d %s", code, body)
		}
		code, body = get("GET", "x", "")
		if code != http.StatusOK || !strings.Contains(body, theirs.ID) || strings.Contains(body, mine[0]) || strings.Contains(body, mine[1]) ||
			!strings.Contains(body, `"consecutive_failures":1`) {
			t.Errorf("GET as x: %d %s", code, body)
		}
		for _, q := range []string{"?window=forever", "?window=1s", "?window=1000h"} {
			if code, _ := get("GET", "m", q); code != http.StatusBadRequest {
				t.Errorf("%s: %d, want 400", q, code)
			}
		}
		if code, _ := get("POST", "m", ""); code != http.StatusMethodNotAllowed {
			t.Errorf("POST as m: %d", code)
		}
	})
}
