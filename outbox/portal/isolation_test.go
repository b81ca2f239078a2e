package portal_test

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testob"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/portal"
)

// seeded is a portal with two tenants: acme with a working and a failing
// endpoint and one event delivered to both, globex with one endpoint.
type seeded struct {
	*env
	okEp, failEp, globexEp outbox.Endpoint
	event                  string
	ok, failed             outbox.Delivery
}

func seed(t *testing.T, db *testdb.DB) *seeded {
	e := newEnv(t, db, outbox.Config{}, portal.Config{})
	s := &seeded{env: e}
	var err error
	if s.okEp, err = e.ob.CreateEndpoint(e.ctx, outbox.NewEndpoint{Tenant: "acme", URL: testob.Receiver(t, 200) + "/acme-ok", Description: "acme books"}); err != nil {
		t.Fatal(err)
	}
	if s.failEp, err = e.ob.CreateEndpoint(e.ctx, outbox.NewEndpoint{Tenant: "acme", URL: testob.Receiver(t, 503) + "/acme-down"}); err != nil {
		t.Fatal(err)
	}
	if s.globexEp, err = e.ob.CreateEndpoint(e.ctx, outbox.NewEndpoint{Tenant: "globex", URL: testob.Receiver(t, 200) + "/globex"}); err != nil {
		t.Fatal(err)
	}
	s.event = e.enqueue("acme", "payment.succeeded", `{"id":"pay_acme_1","amount":4200}`)
	e.relay()
	for _, d := range e.deliveries("acme", 2) {
		if d.EndpointID == s.okEp.ID {
			s.ok = d
		} else {
			s.failed = d
		}
	}
	if s.ok.State != outbox.StateSucceeded || s.failed.Attempts == 0 {
		t.Fatalf("seed: %+v %+v", s.ok, s.failed)
	}
	return s
}

// acmeState is what a request of another tenant must not change.
type acmeState struct {
	endpoints  string
	deliveries int
	audit      int
}

func (s *seeded) snapshot() acmeState {
	s.t.Helper()
	v := s.ob.Tenant("acme")
	eps, err := v.Endpoints(s.ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	var b strings.Builder
	for _, ep := range eps {
		b.WriteString(ep.ID + ep.URL + ep.Description + strconv.FormatBool(ep.Enabled) + strings.Join(ep.EventTypes, ","))
		for _, sec := range ep.Secrets {
			b.WriteString(sec.Value)
		}
		b.WriteString(";")
	}
	pg, err := v.Deliveries(s.ctx, outbox.DeliveryFilter{Limit: outbox.MaxDeliveryPage})
	if err != nil {
		s.t.Fatal(err)
	}
	au, err := v.AuditLog(s.ctx, outbox.AuditFilter{Limit: outbox.MaxAuditPage})
	if err != nil {
		s.t.Fatal(err)
	}
	return acmeState{endpoints: b.String(), deliveries: len(pg.Deliveries), audit: len(au.Entries)}
}

// secrets are strings of acme's that must not appear in globex's answers.
func (s *seeded) secrets() []string {
	out := []string{"acme", s.okEp.ID, s.failEp.ID, s.okEp.URL, s.failEp.URL, s.event, "pay_acme_1", s.okEp.Secrets[0].Value}
	return out
}

type route struct {
	method, path string
	form         url.Values // HTML POST form (the CSRF token is added)
	body         string     // API body
	api          bool
	list         bool // a list or export: 200 with nothing of acme's, not 404
}

func (s *seeded) routes() []route {
	ep, fail, ev := s.okEp.ID, s.failEp.ID, s.event
	d, df := strconv.FormatInt(s.ok.ID, 10), strconv.FormatInt(s.failed.ID, 10)
	return []route{
		{method: "GET", path: "endpoints/" + ep},
		{method: "GET", path: "endpoints/" + ep + "/edit"},
		{method: "GET", path: "deliveries/" + d},
		{method: "GET", path: "deliveries/" + df},
		{method: "GET", path: "events/" + ev},
		{method: "GET", path: "deliveries?endpoint=" + ep, list: true},
		{method: "GET", path: "deliveries?event=" + ev, list: true},
		{method: "GET", path: "deliveries?endpoint=" + fail + "&status=pending", list: true},
		{method: "GET", path: "export?format=csv&endpoint=" + ep, list: true},
		{method: "GET", path: "export?format=json", list: true},
		{method: "GET", path: "endpoints", list: true},
		{method: "GET", path: "catalog", list: true},
		{method: "GET", path: "audit", list: true},
		{method: "POST", path: "endpoints/" + ep, form: url.Values{"url": {"http://127.0.0.1:1/taken-over"}, "description": {"mine"}}},
		{method: "POST", path: "endpoints/" + ep + "/disable", form: url.Values{"reason": {"x"}}},
		{method: "POST", path: "endpoints/" + fail + "/enable", form: url.Values{}},
		{method: "POST", path: "endpoints/" + ep + "/rotate", form: url.Values{"overlap": {"0s"}}},
		{method: "POST", path: "endpoints/" + fail + "/recover", form: url.Values{"since": {"2020-01-01T00:00"}}},
		{method: "POST", path: "endpoints/" + ep + "/test", form: url.Values{"type": {"payment.succeeded"}}},
		{method: "POST", path: "deliveries/" + d + "/resend", form: url.Values{}},
		{method: "GET", path: "endpoints/" + ep, api: true},
		{method: "GET", path: "endpoints/" + ep + "/health?window=7d", api: true},
		{method: "PATCH", path: "endpoints/" + ep, api: true, body: `{"url":"http://127.0.0.1:1/taken-over"}`},
		{method: "POST", path: "endpoints/" + ep + "/disable", api: true, body: `{"reason":"x"}`},
		{method: "POST", path: "endpoints/" + fail + "/enable", api: true},
		{method: "POST", path: "endpoints/" + ep + "/rotate", api: true, body: `{"overlap":"0s"}`},
		{method: "POST", path: "endpoints/" + fail + "/recover", api: true, body: `{"since":"2020-01-01T00:00:00Z"}`},
		{method: "POST", path: "endpoints/" + ep + "/test", api: true, body: `{"type":"payment.succeeded"}`},
		{method: "GET", path: "deliveries/" + df, api: true},
		{method: "POST", path: "deliveries/" + d + "/resend", api: true},
		{method: "GET", path: "events/" + ev, api: true},
		{method: "GET", path: "deliveries?endpoint=" + ep, api: true, list: true},
		{method: "GET", path: "deliveries?event=" + ev, api: true, list: true},
		{method: "GET", path: "export?endpoint=" + ep, api: true, list: true},
		{method: "GET", path: "endpoints", api: true, list: true},
		{method: "GET", path: "audit", api: true, list: true},
		{method: "DELETE", path: "endpoints/" + fail, api: true},
		{method: "POST", path: "endpoints/" + ep + "/delete", form: url.Values{"confirm": {"yes"}}},
	}
}

func (u *user) call(rt route) (*http.Response, string) {
	u.e.t.Helper()
	if rt.api {
		return u.api(rt.method, rt.path, rt.body)
	}
	if rt.method == "GET" {
		return u.do("GET", "/portal/"+rt.path, nil, nil)
	}
	return u.post(rt.path, rt.form)
}

// Tenant isolation over every route and API call: globex naming acme's
// endpoint, event, delivery or attempt gets 404 (or, on lists and exports,
// nothing of acme's), no acme data in the body, and nothing changes. Then
// acme itself makes the same calls, which succeed: the routes are real.
func TestTenantIsolationEveryRoute(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		s := seed(t, db)
		globex, acme := s.login("globex"), s.login("acme")
		before := s.snapshot()
		for _, rt := range s.routes() {
			name := rt.method + " " + rt.path
			if rt.api {
				name = "api " + name
			}
			res, body := globex.call(rt)
			if rt.list {
				if res.StatusCode != http.StatusOK {
					t.Errorf("globex %s: %d, want 200", name, res.StatusCode)
				}
			} else if res.StatusCode != http.StatusNotFound {
				t.Errorf("globex %s: %d, want 404\n%.300s", name, res.StatusCode, body)
			}
			for _, secret := range s.secrets() {
				// A list echoes the filter globex typed (the search box, the
				// export link); that is globex's input, not acme's data.
				if rt.list && strings.Contains(rt.path, secret) {
					continue
				}
				if strings.Contains(body, secret) {
					t.Errorf("globex %s: the answer contains acme's %q", name, secret)
				}
			}
			if after := s.snapshot(); after != before {
				t.Fatalf("globex %s changed acme's data:\n%+v\n%+v", name, before, after)
			}
		}
		// acme's own calls are served (and change what they should).
		for _, rt := range s.routes() {
			res, body := acme.call(rt)
			if res.StatusCode >= 400 {
				t.Errorf("acme %s %s (api %v): %d\n%.400s", rt.method, rt.path, rt.api, res.StatusCode, body)
			}
		}
		if after := s.snapshot(); after.endpoints != "" || after.audit <= before.audit {
			t.Errorf("acme's own calls did not take effect: %+v", after)
		}
	})
}
