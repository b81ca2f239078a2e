package dlq_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/dlq"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testob"
	"github.com/txhook/txhook/outbox"
)

// uiEnv is an outbox on a test database with the UI served on loopback.
type uiEnv struct {
	t      *testing.T
	db     *testdb.DB
	ob     *outbox.Outbox
	ctx    context.Context
	srv    *httptest.Server
	prefix string
	client *http.Client // keeps cookies, does not follow redirects
}

const opsToken = "Bearer ops-token"

// authorize is the Authorize of the tests: a fixed bearer token.
func authorize(r *http.Request) bool { return r.Header.Get("Authorization") == opsToken }

// newOutbox opens a migrated outbox on db.
func newOutbox(t *testing.T, db *testdb.DB, cfg outbox.Config) (*outbox.Outbox, context.Context) {
	t.Helper()
	return testob.NewOutboxWith(t, db, cfg)
}

// newUIEnv serves the UI under prefix: mounted as it is, or behind
// http.StripPrefix when strip is set.
func newUIEnv(t *testing.T, db *testdb.DB, prefix string, strip bool) *uiEnv {
	return newUIEnvWith(t, db, dlq.UIConfig{Prefix: prefix}, strip)
}

// newUIEnvWith serves the UI configured by cfg (Authorize is the tests').
func newUIEnvWith(t *testing.T, db *testdb.DB, cfg dlq.UIConfig, strip bool) *uiEnv {
	t.Helper()
	ob, ctx := newOutbox(t, db, outbox.Config{})
	cfg.Authorize = authorize
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = "/"
	}
	h, err := dlq.NewUI(ob, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var root http.Handler = h
	if prefix != "/" {
		mux := http.NewServeMux()
		if strip {
			mux.Handle(prefix, http.StripPrefix(strings.TrimSuffix(prefix, "/"), h))
		} else {
			mux.Handle(prefix, h)
		}
		root = mux
	}
	srv := httptest.NewServer(root)
	t.Cleanup(srv.Close)
	return &uiEnv{t: t, db: db, ob: ob, ctx: ctx, srv: srv, prefix: prefix, client: newClient()}
}

// newClient is a browser-like client: it keeps cookies, and it does not
// follow redirects so tests can check them.
func newClient() *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, Timeout: time.Minute,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// do sends a request to a UI path (relative to the prefix), authorized or
// not, and returns the response with its body read.
func (e *uiEnv) do(method, path string, form url.Values, auth bool) (*http.Response, string) {
	e.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(e.ctx, method, e.srv.URL+e.prefix+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if auth {
		req.Header.Set("Authorization", opsToken)
	}
	res, err := e.client.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return res, string(b)
}

// get fetches a page, authorized, and fails unless it answers 200.
func (e *uiEnv) get(path string) string {
	e.t.Helper()
	res, body := e.do("GET", path, nil, true)
	if res.StatusCode != http.StatusOK {
		e.t.Fatalf("GET %s: %d\n%s", path, res.StatusCode, body)
	}
	return body
}

var csrfPattern = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// token returns the CSRF token of the forms on a page.
func (e *uiEnv) token(page string) string {
	e.t.Helper()
	m := csrfPattern.FindStringSubmatch(page)
	if m == nil {
		e.t.Fatalf("no CSRF token on the page:\n%s", page)
	}
	return m[1]
}

// post submits a form with a valid CSRF token (taken from the dead-letter
// page) and returns the redirect target, relative to the prefix.
func (e *uiEnv) post(path string, form url.Values) string {
	e.t.Helper()
	form.Set("csrf", e.token(e.get("dead")))
	res, body := e.do("POST", path, form, true)
	if res.StatusCode != http.StatusSeeOther {
		e.t.Fatalf("POST %s: %d, want 303\n%s", path, res.StatusCode, body)
	}
	loc := res.Header.Get("Location")
	if !strings.HasPrefix(loc, e.prefix) {
		e.t.Fatalf("POST %s redirects to %q, outside the prefix %q", path, loc, e.prefix)
	}
	return strings.TrimPrefix(loc, e.prefix)
}

func (e *uiEnv) rebind(q string) string {
	if !e.db.Backend.Postgres() {
		return q
	}
	var b strings.Builder
	n := 0
	for _, c := range q {
		if c == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

func (e *uiEnv) ts(t time.Time) any {
	if e.db.Backend.Postgres() {
		return t.UTC()
	}
	return t.UnixMicro()
}

func (e *uiEnv) count(query string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.db.QueryRowContext(e.ctx, e.rebind(query), args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
	return n
}

func (e *uiEnv) endpoint(tenant, u string) outbox.Endpoint {
	e.t.Helper()
	ep, err := e.ob.CreateEndpoint(e.ctx, outbox.NewEndpoint{Tenant: tenant, URL: u, Description: "orders service"})
	if err != nil {
		e.t.Fatal(err)
	}
	return ep
}

// deadLetter writes an event whose delivery to ep failed for good, as a
// relay would leave it, and returns the dead delivery's ID.
func (e *uiEnv) deadLetter(ep outbox.Endpoint, eventID, typ string, failedAt time.Time) int64 {
	e.t.Helper()
	return e.deadLetterAs(ep, eventID, typ, failedAt, 500, "HTTP 500", `<script>alert("x")</script> database down`)
}

// deadLetterAs is deadLetter with the last attempts' outcome: a status (0
// for none), an error and a response excerpt.
func (e *uiEnv) deadLetterAs(ep outbox.Endpoint, eventID, typ string, failedAt time.Time, status int, msg, excerpt string) int64 {
	e.t.Helper()
	var st any
	if status != 0 {
		st = status
	}
	if _, err := e.db.ExecContext(e.ctx, e.rebind(`INSERT INTO txhook_events (id, tenant, type, payload, created_at, dispatched_at)
VALUES (?, ?, ?, ?, ?, ?)`), eventID, ep.Tenant, typ, `{"payment_id":"pay_`+eventID+`","amount":1200}`, e.ts(failedAt.Add(-time.Hour)), e.ts(failedAt.Add(-time.Hour))); err != nil {
		e.t.Fatal(err)
	}
	var id int64
	if err := e.db.QueryRowContext(e.ctx, e.rebind(`INSERT INTO txhook_deliveries
(event_id, endpoint_id, state, attempts, next_attempt_at, last_status, last_error, created_at, updated_at)
VALUES (?, ?, 'dead', 2, ?, ?, ?, ?, ?) RETURNING id`), eventID, ep.ID, e.ts(failedAt), st, msg, e.ts(failedAt.Add(-time.Hour)), e.ts(failedAt)).Scan(&id); err != nil {
		e.t.Fatal(err)
	}
	for n := 1; n <= 2; n++ {
		if _, err := e.db.ExecContext(e.ctx, e.rebind(`INSERT INTO txhook_attempts
(delivery_id, endpoint_id, attempt, started_at, duration_us, status, response_excerpt, error) VALUES (?, ?, ?, ?, 1500, ?, ?, ?)`),
			id, ep.ID, n, e.ts(failedAt.Add(-time.Duration(3-n)*time.Minute)), st, excerpt, msg); err != nil {
			e.t.Fatal(err)
		}
	}
	if _, err := e.db.ExecContext(e.ctx, e.rebind(`INSERT INTO txhook_dead_letters
(delivery_id, event_id, endpoint_id, tenant, event_type, attempts, last_status, last_error, failed_at) VALUES (?, ?, ?, ?, ?, 2, ?, ?, ?)`),
		id, eventID, ep.ID, ep.Tenant, typ, st, msg, e.ts(failedAt)); err != nil {
		e.t.Fatal(err)
	}
	return id
}

// snapshot is the state the UI can change, to check that GETs change none
// of it.
func (e *uiEnv) snapshot() string {
	e.t.Helper()
	var b strings.Builder
	rows, err := e.db.QueryContext(e.ctx, `SELECT id, enabled, disabled_reason, secrets FROM txhook_endpoints ORDER BY id`)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, reason, secrets string
		var enabled bool
		if err := rows.Scan(&id, &enabled, &reason, &secrets); err != nil {
			e.t.Fatal(err)
		}
		b.WriteString(id + strconv.FormatBool(enabled) + reason + secrets + "\n")
	}
	for _, q := range []string{
		"SELECT count(*) FROM txhook_dead_letters",
		"SELECT count(*) FROM txhook_deliveries",
		"SELECT count(*) FROM txhook_deliveries WHERE state = 'pending'",
		"SELECT count(*) FROM txhook_events",
		"SELECT count(*) FROM txhook_attempts",
	} {
		b.WriteString(strconv.Itoa(e.count(q)) + "\n")
	}
	return b.String()
}
