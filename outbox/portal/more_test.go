package portal_test

import (
	"encoding/json"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/portal"
)

func TestCSVCells(t *testing.T) {
	for in, want := range map[string]string{
		"=HYPERLINK(\"http://x\")": "'=HYPERLINK(\"http://x\")",
		"+1":                       "'+1",
		"-2-3":                     "'-2-3",
		"@SUM(A1)":                 "'@SUM(A1)",
		"\tx":                      "'\tx",
		"\rx":                      "'\rx",
		"evt_1":                    "evt_1",
		"":                         "",
	} {
		if got := portal.Cell(in); got != want {
			t.Errorf("cell(%q) = %q, want %q", in, got, want)
		}
	}
}

// An event whose ID a spreadsheet would read as a formula is exported
// with a leading apostrophe in CSV, and as it is in JSON.
func TestExportCSVInjection(t *testing.T) {
	e := newEnv(t, testdb.SQLite(t), outbox.Config{}, portal.Config{})
	if _, err := e.ob.CreateEndpoint(e.ctx, outbox.NewEndpoint{Tenant: "acme", URL: "http://127.0.0.1:1/hook"}); err != nil {
		t.Fatal(err)
	}
	tx, _ := e.db.BeginTx(e.ctx, nil)
	if _, err := e.ob.Enqueue(e.ctx, tx, outbox.Event{ID: "-1-1", Tenant: "acme", Type: "refund.created", Payload: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	e.relay()
	e.deliveries("acme", 1)
	u := e.login("acme")
	_, body := u.do("GET", "/portal/export?format=csv", nil, nil)
	if !strings.Contains(body, "\n'-1-1,refund.created,") {
		t.Errorf("CSV:\n%s", body)
	}
	_, body = u.do("GET", "/portal/export?format=json", nil, nil)
	if !strings.Contains(body, `"event_id":"-1-1"`) {
		t.Errorf("JSON:\n%s", body)
	}
}

// Behind a trusted TLS proxy the session and CSRF cookies are __Host- and
// Secure, and the audit log names the client the proxy saw; the host's
// Actor names who.
func TestTrustedProxy(t *testing.T) {
	e := newEnv(t, testdb.SQLite(t), outbox.Config{}, portal.Config{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")},
		Actor:          func(r *http.Request) string { return r.Header.Get("X-User") },
	})
	ep, err := e.ob.CreateEndpoint(e.ctx, outbox.NewEndpoint{Tenant: "acme", URL: "http://127.0.0.1:1/hook"})
	if err != nil {
		t.Fatal(err)
	}
	proxy := http.Header{"X-Forwarded-Proto": {"https"}, "X-Forwarded-For": {"198.51.100.1, 203.0.113.9"}, "X-User": {"alice"}}
	u := &user{e: e, client: newClient()}
	link, _ := e.p.Link("acme", 10*60*1e9)
	res, _ := u.do("GET", link, nil, proxy)
	var session *http.Cookie
	for _, c := range res.Cookies() {
		if strings.Contains(c.Name, "portal") {
			session = c
		}
	}
	if session == nil || session.Name != "__Host-txhook_portal" || !session.Secure || session.Path != "/" || !session.HttpOnly || session.SameSite != http.SameSiteLaxMode {
		t.Fatalf("session cookie behind a TLS proxy: %+v", session)
	}
	// The jar keeps no Secure cookie over http: send it by hand.
	page := func(method, path string, form url.Values, csrf *http.Cookie) (*http.Response, string) {
		h := proxy.Clone()
		h.Add("Cookie", session.Name+"="+session.Value)
		if csrf != nil {
			h.Add("Cookie", csrf.Name+"="+csrf.Value)
		}
		return (&user{e: e, client: newClient()}).do(method, path, form, h)
	}
	res, body := page("GET", "/portal/endpoints/new", nil, nil)
	var csrf *http.Cookie
	for _, c := range res.Cookies() {
		if c.Name == "__Host-txhook_portal_csrf" && c.Secure && c.Path == "/" {
			csrf = c
		}
	}
	m := csrfPattern.FindStringSubmatch(body)
	if csrf == nil || m == nil {
		t.Fatalf("CSRF cookie behind a TLS proxy: %v", res.Cookies())
	}
	if res, _ := page("POST", "/portal/endpoints/"+ep.ID+"/disable", url.Values{"csrf": {m[1]}, "reason": {"holiday"}}, csrf); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("disable: %d", res.StatusCode)
	}
	au, err := e.ob.Tenant("acme").AuditLog(e.ctx, outbox.AuditFilter{})
	if err != nil || len(au.Entries) == 0 {
		t.Fatalf("audit %+v %v", au, err)
	}
	if a := au.Entries[0]; a.Action != "endpoint.disable" || a.Actor != "alice" || a.Addr != "203.0.113.9" {
		t.Errorf("audit entry %+v", a)
	}
}

// The JSON API: the header is required, errors have codes, the secret is
// in full only in the answer that created it.
func TestAPI(t *testing.T) {
	e := newEnv(t, testdb.SQLite(t), outbox.Config{}, portal.Config{})
	u := e.login("acme")
	res, body := u.api("POST", "endpoints", `{"url":"http://127.0.0.1:1/hook","event_types":["payment.*"],"description":"books"}`)
	var created struct {
		ID      string `json:"id"`
		Secrets []struct {
			Value string `json:"value"`
		} `json:"secrets"`
	}
	if res.StatusCode != http.StatusCreated || json.Unmarshal([]byte(body), &created) != nil || !strings.HasPrefix(created.Secrets[0].Value, "whsec_") {
		t.Fatalf("create: %d %s", res.StatusCode, body)
	}
	eps, _ := e.ob.Tenant("acme").Endpoints(e.ctx)
	if len(eps) != 1 || eps[0].Secrets[0].Value != created.Secrets[0].Value {
		t.Fatalf("the API's secret is not the endpoint's")
	}
	if _, body := u.api("GET", "endpoints/"+created.ID, ""); strings.Contains(body, created.Secrets[0].Value) || !strings.Contains(body, `"24h"`) {
		t.Errorf("GET shows the secret or no health: %s", body)
	}
	for _, tc := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"POST", "endpoints", `{"url":"ftp://x"}`, 400, `"code":"url"`},
		{"POST", "endpoints", `not json`, 400, `"code":"bad_request"`},
		{"POST", "endpoints/" + created.ID + "/test", `{"type":"nope.nope"}`, 400, `"code":"unknown_type"`},
		{"GET", "endpoints/ep_nope", ``, 404, `"code":"not_found"`},
		{"GET", "nothing-here", ``, 404, `"code":"not_found"`},
		{"GET", "deliveries?status=weird", ``, 400, `"code":"filter"`},
	} {
		res, body := u.api(tc.method, tc.path, tc.body)
		if res.StatusCode != tc.status || !strings.Contains(body, tc.code) || res.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: %d %s", tc.method, tc.path, res.StatusCode, body)
		}
	}
	req, _ := http.NewRequest("GET", e.srv.URL+"/portal/api/endpoints", nil)
	res, err := u.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Errorf("no header: %d", res.StatusCode)
	}
}

// Custom header values can be credentials: the edit form shows their
// names only, saving it without headers keeps them, and the box removes
// them.
func TestEditKeepsHeaderValuesHidden(t *testing.T) {
	e := newEnv(t, testdb.SQLite(t), outbox.Config{}, portal.Config{})
	ep, err := e.ob.CreateEndpoint(e.ctx, outbox.NewEndpoint{Tenant: "acme", URL: "http://127.0.0.1:1/hook", Headers: outbox.Headers{"Authorization": "Bearer s3cr3t-value"}})
	if err != nil {
		t.Fatal(err)
	}
	u := e.login("acme")
	form := u.get("endpoints/" + ep.ID + "/edit")
	if strings.Contains(form, "s3cr3t-value") || !strings.Contains(form, "Authorization") {
		t.Fatalf("edit form shows the header value, or not its name:\n%s", form)
	}
	if res, _ := u.post("endpoints/"+ep.ID, url.Values{"url": {ep.URL}, "description": {"renamed"}}); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("save: %d", res.StatusCode)
	}
	got, _ := e.ob.Endpoint(e.ctx, ep.ID)
	if got.Description != "renamed" || got.Headers["Authorization"] != "Bearer s3cr3t-value" {
		t.Fatalf("after saving without headers: %q %v", got.Description, got.Headers)
	}
	if res, _ := u.post("endpoints/"+ep.ID, url.Values{"url": {ep.URL}, "clear_headers": {"yes"}}); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("clear: %d", res.StatusCode)
	}
	if got, _ := e.ob.Endpoint(e.ctx, ep.ID); len(got.Headers) != 0 {
		t.Fatalf("headers after clearing: %v", got.Headers)
	}
}
