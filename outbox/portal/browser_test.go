package portal_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/txhook/txhook/internal/clock"
	"github.com/txhook/txhook/internal/testbrowser"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testob"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/portal"
	"github.com/txhook/txhook/retry"
	"github.com/txhook/txhook/verify"
)

// envScreenshots, set to a directory (docs), makes the browser test save
// a screenshot of each page in English and Chinese there.
const envScreenshots = "TXHOOK_PORTAL_SCREENSHOTS"

func language(t *testing.T, ctx context.Context, lang string) {
	t.Helper()
	testbrowser.SetHeaders(t, ctx, map[string]string{"Accept-Language": lang})
}

// text reads the visible text of the first element matching a selector.
func text(t *testing.T, ctx context.Context, css string) string {
	t.Helper()
	return testbrowser.Text(t, ctx, css)
}

func do(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// verifying is a receiver that checks each request's signature with
// package verify against the secret it is told, and reports the verified
// event IDs; it fails with 503 while down.
type verifying struct {
	secret atomic.Value // string
	down   atomic.Bool
	got    chan string
	bad    atomic.Int64
	url    string
}

func newVerifying(t *testing.T) *verifying {
	v := &verifying{got: make(chan string, 64)}
	v.secret.Store("")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if v.down.Load() {
			http.Error(w, "upstream database unavailable", http.StatusServiceUnavailable)
			return
		}
		vf, err := verify.New(verify.Config{Secrets: []string{v.secret.Load().(string)}})
		if err == nil {
			var ev verify.Event
			if ev, err = vf.Verify(r.Header, body); err == nil {
				v.got <- ev.ID
				w.WriteHeader(http.StatusOK)
				return
			}
		}
		v.bad.Add(1)
		http.Error(w, "bad signature", http.StatusBadRequest)
	}))
	t.Cleanup(srv.Close)
	v.url = srv.URL + "/hook"
	return v
}

func (v *verifying) wait(t *testing.T, what string) string {
	t.Helper()
	select {
	case id := <-v.got:
		return id
	case <-time.After(testob.WaitFor):
		t.Fatalf("%s never reached the receiver (%d refused signatures)", what, v.bad.Load())
	}
	return ""
}

// A merchant in a real browser: opens a signed link, creates an endpoint
// pointing at a receiver that verifies signatures, sends a test event and
// sees it arrive, sees a failing attempt's reason, resends it, rotates the
// secret and exports CSV; altered and expired links and another tenant's
// IDs are refused. With TXHOOK_PORTAL_SCREENSHOTS=docs it saves each page
// in English and Chinese.
func TestBrowserMerchant(t *testing.T) {
	ctx := testbrowser.Start(t, 1280, 900, 4*time.Minute, nil)
	e := newEnv(t, testdb.SQLite(t), outbox.Config{}, portal.Config{DisableAfter: 5 * 24 * time.Hour})
	r, err := e.ob.NewRelay(outbox.RelayConfig{Retry: retry.Intervals(200 * time.Millisecond), DisableAfter: 5 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	globexEp, err := e.ob.CreateEndpoint(e.ctx, outbox.NewEndpoint{Tenant: "globex", URL: "http://127.0.0.1:1/globex-private"})
	if err != nil {
		t.Fatal(err)
	}
	base := e.srv.URL + "/portal/"
	language(t, ctx, "en-US,en;q=0.9")

	// Refused links, before any session.
	link, err := e.p.Link("acme", 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	altered := strings.Replace(link, "token=A", "token=B", 1)
	if altered == link {
		altered = link[:len(link)-2] + "xx"
	}
	do(t, ctx, "opening an altered link", chromedp.Navigate(e.srv.URL+altered), chromedp.WaitVisible(chromedp.CSS("p.flash-error")))
	if s := text(t, ctx, "main"); !strings.Contains(s, "invalid or has expired") || strings.Contains(s, "acme") {
		t.Fatalf("altered link page: %q", s)
	}
	// An expired link: signed with the same key by a portal whose clock is
	// an hour behind, so it expired 59 minutes ago, without waiting.
	past, _ := testob.NewOutboxWith(t, e.db, outbox.Config{Clock: clock.NewFake(time.Now().Add(-time.Hour))})
	pastPortal, err := portal.New(past, portal.Config{Prefix: "/portal/", LinkKeys: [][]byte{linkKey}})
	if err != nil {
		t.Fatal(err)
	}
	expired := mustLink(t, pastPortal, "acme", time.Minute)
	do(t, ctx, "opening an expired link", chromedp.Navigate(e.srv.URL+expired), chromedp.WaitVisible(chromedp.CSS("p.flash-error")))
	if s := text(t, ctx, "main"); !strings.Contains(s, "invalid or has expired") {
		t.Fatalf("expired link page: %q", s)
	}

	// The link opens a session and lands on a URL without the token.
	do(t, ctx, "opening the link", chromedp.Navigate(e.srv.URL+link), chromedp.WaitVisible(chromedp.CSS("a.button")))
	loc, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil || loc != base+"endpoints" {
		t.Fatalf("after the link the browser is at %q (%v)", loc, err)
	}

	// Create an endpoint: the secret is shown once.
	good := newVerifying(t)
	do(t, ctx, "creating an endpoint",
		chromedp.Click(chromedp.CSS("a.button")),
		chromedp.WaitVisible(chromedp.CSS(`input[name=url]`)),
		chromedp.SendKeys(chromedp.CSS(`input[name=url]`), good.url),
		chromedp.SendKeys(chromedp.CSS(`input[name=description]`), "order service"),
		chromedp.Click(chromedp.CSS(`input[value="payment.*"]`)),
		chromedp.Click(chromedp.CSS("form.stack button")),
		chromedp.WaitVisible(chromedp.CSS("code.secret.full")),
	)
	secret := text(t, ctx, "code.secret.full")
	good.secret.Store(secret)
	do(t, ctx, "back to the endpoint", chromedp.Click(chromedp.CSS("section.reveal a.button")), chromedp.WaitVisible(chromedp.CSS(`form[action$="/test"] button`)))
	if s := text(t, ctx, "main"); strings.Contains(s, secret) {
		t.Fatal("the endpoint page shows the whole secret")
	}
	epURL, _ := chromedp.Run(ctx, chromedp.Location())

	// A test event: the page refreshes until it has the result.
	do(t, ctx, "sending a test event",
		chromedp.SetValue(chromedp.CSS(`select[name=type]`), "payment.succeeded"),
		chromedp.Click(chromedp.CSS(`form[action$="/test"] button`)),
		chromedp.WaitVisible(chromedp.CSS("h1 .badge.st-succeeded")),
	)
	if id := good.wait(t, "the test event"); !strings.HasPrefix(id, outbox.TestEventPrefix) {
		t.Errorf("the receiver verified event %q, not a test event", id)
	}
	if s := text(t, ctx, "pre.headers"); !strings.Contains(s, "Webhook-Signature: v1,") {
		t.Errorf("request headers shown: %q", s)
	}

	// A failing endpoint: the reason of its attempts, then a resend once
	// it is back.
	bad := newVerifying(t)
	bad.down.Store(true)
	badEp, err := e.ob.CreateEndpoint(e.ctx, outbox.NewEndpoint{Tenant: "acme", URL: bad.url, EventTypes: []string{"refund.*"}})
	if err != nil {
		t.Fatal(err)
	}
	bad.secret.Store(badEp.Secrets[0].Value)
	evID := e.enqueue("acme", "refund.created", `{"id":"re_1"}`)
	var dead outbox.Delivery
	testob.Eventually(t, "the failing delivery dead-lettered", func() bool {
		pg, err := e.ob.Tenant("acme").Deliveries(e.ctx, outbox.DeliveryFilter{EventID: evID, State: outbox.StateDead})
		if err == nil && len(pg.Deliveries) == 1 {
			dead = pg.Deliveries[0]
		}
		return dead.ID != 0
	})
	do(t, ctx, "finding the failed delivery",
		chromedp.Navigate(base+"deliveries?status=dead&endpoint="+badEp.ID),
		chromedp.Click(chromedp.CSS(`a[href$="/deliveries/`+itoa(dead.ID)+`"]`)),
		chromedp.WaitVisible(chromedp.CSS("section.attempt")),
	)
	if s := text(t, ctx, "main"); !strings.Contains(s, "HTTP 503") || !strings.Contains(s, "upstream database unavailable") {
		t.Errorf("failed delivery page: %q", s)
	}
	bad.down.Store(false)
	do(t, ctx, "resending", chromedp.Click(chromedp.CSS(`form[action$="/resend"] button`)), chromedp.WaitVisible(chromedp.CSS("h1 .badge.st-succeeded")))
	if id := bad.wait(t, "the resent delivery"); id != evID {
		t.Errorf("resent event %q, want %q", id, evID)
	}

	// Rotate the secret: the new one once, the old one with a countdown;
	// the receiver verifies with the new one.
	do(t, ctx, "rotating",
		chromedp.Navigate(epURL),
		chromedp.Click(chromedp.CSS(`form[action$="/rotate"] button`)),
		chromedp.WaitVisible(chromedp.CSS("code.secret.full")),
	)
	newSecret := text(t, ctx, "code.secret.full")
	if newSecret == secret || !strings.Contains(text(t, ctx, "p.countdown"), "23h") {
		t.Errorf("rotation page: %q", text(t, ctx, "main"))
	}
	good.secret.Store(newSecret)
	do(t, ctx, "endpoint after rotation", chromedp.Navigate(epURL), chromedp.WaitVisible(chromedp.CSS("span.countdown")))

	// Export CSV with the browser's session.
	cookies, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", base+"export?format=csv", nil)
	for _, c := range cookies.Cookies {
		req.AddCookie(&http.Cookie{Name: c.Name, Value: c.Value})
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	csvBody, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(csvBody), evID) || !strings.HasPrefix(string(csvBody), "event_id,") {
		t.Errorf("CSV export: %d\n%s", res.StatusCode, csvBody)
	}

	// Another tenant's endpoint is not found, with nothing of it shown.
	do(t, ctx, "opening globex's endpoint", chromedp.Navigate(base+"endpoints/"+globexEp.ID), chromedp.WaitVisible(chromedp.CSS("p.flash-error")))
	if s := text(t, ctx, "main"); !strings.Contains(s, "no such page") || strings.Contains(s, "globex") {
		t.Errorf("globex's endpoint in acme's portal: %q", s)
	}

	if dir := os.Getenv(envScreenshots); dir != "" {
		screenshots(t, ctx, e, dir, base, epURL, dead.ID, evID)
	}
}

func mustLink(t *testing.T, p *portal.Portal, tenant string, ttl time.Duration) string {
	t.Helper()
	l, err := p.Link(tenant, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// screenshots saves each page in English and Chinese: docs/portal-<page>-<lang>.png.
func screenshots(t *testing.T, ctx context.Context, e *env, dir, base, epURL string, delivery int64, event string) {
	var mu sync.Mutex
	for _, lang := range []struct{ tag, accept string }{{"en", "en-US,en;q=0.9"}, {"zh", "zh-CN,zh;q=0.9"}} {
		language(t, ctx, lang.accept)
		shot := func(name, url, ready string, actions ...chromedp.Action[chromedp.Void]) {
			t.Helper()
			mu.Lock()
			defer mu.Unlock()
			acts := []chromedp.Action[chromedp.Void]{chromedp.EmulateViewport(1280, 860)}
			if url != "" {
				acts = append(acts, chromedp.Navigate(url))
			}
			acts = append(append(acts, actions...), chromedp.WaitVisible(chromedp.CSS(ready)))
			do(t, ctx, "screenshot "+name, acts...)
			png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "portal-"+name+"-"+lang.tag+".png")
			if err := os.WriteFile(path, png, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("wrote %s (%d bytes)", path, len(png))
		}
		shot("endpoints", base+"endpoints", "table.list")
		shot("endpoint", epURL, "section.panel svg")
		shot("new", base+"endpoints/new", "form.stack")
		shot("secret", epURL, "code.secret.full", chromedp.Click(chromedp.CSS(`form[action$="/rotate"] button`)))
		shot("deliveries", base+"deliveries", "table.list")
		shot("delivery", base+"deliveries/"+itoa(delivery), "section.attempt")
		shot("event", base+"events/"+event, "table.list")
		shot("catalog", base+"catalog", "section.panel")
		shot("audit", base+"audit", "table.list")
		shot("denied", e.srv.URL+"/portal/link?token=expired", "p.flash-error")
	}
}
