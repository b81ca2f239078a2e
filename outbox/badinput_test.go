package outbox_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// serveOn starts a test server on the given loopback address.
func serveOn(t *testing.T, addr string, h http.Handler) *httptest.Server {
	t.Helper()
	ln, err := net.Listen("tcp", addr+":0")
	if err != nil {
		t.Skipf("cannot listen on %s: %v", addr, err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func TestBadEndpointURLsAreRefusedWritingNothing(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{AllowedTargets: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}})
		strict, err := outbox.New(b.ctx, db.DB, outbox.Config{Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			ob   *outbox.Outbox
			ne   outbox.NewEndpoint
			want error
		}{
			{b.ob, outbox.NewEndpoint{URL: "not a url"}, outbox.ErrInvalidURL},
			{b.ob, outbox.NewEndpoint{URL: "/relative/path"}, outbox.ErrInvalidURL},
			{b.ob, outbox.NewEndpoint{URL: "ftp://example.com/hook"}, outbox.ErrInvalidURL},
			{b.ob, outbox.NewEndpoint{URL: "https://user:secret@example.com/hook"}, outbox.ErrInvalidURL},
			{b.ob, outbox.NewEndpoint{URL: "https://"}, outbox.ErrInvalidURL},
			{b.ob, outbox.NewEndpoint{URL: "https://example.com/" + strings.Repeat("a", 3000)}, outbox.ErrInvalidURL},
			{strict, outbox.NewEndpoint{URL: "http://93.184.216.34/hook"}, outbox.ErrInsecureURL},
			{b.ob, outbox.NewEndpoint{URL: "https://localhost/hook"}, outbox.ErrForbiddenTarget}, // a name resolving to 127.0.0.1
			{b.ob, outbox.NewEndpoint{URL: "https://127.0.0.1/"}, outbox.ErrForbiddenTarget},
			{b.ob, outbox.NewEndpoint{URL: "https://[::1]/"}, outbox.ErrForbiddenTarget},
			{b.ob, outbox.NewEndpoint{URL: "https://10.0.0.1/"}, outbox.ErrForbiddenTarget},
			{b.ob, outbox.NewEndpoint{URL: "https://192.168.1.1/"}, outbox.ErrForbiddenTarget},
			{b.ob, outbox.NewEndpoint{URL: "http://169.254.169.254/latest/meta-data/"}, outbox.ErrForbiddenTarget},
			{b.ob, outbox.NewEndpoint{URL: "https://[::ffff:127.0.0.1]/"}, outbox.ErrForbiddenTarget},
			{b.ob, outbox.NewEndpoint{URL: "https://2130706433/"}, outbox.ErrInvalidURL}, // 127.0.0.1 in disguise
			{b.ob, outbox.NewEndpoint{URL: "https://93.184.216.34/", Secret: "short"}, outbox.ErrInvalidSecret},
			{b.ob, outbox.NewEndpoint{URL: "https://93.184.216.34/", Secret: "whsec_!!!"}, outbox.ErrInvalidSecret},
			{b.ob, outbox.NewEndpoint{URL: "https://93.184.216.34/", EventTypes: []string{"pay*ment"}}, outbox.ErrInvalidEndpoint},
			{b.ob, outbox.NewEndpoint{Tenant: "-", URL: "https://93.184.216.34/"}, nil}, // control: valid
		}
		for i, c := range cases {
			if c.ne.Tenant == "" {
				c.ne.Tenant = "m"
			}
			_, err := c.ob.CreateEndpoint(b.ctx, c.ne)
			if c.want == nil {
				if err != nil {
					t.Errorf("case %d (%s): %v", i, c.ne.URL, err)
				}
				continue
			}
			if !errors.Is(err, c.want) {
				t.Errorf("case %d (%.60s): err = %v, want %v", i, c.ne.URL, err, c.want)
			}
			if err != nil && (strings.Contains(err.Error(), "secret@") || strings.Contains(err.Error(), "whsec_!!!")) {
				t.Errorf("case %d: error leaks a credential: %v", i, err)
			}
		}
		if n := b.count("SELECT count(*) FROM txhook_endpoints"); n != 1 {
			t.Fatalf("%d endpoints written, want only the valid one", n)
		}
	})
}

func TestHostileReceiversAreRecordedAndNothingIsLost(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{AllowedTargets: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}})

		// A server on 127.0.0.1 that must never be reached.
		var forbiddenHits atomic.Int32
		private := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { forbiddenHits.Add(1) }))
		t.Cleanup(private.Close)
		_, privatePort, _ := net.SplitHostPort(private.Listener.Addr().String())

		release := make(chan struct{})
		var loops atomic.Int32
		mux := http.NewServeMux()
		mux.HandleFunc("/redirect-private", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://127.0.0.1:"+privatePort+"/", http.StatusTemporaryRedirect)
		})
		mux.HandleFunc("/redirect-metadata", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/", http.StatusFound)
		})
		mux.HandleFunc("/redirect-forever", func(w http.ResponseWriter, r *http.Request) {
			loops.Add(1)
			http.Redirect(w, r, "/redirect-forever?n="+fmt.Sprint(loops.Load()), http.StatusFound)
		})
		mux.HandleFunc("/hang", func(w http.ResponseWriter, r *http.Request) {
			// Reading the body lets the server notice the client hanging up.
			io.Copy(io.Discard, r.Body)
			select {
			case <-release:
			case <-r.Context().Done():
			}
		})
		huge := func(status int) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.WriteHeader(status)
				chunk := []byte(strings.Repeat("x", 64<<10))
				for sent := 0; sent < 50<<20; sent += len(chunk) {
					if _, err := w.Write(chunk); err != nil {
						return
					}
				}
			}
		}
		mux.HandleFunc("/huge-500", huge(http.StatusInternalServerError))
		mux.HandleFunc("/huge-200", huge(http.StatusOK))
		mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
		srv := serveOn(t, "127.0.0.2", mux)
		t.Cleanup(func() { close(release) }) // before srv.Close, which waits for handlers

		type expect struct {
			path    string
			state   string // state after one attempt
			errPart string // in the attempt's error
		}
		cases := []expect{
			{"/redirect-private", "pending", "forbidden"},
			{"/redirect-metadata", "pending", "forbidden"},
			{"/redirect-forever", "pending", "redirect"},
			{"/hang", "pending", "timeout"},
			{"/huge-500", "pending", "HTTP 500"},
			{"/huge-200", "succeeded", ""},
			{"/rebound", "pending", "forbidden"},
		}
		eps := map[string]string{}
		for i, c := range cases {
			tenant := fmt.Sprintf("t%d", i)
			url := srv.URL + c.path
			if c.path == "/rebound" {
				url = srv.URL + "/ok"
			}
			ep := b.endpoint(tenant, url)
			eps[ep.ID] = c.path
			if c.path == "/rebound" {
				// DNS rebinding, in effect: after registration the endpoint's
				// host now leads to 127.0.0.1. The connect-time guard must catch it.
				if _, err := db.ExecContext(b.ctx, b.rebind("UPDATE txhook_endpoints SET url = ? WHERE id = ?"),
					"http://localhost:"+privatePort+"/", ep.ID); err != nil {
					t.Fatal(err)
				}
			}
			b.enqueue(outbox.Event{Tenant: tenant, Type: "payment.succeeded", Payload: []byte(`{}`)})
		}
		b.relay(outbox.RelayConfig{Timeout: 500 * time.Millisecond})
		b.eventually("one attempt per delivery", func() bool {
			return b.count("SELECT count(*) FROM txhook_attempt_log") >= len(cases) &&
				b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'running'") == 0
		})
		for id, path := range eps {
			var c expect
			for _, x := range cases {
				if x.path == path {
					c = x
				}
			}
			var state, lastErr string
			if err := db.QueryRowContext(b.ctx, b.rebind("SELECT state, last_error FROM txhook_deliveries WHERE endpoint_id = ?"), id).Scan(&state, &lastErr); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if state != c.state {
				t.Errorf("%s: state %s, want %s (error %q)", path, state, c.state, lastErr)
			}
			if !strings.Contains(strings.ToLower(lastErr), strings.ToLower(c.errPart)) {
				t.Errorf("%s: last error %q, want it to mention %q", path, lastErr, c.errPart)
			}
			var excerpt string
			var dur int64
			if err := db.QueryRowContext(b.ctx, b.rebind("SELECT response_excerpt, duration_us FROM txhook_attempt_log WHERE endpoint_id = ?"), id).Scan(&excerpt, &dur); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if len(excerpt) > 4096 {
				t.Errorf("%s: excerpt of %d bytes", path, len(excerpt))
			}
			if strings.HasPrefix(path, "/huge") && len(excerpt) != 4096 {
				t.Errorf("%s: excerpt of %d bytes, want 4096", path, len(excerpt))
			}
			if time.Duration(dur)*time.Microsecond > 10*time.Second {
				t.Errorf("%s: attempt took %v", path, time.Duration(dur)*time.Microsecond)
			}
		}
		if n := forbiddenHits.Load(); n != 0 {
			t.Errorf("the private server was reached %d times", n)
		}
		if n := loops.Load(); n != 3 {
			t.Errorf("redirect loop followed %d hops, want 3 requests (1 + 2 redirects)", n)
		}
		// Nothing lost: every delivery is either done or waiting for its retry.
		if n := b.count("SELECT count(*) FROM txhook_deliveries WHERE state IN ('pending', 'succeeded')"); n != len(cases) {
			t.Fatalf("%d of %d deliveries accounted for", n, len(cases))
		}
	})
}
