package safehttp

import (
	"context"
	"crypto/x509"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"time"
)

// Defaults applied by WithDefaults.
const (
	DefaultTimeout             = 5 * time.Second
	DefaultConnectTimeout      = 3 * time.Second
	DefaultMaxRedirects        = 2
	DefaultMaxBodyBytes        = 64 << 10
	DefaultExcerptBytes        = 4096
	DefaultMaxIdleConnsPerHost = 100
	DefaultUserAgent           = "txhook/1 (+https://github.com/txhook/txhook)"
)

// Config configures a Client and CheckURL. The zero value is the safe
// production setting: https only, public addresses only.
type Config struct {
	// AllowHTTP allows plain http:// URLs; otherwise only https:// is
	// accepted, for the first request and for every redirect.
	AllowHTTP bool
	// AllowPrivate turns the address guard off: loopback, private,
	// link-local, CGNAT, multicast, cloud metadata and the rest of what
	// Forbidden refuses become reachable. For tests and self-hosted setups
	// where receivers live on the same network.
	AllowPrivate bool
	// AllowPrefixes lets these networks through the address guard even
	// though Forbidden refuses them: a partner's VPN range, or one loopback
	// address in tests, without opening every private address.
	AllowPrefixes []netip.Prefix
	// Timeout bounds a whole Post: connecting, every redirect, and reading
	// the capped response body. Default 5s.
	Timeout time.Duration
	// ConnectTimeout bounds name resolution plus TCP connect. Default 3s.
	// (The TLS handshake is bounded by Timeout.)
	ConnectTimeout time.Duration
	// MaxRedirects is how many redirects are followed; 0 means the default
	// (2), a negative value means none.
	MaxRedirects int
	// MaxBodyBytes is the most response body read. A body within it is
	// read to the end so the connection is reused; a longer one is cut and
	// its connection closed. Default 64 KiB.
	MaxBodyBytes int64
	// ExcerptBytes is the most body bytes kept in Result.Excerpt. Default
	// 4096.
	ExcerptBytes int
	// MaxIdleConnsPerHost is the keep-alive pool size per host. Default 100.
	MaxIdleConnsPerHost int
	// UserAgent is sent unless the caller's header has one. Default
	// DefaultUserAgent.
	UserAgent string
	// LookupIPAddr resolves host names, both in CheckURL and when dialing;
	// nil means net.DefaultResolver. Its signature is that of
	// (*net.Resolver).LookupIPAddr. For tests.
	LookupIPAddr func(ctx context.Context, host string) ([]net.IPAddr, error)

	// Proxy, if set, is an HTTP CONNECT proxy (an http:// URL, with
	// user:password for Proxy-Authorization: Basic) through which every
	// connection goes, http and https targets alike, as a tunnel to
	// host:port: the proxy resolves the name and connects. The guard
	// still refuses IP-literal targets it forbids, and names that resolve
	// here to a forbidden address; a name that does not resolve here is
	// left to the proxy, which must enforce its own rules (smokescreen
	// does). The connection to the proxy itself is not guarded.
	Proxy *url.URL
	// DialContext, if set, makes the TCP connections: to the proxy when
	// Proxy is set (it may return a TLS connection to a TLS proxy),
	// otherwise to the target, always as ip:port of an address the guard
	// has checked. Nil means a net.Dialer with ConnectTimeout.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// WrapTransport, if set, wraps the RoundTripper that sends every
	// request (each redirect hop separately), for instrumentation or a
	// custom egress. The wrapper must send the request it is given.
	WrapTransport func(http.RoundTripper) http.RoundTripper
	// RootCAs verify receivers' certificates; nil means the system's.
	RootCAs *x509.CertPool
}

// WithDefaults returns c with every zero field set to its default.
// A negative MaxRedirects is kept: it means "follow none".
func (c Config) WithDefaults() Config {
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.MaxRedirects == 0 {
		c.MaxRedirects = DefaultMaxRedirects
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.ExcerptBytes <= 0 {
		c.ExcerptBytes = DefaultExcerptBytes
	}
	if c.MaxIdleConnsPerHost <= 0 {
		c.MaxIdleConnsPerHost = DefaultMaxIdleConnsPerHost
	}
	if c.UserAgent == "" {
		c.UserAgent = DefaultUserAgent
	}
	return c
}

// follows is the number of redirects to follow.
func (c Config) follows() int { return max(c.MaxRedirects, 0) }

// excerptLimit is the most bytes read into the excerpt.
func (c Config) excerptLimit() int { return int(min(int64(c.ExcerptBytes), c.MaxBodyBytes)) }

// permitted reports whether the guard lets ip through.
func (c Config) permitted(ip netip.Addr) bool {
	if c.AllowPrivate {
		return true
	}
	ip = ip.Unmap()
	for _, p := range c.AllowPrefixes {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
