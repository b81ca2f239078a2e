package dlq_test

import (
	"html"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/dlq"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

func TestNewUIRequiresAuthorize(t *testing.T) {
	ob, _ := newOutbox(t, testdb.SQLite(t), outbox.Config{})
	if _, err := dlq.NewUI(ob, dlq.UIConfig{}); err == nil || !strings.Contains(err.Error(), "Authorize") {
		t.Fatalf("NewUI without Authorize: %v", err)
	}
	if _, err := dlq.NewUI(ob, dlq.UIConfig{Authorize: authorize, CSRFKey: []byte("short")}); err == nil {
		t.Fatal("NewUI with a short CSRF key succeeded")
	}
	if _, err := dlq.NewUI(nil, dlq.UIConfig{Authorize: authorize}); err == nil {
		t.Fatal("NewUI without outbox succeeded")
	}
}

// seeded is a UI with two tenants' endpoints and dead letters.
type seeded struct {
	*uiEnv
	acme, globex outbox.Endpoint
	dead         []int64 // acme: payment.failed, payment.failed, refund.failed; globex: payment.failed, payment.failed
	base         time.Time
}

func seed(t *testing.T, db *testdb.DB, prefix string, strip bool) *seeded {
	return seedEnv(t, newUIEnv(t, db, prefix, strip))
}

// seedWith is seed with the UI configured by cfg, at "/".
func seedWith(t *testing.T, db *testdb.DB, cfg dlq.UIConfig) *seeded {
	return seedEnv(t, newUIEnvWith(t, db, cfg, false))
}

func seedEnv(t *testing.T, e *uiEnv) *seeded {
	s := &seeded{uiEnv: e, base: time.Now().UTC().Add(-3 * time.Hour).Truncate(time.Second)}
	s.acme = e.endpoint("acme", "http://127.0.0.1:1/acme-hook")
	s.globex = e.endpoint("globex", "http://127.0.0.1:1/globex-hook")
	for i, x := range []struct {
		ep  outbox.Endpoint
		typ string
	}{{s.acme, "payment.failed"}, {s.acme, "payment.failed"}, {s.acme, "refund.failed"}, {s.globex, "payment.failed"}, {s.globex, "payment.failed"}} {
		s.dead = append(s.dead, e.deadLetter(x.ep, "evt_"+strconv.Itoa(i), x.typ, s.base.Add(time.Duration(i)*time.Minute)))
	}
	return s
}

// routes are every route of the UI, with a valid target.
func (s *seeded) routes() (gets []string, posts map[string]url.Values) {
	ep := s.acme.ID
	gets = []string{"", "endpoints", "endpoints?tenant=acme", "endpoints/" + ep, "deliveries", "deliveries?event_id=evt_0",
		"dead", "dead?tenant=acme&type=payment.failed", "dead/" + strconv.FormatInt(s.dead[0], 10), "static/ui.css", "no-such-page"}
	posts = map[string]url.Values{
		"endpoints/" + ep + "/enable":  {},
		"endpoints/" + ep + "/disable": {"reason": {"maintenance"}},
		"endpoints/" + ep + "/rotate":  {"overlap": {"1h"}},
		"endpoints/" + ep + "/reveal":  {},
		"endpoints/" + ep + "/recover": {"since": {"2020-01-01T00:00"}},
		"dead/action":                  {"replay": {strconv.FormatInt(s.dead[0], 10)}},
		"dead/replay-all":              {"confirm": {"yes"}},
		"dead/purge-all":               {"confirm": {"yes"}},
	}
	return gets, posts
}

func TestUIRefusesUnauthorizedRequests(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		s := seed(t, db, "/", false)
		before := s.snapshot()
		token := s.token(s.get("dead")) // a valid token does not stand in for authorization
		gets, posts := s.routes()
		for _, p := range gets {
			for _, m := range []string{"GET", "HEAD"} {
				res, body := s.do(m, p, nil, false)
				if res.StatusCode != http.StatusForbidden || strings.Contains(body, "acme") {
					t.Errorf("%s /%s without authorization: %d %.200s", m, p, res.StatusCode, body)
				}
			}
		}
		for p, form := range posts {
			form.Set("csrf", token)
			res, body := s.do("POST", p, form, false)
			if res.StatusCode != http.StatusForbidden || strings.Contains(body, "whsec_") {
				t.Errorf("POST /%s without authorization: %d %.200s", p, res.StatusCode, body)
			}
		}
		for _, m := range []string{"PUT", "DELETE", "PATCH"} {
			if res, _ := s.do(m, "dead", nil, false); res.StatusCode != http.StatusForbidden {
				t.Errorf("%s without authorization: %d", m, res.StatusCode)
			}
		}
		if after := s.snapshot(); after != before {
			t.Errorf("refused requests changed state:\n%s\n---\n%s", before, after)
		}
	})
}

func TestUIPostsNeedTheCSRFToken(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		s := seed(t, db, "/", false)
		good := s.token(s.get("dead"))
		before := s.snapshot()
		_, posts := s.routes()
		for p, form := range posts {
			wrong := []byte(good)
			wrong[len(wrong)-1] ^= 1 // still base64url, another token
			for name, tok := range map[string]string{"missing": "", "wrong": string(wrong), "blank": " "} {
				f := url.Values{}
				for k, v := range form {
					f[k] = v
				}
				if tok != "" {
					f.Set("csrf", tok)
				}
				res, body := s.do("POST", p, f, true)
				if res.StatusCode != http.StatusForbidden || strings.Contains(body, "whsec_") {
					t.Errorf("POST /%s with %s token: %d %.200s", p, name, res.StatusCode, body)
				}
			}
		}

		// A token is only good with the cookie it was made for.
		other := newUIEnvClient(s.uiEnv)
		f := url.Values{"replay": {strconv.FormatInt(s.dead[0], 10)}, "csrf": {good}}
		if res, _ := other.do("POST", "dead/action", f, true); res.StatusCode != http.StatusForbidden {
			t.Errorf("token without its cookie: %d", res.StatusCode)
		}
		other.get("dead") // a cookie of its own, still not the one the token is for
		if res, _ := other.do("POST", "dead/action", f, true); res.StatusCode != http.StatusForbidden {
			t.Errorf("token of another cookie: %d", res.StatusCode)
		}

		// The browser's cross-origin signal is refused even with the token.
		req, _ := http.NewRequestWithContext(s.ctx, "POST", s.srv.URL+"/dead/action", strings.NewReader(f.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Authorization", opsToken)
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		res, err := s.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusForbidden {
			t.Errorf("cross-site POST: %d", res.StatusCode)
		}

		if after := s.snapshot(); after != before {
			t.Errorf("refused posts changed state:\n%s\n---\n%s", before, after)
		}
		// And the real token works.
		if loc := s.post("dead/action", url.Values{"replay": {strconv.FormatInt(s.dead[0], 10)}}); !strings.Contains(loc, "done=replayed") {
			t.Errorf("replay redirected to %s", loc)
		}
	})
}

// newUIEnvClient is another browser on the same UI: its own cookies.
func newUIEnvClient(e *uiEnv) *uiEnv {
	c := *e
	c.client = newClient()
	return &c
}

func TestUIGetsChangeNothingAndSetSecurityHeaders(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		s := seed(t, db, "/", false)
		before := s.snapshot()
		gets, _ := s.routes()
		for _, p := range gets {
			res, body := s.do("GET", p, nil, true)
			want := http.StatusOK
			switch p {
			case "":
				want = http.StatusFound
			case "no-such-page":
				want = http.StatusNotFound
			}
			if res.StatusCode != want {
				t.Errorf("GET /%s: %d, want %d\n%.300s", p, res.StatusCode, want, body)
			}
			h := res.Header
			if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
				t.Errorf("GET /%s: CSP %q", p, csp)
			}
			if h.Get("X-Frame-Options") != "DENY" || h.Get("Cache-Control") != "no-store" || h.Get("Referrer-Policy") == "" || h.Get("X-Content-Type-Options") != "nosniff" {
				t.Errorf("GET /%s: headers %v", p, h)
			}
			if strings.Contains(body, "<script") {
				t.Errorf("GET /%s has a script tag (unescaped data?)", p)
			}
		}
		if after := s.snapshot(); after != before {
			t.Errorf("GETs changed state:\n%s\n---\n%s", before, after)
		}
		// Response excerpts are shown as text.
		body := s.get("dead/" + strconv.FormatInt(s.dead[0], 10))
		if !strings.Contains(body, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; database down") {
			t.Errorf("excerpt not escaped as text:\n%s", body)
		}
	})
}

func TestUIDeadLetterActions(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		s := seed(t, db, "/", false)
		id := func(i int) string { return strconv.FormatInt(s.dead[i], 10) }
		dead := func() int { return s.count("SELECT count(*) FROM txhook_dead_letters") }
		pending := func() int { return s.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'pending'") }

		// Filters: tenant, endpoint, type, time range; the count says how
		// many match in all.
		page := s.get("dead?tenant=acme&type=payment.failed")
		if !strings.Contains(page, "2 matching") || !strings.Contains(page, "evt_0") || !strings.Contains(page, "evt_1") || strings.Contains(page, "evt_2") || strings.Contains(page, "evt_3") {
			t.Errorf("filtered page:\n%s", page)
		}
		page = s.get("dead?endpoint=" + s.globex.ID)
		if !strings.Contains(page, "2 matching") || !strings.Contains(page, "evt_3") || strings.Contains(page, "evt_0") {
			t.Errorf("endpoint filter:\n%s", page)
		}
		since := s.base.Add(90 * time.Second).Format("2006-01-02T15:04:05")
		until := s.base.Add(210 * time.Second).Format("2006-01-02T15:04:05")
		page = s.get("dead?since=" + since + "&until=" + until)
		if !strings.Contains(page, "2 matching") || !strings.Contains(page, "evt_2") || !strings.Contains(page, "evt_3") || strings.Contains(page, "evt_1<") {
			t.Errorf("time filter:\n%s", page)
		}
		if res, _ := s.do("GET", "dead?since=yesterday", nil, true); res.StatusCode != http.StatusBadRequest {
			t.Errorf("bad time: %d", res.StatusCode)
		}

		// Replay one.
		loc := s.post("dead/action", url.Values{"replay": {id(0)}, "tenant": {"acme"}})
		if loc != "dead?done=replayed&n=1&tenant=acme" {
			t.Errorf("replay one redirects to %q", loc)
		}
		if dead() != 4 || pending() != 1 {
			t.Errorf("after replay one: %d dead, %d pending", dead(), pending())
		}
		// The replayed delivery is pending: its listing says when it is due.
		if page := s.get("deliveries?event_id=evt_0"); !strings.Contains(page, `class="when next"`) {
			t.Errorf("pending delivery without its next attempt:\n%s", page)
		}
		if page := s.get(loc); !strings.Contains(page, "Replayed 1 dead letter") {
			t.Errorf("no flash after replay:\n%s", page)
		}
		// Replaying it again finds nothing; purging a replayed one neither.
		if loc := s.post("dead/action", url.Values{"replay": {id(0)}}); !strings.Contains(loc, "n=0") || !strings.Contains(loc, "skipped=1") {
			t.Errorf("second replay redirects to %q", loc)
		}

		// Replay selected.
		s.post("dead/action", url.Values{"action": {"replay-selected"}, "id": {id(1), id(3)}})
		if dead() != 2 || pending() != 3 {
			t.Errorf("after replay selected: %d dead, %d pending", dead(), pending())
		}
		// Nothing selected.
		if loc := s.post("dead/action", url.Values{"action": {"purge-selected"}}); !strings.Contains(loc, "done=none") {
			t.Errorf("empty selection redirects to %q", loc)
		}
		// Purge one.
		s.post("dead/action", url.Values{"purge": {id(2)}})
		if dead() != 1 || pending() != 3 {
			t.Errorf("after purge one: %d dead, %d pending", dead(), pending())
		}

		// All matching: not without the confirmation box.
		extra := []int64{
			s.deadLetter(s.acme, "evt_10", "payment.failed", s.base),
			s.deadLetter(s.acme, "evt_11", "payment.failed", s.base),
			s.deadLetter(s.acme, "evt_12", "refund.failed", s.base),
		}
		if loc := s.post("dead/replay-all", url.Values{"tenant": {"acme"}}); !strings.Contains(loc, "done=unconfirmed") {
			t.Errorf("unconfirmed replay-all redirects to %q", loc)
		}
		if dead() != 4 {
			t.Errorf("unconfirmed replay-all changed something: %d dead", dead())
		}
		loc = s.post("dead/replay-all", url.Values{"tenant": {"acme"}, "type": {"payment.failed"}, "confirm": {"yes"}})
		if !strings.Contains(loc, "done=replayed") || !strings.Contains(loc, "n=2") || !strings.Contains(loc, "type=payment.failed") {
			t.Errorf("replay-all redirects to %q", loc)
		}
		if dead() != 2 || pending() != 5 {
			t.Errorf("after replay all: %d dead, %d pending", dead(), pending())
		}
		// Purge selected, then purge all.
		s.post("dead/action", url.Values{"action": {"purge-selected"}, "id": {strconv.FormatInt(extra[2], 10)}})
		if dead() != 1 {
			t.Errorf("after purge selected: %d dead", dead())
		}
		loc = s.post("dead/purge-all", url.Values{"confirm": {"yes"}})
		if !strings.Contains(loc, "done=purged&n=1") || dead() != 0 {
			t.Errorf("purge all: %q, %d dead", loc, dead())
		}
		if res, _ := s.do("GET", "dead/"+id(4), nil, true); res.StatusCode != http.StatusNotFound {
			t.Errorf("purged dead letter page: %d", res.StatusCode)
		}
		if page := s.get("dead"); !strings.Contains(page, "No dead letters") {
			t.Errorf("empty dead-letter page:\n%s", page)
		}
		// Invalid IDs are refused.
		f := url.Values{"action": {"replay-selected"}, "id": {"1", "x"}, "csrf": {s.token(s.get("dead"))}}
		if res, _ := s.do("POST", "dead/action", f, true); res.StatusCode != http.StatusBadRequest {
			t.Errorf("invalid ID: %d", res.StatusCode)
		}
	})
}

func TestUIEndpointActionsAndSecrets(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		s := seed(t, db, "/", false)
		ep := s.acme
		secret := ep.Secrets[0].Value
		path := "endpoints/" + ep.ID

		// html/template writes some characters of a secret (+) as entities.
		text := html.UnescapeString
		page := s.get(path)
		if strings.Contains(text(page), secret) || !strings.Contains(text(page), ep.Secrets[0].Masked()) {
			t.Errorf("endpoint page does not mask the secret")
		}
		for _, p := range []string{"endpoints", "dead", "deliveries?event_id=evt_0", "dead/" + strconv.FormatInt(s.dead[0], 10)} {
			if strings.Contains(text(s.get(p)), secret) {
				t.Errorf("%s shows the secret", p)
			}
		}
		if !strings.Contains(page, "evt_0") || !strings.Contains(page, "1.5 ms") {
			t.Errorf("endpoint page lacks its deliveries and attempts:\n%s", page)
		}

		// Reveal: the secret is in the response to the POST, and only there.
		f := url.Values{"csrf": {s.token(page)}}
		res, body := s.do("POST", path+"/reveal", f, true)
		if res.StatusCode != http.StatusOK || !strings.Contains(text(body), secret) || res.Header.Get("Cache-Control") != "no-store" {
			t.Errorf("reveal: %d, secret shown %v", res.StatusCode, strings.Contains(text(body), secret))
		}
		if strings.Contains(text(s.get(path)), secret) {
			t.Error("the secret stays revealed on the next GET")
		}
		// GET on an action path does nothing.
		if res, body := s.do("GET", path+"/reveal", nil, true); res.StatusCode != http.StatusNotFound || strings.Contains(text(body), secret) {
			t.Errorf("GET reveal: %d", res.StatusCode)
		}

		// Disable and enable.
		if loc := s.post(path+"/disable", url.Values{"reason": {"merchant asked"}}); loc != path+"?done=disabled" {
			t.Errorf("disable redirects to %q", loc)
		}
		got, err := s.ob.Endpoint(s.ctx, ep.ID)
		if err != nil || got.Enabled || got.DisabledReason != "merchant asked" {
			t.Fatalf("after disable: %+v %v", got, err)
		}
		if page := s.get(path + "?done=disabled"); !strings.Contains(page, "Endpoint disabled") || !strings.Contains(page, "merchant asked") {
			t.Errorf("disabled page:\n%s", page)
		}
		s.post(path+"/enable", url.Values{})
		if got, _ := s.ob.Endpoint(s.ctx, ep.ID); !got.Enabled {
			t.Error("not enabled")
		}

		// Rotate: a new secret signs; the old one keeps signing for the
		// overlap picked.
		before := time.Now()
		if loc := s.post(path+"/rotate", url.Values{"overlap": {"1h"}}); loc != path+"?done=rotated" {
			t.Errorf("rotate redirects to %q", loc)
		}
		got, _ = s.ob.Endpoint(s.ctx, ep.ID)
		if len(got.Secrets) != 2 || got.Secrets[1].Value != secret || got.Secrets[0].Value == secret ||
			got.Secrets[1].ExpiresAt.Before(before.Add(59*time.Minute)) || got.Secrets[1].ExpiresAt.After(time.Now().Add(time.Hour)) {
			t.Errorf("after rotation: %#v", got.Secrets)
		}
		page = s.get(path)
		if strings.Contains(text(page), got.Secrets[0].Value) || strings.Contains(text(page), secret) {
			t.Error("rotated secrets shown unmasked")
		}
		f = url.Values{"csrf": {s.token(page)}, "overlap": {"forever"}}
		if res, _ := s.do("POST", path+"/rotate", f, true); res.StatusCode != http.StatusBadRequest {
			t.Errorf("rotate with a bad overlap: %d", res.StatusCode)
		}
		s.post(path+"/rotate", url.Values{"overlap": {"now"}})
		if got, _ := s.ob.Endpoint(s.ctx, ep.ID); len(got.Secrets) != 1 {
			t.Errorf("rotate now kept %d secrets", len(got.Secrets))
		}

		// Unknown endpoints.
		f = url.Values{"csrf": {s.token(page)}}
		if res, _ := s.do("POST", "endpoints/ep_nope/enable", f, true); res.StatusCode != http.StatusNotFound {
			t.Errorf("enable unknown: %d", res.StatusCode)
		}
		if res, _ := s.do("GET", "endpoints/ep_nope", nil, true); res.StatusCode != http.StatusNotFound {
			t.Errorf("unknown endpoint page: %d", res.StatusCode)
		}

		// The endpoints list, all tenants or one.
		page = s.get("endpoints")
		if !strings.Contains(page, s.acme.ID) || !strings.Contains(page, s.globex.ID) {
			t.Errorf("endpoints page:\n%s", page)
		}
		page = s.get("endpoints?tenant=globex")
		if strings.Contains(page, s.acme.ID) || !strings.Contains(page, s.globex.ID) {
			t.Errorf("endpoints of globex:\n%s", page)
		}
		// Search by event ID.
		page = s.get("deliveries?event_id=evt_3")
		if !strings.Contains(page, s.globex.ID) || !strings.Contains(page, "dead letter") {
			t.Errorf("search:\n%s", page)
		}
		if page := s.get("deliveries?event_id=evt_missing"); !strings.Contains(page, "No deliveries") {
			t.Errorf("search for nothing:\n%s", page)
		}
	})
}

func TestUIPaginates(t *testing.T) {
	e := newUIEnvWith(t, testdb.SQLite(t), dlq.UIConfig{PageSize: 2}, false)
	var eps []outbox.Endpoint
	for i := range 5 {
		eps = append(eps, e.endpoint("t"+strconv.Itoa(i%2), "http://127.0.0.1:1/"+strconv.Itoa(i)))
	}
	base := time.Now().Add(-time.Hour)
	for i := range 5 {
		e.deadLetter(eps[0], "evt_"+strconv.Itoa(i), "payment.failed", base.Add(time.Duration(i)*time.Second))
	}
	seen := map[string]bool{}
	next := "dead"
	for pages := 0; next != ""; pages++ {
		if pages > 3 {
			t.Fatal("too many pages")
		}
		page := e.get(next)
		next = ""
		if i := strings.Index(page, `">Older »`); i >= 0 {
			j := strings.LastIndex(page[:i], `href="`)
			next = strings.TrimPrefix(strings.ReplaceAll(page[j+len(`href="`):i], "&amp;", "&"), "/")
		}
		for i := range 5 {
			if strings.Contains(page, ">evt_"+strconv.Itoa(i)+"<") {
				if seen["evt_"+strconv.Itoa(i)] {
					t.Errorf("evt_%d on two pages", i)
				}
				seen["evt_"+strconv.Itoa(i)] = true
			}
		}
	}
	if len(seen) != 5 {
		t.Errorf("dead letters seen over the pages: %v", seen)
	}
	seen = map[string]bool{}
	next = "endpoints"
	for pages := 0; next != ""; pages++ {
		if pages > 3 {
			t.Fatal("too many pages")
		}
		page := e.get(next)
		next = ""
		if i := strings.Index(page, `">Next page »`); i >= 0 {
			j := strings.LastIndex(page[:i], `href="`)
			next = strings.TrimPrefix(strings.ReplaceAll(page[j+len(`href="`):i], "&amp;", "&"), "/")
		}
		for _, ep := range eps {
			if strings.Contains(page, ">"+ep.ID+"<") {
				seen[ep.ID] = true
			}
		}
	}
	if len(seen) != 5 {
		t.Errorf("endpoints seen over the pages: %d", len(seen))
	}
	page := e.get("endpoints/" + eps[0].ID)
	if !strings.Contains(page, "Older »") || !strings.Contains(page, ">evt_4<") || strings.Contains(page, ">evt_2<") {
		t.Errorf("endpoint deliveries page 1:\n%s", page)
	}
}

func TestUIUnderAPrefix(t *testing.T) {
	for _, strip := range []bool{false, true} {
		t.Run("strip="+strconv.FormatBool(strip), func(t *testing.T) {
			testdb.Each(t, func(t *testing.T, db *testdb.DB) {
				s := seed(t, db, "/admin/webhooks/", strip)
				res, _ := s.do("GET", "", nil, true)
				if res.StatusCode != http.StatusFound || res.Header.Get("Location") != "/admin/webhooks/endpoints" {
					t.Errorf("GET prefix: %d %q", res.StatusCode, res.Header.Get("Location"))
				}
				page := s.get("endpoints")
				for _, want := range []string{`href="/admin/webhooks/static/ui.css"`, `href="/admin/webhooks/endpoints/` + s.acme.ID + `"`, `href="/admin/webhooks/dead"`} {
					if !strings.Contains(page, want) {
						t.Errorf("page lacks %s", want)
					}
				}
				if strings.Contains(page, `href="/endpoints`) || strings.Contains(page, `action="/dead`) {
					t.Error("a link escapes the prefix")
				}
				if css := s.get("static/ui.css"); !strings.Contains(css, "font-family") {
					t.Error("stylesheet not served")
				}
				if !hasCookie(s.client, s.srv.URL+"/admin/webhooks/dead", "txhook_csrf") || hasCookie(s.client, s.srv.URL+"/elsewhere", "txhook_csrf") {
					t.Error("the CSRF cookie is not scoped to the prefix")
				}
				if loc := s.post("dead/action", url.Values{"replay": {strconv.FormatInt(s.dead[0], 10)}}); !strings.HasPrefix(loc, "dead?") {
					t.Errorf("replay redirects to %q", loc)
				}
				if n := s.count("SELECT count(*) FROM txhook_dead_letters"); n != 4 {
					t.Errorf("%d dead letters after replay", n)
				}
				if res, _ := s.do("GET", "endpoints", nil, false); res.StatusCode != http.StatusForbidden {
					t.Errorf("unauthorized under the prefix: %d", res.StatusCode)
				}
			})
		})
	}
}

func hasCookie(c *http.Client, rawURL, name string) bool {
	u, err := url.Parse(rawURL)
	if err != nil {
		panic(err)
	}
	for _, k := range c.Jar.Cookies(u) {
		if k.Name == name && k.Value != "" {
			return true
		}
	}
	return false
}

// Dead letters of deliveries the target rules refused too long are shown
// as such (a column and a badge, the detail page says what to fix), can
// be listed and replayed by reason, and an unknown reason is a 400.
func TestUIShowsRefusedDeadLetters(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		s := seed(t, db, "/", false)
		refused := s.deadLetterAs(s.acme, "evt_refused", "payment.failed", s.base.Add(10*time.Minute), 0,
			"not sent, no attempt spent: relay r1 refuses the endpoint by its target rules: txhook: loopback target refused: 127.0.0.1", "")
		since := s.base.Add(-time.Hour)
		if _, err := s.db.ExecContext(s.ctx, s.rebind(`UPDATE txhook_dead_letters SET reason = 'refused' WHERE delivery_id = ?`), refused); err != nil {
			t.Fatal(err)
		}
		if _, err := s.db.ExecContext(s.ctx, s.rebind(`UPDATE txhook_deliveries SET refused_since = ? WHERE id = ?`), s.ts(since), refused); err != nil {
			t.Fatal(err)
		}

		page := s.get("dead?reason=refused")
		if !strings.Contains(page, "1 matching") || !strings.Contains(page, "evt_refused") || strings.Contains(page, "evt_0<") ||
			!strings.Contains(page, "refused by target rules") {
			t.Errorf("refused dead letters:\n%s", page)
		}
		page = s.get("dead?reason=failed")
		if !strings.Contains(page, "5 matching") || strings.Contains(page, "evt_refused") {
			t.Errorf("failed dead letters:\n%s", page)
		}
		if res, _ := s.do("GET", "dead?reason=bored", nil, true); res.StatusCode != http.StatusBadRequest {
			t.Errorf("unknown reason: %d", res.StatusCode)
		}
		if page := s.get("dead/" + strconv.FormatInt(refused, 10)); !strings.Contains(page, "Fix the rules or the URL, then replay") {
			t.Errorf("refused dead letter's page:\n%s", page)
		}
		if page := s.get("deliveries?event_id=evt_refused"); !strings.Contains(page, "refused by target rules since") {
			t.Errorf("refused delivery:\n%s", page)
		}

		// Replay all refused: only that one.
		pending := func() int { return s.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'pending'") }
		loc := s.post("dead/replay-all", url.Values{"reason": {"refused"}, "confirm": {"yes"}})
		if !strings.Contains(loc, "n=1") || pending() != 1 || s.count("SELECT count(*) FROM txhook_dead_letters WHERE reason = 'failed'") != 5 {
			t.Errorf("replay all refused redirects to %q; %d pending", loc, pending())
		}
	})
}
