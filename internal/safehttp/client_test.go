package safehttp

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"
)

// testServer is an httptest server on loopback that counts requests and new
// connections.
type testServer struct {
	*httptest.Server
	hits  atomic.Int64
	conns atomic.Int64
	roots *x509.CertPool // trusts the server's certificate (TLS only)
}

type serverMode int

const (
	plainHTTP serverMode = iota
	withTLS
	withHTTP2
)

func startServer(t testing.TB, mode serverMode, h http.HandlerFunc) *testServer {
	t.Helper()
	ts := &testServer{}
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ts.hits.Add(1)
		h(w, r)
	}))
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			ts.conns.Add(1)
		}
	}
	s.Config.ErrorLog = log.New(io.Discard, "", 0) // TLS handshake errors are expected
	switch mode {
	case plainHTTP:
		s.Start()
	case withTLS, withHTTP2:
		s.EnableHTTP2 = mode == withHTTP2
		s.StartTLS()
		ts.roots = x509.NewCertPool()
		ts.roots.AddCert(s.Certificate())
	}
	ts.Server = s
	t.Cleanup(s.Close)
	return ts
}

func (ts *testServer) addrPort() netip.AddrPort {
	return netip.MustParseAddrPort(ts.Listener.Addr().String())
}

func ok(w http.ResponseWriter, r *http.Request) {}

// haveIPv6 reports whether IPv6 sockets can be made (the dial guard runs
// after socket creation, so without them an IPv6 target fails earlier).
func haveIPv6() bool {
	l, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// private is the config for tests against loopback servers.
var private = roomy(Config{AllowHTTP: true, AllowPrivate: true})

func post(t *testing.T, c *Client, url string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return c.Post(ctx, url, http.Header{"X-Kxp-Signature": {"t=1,v1=abc"}}, []byte(`{"id":"evt_1"}`))
}

func wantErr(t *testing.T, res Result, want error) {
	t.Helper()
	if !errors.Is(res.Err, want) {
		t.Fatalf("Err = %v, want %v (status %d)", res.Err, want, res.Status)
	}
	if res.OK() {
		t.Fatal("OK() = true with an error")
	}
}

func TestPostDelivers(t *testing.T) {
	t.Parallel()
	type seen struct {
		method, ua, sig, ctype, body string
	}
	got := make(chan seen, 1)
	srv := startServer(t, plainHTTP, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.UserAgent(), r.Header.Get("X-Kxp-Signature"), r.Header.Get("Content-Type"), string(b)}
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "thanks")
	})
	c := New(private)
	hdr := http.Header{"X-Kxp-Signature": {"t=1,v1=abc"}, "Content-Type": {"application/json"}}
	res := c.Post(context.Background(), srv.URL+"/in", hdr, []byte(`{"id":"evt_1"}`))
	if !res.OK() || res.Err != nil || res.Status != http.StatusAccepted || string(res.Excerpt) != "thanks" {
		t.Fatalf("res = %+v", res)
	}
	if res.Duration <= 0 {
		t.Fatalf("Duration = %v", res.Duration)
	}
	s := <-got
	want := seen{"POST", DefaultUserAgent, "t=1,v1=abc", "application/json", `{"id":"evt_1"}`}
	if s != want {
		t.Fatalf("server saw %+v, want %+v", s, want)
	}
	if _, ok := hdr["User-Agent"]; ok || len(hdr) != 2 {
		t.Fatalf("caller's header modified: %v", hdr)
	}
}

func TestPostKeepsCallerUserAgent(t *testing.T) {
	t.Parallel()
	ua := make(chan string, 1)
	srv := startServer(t, plainHTTP, func(w http.ResponseWriter, r *http.Request) { ua <- r.UserAgent() })
	c := New(roomy(Config{AllowHTTP: true, AllowPrivate: true, UserAgent: "ignored"}))
	res := c.Post(context.Background(), srv.URL, http.Header{"User-Agent": {"mine/2"}}, nil)
	if !res.OK() {
		t.Fatal(res.Err)
	}
	if got := <-ua; got != "mine/2" {
		t.Fatalf("User-Agent = %q", got)
	}
}

func TestPostRefusesLoopback(t *testing.T) {
	t.Parallel()
	srv := startServer(t, plainHTTP, ok)
	c := New(roomy(Config{AllowHTTP: true}))
	res := post(t, c, srv.URL+"/in")
	wantErr(t, res, ErrForbiddenAddress)
	if res.Status != 0 {
		t.Fatalf("Status = %d", res.Status)
	}
	if !strings.Contains(res.Err.Error(), "127.0.0.1") {
		t.Fatalf("error does not name the address: %v", res.Err)
	}
	if srv.hits.Load() != 0 || srv.conns.Load() != 0 {
		t.Fatalf("server saw %d requests on %d connections", srv.hits.Load(), srv.conns.Load())
	}
}

func TestPostDNSRebinding(t *testing.T) {
	t.Parallel()
	srv := startServer(t, plainHTTP, ok)
	var calls atomic.Int32
	cfg := Config{AllowHTTP: true, LookupIPAddr: func(ctx context.Context, host string) ([]net.IPAddr, error) {
		if host != "rebind.example" {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		if calls.Add(1) == 1 {
			return []net.IPAddr{{IP: net.ParseIP("93.184.215.14")}}, nil // what registration sees
		}
		return []net.IPAddr{{IP: net.ParseIP("127.0.0.1")}}, nil // what the attacker answers later
	}}
	u := "http://rebind.example:" + strconv.Itoa(int(srv.addrPort().Port())) + "/in"
	if err := CheckURL(context.Background(), u, cfg); err != nil {
		t.Fatalf("CheckURL: %v", err)
	}
	res := post(t, New(cfg), u)
	wantErr(t, res, ErrForbiddenAddress)
	if calls.Load() != 2 {
		t.Fatalf("lookup called %d times, want 2", calls.Load())
	}
	if srv.hits.Load() != 0 || srv.conns.Load() != 0 {
		t.Fatalf("server saw %d requests on %d connections", srv.hits.Load(), srv.conns.Load())
	}
}

func TestPostLookupHookUsedForDialing(t *testing.T) {
	t.Parallel()
	srv := startServer(t, plainHTTP, ok)
	cfg := private
	cfg.LookupIPAddr = hostsLookup(map[string]string{"receiver.example": "127.0.0.1"})
	res := post(t, New(cfg), "http://receiver.example:"+strconv.Itoa(int(srv.addrPort().Port()))+"/in")
	if !res.OK() {
		t.Fatal(res.Err)
	}
	res = post(t, New(cfg), "http://unknown.example:"+strconv.Itoa(int(srv.addrPort().Port()))+"/in")
	wantErr(t, res, ErrConnection)
}

func TestPostRedirectToForbiddenAddress(t *testing.T) {
	t.Parallel()
	for _, target := range []string{
		"http://169.254.169.254/latest/meta-data/",
		"http://10.1.2.3/",
		"http://127.0.0.1:1/",
		"http://[::1]:1/",
		"http://[fd00:ec2::254]/",
		"http://[::ffff:a9fe:a9fe]/",
	} {
		t.Run(target, func(t *testing.T) {
			t.Parallel()
			if strings.HasPrefix(target, "http://[") && !strings.Contains(target, "ffff") && !haveIPv6() {
				t.Skip("no IPv6 sockets here: the guard would not be reached")
			}
			srv := startServer(t, plainHTTP, func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, target, http.StatusTemporaryRedirect)
			})
			// The guard is on, but lets exactly this server through: the
			// test is about the hop, not the first request.
			c := newClient(roomy(Config{AllowHTTP: true}), testHooks{allow: []netip.AddrPort{srv.addrPort()}})
			res := post(t, c, srv.URL+"/in")
			wantErr(t, res, ErrForbiddenAddress)
			if res.Status != 0 {
				t.Fatalf("Status = %d, want 0: the final hop got no response", res.Status)
			}
			if srv.hits.Load() != 1 {
				t.Fatalf("first server hits = %d", srv.hits.Load())
			}
		})
	}
}

func TestPostRedirectCounts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		maxRedirects int
		path         string
		code         int
		want         error
		wantHits     int64
		wantStatus   int
	}{
		{"loop, default limit", 0, "/loop", http.StatusFound, ErrTooManyRedirects, 3, http.StatusFound},
		{"loop, limit 5", 5, "/loop", http.StatusTemporaryRedirect, ErrTooManyRedirects, 6, http.StatusTemporaryRedirect},
		{"loop, follow none", -1, "/loop", http.StatusMovedPermanently, ErrTooManyRedirects, 1, http.StatusMovedPermanently},
		{"2 then 200", 0, "/hop/2", http.StatusFound, nil, 3, http.StatusOK},
		{"3 then 200, limit 2", 0, "/hop/3", http.StatusFound, ErrTooManyRedirects, 3, http.StatusFound},
		{"1 then 200, follow none", -1, "/hop/1", http.StatusFound, ErrTooManyRedirects, 1, http.StatusFound},
		{"3xx without Location", 0, "/bare", http.StatusFound, ErrStatus, 1, http.StatusFound},
		{"300 is not a redirect", 0, "/hop/1", http.StatusMultipleChoices, ErrStatus, 1, http.StatusMultipleChoices},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := startServer(t, plainHTTP, func(w http.ResponseWriter, r *http.Request) {
				switch {
				case r.URL.Path == "/loop":
					w.Header().Set("Location", "/loop")
					w.WriteHeader(tt.code)
				case r.URL.Path == "/bare":
					w.WriteHeader(tt.code)
				case strings.HasPrefix(r.URL.Path, "/hop/"):
					n, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/hop/"))
					if n == 0 {
						io.WriteString(w, "done")
						return
					}
					w.Header().Set("Location", fmt.Sprintf("/hop/%d", n-1))
					w.WriteHeader(tt.code)
					io.WriteString(w, "moved")
				}
			})
			c := New(roomy(Config{AllowHTTP: true, AllowPrivate: true, MaxRedirects: tt.maxRedirects}))
			res := post(t, c, srv.URL+tt.path)
			if tt.want == nil {
				if !res.OK() {
					t.Fatalf("res = %+v", res)
				}
			} else {
				wantErr(t, res, tt.want)
			}
			if got := srv.hits.Load(); got != tt.wantHits {
				t.Fatalf("server hits = %d, want %d", got, tt.wantHits)
			}
			if res.Status != tt.wantStatus {
				t.Fatalf("Status = %d, want %d", res.Status, tt.wantStatus)
			}
		})
	}
}

// Every redirect code repeats the same POST: method, body and headers.
func TestPostRedirectRepostsSameRequest(t *testing.T) {
	t.Parallel()
	for _, code := range []int{301, 302, 303, 307, 308} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			t.Parallel()
			type seen struct{ method, sig, body string }
			var mu sync.Mutex
			var got []seen
			target := startServer(t, plainHTTP, func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				mu.Lock()
				got = append(got, seen{r.Method, r.Header.Get("X-Kxp-Signature"), string(b)})
				mu.Unlock()
			})
			first := startServer(t, plainHTTP, func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				mu.Lock()
				got = append(got, seen{r.Method, r.Header.Get("X-Kxp-Signature"), string(b)})
				mu.Unlock()
				// another host:port: customers move endpoints
				http.Redirect(w, r, target.URL+"/moved", code)
			})
			res := post(t, New(private), first.URL+"/in")
			if !res.OK() {
				t.Fatalf("res = %+v", res)
			}
			want := seen{"POST", "t=1,v1=abc", `{"id":"evt_1"}`}
			if len(got) != 2 || got[0] != want || got[1] != want {
				t.Fatalf("requests = %+v, want 2 × %+v", got, want)
			}
		})
	}
}

func TestPostRedirectTargetRules(t *testing.T) {
	t.Parallel()
	plain := startServer(t, plainHTTP, ok)
	port := strconv.Itoa(int(plain.addrPort().Port()))
	tests := []struct {
		name     string
		location string
		want     error
	}{
		{"https to http", plain.URL + "/in", ErrInsecureScheme},
		{"credentials", "https://user:secret@127.0.0.1:" + port + "/", ErrInvalidURL},
		{"ftp", "ftp://127.0.0.1/", ErrInvalidURL},
		{"legacy numeric", "https://2130706433:" + port + "/", ErrInvalidURL},
		{"bad port", "https://127.0.0.1:99999/", ErrInvalidURL},
		{"unparseable", "https://[::1/", ErrInvalidURL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := startServer(t, withTLS, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", tt.location)
				w.WriteHeader(http.StatusFound)
			})
			c := newClient(roomy(Config{AllowPrivate: true}), testHooks{rootCAs: srv.roots})
			res := post(t, c, srv.URL+"/in")
			wantErr(t, res, tt.want)
			if strings.Contains(res.Err.Error(), "secret") {
				t.Fatalf("error leaks credentials: %v", res.Err)
			}
			if srv.hits.Load() != 1 {
				t.Fatalf("hits = %d", srv.hits.Load())
			}
		})
	}
	if plain.hits.Load() != 0 || plain.conns.Load() != 0 {
		t.Fatalf("http target was contacted")
	}
}

func TestPostInvalidURL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		url  string
		want error
	}{
		{"", ErrInvalidURL},
		{"/relative", ErrInvalidURL},
		{"ftp://8.8.8.8/", ErrInvalidURL},
		{"http://8.8.8.8/", ErrInsecureScheme},
		{"https://user:secret@8.8.8.8/", ErrInvalidURL},
		{"https://8.8.8.8/#frag", ErrInvalidURL},
		{"https://0x7f.1/", ErrInvalidURL},
		{"https:///x", ErrInvalidURL},
		{"https://8.8.8.8:secret/", ErrInvalidURL},
		{"https://8.8.8.8/\x7fsecret", ErrInvalidURL},
	}
	c := New(roomy(Config{}))
	for _, tt := range tests {
		res := post(t, c, tt.url)
		if !errors.Is(res.Err, tt.want) {
			t.Errorf("Post(%q): Err = %v, want %v", tt.url, res.Err, tt.want)
			continue
		}
		if strings.Contains(res.Err.Error(), "secret") {
			t.Errorf("Post(%q): error leaks the URL: %v", tt.url, res.Err)
		}
	}
}

func TestPostHangingReceiver(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := startServer(t, plainHTTP, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	t.Cleanup(func() { close(release) }) // runs before srv.Close
	c := New(roomy(Config{AllowHTTP: true, AllowPrivate: true, Timeout: 200 * time.Millisecond}))
	res := post(t, c, srv.URL)
	wantErr(t, res, ErrTimeout)
	if res.Status != 0 {
		t.Fatalf("Status = %d", res.Status)
	}
	if res.Duration < 200*time.Millisecond || res.Duration > 5*time.Second {
		t.Fatalf("Duration = %v, want about 200ms", res.Duration)
	}
}

// Whichever comes first bounds a Post: Timeout, or the caller's deadline
// (the relay's lease, cut at its safety margin).
func TestPostHangingReceiverCallerDeadline(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := startServer(t, plainHTTP, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	t.Cleanup(func() { close(release) }) // runs before srv.Close
	for _, tc := range []struct {
		timeout, deadline time.Duration
	}{
		{20 * time.Second, 200 * time.Millisecond}, // the caller's deadline first
		{200 * time.Millisecond, 20 * time.Second}, // Timeout first
	} {
		c := New(roomy(Config{AllowHTTP: true, AllowPrivate: true, Timeout: tc.timeout}))
		ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
		res := c.Post(ctx, srv.URL, nil, []byte(`{}`))
		cancel()
		wantErr(t, res, ErrTimeout)
		if res.Duration < 200*time.Millisecond || res.Duration > 5*time.Second {
			t.Fatalf("Timeout %v, deadline in %v: Duration = %v, want about 200ms", tc.timeout, tc.deadline, res.Duration)
		}
	}
}

func TestPostConnectTimeout(t *testing.T) {
	t.Parallel()
	cfg := Config{AllowHTTP: true, AllowPrivate: true, ConnectTimeout: 100 * time.Millisecond, Timeout: 20 * time.Second,
		LookupIPAddr: func(ctx context.Context, host string) ([]net.IPAddr, error) {
			<-ctx.Done() // a resolver that never answers
			return nil, ctx.Err()
		}}
	res := post(t, New(cfg), "http://slow-dns.example/in")
	wantErr(t, res, ErrTimeout)
	if res.Duration > 5*time.Second {
		t.Fatalf("Duration = %v: ConnectTimeout was not applied", res.Duration)
	}
}

// A peer that accepts TCP and never answers the TLS ClientHello.
func TestPostTLSHandshakeHangs(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	c := New(roomy(Config{AllowPrivate: true, Timeout: 200 * time.Millisecond}))
	res := post(t, c, "https://"+l.Addr().String()+"/in")
	wantErr(t, res, ErrTimeout)
	if res.Duration > 5*time.Second {
		t.Fatalf("Duration = %v", res.Duration)
	}
}

func TestPostTricklingBody(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := startServer(t, plainHTTP, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		tick := time.NewTicker(10 * time.Millisecond) // the behaviour under test, not synchronization
		defer tick.Stop()
		for {
			select {
			case <-r.Context().Done():
				return
			case <-release:
				return
			case <-tick.C:
				if _, err := io.WriteString(w, "a"); err != nil {
					return
				}
				w.(http.Flusher).Flush()
			}
		}
	})
	t.Cleanup(func() { close(release) })
	c := New(roomy(Config{AllowHTTP: true, AllowPrivate: true, Timeout: 300 * time.Millisecond}))
	res := post(t, c, srv.URL)
	wantErr(t, res, ErrTimeout)
	if res.Status != http.StatusOK {
		t.Fatalf("Status = %d, want 200 (the status line came in time)", res.Status)
	}
	if res.Duration > 5*time.Second {
		t.Fatalf("Duration = %v", res.Duration)
	}
	if len(res.Excerpt) == 0 || strings.Trim(string(res.Excerpt), "a") != "" {
		t.Fatalf("Excerpt = %q", res.Excerpt)
	}
}

// Not parallel: it measures the process's allocations, which other tests
// running at the same time would add to.
func TestPostHugeBodyIsNotRead(t *testing.T) {
	const total = 50 << 20
	chunk := bytes.Repeat([]byte("x"), 32<<10)
	written := make(chan int64, 1)
	srv := startServer(t, plainHTTP, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(total))
		var n int64
		for n < total {
			m, err := w.Write(chunk)
			n += int64(m)
			if err != nil {
				break
			}
		}
		written <- n
	})
	c := New(roomy(Config{AllowHTTP: true, AllowPrivate: true, ExcerptBytes: 1000}))

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	res := post(t, c, srv.URL)
	runtime.ReadMemStats(&after)

	if !res.OK() {
		t.Fatalf("res.Err = %v", res.Err)
	}
	if len(res.Excerpt) != 1000 || strings.Trim(string(res.Excerpt), "x") != "" {
		t.Fatalf("Excerpt: %d bytes", len(res.Excerpt))
	}
	if res.Duration > 5*time.Second {
		t.Fatalf("Duration = %v", res.Duration)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 4<<20 {
		t.Fatalf("Post allocated %d bytes", d)
	}
	select {
	case n := <-written:
		if n >= total {
			t.Fatalf("server wrote all %d bytes: the client read everything", n)
		}
		t.Logf("server stopped after %d of %d bytes", n, total)
	case <-time.After(30 * time.Second):
		t.Fatal("server still writing: connection was not closed")
	}
	// The cut connection is not reused.
	res = post(t, c, srv.URL)
	<-written
	if !res.OK() || srv.conns.Load() != 2 {
		t.Fatalf("second post: %v on %d connections, want 2", res.Err, srv.conns.Load())
	}
}

func TestPostExcerpt(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		body    string
		limit   int
		want    string
		wantLen int // -1: len(want)
	}{
		{"plain", "hello", 100, "hello", -1},
		{"cut", "hello world", 5, "hello", -1},
		{"invalid byte", "ok\xffok", 100, "ok\uFFFDok", -1},
		{"NUL", "a\x00b", 100, "a\uFFFDb", -1},
		{"NUL and invalid run", "\x00\xfe\xfe\x00", 100, "\uFFFD\uFFFD\uFFFD", -1},
		{"rune cut at limit", "ééé", 5, "éé", -1},
		{"growth stays within limit", "\xff1\xff2\xff3", 6, "\uFFFD1", -1},
		{"empty", "", 100, "", -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := startServer(t, plainHTTP, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusInternalServerError)
				io.WriteString(w, tt.body)
			})
			c := New(roomy(Config{AllowHTTP: true, AllowPrivate: true, ExcerptBytes: tt.limit}))
			res := post(t, c, srv.URL)
			wantErr(t, res, ErrStatus)
			if string(res.Excerpt) != tt.want {
				t.Fatalf("Excerpt = %q, want %q", res.Excerpt, tt.want)
			}
			if !utf8.Valid(res.Excerpt) || bytes.IndexByte(res.Excerpt, 0) >= 0 || len(res.Excerpt) > tt.limit {
				t.Fatalf("Excerpt %q breaks the contract", res.Excerpt)
			}
		})
	}
}

func TestPostNoDecompression(t *testing.T) {
	t.Parallel()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(bytes.Repeat([]byte("A"), 1<<20))
	zw.Close()
	acceptEncoding := make(chan string, 1)
	srv := startServer(t, plainHTTP, func(w http.ResponseWriter, r *http.Request) {
		acceptEncoding <- r.Header.Get("Accept-Encoding")
		w.Header().Set("Content-Encoding", "gzip")
		w.Write(gz.Bytes())
	})
	res := post(t, New(private), srv.URL)
	if !res.OK() {
		t.Fatal(res.Err)
	}
	if ae := <-acceptEncoding; ae != "" {
		t.Fatalf("Accept-Encoding = %q", ae)
	}
	if bytes.Contains(res.Excerpt, []byte("AAAA")) {
		t.Fatal("the body was inflated")
	}
}

func TestPostConnectionRefused(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	res := post(t, New(private), "http://"+addr+"/hook/PATHTOKEN?token=QUERYSECRET")
	wantErr(t, res, ErrConnection)
	msg := res.Err.Error()
	if !strings.Contains(msg, "http://"+addr) || strings.Contains(msg, "PATHTOKEN") || strings.Contains(msg, "QUERYSECRET") || strings.Contains(msg, "abc") {
		t.Fatalf("error message %q: want scheme://host only", msg)
	}
}

func TestPostTLS(t *testing.T) {
	t.Parallel()
	protos := make(chan int, 2)
	srv := startServer(t, withHTTP2, func(w http.ResponseWriter, r *http.Request) {
		protos <- r.ProtoMajor
		io.WriteString(w, "h2 ok")
	})

	// Untrusted certificate.
	res := post(t, New(roomy(Config{AllowPrivate: true})), srv.URL)
	wantErr(t, res, ErrTLS)
	if srv.hits.Load() != 0 {
		t.Fatal("request sent over an unverified connection")
	}

	// Trusted: HTTP/2 through the guarded TLS dialer.
	res = post(t, newClient(roomy(Config{AllowPrivate: true}), testHooks{rootCAs: srv.roots}), srv.URL)
	if !res.OK() || string(res.Excerpt) != "h2 ok" {
		t.Fatalf("res = %+v", res)
	}
	if p := <-protos; p != 2 {
		t.Fatalf("ProtoMajor = %d, want 2", p)
	}

	// The guard applies to TLS connections too.
	res = post(t, newClient(roomy(Config{}), testHooks{rootCAs: srv.roots}), srv.URL)
	wantErr(t, res, ErrForbiddenAddress)
}

func TestPostPlainHTTPToTLSPort(t *testing.T) {
	t.Parallel()
	srv := startServer(t, plainHTTP, ok)
	res := post(t, New(roomy(Config{AllowPrivate: true})), "https://"+srv.Listener.Addr().String())
	wantErr(t, res, ErrTLS)
}

func TestPostStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code       int
		retryAfter string
		wantOK     bool
	}{
		{200, "", true},
		{204, "", true},
		{299, "", true},
		{503, "7", false},
		{429, "Wed, 21 Oct 2026 07:28:00 GMT", false},
		{401, "", false},
		{410, "", false},
	}
	for _, tt := range tests {
		t.Run(strconv.Itoa(tt.code), func(t *testing.T) {
			t.Parallel()
			srv := startServer(t, plainHTTP, func(w http.ResponseWriter, r *http.Request) {
				if tt.retryAfter != "" {
					w.Header().Set("Retry-After", tt.retryAfter)
				}
				w.WriteHeader(tt.code)
			})
			res := post(t, New(private), srv.URL)
			if res.Status != tt.code || res.RetryAfter != tt.retryAfter || res.OK() != tt.wantOK {
				t.Fatalf("res = %+v", res)
			}
			if tt.wantOK {
				if res.Err != nil {
					t.Fatal(res.Err)
				}
				return
			}
			wantErr(t, res, ErrStatus)
			if got, want := res.Err.Error(), "HTTP "+strconv.Itoa(tt.code); got != want {
				t.Fatalf("Err = %q, want %q", got, want)
			}
		})
	}
}

func TestPostCanceled(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{})
	srv := startServer(t, plainHTTP, func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-r.Context().Done()
	})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-arrived; cancel() }()
	res := New(private).Post(ctx, srv.URL, nil, nil)
	wantErr(t, res, ErrConnection)
	if !errors.Is(res.Err, context.Canceled) {
		t.Fatalf("Err = %v, want context.Canceled in the chain", res.Err)
	}
}

func TestPostReusesConnections(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		h    http.HandlerFunc
	}{
		{"empty", ok},
		{"small", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"received":true}`) }},
		{"chunked", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "part 1 ")
			w.(http.Flusher).Flush()
			io.WriteString(w, "part 2")
		}},
		{"error status", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "nope", 500) }},
		{"body at the cap", func(w http.ResponseWriter, r *http.Request) { w.Write(make([]byte, 8<<10)) }},
		{"redirect", func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/" {
				http.Redirect(w, r, "/final", http.StatusTemporaryRedirect)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := startServer(t, plainHTTP, tt.h)
			c := New(roomy(Config{AllowHTTP: true, AllowPrivate: true, MaxBodyBytes: 8 << 10}))
			for i := 0; i < 100; i++ {
				res := post(t, c, srv.URL+"/")
				if res.Status == 0 {
					t.Fatalf("post %d: %v", i, res.Err)
				}
			}
			if n := srv.conns.Load(); n > 2 {
				t.Fatalf("100 posts opened %d connections", n)
			}
		})
	}
}

// A body over the cap is not read to its end: its connection is closed.
// The body is far over the 256 KiB that Go's Transport (from Go 1.27)
// drains in the background after an early Close to keep a connection: a
// body just over the cap (12 KiB against 8) is drained there and its
// connection reused, which costs the relay nothing it waits for.
func TestPostOverCapClosesConnection(t *testing.T) {
	t.Parallel()
	srv := startServer(t, plainHTTP, func(w http.ResponseWriter, r *http.Request) {
		w.Write(make([]byte, 1<<20))
	})
	c := New(roomy(Config{AllowHTTP: true, AllowPrivate: true, MaxBodyBytes: 8 << 10}))
	for i := 0; i < 10; i++ {
		if res := post(t, c, srv.URL); !res.OK() {
			t.Fatal(res.Err)
		}
	}
	if n := srv.conns.Load(); n != 10 {
		t.Fatalf("10 posts with bodies over the cap used %d connections, want 10", n)
	}
}

func TestPostConcurrent(t *testing.T) {
	t.Parallel()
	srv := startServer(t, withHTTP2, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	plain := startServer(t, plainHTTP, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	c := newClient(private, testHooks{rootCAs: srv.roots})
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := 0; i < 32; i++ {
		for _, u := range []string{srv.URL, plain.URL} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < 20; j++ {
					if res := c.Post(context.Background(), u, nil, []byte("x")); !res.OK() {
						errs <- res.Err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	c.CloseIdleConnections()
}

// roomy gives a client that a test does not time out generous bounds in
// place of the 5 s and 3 s defaults: a TLS handshake under the race
// detector on a loaded 2-core machine can take longer than 5 s, and these
// tests are about what a request does, not how long it takes. Tests of the
// timeouts set their own.
func roomy(c Config) Config {
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Minute
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = 2 * time.Minute
	}
	return c
}
