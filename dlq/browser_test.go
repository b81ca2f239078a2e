package dlq_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/oklog/ulid/v2"

	"github.com/txhook/txhook/dlq"
	"github.com/txhook/txhook/internal/testbrowser"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/retry"
)

// envScreenshot, set to a file path, makes TestUIScreenshot save a
// screenshot of the dead-letter page there (docs/ui.png).
const envScreenshot = "TXHOOK_UI_SCREENSHOT"

// browser starts headless Chromium with the UI's bearer token on every
// request (see internal/testbrowser), and returns its context.
func browser(t *testing.T) context.Context {
	t.Helper()
	return testbrowser.Start(t, 1440, 900, 3*time.Minute, map[string]string{"Authorization": opsToken})
}

func TestBrowserReplaysADeadLetter(t *testing.T) {
	ctx := browser(t)
	db := testdb.SQLite(t)
	ob, octx := newOutbox(t, db, outbox.Config{})

	// A receiver that fails until it is fixed, and says what it received.
	var healthy atomic.Bool
	got := make(chan string, 16)
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if !healthy.Load() {
			http.Error(w, "upstream database unavailable", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
		got <- r.Header.Get(outbox.HeaderEventID)
	}))
	t.Cleanup(rc.Close)
	ep, err := ob.CreateEndpoint(octx, outbox.NewEndpoint{Tenant: "acme", URL: rc.URL, Description: "orders service"})
	if err != nil {
		t.Fatal(err)
	}
	relay, err := ob.NewRelay(outbox.RelayConfig{Retry: retry.Intervals(10 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	if err := relay.Start(octx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = relay.Stop(ctx)
	})
	const eventID = "evt_browser_replay"
	tx, err := db.BeginTx(octx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Enqueue(octx, tx, outbox.Event{ID: eventID, Tenant: "acme", Type: "payment.succeeded", Payload: []byte(`{"payment_id":"pay_1","amount":1200}`)}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	q := dlq.New(ob)
	var deadID int64
	eventually(t, "the dead letter", func() bool {
		p, err := q.List(octx, dlq.Filter{}, "", 10)
		if err == nil && len(p.Entries) == 1 {
			deadID = p.Entries[0].DeliveryID
		}
		return deadID != 0
	})
	healthy.Store(true) // the merchant fixed their receiver

	h, err := dlq.NewUI(ob, dlq.UIConfig{Authorize: authorize, Prefix: "/admin/webhooks/"})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/webhooks/", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	base := srv.URL + "/admin/webhooks/"

	row := "#dead-" + strconv.FormatInt(deadID, 10)
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"dead?tenant=acme"),
		chromedp.WaitVisible(chromedp.CSS(row)),
	); err != nil {
		t.Fatalf("opening the dead letters: %v", err)
	}
	rowText := text(t, ctx, row)
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(row+" button.replay")),
		chromedp.WaitVisible(chromedp.CSS("p.flash")),
	); err != nil {
		t.Fatalf("replaying in the browser: %v", err)
	}
	flash := text(t, ctx, "p.flash")
	if !strings.Contains(rowText, eventID) || !strings.Contains(rowText, "503") {
		t.Errorf("dead-letter row reads %q", rowText)
	}
	if !strings.Contains(flash, "Replayed 1 dead letter") {
		t.Errorf("after replay the page says %q", flash)
	}

	// The receiver gets the event, with the same ID...
	select {
	case id := <-got:
		if id != eventID {
			t.Errorf("receiver got event %q, want %q", id, eventID)
		}
	case <-time.After(waitFor):
		t.Fatal("the replayed delivery never reached the receiver")
	}
	eventually(t, "the replayed delivery recorded as succeeded", func() bool {
		ds, err := ob.EventDeliveries(octx, eventID)
		return err == nil && len(ds) == 2 && ds[1].State == outbox.StateSucceeded
	})
	// ...and the UI shows it: no dead letter left, the delivery succeeded.
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS("td.empty"))); err != nil {
		t.Fatal(err)
	}
	empty := text(t, ctx, "td.empty")
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"deliveries?event_id="+eventID),
		chromedp.WaitVisible(chromedp.CSS(".state-succeeded")),
	); err != nil {
		t.Fatal(err)
	}
	state := text(t, ctx, ".state-succeeded")
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"endpoints/"+ep.ID),
		chromedp.WaitVisible(chromedp.CSS("section.cards")),
	); err != nil {
		t.Fatal(err)
	}
	health := text(t, ctx, "section.cards")
	if !strings.Contains(empty, "No dead letters") || state != "succeeded" {
		t.Errorf("dead letters %q, delivery state %q", empty, state)
	}
	if !strings.Contains(health, "1 of 3 attempts") {
		t.Errorf("endpoint health reads %q", health)
	}
}

// text reads the visible text of the first element matching a CSS selector.
func text(t *testing.T, ctx context.Context, css string) string {
	t.Helper()
	return testbrowser.Text(t, ctx, css)
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

const waitFor = 60 * time.Second

// TestUIScreenshot saves screenshots of the UI with realistic data, for the
// docs: TXHOOK_UI_SCREENSHOT=docs/ui.png go test ./dlq -run Screenshot
// writes the dead-letter page there and the endpoint page beside it
// (ui-endpoint.png).
func TestUIScreenshot(t *testing.T) {
	out := os.Getenv(envScreenshot)
	if out == "" {
		t.Skipf("set %s to a PNG path to save screenshots of the UI", envScreenshot)
	}
	ctx := browser(t)
	e := newUIEnvWith(t, testdb.SQLite(t), dlq.UIConfig{Prefix: "/admin/webhooks/", PageSize: 12}, false)
	now := time.Now().UTC()
	eventID := func(at time.Time) string {
		return "evt_" + ulid.MustNew(ulid.Timestamp(at), ulid.DefaultEntropy()).String()
	}

	acme := e.endpoint("acme", "https://hooks.acme.example/txhook")
	globex := e.endpoint("globex", "https://api.globex.example/webhooks/payments")
	initech := e.endpoint("initech", "https://initech.example/hooks")
	shop := e.endpoint("umbrella-shop", "https://shop.umbrella.example/api/webhooks")
	if err := e.ob.DisableEndpoint(e.ctx, initech.ID, "every attempt failed for 5 days"); err != nil {
		t.Fatal(err)
	}
	// Delivery history: mostly fine, globex in trouble for the last hour.
	type hist struct {
		ep      outbox.Endpoint
		n       int
		outcome func(i int) (int, string)
	}
	for _, h := range []hist{
		{acme, 60, func(i int) (int, string) {
			if i%23 == 7 {
				return 502, "HTTP 502"
			}
			return 200, ""
		}},
		{globex, 40, func(i int) (int, string) {
			switch {
			case i >= 36:
				return 0, "timeout: no response within 5s"
			case i >= 30:
				return 503, "HTTP 503"
			}
			return 200, ""
		}},
		{shop, 25, func(int) (int, string) { return 204, "" }},
	} {
		for i := range h.n {
			at := now.Add(-time.Duration(h.n-i) * 6 * time.Minute)
			status, msg := h.outcome(i)
			state, excerpt, dur := "succeeded", `{"received":true}`, time.Duration(40+(i*37)%160)*time.Millisecond
			if msg != "" {
				state, excerpt = "pending", `{"error":"upstream unavailable, try again later"}`
			}
			var st any
			if status != 0 {
				st = status
			} else {
				dur, excerpt = 5*time.Second, ""
			}
			var id int64
			if err := e.db.QueryRowContext(e.ctx, `INSERT INTO txhook_deliveries
(event_id, endpoint_id, state, attempts, next_attempt_at, last_status, last_error, created_at, updated_at)
VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?) RETURNING id`, eventID(at), h.ep.ID, state,
				e.ts(at.Add(time.Minute)), st, msg, e.ts(at), e.ts(at)).Scan(&id); err != nil {
				t.Fatal(err)
			}
			if _, err := e.db.ExecContext(e.ctx, `INSERT INTO txhook_attempts
(delivery_id, endpoint_id, attempt, started_at, duration_us, status, response_excerpt, error) VALUES (?, ?, 1, ?, ?, ?, ?, ?)`,
				id, h.ep.ID, e.ts(at), dur.Microseconds(), st, excerpt, msg); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, d := range []struct {
		ep     outbox.Endpoint
		typ    string
		ago    time.Duration
		status int
		msg    string
	}{
		{globex, "payment.succeeded", 4 * time.Minute, 0, "timeout: no response within 5s"},
		{globex, "payment.succeeded", 9 * time.Minute, 503, "HTTP 503"},
		{globex, "refund.created", 17 * time.Minute, 503, "HTTP 503"},
		{globex, "payment.failed", 41 * time.Minute, 503, "HTTP 503"},
		{acme, "payment.succeeded", 3 * time.Hour, 401, "HTTP 401"},
		{initech, "payment.succeeded", 26 * time.Hour, 0, "dial tcp 203.0.113.7:443: connect: connection refused"},
		{initech, "payout.paid", 30 * time.Hour, 0, "dial tcp 203.0.113.7:443: connect: connection refused"},
	} {
		at := now.Add(-d.ago)
		e.deadLetterAs(d.ep, eventID(at), d.typ, at, d.status, d.msg, `{"error":"upstream unavailable"}`)
	}

	base := e.srv.URL + "/admin/webhooks/"
	shot := func(path, ready string) []byte {
		t.Helper()
		if err := chromedp.Do(ctx,
			chromedp.EmulateViewport(1440, 900),
			chromedp.Navigate(base+path),
			chromedp.WaitVisible(chromedp.CSS(ready)),
		); err != nil {
			t.Fatal(err)
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		return png
	}
	dead := shot("dead?done=replayed&n=3", "table.dead")
	endpoint := shot("endpoints/"+globex.ID, "section.cards")
	endpoints := shot("endpoints", "table.endpoints")
	stem := strings.TrimSuffix(out, ".png")
	for path, png := range map[string][]byte{out: dead, stem + "-endpoint.png": endpoint, stem + "-endpoints.png": endpoints} {
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s (%d bytes)", path, len(png))
	}
}
