package safehttp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"time"
	"unicode/utf8"
)

// Client posts webhooks. It is safe for concurrent use and keeps one pool of
// keep-alive connections (one more per client certificate in use); create
// one per process and share it.
type Client struct {
	cfg     Config
	guard   *guard
	tr      *http.Transport   // the pool without a client certificate
	rt      http.RoundTripper // tr, wrapped by Config.WrapTransport
	uaOnly  http.Header       // {"User-Agent": cfg.UserAgent}, read-only
	scratch sync.Pool         // *[]byte for reading response bodies

	certMu sync.Mutex
	certs  map[[32]byte]certTransport // by the SHA-256 of the leaf certificate
}

// certTransport is the pool of connections that present one client
// certificate: pooled connections are per host, so sharing one pool
// between certificates would hand one endpoint's TLS identity to another.
type certTransport struct {
	tr *http.Transport
	rt http.RoundTripper
}

// maxCertTransports bounds the pools kept for client certificates; past
// it they are all closed (once idle) and rebuilt on use.
const maxCertTransports = 256

// Result is the outcome of one Post.
type Result struct {
	// Status is the final HTTP status; 0 when no response was received.
	Status int
	// RetryAfter is the raw Retry-After header of the final response.
	RetryAfter string
	// Excerpt is the start of the final response body: at most
	// ExcerptBytes bytes, valid UTF-8 (invalid sequences and NUL bytes
	// replaced by U+FFFD), safe to store and show.
	Excerpt []byte
	// Duration is the time Post took, redirects and body included.
	Duration time.Duration
	// Redirects is how many redirects were followed, or refused: 0 when
	// Err is about the URL Post was given.
	Redirects int
	// Err is nil only when the final status is 2xx and its capped body was
	// read in time; otherwise it matches one of the Err* sentinels.
	// Messages name at most scheme://host[:port] of a URL, never its
	// userinfo, path or query, and never a header value.
	Err error
}

// OK reports whether the webhook was delivered: a 2xx, read in time.
func (r Result) OK() bool { return r.Err == nil && r.Status >= 200 && r.Status < 300 }

// New returns a Client for cfg (defaults applied).
func New(cfg Config) *Client { return newClient(cfg, testHooks{}) }

// testHooks are knobs only tests can reach.
type testHooks struct {
	allow   []netip.AddrPort // exact ip:port let through the guard
	rootCAs *x509.CertPool   // trust httptest's certificate
}

func newClient(cfg Config, th testHooks) *Client {
	cfg = cfg.WithDefaults()
	roots := cfg.RootCAs
	if th.rootCAs != nil {
		roots = th.rootCAs
	}
	g := &guard{
		lookup:       cfg.LookupIPAddr,
		custom:       cfg.DialContext,
		proxy:        cfg.Proxy,
		connTimeout:  cfg.ConnectTimeout,
		allowPrivate: cfg.AllowPrivate,
		permitted:    cfg.permitted,
		tlsTimeout:   cfg.Timeout,
		tls: &tls.Config{
			MinVersion: tls.VersionTLS12,
			NextProtos: []string{"h2", "http/1.1"},
			RootCAs:    roots,
		},
	}
	if u := cfg.Proxy; u != nil && u.User != nil {
		pw, _ := u.User.Password()
		g.proxyAuth = "Basic " + base64.StdEncoding.EncodeToString([]byte(u.User.Username()+":"+pw))
	}
	g.dialer = net.Dialer{Timeout: cfg.ConnectTimeout, Control: g.control}
	g.proxyDialer = net.Dialer{Timeout: cfg.ConnectTimeout}
	if len(th.allow) > 0 {
		g.allow = make(map[netip.AddrPort]bool, len(th.allow))
		for _, ap := range th.allow {
			g.allow[ap] = true
		}
	}
	c := &Client{
		cfg:    cfg,
		guard:  g,
		uaOnly: http.Header{"User-Agent": {cfg.UserAgent}},
	}
	c.tr, c.rt = c.transport(g)
	size := max(c.cfg.excerptLimit(), 16<<10)
	c.scratch.New = func() any { b := make([]byte, size); return &b }
	return c
}

// transport returns a Transport that dials through g, and the
// RoundTripper requests go through.
func (c *Client) transport(g *guard) (*http.Transport, http.RoundTripper) {
	tr := &http.Transport{
		Proxy:                  nil, // an environment proxy would dial for us, past the guard; Config.Proxy goes through the guard
		DialContext:            g.dial,
		DialTLSContext:         g.dialTLS,
		ForceAttemptHTTP2:      true,
		DisableCompression:     true, // never inflate a receiver's gzip bomb
		MaxIdleConnsPerHost:    c.cfg.MaxIdleConnsPerHost,
		IdleConnTimeout:        90 * time.Second,
		MaxResponseHeaderBytes: 64 << 10,
	}
	var rt http.RoundTripper = tr
	if c.cfg.WrapTransport != nil {
		rt = c.cfg.WrapTransport(tr)
	}
	return tr, rt
}

// roundTripper returns the RoundTripper for requests presenting cert (nil:
// none).
func (c *Client) roundTripper(cert *tls.Certificate) http.RoundTripper {
	if cert == nil || len(cert.Certificate) == 0 {
		return c.rt
	}
	key := sha256.Sum256(cert.Certificate[0])
	c.certMu.Lock()
	defer c.certMu.Unlock()
	if ct, ok := c.certs[key]; ok {
		return ct.rt
	}
	if c.certs == nil || len(c.certs) >= maxCertTransports {
		for _, ct := range c.certs {
			ct.tr.CloseIdleConnections()
		}
		c.certs = make(map[[32]byte]certTransport)
	}
	g := *c.guard
	g.tls = c.guard.tls.Clone()
	g.tls.Certificates = []tls.Certificate{*cert}
	var ct certTransport
	ct.tr, ct.rt = c.transport(&g)
	c.certs[key] = ct
	return ct.rt
}

// CloseIdleConnections closes the keep-alive connections not in use, for
// shutdown and tests.
func (c *Client) CloseIdleConnections() {
	c.tr.CloseIdleConnections()
	c.certMu.Lock()
	defer c.certMu.Unlock()
	for _, ct := range c.certs {
		ct.tr.CloseIdleConnections()
	}
}

// Post sends body to url with header, following redirects, and reports the
// outcome; it never returns a Go error. header is not modified; User-Agent is
// added when it has none. Every redirect (301, 302, 303, 307, 308) is
// followed by the same POST with the same body and headers, to any host that
// passes the same rules.
func (c *Client) Post(ctx context.Context, url string, header http.Header, body []byte) Result {
	return c.PostCert(ctx, url, header, body, nil)
}

// PostCert is Post presenting cert, when not nil, as the TLS client
// certificate (mTLS), on every hop. Connections presenting one certificate
// are pooled apart from those presenting another or none.
func (c *Client) PostCert(ctx context.Context, url string, header http.Header, body []byte, cert *tls.Certificate) (res Result) {
	start := time.Now()
	defer func() { res.Duration = time.Since(start) }()

	// A caller's deadline within Timeout bounds the Post alone: no second
	// timer for each request.
	if d, ok := ctx.Deadline(); !ok || d.Sub(start) > c.cfg.Timeout {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
	}

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		res.Err = fmt.Errorf("%w: %w", ErrInvalidURL, urlReason(err))
		return res
	}
	if err := checkURL(req.URL, c.cfg.AllowHTTP); err != nil {
		res.Err = err
		return res
	}
	if req.URL.Fragment != "" {
		res.Err = fmt.Errorf("%w: has a fragment", ErrInvalidURL)
		return res
	}
	hdr := c.header(header)
	req.Header = hdr
	rt := c.roundTripper(cert)

	for hop := 0; ; hop++ {
		res.Redirects = hop
		resp, err := rt.RoundTrip(req)
		if err != nil {
			res.Err = wrap(ctx, req.URL, err)
			return res
		}
		loc := ""
		if isRedirect(resp.StatusCode) {
			loc = resp.Header.Get("Location")
		}
		if loc == "" || hop >= c.cfg.follows() {
			res.Status = resp.StatusCode
			res.RetryAfter = resp.Header.Get("Retry-After")
			var rerr error
			res.Excerpt, rerr = c.readBody(resp)
			switch {
			case loc != "":
				res.Err = fmt.Errorf("%w: HTTP %d from %s after %d redirects", ErrTooManyRedirects, resp.StatusCode, origin(req.URL), hop)
			case rerr != nil:
				res.Err = wrap(ctx, req.URL, fmt.Errorf("reading body after HTTP %d: %w", resp.StatusCode, rerr))
			case resp.StatusCode < 200 || resp.StatusCode > 299:
				res.Err = &statusError{resp.StatusCode}
			}
			return res
		}
		next, err := req.URL.Parse(loc)
		if err == nil {
			err = checkURL(next, c.cfg.AllowHTTP)
		} else {
			err = fmt.Errorf("%w: %w", ErrInvalidURL, urlReason(err))
		}
		if err != nil {
			c.readBody(resp)
			res.Redirects = hop + 1 // the refusal is the redirect target's
			res.Err = fmt.Errorf("redirect from %s: %w", origin(req.URL), err)
			return res
		}
		c.readBody(resp) // drain within the cap so the connection is reused
		from := req.URL
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, next.String(), bytes.NewReader(body))
		if err != nil { // not expected: next was parsed and checked
			res.Err = fmt.Errorf("redirect from %s: %w: %w", origin(from), ErrInvalidURL, urlReason(err))
			return res
		}
		req.Header = hdr
	}
}

// header returns the request header: the caller's own map when it already
// names a User-Agent (the Transport does not modify request headers), else a
// shallow copy with ours added, so the caller's map is never written.
func (c *Client) header(h http.Header) http.Header {
	if len(h) == 0 {
		return c.uaOnly
	}
	if _, ok := h["User-Agent"]; ok {
		return h
	}
	out := make(http.Header, len(h)+1)
	for k, v := range h {
		out[k] = v
	}
	out["User-Agent"] = c.uaOnly["User-Agent"]
	return out
}

func isRedirect(code int) bool {
	switch code {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther,
		http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		return true
	}
	return false
}

// wrap gives a transport error its sentinel and the origin it happened at.
func wrap(ctx context.Context, u *url.URL, err error) error {
	if kind := kindOf(ctx, err); kind != nil {
		return fmt.Errorf("%w: POST %s: %w", kind, origin(u), err)
	}
	return fmt.Errorf("POST %s: %w", origin(u), err)
}

// readBody reads at most MaxBodyBytes of resp's body, keeps the first
// ExcerptBytes, and closes it. A body that ends within the cap was read to
// EOF, so its connection goes back to the pool; a longer one is abandoned and
// the Transport closes its connection rather than read the rest. (From Go
// 1.27 the Transport first drains up to 256 KiB for at most 50 ms, in its
// own goroutine after Close returned, and keeps the connection when the
// body ends within that: nothing the relay waits for or stores.)
func (c *Client) readBody(resp *http.Response) ([]byte, error) {
	defer resp.Body.Close()
	if resp.ContentLength == 0 {
		return nil, nil
	}
	bp := c.scratch.Get().(*[]byte)
	defer c.scratch.Put(bp)
	buf := *bp

	limit := c.cfg.excerptLimit()
	n, eof, err := readFull(resp.Body, buf[:limit])
	excerpt := sanitize(buf[:n], n == limit, limit)
	if eof || err != nil {
		return excerpt, err
	}
	// One byte past the cap tells a body that ends exactly at the cap (a
	// chunked one has not said so yet) from one that goes on.
	left := c.cfg.MaxBodyBytes - int64(n) + 1
	for left > 0 {
		m, eof, err := readFull(resp.Body, buf[:min(int64(len(buf)), left)])
		left -= int64(m)
		if eof || err != nil {
			return excerpt, err
		}
	}
	return excerpt, nil // over the cap: Close drops the connection
}

// readFull reads until p is full or the body ends; eof reports a clean end.
func readFull(r io.Reader, p []byte) (n int, eof bool, err error) {
	for n < len(p) {
		m, err := r.Read(p[n:])
		n += m
		if errors.Is(err, io.EOF) {
			return n, true, nil
		}
		if err != nil {
			return n, false, err
		}
	}
	return n, false, nil
}

// sanitize copies b into a string-safe excerpt: valid UTF-8, no NUL bytes,
// at most limit bytes. cut says b was cut at the limit, so a final incomplete
// rune is dropped rather than replaced.
func sanitize(b []byte, cut bool, limit int) []byte {
	if len(b) == 0 {
		return nil
	}
	if cut {
		for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
			if utf8.RuneStart(b[i]) {
				if !utf8.FullRune(b[i:]) {
					b = b[:i]
				}
				break
			}
		}
	}
	if utf8.Valid(b) && bytes.IndexByte(b, 0) < 0 {
		return bytes.Clone(b)
	}
	out := bytes.ReplaceAll(bytes.ToValidUTF8(b, []byte("\uFFFD")), []byte{0}, []byte("\uFFFD"))
	for len(out) > limit { // replacements grew it: drop whole runes from the end
		_, size := utf8.DecodeLastRune(out)
		out = out[:len(out)-size]
	}
	return out
}
