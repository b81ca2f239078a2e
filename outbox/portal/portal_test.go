package portal_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/clock"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testob"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/portal"
)

func TestNewRefusesBadConfig(t *testing.T) {
	ob, _ := testob.NewOutbox(t, testdb.SQLite(t))
	for name, cfg := range map[string]portal.Config{
		"no tenant source": {},
		"short key":        {LinkKeys: [][]byte{[]byte("short")}},
		"bad prefix":       {LinkKeys: [][]byte{linkKey}, Prefix: "/a b/"},
		"bad ancestor":     {LinkKeys: [][]byte{linkKey}, FrameAncestors: []string{"https://x; script-src *"}},
	} {
		if _, err := portal.New(ob, cfg); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
	if _, err := portal.New(nil, portal.Config{LinkKeys: [][]byte{linkKey}}); err == nil {
		t.Error("New without outbox succeeded")
	}
	p, err := portal.New(ob, portal.Config{Tenant: func(*http.Request) (string, bool) { return "", false }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Link("acme", time.Minute); err != portal.ErrNoLinkKeys {
		t.Errorf("Link without keys: %v", err)
	}
}

// Links: a good one opens a session and redirects to a URL without the
// token; expired, altered, foreign-key and revoked ones get a bare 403.
func TestAccessLinks(t *testing.T) {
	db := testdb.SQLite(t)
	fake := clock.NewFake(time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC))
	e := newEnv(t, db, outbox.Config{Clock: fake}, portal.Config{SessionTTL: 30 * time.Minute})
	if _, err := e.ob.CreateEndpoint(e.ctx, outbox.NewEndpoint{Tenant: "acme", URL: "http://127.0.0.1:1/acme-secret-hook"}); err != nil {
		t.Fatal(err)
	}
	refused := func(name, link string, c *http.Client) {
		t.Helper()
		u := &user{e: e, client: c}
		if c == nil {
			u.client = newClient()
		}
		res, body := u.do("GET", link, nil, nil)
		if res.StatusCode != http.StatusForbidden || len(res.Cookies()) > 0 && res.Cookies()[0].Name == "txhook_portal" {
			t.Errorf("%s: %d, cookies %v", name, res.StatusCode, res.Cookies())
		}
		if strings.Contains(body, "acme") {
			t.Errorf("%s: the 403 page names the tenant", name)
		}
		res, body = u.do("GET", "/portal/endpoints", nil, nil)
		if res.StatusCode != http.StatusForbidden || strings.Contains(body, "acme-secret-hook") {
			t.Errorf("%s: endpoints after the refused link: %d", name, res.StatusCode)
		}
	}

	link, err := e.p.Link("acme", 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(link, "/portal/link?token=") {
		t.Fatalf("link %q", link)
	}
	u := e.login("acme")
	if body := u.get("endpoints"); !strings.Contains(body, "acme-secret-hook") {
		t.Fatalf("the session does not show acme's endpoint:\n%.500s", body)
	}

	// Altered: every character of the token changed in turn.
	tok, _ := url.QueryUnescape(strings.TrimPrefix(link, "/portal/link?token="))
	for i := 0; i < len(tok); i += 7 {
		b := []byte(tok)
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		refused("altered at "+string(rune('0'+i%10)), "/portal/link?token="+url.QueryEscape(string(b)), nil)
	}
	refused("empty", "/portal/link?token=", nil)
	refused("garbage", "/portal/link?token=..x", nil)

	// Signed by another key.
	other, err := portal.New(e.ob, portal.Config{Prefix: "/portal/", LinkKeys: [][]byte{[]byte("another key, 32 bytes or more.....")}})
	if err != nil {
		t.Fatal(err)
	}
	foreign, _ := other.Link("acme", time.Minute)
	refused("other key", foreign, nil)

	// Expired: a link of 10 minutes after 10 minutes, and the session it
	// opened after SessionTTL.
	fake.Advance(10 * time.Minute)
	refused("expired", link, nil)
	fake.Advance(21 * time.Minute)
	if res, _ := u.do("GET", "/portal/endpoints", nil, nil); res.StatusCode != http.StatusForbidden {
		t.Errorf("session after SessionTTL: %d", res.StatusCode)
	}
}

// Rotating the key: links and sessions of a key dropped from LinkKeys are
// refused; while it is still listed second they work.
func TestLinkKeyRotation(t *testing.T) {
	db := testdb.SQLite(t)
	oldKey, newKey := linkKey, []byte("the new portal link key, 32+ bytes long")
	e := newEnv(t, db, outbox.Config{}, portal.Config{LinkKeys: [][]byte{oldKey}})
	oldLink, _ := e.p.Link("acme", time.Hour)
	u := e.login("acme")

	serve := func(keys ...[]byte) {
		p, err := portal.New(e.ob, portal.Config{Prefix: "/portal/", LinkKeys: keys})
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.Handle("/portal/", p)
		e.srv.Config.Handler = mux
		e.p = p
	}
	serve(newKey, oldKey)
	u.get("endpoints")
	u2 := &user{e: e, client: newClient()}
	if res, _ := u2.do("GET", oldLink, nil, nil); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("old link while its key is still listed: %d", res.StatusCode)
	}
	serve(newKey)
	if res, _ := u.do("GET", "/portal/endpoints", nil, nil); res.StatusCode != http.StatusForbidden {
		t.Errorf("session of a revoked key: %d", res.StatusCode)
	}
	// The session the old link opened while its key was listed second was
	// signed with the first key, the new one.
	u2.get("endpoints")
	if res, _ := (&user{e: e, client: newClient()}).do("GET", oldLink, nil, nil); res.StatusCode != http.StatusForbidden {
		t.Errorf("link of a revoked key: %d", res.StatusCode)
	}
	e.login("acme").get("endpoints") // the new key's links work
}

// Every POST needs the CSRF token of the user's own cookie and tenant.
func TestCSRF(t *testing.T) {
	db := testdb.SQLite(t)
	e := newEnv(t, db, outbox.Config{}, portal.Config{})
	ep, err := e.ob.CreateEndpoint(e.ctx, outbox.NewEndpoint{Tenant: "acme", URL: "http://127.0.0.1:1/hook"})
	if err != nil {
		t.Fatal(err)
	}
	acme, globex := e.login("acme"), e.login("globex")
	acmeTok, globexTok := acme.token(), globex.token()
	for name, f := range map[string]url.Values{
		"no token":             {"reason": {"x"}},
		"wrong token":          {"reason": {"x"}, "csrf": {"AAAA" + acmeTok[4:]}},
		"other tenant's token": {"reason": {"x"}, "csrf": {globexTok}},
	} {
		res, body := acme.do("POST", "/portal/endpoints/"+ep.ID+"/disable", f, nil)
		if res.StatusCode != http.StatusForbidden {
			t.Errorf("%s: %d %.200s", name, res.StatusCode, body)
		}
	}
	// A cross-site POST with the right token is refused too.
	res, _ := acme.do("POST", "/portal/endpoints/"+ep.ID+"/disable", url.Values{"csrf": {acmeTok}},
		http.Header{"Sec-Fetch-Site": {"cross-site"}})
	if res.StatusCode != http.StatusForbidden {
		t.Errorf("cross-site POST: %d", res.StatusCode)
	}
	if got, _ := e.ob.Endpoint(e.ctx, ep.ID); !got.Enabled {
		t.Fatal("a refused POST disabled the endpoint")
	}
	// A token is for one tenant: a form of globex's, submitted after the
	// same browser switched to acme's session, is refused.
	both := e.login("globex")
	globexForm := both.token()
	link, _ := e.p.Link("acme", time.Minute)
	both.do("GET", link, nil, nil)
	if res, _ := both.do("POST", "/portal/endpoints/"+ep.ID+"/disable", url.Values{"csrf": {globexForm}}, nil); res.StatusCode != http.StatusForbidden {
		t.Errorf("another tenant's form in the same browser: %d", res.StatusCode)
	}
	if res, _ := acme.do("POST", "/portal/endpoints/"+ep.ID+"/disable", url.Values{"csrf": {acmeTok}}, nil); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("POST with the token: %d", res.StatusCode)
	}
	if got, _ := e.ob.Endpoint(e.ctx, ep.ID); got.Enabled {
		t.Fatal("the POST with its token did not disable the endpoint")
	}
	// The API needs its header instead, and refuses cross-site calls.
	req, _ := http.NewRequest("GET", e.srv.URL+"/portal/api/endpoints", nil)
	res, err = acme.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Errorf("API call without %s: %d", portal.APIHeader, res.StatusCode)
	}
}

func TestSecurityHeaders(t *testing.T) {
	db := testdb.SQLite(t)
	for _, tc := range []struct {
		ancestors []string
		fa        string
		xfo       string
	}{{nil, "frame-ancestors 'none'", "DENY"}, {[]string{"https://dash.example.com"}, "frame-ancestors https://dash.example.com", ""}} {
		e := newEnv(t, db, outbox.Config{}, portal.Config{FrameAncestors: tc.ancestors})
		u := e.login("acme")
		for _, path := range []string{"/portal/endpoints", "/portal/no-such", "/portal/link?token=x"} {
			res, _ := u.do("GET", path, nil, nil)
			h := res.Header
			csp := h.Get("Content-Security-Policy")
			if !strings.Contains(csp, "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "+tc.fa+"; base-uri 'none'") {
				t.Errorf("%s CSP %q", path, csp)
			}
			if h.Get("X-Frame-Options") != tc.xfo || h.Get("X-Content-Type-Options") != "nosniff" ||
				h.Get("Referrer-Policy") != "no-referrer" || h.Get("Cache-Control") != "no-store" {
				t.Errorf("%s headers %v", path, h)
			}
		}
	}
}
