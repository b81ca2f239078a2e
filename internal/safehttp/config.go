package safehttp

import (
	"context"
	"net"
	"net/netip"
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
