package outbox_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// deliveryRow is what the tests read of a delivery.
type deliveryRow struct {
	state     string
	attempts  int
	lastError string
}

func (b *bundle) delivery(endpointID string) (deliveryRow, bool) {
	b.t.Helper()
	var d deliveryRow
	err := b.db.QueryRowContext(b.ctx, b.rebind(`SELECT state, attempts, last_error FROM txhook_deliveries WHERE endpoint_id = ?`), endpointID).
		Scan(&d.state, &d.attempts, &d.lastError)
	if err != nil {
		return d, false
	}
	return d, true
}

// outboxOn opens another Outbox on b's database, with cfg as it is (no
// rules relaxed).
func (b *bundle) outboxOn(cfg outbox.Config) *outbox.Outbox {
	b.t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	ob, err := outbox.New(b.ctx, b.db.DB, cfg)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { ob.Close() })
	return ob
}

// recv waits for a value on ch.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitFor):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func basicAuth(user, pw string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pw))
}

// Deliveries to an http and an https receiver go through CONNECT tunnels of
// the proxy, which resolves the name it is given and sees the relay's
// Proxy-Authorization; TLS to the receiver runs inside the tunnel.
func TestDeliveryThroughConnectProxy(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		proxy := newConnectProxy(t, basicAuth("relay", "s3cret"))
		plain := newReceiver(t, nil)
		got := make(chan http.Header, 10)
		tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got <- r.Header.Clone()
		}))
		t.Cleanup(tlsSrv.Close)
		roots := tlsSrv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs

		_, plainPort, _ := net.SplitHostPort(plain.Listener.Addr().String())
		epPlain := b.endpoint("proxied", "http://localhost:"+plainPort+"/hook")
		epTLS := b.endpoint("proxied", tlsSrv.URL+"/hook")

		pu, _ := url.Parse(proxy.URL)
		pu.User = url.UserPassword("relay", "s3cret")
		r := b.relay(outbox.RelayConfig{Proxy: pu, RootCAs: roots})
		b.enqueue(outbox.Event{Tenant: "proxied", Type: "payment.succeeded", Payload: []byte(`{"n":1}`)})

		if h := recv(t, got, "a request at the https receiver"); h.Get("Webhook-Signature") == "" {
			t.Fatalf("https receiver got no signature: %v", h)
		}
		b.eventually("both delivered", func() bool {
			d1, ok1 := b.delivery(epPlain.ID)
			d2, ok2 := b.delivery(epTLS.ID)
			return ok1 && ok2 && d1.state == outbox.StateSucceeded && d2.state == outbox.StateSucceeded
		})
		if n := len(plain.requests()); n != 1 {
			t.Fatalf("http receiver got %d requests", n)
		}
		tunnels, targets, other := proxy.stats()
		if tunnels < 2 || other != 0 {
			t.Fatalf("proxy opened %d tunnels and saw %d other requests, want at least 2 and 0", tunnels, other)
		}
		// The name goes to the proxy as it is: the proxy resolves it.
		if !contains(targets, "localhost:"+plainPort) || !contains(targets, strings.TrimPrefix(tlsSrv.URL, "https://")) {
			t.Fatalf("proxy was asked for %v", targets)
		}
		b.eventually("the successes counted", func() bool { return r.Stats().Succeeded == 2 })
		if s := r.Stats(); s.Refused != 0 {
			t.Fatalf("relay stats %+v", s)
		}
	})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// A proxy that refuses the tunnel (here: wrong credentials) fails the
// attempt with an error that says so.
func TestProxyRefusingTheTunnelFailsTheAttempt(t *testing.T) {
	b := setup(t, testdb.SQLite(t), outbox.Config{})
	proxy := newConnectProxy(t, basicAuth("relay", "s3cret"))
	rc := newReceiver(t, nil)
	ep := b.endpoint("m", rc.URL)
	pu, _ := url.Parse(proxy.URL)
	pu.User = url.UserPassword("relay", "wrong")
	b.relay(outbox.RelayConfig{Proxy: pu})
	b.enqueue(outbox.Event{Tenant: "m", Type: "t", Payload: []byte(`{}`)})
	var d deliveryRow
	b.eventually("a failed attempt", func() bool {
		var ok bool
		d, ok = b.delivery(ep.ID)
		return ok && d.attempts == 1 && d.state == outbox.StatePending
	})
	if !strings.Contains(d.lastError, "refused CONNECT") || !strings.Contains(d.lastError, "407") || strings.Contains(d.lastError, "wrong") {
		t.Fatalf("last error %q", d.lastError)
	}
	if len(rc.requests()) != 0 {
		t.Fatal("the receiver was reached")
	}
}

// Behind a proxy the relay still refuses what its rules forbid, opening no
// tunnel: an IP literal (spending no attempt, a matter of configuration),
// and a name it can resolve to a forbidden address (a failed attempt, as
// for a name that rebinds without a proxy).
func TestProxyKeepsTheTargetRules(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		dns := newDNSServer(t, map[string]string{"internal.test": "10.1.2.3"})
		// The relay's rules allow 127.0.0.1 only; the endpoints are
		// registered through a laxer Outbox on the same database.
		b := setup(t, db, outbox.Config{})
		strict := b.outboxOn(outbox.Config{AllowHTTP: true, Resolver: dns.resolver(),
			AllowedTargets: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
		proxy := newConnectProxy(t, "")
		literal := b.endpoint("m", "http://127.0.0.2:9/hook")
		named := b.endpoint("m", "http://internal.test:9/hook")

		pu, _ := url.Parse(proxy.URL)
		r := b.startRelay(strict, outbox.RelayConfig{Proxy: pu})
		b.enqueue(outbox.Event{Tenant: "m", Type: "t", Payload: []byte(`{}`)})
		for ep, want := range map[string]struct {
			attempts int
			err      string
		}{
			literal.ID: {0, "loopback target refused: 127.0.0.2 (see Config.AllowedTargets"},
			named.ID:   {1, "host internal.test resolves to forbidden address 10.1.2.3 (private)"},
		} {
			var d deliveryRow
			b.eventually("the refusal of "+ep, func() bool {
				var ok bool
				d, ok = b.delivery(ep)
				return ok && d.lastError != "" && d.state == outbox.StatePending
			})
			if d.attempts != want.attempts || !strings.Contains(d.lastError, want.err) {
				t.Fatalf("delivery %+v, want %d attempts spent and an error with %q", d, want.attempts, want.err)
			}
		}
		if tunnels, targets, _ := proxy.stats(); tunnels != 0 || len(targets) != 0 {
			t.Fatalf("proxy asked for %v", targets)
		}
		b.eventually("the outcomes counted", func() bool { s := r.Stats(); return s.Refused >= 1 && s.Failed == 1 })
	})
}

// Two relays of different rules on one database: the stricter one refuses
// the endpoint without spending an attempt and says which knob; the other
// then delivers it with its first attempt.
func TestStricterRelaySpendsNoAttempts(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  outbox.Config
		want string
	}{
		{"https only", outbox.Config{}, "https required (set Config.AllowHTTP for local development)"},
		{"public only", outbox.Config{AllowHTTP: true}, "loopback target refused: 127.0.0.1 (see Config.AllowedTargets"},
	} {
		t.Run(c.name, func(t *testing.T) {
			testdb.Each(t, func(t *testing.T, db *testdb.DB) {
				b := setup(t, db, outbox.Config{})
				rc := newReceiver(t, nil)
				ep := b.endpoint("m", rc.URL)
				strict := b.startRelay(b.outboxOn(c.cfg), outbox.RelayConfig{ID: "strict"})
				b.enqueue(outbox.Event{Tenant: "m", Type: "t", Payload: []byte(`{}`)})

				var d deliveryRow
				b.eventually("the strict relay's refusal", func() bool {
					var ok bool
					d, ok = b.delivery(ep.ID)
					return ok && d.lastError != ""
				})
				if d.state != outbox.StatePending || d.attempts != 0 ||
					!strings.Contains(d.lastError, c.want) || !strings.Contains(d.lastError, "relay strict") {
					t.Fatalf("after the refusal: %+v, want pending, 0 attempts, an error naming %q and the relay", d, c.want)
				}
				if n := b.count(`SELECT COUNT(*) FROM txhook_attempt_log`); n != 0 || len(rc.requests()) != 0 {
					t.Fatalf("%d attempts recorded, %d requests received", n, len(rc.requests()))
				}
				// Stats count once the outcome is written.
				b.eventually("the refusal counted", func() bool { return strict.Stats().Refused == 1 })
				if s := strict.Stats(); s.Refused != 1 || s.Failed != 0 || s.Released != 0 {
					t.Fatalf("strict relay stats %+v", s)
				}

				// A relay that allows the endpoint, its clock past the
				// refusal's hand-back, delivers it with attempt 1.
				lax := setup(t, db, outbox.Config{Clock: skewedClock{offset: outbox.RefusedRetryDelay + time.Minute}})
				lax.relay(outbox.RelayConfig{ID: "lax"})
				b.eventually("delivery by the lax relay", func() bool {
					d, _ = b.delivery(ep.ID)
					return d.state == outbox.StateSucceeded
				})
				if d.attempts != 1 || len(rc.requests()) != 1 {
					t.Fatalf("delivered after %d attempts, %d requests", d.attempts, len(rc.requests()))
				}
				if n := b.count(`SELECT COUNT(*) FROM txhook_attempt_log WHERE attempt = 1 AND error = ''`); n != 1 {
					t.Fatalf("attempt log has %d successful first attempts", n)
				}
			})
		})
	}
}

// A redirect to a target the rules refuse is the receiver's doing: an
// ordinary failed attempt, not a refusal of the endpoint.
func TestRedirectToRefusedTargetSpendsTheAttempt(t *testing.T) {
	b := setup(t, testdb.SQLite(t), outbox.Config{AllowedTargets: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://127.0.0.2:9/", http.StatusTemporaryRedirect)
	}))
	t.Cleanup(redirect.Close)
	ep := b.endpoint("m", redirect.URL)
	r := b.relay(outbox.RelayConfig{})
	b.enqueue(outbox.Event{Tenant: "m", Type: "t", Payload: []byte(`{}`)})
	b.eventually("a failed attempt", func() bool {
		d, ok := b.delivery(ep.ID)
		return ok && d.attempts == 1 && d.lastError != ""
	})
	if s := r.Stats(); s.Refused != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// Custom headers reach the receiver; names that would spoof txhook's are
// refused with ErrReservedHeader; values never show in printed endpoints.
func TestEndpointHeaders(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		for _, name := range []string{"Webhook-Signature", "webhook-id", "Webhook-Timestamp", "X-Webhook-Signature",
			"Content-Type", "content-length", "Host", "User-Agent", "traceparent", "Tracestate", "Connection",
			"Transfer-Encoding", "Proxy-Authorization", "Upgrade"} {
			_, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m", URL: "http://127.0.0.1:9/",
				Headers: outbox.Headers{name: "x"}})
			if !errors.Is(err, outbox.ErrReservedHeader) || !errors.Is(err, outbox.ErrInvalidEndpoint) {
				t.Fatalf("header %s: %v, want ErrReservedHeader", name, err)
			}
		}
		for _, h := range []outbox.Headers{
			{"X-Bad Name": "v"}, {"": "v"}, {"X-Line": "a\r\nInjected: 1"}, {"X-Nul": "a\x00"},
			{"X-Utf8": "café"}, {"X-Space": " padded"}, {"X-Long": strings.Repeat("v", outbox.MaxEndpointHeaderValue+1)},
			{strings.Repeat("N", outbox.MaxEndpointHeaderName+1): "v"},
		} {
			_, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m", URL: "http://127.0.0.1:9/", Headers: h})
			if !errors.Is(err, outbox.ErrInvalidEndpoint) || errors.Is(err, outbox.ErrReservedHeader) {
				t.Fatalf("headers %q: %v, want ErrInvalidEndpoint", h.String(), err)
			}
			if err != nil && strings.Contains(err.Error(), "Injected") {
				t.Fatalf("error quotes the value: %v", err)
			}
		}
		many := outbox.Headers{}
		for i := range outbox.MaxEndpointHeaders + 1 {
			many[fmt.Sprintf("X-H%d", i)] = "v"
		}
		if _, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m", URL: "http://127.0.0.1:9/", Headers: many}); !errors.Is(err, outbox.ErrInvalidEndpoint) {
			t.Fatalf("too many headers: %v", err)
		}

		rc := newReceiver(t, nil)
		ep, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m", URL: rc.URL,
			Headers: outbox.Headers{"authorization": "Bearer merchant-token", "X-Route": "eu-1"}})
		if err != nil {
			t.Fatal(err)
		}
		if ep.Headers["Authorization"] != "Bearer merchant-token" {
			t.Fatalf("stored headers %v", map[string]string(ep.Headers))
		}
		printed := fmt.Sprintf("%v %+v %#v", ep, ep, ep)
		js, _ := json.Marshal(ep)
		if strings.Contains(printed+string(js), "merchant-token") {
			t.Fatalf("header value printed: %s %s", printed, js)
		}
		b.relay(outbox.RelayConfig{})
		b.enqueue(outbox.Event{Tenant: "m", Type: "t", Payload: []byte(`{}`)})
		got := recv(t, rc.got, "a request")
		if got.Header.Get("Authorization") != "Bearer merchant-token" || got.Header.Get("X-Route") != "eu-1" ||
			got.Header.Get("Webhook-Signature") == "" || got.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("received headers %v", got.Header)
		}

		// Update replaces them; an empty map removes them.
		none := outbox.Headers{}
		ep, err = b.ob.UpdateEndpoint(b.ctx, ep.ID, outbox.EndpointUpdate{Headers: &none})
		if err != nil || len(ep.Headers) != 0 {
			t.Fatalf("update: %v %v", err, ep.Headers)
		}
		if ep, err = b.ob.Endpoint(b.ctx, ep.ID); err != nil || len(ep.Headers) != 0 {
			t.Fatalf("read back: %v %v", err, ep.Headers)
		}
	})
}

// An endpoint whose server requires a client certificate accepts the
// endpoint that has one and refuses the one without.
func TestEndpointClientCertificate(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		srv := newMTLSServer(t)
		peers, roots := srv.peers, srv.roots

		cert := srv.clientCert(t, "relay-for-m1")
		withCert, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m1", URL: srv.URL, ClientCert: cert})
		if err != nil {
			t.Fatal(err)
		}
		if withCert.ClientCert == nil || string(withCert.ClientCert.CertPEM) != string(cert.CertPEM) || withCert.ClientCert.KeyPEM != nil {
			t.Fatalf("endpoint's certificate read back as %v", withCert.ClientCert)
		}
		js, _ := json.Marshal(withCert)
		if strings.Contains(fmt.Sprintf("%v %#v %s", withCert, withCert, js), "PRIVATE KEY") {
			t.Fatal("the key was printed")
		}
		without := b.endpoint("m2", srv.URL)

		r := b.relay(outbox.RelayConfig{RootCAs: roots})
		b.enqueue(outbox.Event{Tenant: "m1", Type: "t", Payload: []byte(`{}`)})
		b.enqueue(outbox.Event{Tenant: "m2", Type: "t", Payload: []byte(`{}`)})
		if cn := recv(t, peers, "a request at the mTLS server"); cn != "relay-for-m1" {
			t.Fatalf("server saw client %q", cn)
		}
		b.eventually("both outcomes", func() bool {
			d1, _ := b.delivery(withCert.ID)
			d2, _ := b.delivery(without.ID)
			return d1.state == outbox.StateSucceeded && d2.attempts >= 1 && d2.lastError != ""
		})
		d2, _ := b.delivery(without.ID)
		if !strings.Contains(d2.lastError, "tls") && !strings.Contains(d2.lastError, "TLS") {
			t.Fatalf("without a certificate: %q", d2.lastError)
		}
		if len(peers) != 0 {
			t.Fatal("the endpoint without a certificate was served")
		}
		_ = r

		// Removing the certificate.
		ep, err := b.ob.UpdateEndpoint(b.ctx, withCert.ID, outbox.EndpointUpdate{ClientCert: &outbox.ClientCert{}})
		if err != nil || ep.ClientCert != nil {
			t.Fatalf("remove: %v %v", err, ep.ClientCert)
		}
	})
}

func TestClientCertificateIsChecked(t *testing.T) {
	b := setup(t, testdb.SQLite(t), outbox.Config{})
	ca := newTestCA(t)
	certPEM, keyPEM := ca.client(t, "a", time.Now().Add(time.Hour))
	_, otherKey := ca.client(t, "b", time.Now().Add(time.Hour))
	expired, expiredKey := ca.client(t, "c", time.Now().Add(-time.Hour))
	for name, c := range map[string]outbox.ClientCert{
		"mismatched key":  {CertPEM: certPEM, KeyPEM: otherKey},
		"expired":         {CertPEM: expired, KeyPEM: expiredKey},
		"not PEM":         {CertPEM: []byte("hello"), KeyPEM: keyPEM},
		"key only":        {KeyPEM: keyPEM},
		"no key":          {CertPEM: certPEM},
		"invalid UTF-8":   {CertPEM: append(append([]byte{}, certPEM...), 0xff), KeyPEM: keyPEM},
		"oversized chain": {CertPEM: append(certPEM, make([]byte, outbox.MaxClientCertBytes)...), KeyPEM: keyPEM},
	} {
		_, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m", URL: "https://127.0.0.1:9/", ClientCert: &c})
		if !errors.Is(err, outbox.ErrInvalidClientCert) || !errors.Is(err, outbox.ErrInvalidEndpoint) {
			t.Errorf("%s: %v, want ErrInvalidClientCert", name, err)
		}
		if err != nil && strings.Contains(err.Error(), "PRIVATE KEY") {
			t.Errorf("%s: error shows the key: %v", name, err)
		}
	}
}

// CreateEndpoint tells a name that does not exist from a DNS outage, and
// its refusals name the Config field to change.
func TestCreateEndpointErrorsSayWhatToDo(t *testing.T) {
	dns := newDNSServer(t, map[string]string{"public.test": "8.8.8.8", "loop.test": "127.0.0.1"})
	b := setup(t, testdb.SQLite(t), outbox.Config{})
	strict := b.outboxOn(outbox.Config{Resolver: dns.resolver()})
	create := func(u string) error {
		_, err := strict.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m", URL: u})
		return err
	}
	if err := create("https://public.test/hook"); err != nil {
		t.Fatalf("public name: %v", err)
	}
	err := create("https://nx.invalid/hook")
	if !errors.Is(err, outbox.ErrHostNotFound) || errors.Is(err, outbox.ErrDNSUnavailable) {
		t.Fatalf("NXDOMAIN: %v, want ErrHostNotFound", err)
	}
	err = create("https://servfail.test/hook")
	if !errors.Is(err, outbox.ErrDNSUnavailable) || errors.Is(err, outbox.ErrHostNotFound) {
		t.Fatalf("SERVFAIL: %v, want ErrDNSUnavailable", err)
	}
	for u, want := range map[string]string{
		"http://public.test/hook":  "https required (set Config.AllowHTTP for local development)",
		"https://127.0.0.1/hook":   "loopback target refused: 127.0.0.1 (see Config.AllowedTargets",
		"https://loop.test/hook":   "loopback target refused: loop.test (127.0.0.1) (see Config.AllowedTargets",
		"https://10.0.0.1/hook":    "private target refused: 10.0.0.1",
		"https://169.254.169.254/": "cloud metadata target refused",
	} {
		err := create(u)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", u, err, want)
		}
		if !errors.Is(err, outbox.ErrInsecureURL) && !errors.Is(err, outbox.ErrForbiddenTarget) {
			t.Errorf("%s: %v is neither ErrInsecureURL nor ErrForbiddenTarget", u, err)
		}
	}
}

func TestRelayConfigProxyIsChecked(t *testing.T) {
	b := setup(t, testdb.SQLite(t), outbox.Config{})
	for _, raw := range []string{"https://proxy:4750", "socks5://proxy:1080", "http://", "http://proxy:4750/path"} {
		u, _ := url.Parse(raw)
		if _, err := b.ob.NewRelay(outbox.RelayConfig{Proxy: u}); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("Proxy %s: %v, want ErrInvalidConfig", raw, err)
		}
	}
}

// DialContext makes the connections, given addresses the rules allowed;
// WrapTransport sees every request.
func TestCustomDialerAndTransportWrapper(t *testing.T) {
	b := setup(t, testdb.SQLite(t), outbox.Config{})
	rc := newReceiver(t, nil)
	ep := b.endpoint("m", strings.Replace(rc.URL, "127.0.0.1", "localhost", 1))
	dialed := make(chan string, 10)
	wrapped := make(chan string, 10)
	b.relay(outbox.RelayConfig{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dialed <- addr
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
		WrapTransport: func(next http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(r *http.Request) (*http.Response, error) {
				wrapped <- r.URL.Host
				return next.RoundTrip(r)
			})
		},
	})
	b.enqueue(outbox.Event{Tenant: "m", Type: "t", Payload: []byte(`{}`)})
	b.eventually("delivered", func() bool {
		d, _ := b.delivery(ep.ID)
		return d.state == outbox.StateSucceeded
	})
	addr := <-dialed
	if ap, err := netip.ParseAddrPort(addr); err != nil || !ap.Addr().IsLoopback() {
		t.Fatalf("dialer got %q, want a resolved loopback ip:port", addr)
	}
	if host := <-wrapped; !strings.HasPrefix(host, "localhost:") {
		t.Fatalf("wrapper saw %q", host)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
