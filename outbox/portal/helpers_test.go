package portal_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testob"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/portal"
)

var linkKey = []byte("0123456789abcdef0123456789abcdef-portal-test")

func testCatalog(t *testing.T) *outbox.Catalog {
	c := outbox.NewCatalog()
	for _, et := range []outbox.EventType{
		{Name: "payment.succeeded", Description: "A payment went through.", Versions: []outbox.SchemaVersion{{Version: 1, Example: json.RawMessage(`{"id":"pay_1","amount":1000}`)}}},
		{Name: "refund.created", Description: "A refund was made.", Versions: []outbox.SchemaVersion{{Version: 1, Example: json.RawMessage(`{"id":"re_1"}`)}}},
	} {
		if err := c.Register(et); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// env is a portal on loopback over a test database.
type env struct {
	t   *testing.T
	db  *testdb.DB
	ob  *outbox.Outbox
	ctx context.Context
	p   *portal.Portal
	srv *httptest.Server
	cat *outbox.Catalog
}

func newEnv(t *testing.T, db *testdb.DB, ocfg outbox.Config, pcfg portal.Config) *env {
	t.Helper()
	cat := testCatalog(t)
	ocfg.Catalog = cat
	if ocfg.Logger == nil {
		ocfg.Logger = slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelError}))
	}
	ob, ctx := testob.NewOutboxWith(t, db, ocfg)
	if pcfg.LinkKeys == nil && pcfg.Tenant == nil {
		pcfg.LinkKeys = [][]byte{linkKey}
	}
	if pcfg.Prefix == "" {
		pcfg.Prefix = "/portal/"
	}
	pcfg.Catalog = cat
	p, err := portal.New(ob, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(pcfg.Prefix, p)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &env{t: t, db: db, ob: ob, ctx: ctx, p: p, srv: srv, cat: cat}
}

// user is a browser of one tenant: it keeps cookies and does not follow
// redirects.
type user struct {
	e      *env
	client *http.Client
	lang   string
}

func newClient() *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, Timeout: time.Minute,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// login opens an access link of tenant and returns the signed-in user.
func (e *env) login(tenant string) *user {
	e.t.Helper()
	link, err := e.p.Link(tenant, 15*time.Minute)
	if err != nil {
		e.t.Fatal(err)
	}
	u := &user{e: e, client: newClient()}
	res, body := u.do("GET", link, nil, nil)
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/portal/endpoints" {
		e.t.Fatalf("opening the link: %d %s %.300s", res.StatusCode, res.Header.Get("Location"), body)
	}
	return u
}

// do sends a request to an absolute path; form is sent as a POST form.
func (u *user) do(method, path string, form url.Values, hdr http.Header) (*http.Response, string) {
	u.e.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(u.e.ctx, method, u.e.srv.URL+path, body)
	if err != nil {
		u.e.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if u.lang != "" {
		req.Header.Set("Accept-Language", u.lang)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	res, err := u.client.Do(req)
	if err != nil {
		u.e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		u.e.t.Fatal(err)
	}
	return res, string(b)
}

// get fetches a portal page (relative to the prefix) and fails unless 200.
func (u *user) get(path string) string {
	u.e.t.Helper()
	res, body := u.do("GET", "/portal/"+path, nil, nil)
	if res.StatusCode != http.StatusOK {
		u.e.t.Fatalf("GET %s: %d\n%.500s", path, res.StatusCode, body)
	}
	return body
}

var csrfPattern = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// token is the CSRF token of the user's forms.
func (u *user) token() string {
	u.e.t.Helper()
	m := csrfPattern.FindStringSubmatch(u.get("endpoints/new"))
	if m == nil {
		u.e.t.Fatal("no CSRF token on the form page")
	}
	return m[1]
}

// post submits a form with the user's CSRF token.
func (u *user) post(path string, form url.Values) (*http.Response, string) {
	u.e.t.Helper()
	f := url.Values{"csrf": {u.token()}}
	for k, v := range form {
		f[k] = v
	}
	return u.do("POST", "/portal/"+path, f, nil)
}

// api calls the JSON API.
func (u *user) api(method, path, body string) (*http.Response, string) {
	u.e.t.Helper()
	req, err := http.NewRequestWithContext(u.e.ctx, method, u.e.srv.URL+"/portal/api/"+path, strings.NewReader(body))
	if err != nil {
		u.e.t.Fatal(err)
	}
	req.Header.Set(portal.APIHeader, "1")
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := u.client.Do(req)
	if err != nil {
		u.e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

// enqueue commits one event of tenant.
func (e *env) enqueue(tenant, typ, payload string) string {
	e.t.Helper()
	tx, err := e.db.BeginTx(e.ctx, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	id, err := e.ob.Enqueue(e.ctx, tx, outbox.Event{Tenant: tenant, Type: typ, Payload: json.RawMessage(payload)})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		e.t.Fatal(err)
	}
	return id
}

// relay starts a relay until the test ends.
func (e *env) relay() {
	e.t.Helper()
	r, err := e.ob.NewRelay(outbox.RelayConfig{})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := r.Start(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = r.Stop(ctx)
	})
}

// deliveries waits until tenant has n deliveries with an attempt each and
// returns them.
func (e *env) deliveries(tenant string, n int) []outbox.Delivery {
	e.t.Helper()
	var ds []outbox.Delivery
	testob.Eventually(e.t, "deliveries attempted", func() bool {
		pg, err := e.ob.Tenant(tenant).Deliveries(e.ctx, outbox.DeliveryFilter{Limit: 100})
		if err != nil {
			e.t.Fatal(err)
		}
		ds = pg.Deliveries
		if len(ds) < n {
			return false
		}
		for _, d := range ds {
			if d.Attempts == 0 || d.State == outbox.StateRunning {
				return false
			}
		}
		return true
	})
	return ds
}

// tlog writes log lines to the test's log.
type tlog struct{ t *testing.T }

func (w tlog) Write(b []byte) (int, error) { w.t.Log(strings.TrimSpace(string(b))); return len(b), nil }
