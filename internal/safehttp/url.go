package safehttp

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// CheckURL validates an endpoint URL at registration time. The URL must be
// absolute, https (or http with AllowHTTP), with a host, without userinfo
// (credentials in URLs end up in logs), without a fragment, with a valid port,
// and its host must not be a legacy numeric IPv4 form such as "2130706433",
// "0x7f.1" or "127.1" (resolvers read those as addresses, other parsers as
// names). Unless AllowPrivate, an IP-literal host must not be Forbidden and a
// name is resolved (respecting ctx) and refused if any of its addresses is;
// a name that does not exist gives ErrHostNotFound, a lookup that failed
// for a passing reason ErrDNSUnavailable.
//
// Passing registration is not enough to be safe: DNS can change afterwards.
// Post checks the address of every connection again.
func CheckURL(ctx context.Context, raw string, cfg Config) error {
	cfg = cfg.WithDefaults()
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidURL, urlReason(err))
	}
	if err := checkURL(u, cfg.AllowHTTP); err != nil {
		return err
	}
	if strings.IndexByte(raw, '#') >= 0 {
		return fmt.Errorf("%w: has a fragment", ErrInvalidURL)
	}
	if cfg.AllowPrivate {
		return nil
	}
	host := u.Hostname()
	if ip, err := netip.ParseAddr(host); err == nil {
		if why := forbiddenReason(ip); why != "" && !cfg.permitted(ip) {
			return &ForbiddenError{IP: ip, Why: why}
		}
		return nil
	}
	lookup := cfg.LookupIPAddr
	if lookup == nil {
		lookup = net.DefaultResolver.LookupIPAddr
	}
	ips, err := lookup(ctx, host)
	if err != nil {
		return dnsError(host, err)
	}
	if len(ips) == 0 {
		return fmt.Errorf("%w: %s has no address", ErrHostNotFound, host)
	}
	for _, a := range ips {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			return fmt.Errorf("%w: resolve %s: bad address %v", ErrConnection, host, a.IP)
		}
		if why := forbiddenReason(ip); why != "" && !cfg.permitted(ip) {
			return &ForbiddenError{IP: ip.Unmap(), Why: why, Host: host}
		}
	}
	return nil
}

// checkURL applies the rules that need no network, to registered URLs and to
// every redirect target alike.
func checkURL(u *url.URL, allowHTTP bool) error {
	switch u.Scheme {
	case "https":
	case "http":
		if !allowHTTP {
			return ErrInsecureScheme
		}
	case "":
		return fmt.Errorf("%w: not absolute", ErrInvalidURL)
	default:
		return fmt.Errorf("%w: scheme %.16q not allowed", ErrInvalidURL, u.Scheme)
	}
	if u.Opaque != "" {
		return fmt.Errorf("%w: no host", ErrInvalidURL)
	}
	if u.User != nil {
		return fmt.Errorf("%w: credentials in URL", ErrInvalidURL)
	}
	host := u.Hostname()
	if host == "" {
		return fmt.Errorf("%w: no host", ErrInvalidURL)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%w: bad port", ErrInvalidURL)
		}
	}
	if legacyNumeric(host) {
		return fmt.Errorf("%w: host %.64q is a non-canonical numeric IPv4 form", ErrInvalidURL, host)
	}
	return nil
}

// legacyNumeric reports whether host is a number-like IPv4 form other than
// canonical dotted decimal: "2130706433", "0x7f.1", "127.1", "0177.0.0.1",
// "1.2.3.4.". The rule is the WHATWG URL one: a host whose last label is a
// number is an IPv4 address. No real domain ends in a numeric label, so
// refusing these costs nothing, and they are a classic way past filters that
// parse differently from the resolver (inet_aton accepts them all).
func legacyNumeric(host string) bool {
	if strings.IndexByte(host, ':') >= 0 {
		return false // IPv6 literal
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.Is4() {
		return false
	}
	h := strings.TrimSuffix(host, ".")
	last := h[strings.LastIndexByte(h, '.')+1:]
	if last == "" {
		return false
	}
	if len(last) >= 2 && last[0] == '0' && (last[1] == 'x' || last[1] == 'X') {
		for _, c := range []byte(last[2:]) {
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
		return true
	}
	for _, c := range []byte(last) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
