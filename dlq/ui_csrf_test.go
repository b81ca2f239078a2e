package dlq_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/txhook/txhook/dlq"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// The CSRF cookie is a Secure __Host- cookie over TLS, to the UI's server
// or to a trusted proxy, and a prefix-scoped plain one over plain HTTP.
func TestUICSRFCookie(t *testing.T) {
	db := testdb.SQLite(t)
	ob, ctx := newOutbox(t, db, outbox.Config{})
	loopback := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	for _, tc := range []struct {
		name    string
		tls     bool
		proxies []netip.Prefix
		proto   []string // X-Forwarded-Proto values sent
		secure  bool
	}{
		{name: "plain HTTP", secure: false},
		{name: "plain HTTP, header but no trusted proxy", proto: []string{"https"}, secure: false},
		{name: "untrusted peer", proxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, proto: []string{"https"}, secure: false},
		{name: "trusted proxy over TLS", proxies: loopback, proto: []string{"https"}, secure: true},
		{name: "trusted proxy, client's forged value first", proxies: loopback, proto: []string{"https, http"}, secure: false},
		{name: "trusted proxy, its value last", proxies: loopback, proto: []string{"http", "HTTPS"}, secure: true},
		{name: "trusted proxy over plain HTTP", proxies: loopback, proto: []string{"http"}, secure: false},
		{name: "TLS to the UI's server", tls: true, secure: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := dlq.NewUI(ob, dlq.UIConfig{Authorize: authorize, Prefix: "/ops/", TrustedProxies: tc.proxies})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewUnstartedServer(h)
			if tc.tls {
				srv.StartTLS()
			} else {
				srv.Start()
			}
			t.Cleanup(srv.Close)
			client := srv.Client()
			client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
			send := func(method, path string, form url.Values, cookies ...*http.Cookie) (*http.Response, string) {
				t.Helper()
				var body io.Reader
				if form != nil {
					body = strings.NewReader(form.Encode())
				}
				req, err := http.NewRequestWithContext(ctx, method, srv.URL+"/ops/"+path, body)
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Authorization", opsToken)
				if form != nil {
					req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				}
				for _, v := range tc.proto {
					req.Header.Add("X-Forwarded-Proto", v)
				}
				for _, c := range cookies {
					req.AddCookie(c)
				}
				res, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer res.Body.Close()
				b, _ := io.ReadAll(res.Body)
				return res, string(b)
			}

			res, page := send("GET", "dead", nil)
			if res.StatusCode != http.StatusOK || len(res.Cookies()) != 1 {
				t.Fatalf("GET: %d, cookies %v", res.StatusCode, res.Header.Values("Set-Cookie"))
			}
			c := res.Cookies()[0]
			wantName, wantPath := "txhook_csrf", "/ops/"
			if tc.secure {
				wantName, wantPath = "__Host-txhook_csrf", "/"
			}
			if c.Name != wantName || c.Secure != tc.secure || c.Path != wantPath || c.Domain != "" || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode {
				t.Fatalf("cookie %s", res.Header.Get("Set-Cookie"))
			}
			m := csrfPattern.FindStringSubmatch(page)
			if m == nil {
				t.Fatal("no CSRF token on the page")
			}
			token := m[1]

			// A POST with the cookie and its token passes the CSRF check
			// (and finds no such page); without the cookie it does not.
			form := url.Values{"csrf": {token}}
			jar := &http.Cookie{Name: c.Name, Value: c.Value}
			if res, body := send("POST", "nowhere", form, jar); res.StatusCode != http.StatusNotFound {
				t.Fatalf("POST with the cookie: %d %s", res.StatusCode, body)
			}
			if res, _ := send("POST", "nowhere", form); res.StatusCode != http.StatusForbidden {
				t.Fatalf("POST without the cookie: %d", res.StatusCode)
			}
			if tc.secure {
				// Over TLS a cookie without the prefix, which plain HTTP or
				// a subdomain could have planted, is not accepted.
				tossed := &http.Cookie{Name: "txhook_csrf", Value: c.Value}
				if res, _ := send("POST", "nowhere", form, tossed); res.StatusCode != http.StatusForbidden {
					t.Fatalf("POST over TLS with the unprefixed cookie: %d", res.StatusCode)
				}
			}
		})
	}
}
