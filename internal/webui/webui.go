// Package webui holds what txhook's server-rendered web handlers (the
// operator UI in dlq and the merchant portal in outbox/portal) share: the
// double-submit CSRF cookie and its token, telling a request made over TLS
// (directly or through a trusted proxy), the client address behind such a
// proxy, the security headers and the path under a mount prefix.
package webui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
)

// MaxForm is the largest form body a handler reads.
const MaxForm = 1 << 20

// Proxies are the addresses of the reverse proxies that terminate TLS in
// front of a handler.
type Proxies []netip.Prefix

// trusts reports whether r's peer is one of the proxies.
func (ps Proxies) trusts(r *http.Request) (netip.Addr, bool) {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}, false
	}
	a := peer.Addr().Unmap()
	for _, p := range ps {
		if p.Contains(a) {
			return a, true
		}
	}
	return a, false
}

// OverTLS reports whether r reached the handler's server over TLS, or
// reached a trusted proxy over TLS by that proxy's X-Forwarded-Proto (the
// last value, the one the proxy set).
func (ps Proxies) OverTLS(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	if len(ps) == 0 {
		return false
	}
	if _, ok := ps.trusts(r); !ok {
		return false
	}
	vals := r.Header.Values("X-Forwarded-Proto")
	if len(vals) == 0 {
		return false
	}
	return strings.EqualFold(lastValue(vals), "https")
}

// ClientAddr is the address of the client that made r: the peer, or,
// when the peer is a trusted proxy, the last address that proxy appended
// to X-Forwarded-For. Empty when unknown.
func (ps Proxies) ClientAddr(r *http.Request) string {
	a, trusted := ps.trusts(r)
	if trusted {
		if vals := r.Header.Values("X-Forwarded-For"); len(vals) > 0 {
			if fwd, err := netip.ParseAddr(lastValue(vals)); err == nil {
				return fwd.Unmap().String()
			}
		}
	}
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

// lastValue is the last comma-separated item of a header's values.
func lastValue(vals []string) string {
	last := vals[len(vals)-1]
	if i := strings.LastIndexByte(last, ','); i >= 0 {
		last = last[i+1:]
	}
	return strings.TrimSpace(last)
}

// SecurityHeaders sets the headers every page of a handler carries: its
// Content-Security-Policy, no framing unless the CSP's frame-ancestors
// allows some (then X-Frame-Options is left out, as it cannot name them),
// no MIME sniffing, no referrer (URLs can carry tokens), no caching.
func SecurityHeaders(h http.Header, csp string, framed bool) {
	h.Set("Content-Security-Policy", csp)
	if !framed {
		h.Set("X-Frame-Options", "DENY")
	}
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
}

// CSRF is a double-submit CSRF defence: a random nonce in an HttpOnly
// cookie, and in each form an HMAC of it (and of a scope, such as the
// tenant, so a token is good for one scope only).
type CSRF struct {
	Key     []byte  // at least 32 bytes
	Label   string  // domain separation of the HMAC, such as "txhook-ui-csrf"
	Cookie  string  // name over plain HTTP, scoped to Path
	Path    string  // the handler's prefix
	Proxies Proxies // see Proxies.OverTLS
	cop     *http.CrossOriginProtection
}

// NewCSRF returns a CSRF with a random key when key is nil.
func NewCSRF(key []byte, label, cookie, path string, proxies Proxies) (*CSRF, error) {
	if key == nil {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
	} else if len(key) < 32 {
		return nil, errors.New("CSRF key must be at least 32 bytes")
	}
	return &CSRF{Key: key, Label: label, Cookie: cookie, Path: path, Proxies: proxies, cop: http.NewCrossOriginProtection()}, nil
}

// CookieName names the CSRF cookie of r: "__Host-" + Cookie over TLS, so
// neither plain HTTP nor a sibling subdomain can set or replace it.
// Browsers refuse __Host- cookies without Secure, so over plain HTTP it is
// Cookie, scoped to Path.
func (c *CSRF) CookieName(r *http.Request) string {
	if c.Proxies.OverTLS(r) {
		return "__Host-" + c.Cookie
	}
	return c.Cookie
}

// Token returns the form token of r's CSRF cookie for scope, setting a
// new cookie when r has none.
func (c *CSRF) Token(w http.ResponseWriter, r *http.Request, scope string) string {
	name := c.CookieName(r)
	if ck, err := r.Cookie(name); err == nil && validNonce(ck.Value) {
		return c.token(ck.Value, scope)
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	nonce := base64.RawURLEncoding.EncodeToString(b)
	ck := &http.Cookie{Name: name, Value: nonce, Path: c.Path, HttpOnly: true, SameSite: http.SameSiteStrictMode}
	if name != c.Cookie {
		ck.Path, ck.Secure = "/", true
	}
	http.SetCookie(w, ck)
	// Later handlers of this request read the new cookie too.
	r.AddCookie(&http.Cookie{Name: name, Value: nonce})
	return c.token(nonce, scope)
}

// Check checks a state-changing request: not cross-origin by the
// browser's own account, and carrying in its form field the token of its
// CSRF cookie for scope. It parses the form (at most MaxForm bytes).
func (c *CSRF) Check(w http.ResponseWriter, r *http.Request, field, scope string) error {
	if err := c.cop.Check(r); err != nil {
		return errors.New("cross-origin request")
	}
	r.Body = http.MaxBytesReader(w, r.Body, MaxForm)
	if err := r.ParseForm(); err != nil {
		return errors.New("unreadable form")
	}
	ck, err := r.Cookie(c.CookieName(r))
	if err != nil || !validNonce(ck.Value) {
		return errors.New("missing CSRF cookie; reload the page")
	}
	got := r.PostForm.Get(field)
	if got == "" {
		return errors.New("missing CSRF token")
	}
	if !hmac.Equal([]byte(got), []byte(c.token(ck.Value, scope))) {
		return errors.New("wrong CSRF token; reload the page")
	}
	return nil
}

// CrossOrigin reports whether the browser says r is cross-origin.
func (c *CSRF) CrossOrigin(r *http.Request) bool { return c.cop.Check(r) != nil }

func validNonce(s string) bool {
	b, err := base64.RawURLEncoding.DecodeString(s)
	return err == nil && len(b) == 32
}

func (c *CSRF) token(nonce, scope string) string {
	m := hmac.New(sha256.New, c.Key)
	m.Write([]byte(c.Label))
	m.Write([]byte{0})
	m.Write([]byte(nonce))
	if scope != "" {
		m.Write([]byte{0})
		m.Write([]byte(scope))
	}
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Prefix normalizes a mount prefix: leading and trailing slash, no
// character that would need escaping in an attribute or a URL.
func Prefix(p string) (string, error) {
	if p == "" {
		p = "/"
	}
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	if !strings.HasSuffix(p, "/") {
		p += "/"
	}
	if strings.ContainsAny(p, "?#\"'<> ") {
		return "", fmt.Errorf("invalid Prefix %q", p)
	}
	return p, nil
}

// Strip returns r with prefix taken off its path, accepting the path with
// the prefix (mounted as is) or without it (behind http.StripPrefix). It
// returns nil, having redirected, when the path is the prefix without its
// trailing slash.
func Strip(w http.ResponseWriter, r *http.Request, prefix string) *http.Request {
	p := r.URL.Path
	switch {
	case strings.HasPrefix(p, prefix):
		p = "/" + p[len(prefix):]
	case p+"/" == prefix:
		http.Redirect(w, r, prefix, http.StatusFound)
		return nil
	case !strings.HasPrefix(p, "/"):
		p = "/" + p
	}
	r2 := new(http.Request)
	*r2 = *r
	u2 := *r.URL
	u2.Path, u2.RawPath = p, ""
	r2.URL = &u2
	return r2
}

// Path is the URL of a page under prefix: the prefix and the escaped parts.
func Path(prefix string, parts ...any) string {
	var b strings.Builder
	b.WriteString(prefix)
	for i, p := range parts {
		if i > 0 {
			b.WriteByte('/')
		}
		b.WriteString(url.PathEscape(fmt.Sprint(p)))
	}
	return b.String()
}
