package safehttp

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"syscall"
	"time"
)

// Forbidden reports whether an address is refused when AllowPrivate is false:
// anything that is not plain public unicast, plus the few public addresses
// that are cloud-platform endpoints. Zones are ignored; IPv4-mapped, NAT64
// (64:ff9b::/96) and 6to4 (2002::/16) addresses are judged by the IPv4
// address inside them. The invalid zero Addr is forbidden.
func Forbidden(ip netip.Addr) bool { return forbiddenReason(ip) != "" }

type rule struct {
	p   netip.Prefix
	why string
}

func rules(why string, prefixes ...string) []rule {
	r := make([]rule, len(prefixes))
	for i, p := range prefixes {
		r[i] = rule{netip.MustParsePrefix(p), why}
	}
	return r
}

func join(groups ...[]rule) []rule {
	var all []rule
	for _, g := range groups {
		all = append(all, g...)
	}
	return all
}

// IPv4 ranges that are not reachable public unicast (IANA special-purpose
// registry), and cloud endpoints that sit inside or outside them.
var rules4 = join(
	rules("broadcast", "255.255.255.255/32"),
	rules("unspecified", "0.0.0.0/32"),
	rules("this network", "0.0.0.0/8"),
	rules("loopback", "127.0.0.0/8"),
	rules("private", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"),
	rules("cloud metadata", "169.254.169.254/32", "100.100.100.200/32", "192.0.0.192/32", "168.63.129.16/32"),
	rules("link-local", "169.254.0.0/16"),
	rules("shared address space (CGNAT)", "100.64.0.0/10"),
	rules("IETF protocol assignments", "192.0.0.0/24"),
	rules("documentation", "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"),
	rules("6to4 relay anycast", "192.88.99.0/24"),
	rules("benchmarking", "198.18.0.0/15"),
	rules("multicast", "224.0.0.0/4"),
	rules("reserved", "240.0.0.0/4"),
)

// IPv6: everything outside 2000::/3 is refused (see forbiddenReason); these
// rules only give the common cases a readable name, and carve the special
// blocks out of 2000::/3.
var rules6 = join(
	rules("unspecified", "::/128"),
	rules("loopback", "::1/128"),
	rules("cloud metadata", "fd00:ec2::254/128"),
	rules("unique local (private)", "fc00::/7"),
	rules("link-local", "fe80::/10"),
	rules("site-local", "fec0::/10"),
	rules("multicast", "ff00::/8"),
	rules("IETF protocol assignments (Teredo, ORCHID, ...)", "2001::/23"),
	rules("documentation", "2001:db8::/32", "3fff::/20"),
)

var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
	global6   = netip.MustParsePrefix("2000::/3")
)

// forbiddenReason returns why ip is forbidden, or "" when it is allowed.
func forbiddenReason(ip netip.Addr) string {
	if !ip.IsValid() {
		return "invalid address"
	}
	ip = ip.WithZone("").Unmap() // ::ffff:a.b.c.d is a.b.c.d on the wire
	if ip.Is4() {
		for _, r := range rules4 {
			if r.p.Contains(ip) {
				return r.why
			}
		}
		return ""
	}
	b := ip.As16()
	switch {
	case nat64.Contains(ip):
		return embedded("NAT64", netip.AddrFrom4([4]byte(b[12:16])))
	case sixToFour.Contains(ip):
		return embedded("6to4", netip.AddrFrom4([4]byte(b[2:6])))
	}
	for _, r := range rules6 {
		if r.p.Contains(ip) {
			return r.why
		}
	}
	if !global6.Contains(ip) {
		// IPv4-compatible ::a.b.c.d, IPv4-translated ::ffff:0:a.b.c.d,
		// local-use NAT64 64:ff9b:1::/48, discard-only 100::/64 and the
		// unassigned rest: no webhook receiver lives there.
		return "not global unicast"
	}
	return ""
}

func embedded(form string, v4 netip.Addr) string {
	if why := forbiddenReason(v4); why != "" {
		return form + " form of " + v4.String() + ": " + why
	}
	return ""
}

// guard dials TCP connections and refuses, in the socket's Control hook,
// every address that policy refuses. The hook sees the address actually being
// connected to, after DNS, so a name that resolved to a public address at
// registration and to 127.0.0.1 now is caught here. With a custom dialer the
// guard resolves the name itself and checks each address before handing it
// over; with a proxy it checks what it can resolve and asks the proxy for a
// tunnel.
type guard struct {
	dialer       net.Dialer // to targets; its Control hook checks each address
	proxyDialer  net.Dialer // to the proxy: not guarded
	lookup       func(ctx context.Context, host string) ([]net.IPAddr, error)
	custom       func(ctx context.Context, network, addr string) (net.Conn, error) // Config.DialContext
	proxy        *url.URL
	proxyAuth    string // Proxy-Authorization value; "" for none
	connTimeout  time.Duration
	allowPrivate bool
	permitted    func(netip.Addr) bool   // Config.permitted
	allow        map[netip.AddrPort]bool // tests only: exact ip:port let through
	tls          *tls.Config             // base client config; cloned per connection
	tlsTimeout   time.Duration
}

// check refuses ap unless the rules let it through.
func (g *guard) check(ap netip.AddrPort) error {
	if g.allow[ap] || g.allowPrivate || (g.permitted != nil && g.permitted(ap.Addr())) {
		return nil
	}
	if why := forbiddenReason(ap.Addr()); why != "" {
		return &ForbiddenError{IP: ap.Addr(), Why: why}
	}
	return nil
}

func (g *guard) control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		// Fail closed: never connect to something we could not judge.
		return fmt.Errorf("%w: unparseable dial address %q", ErrForbiddenAddress, address)
	}
	return g.check(ap)
}

// dial is the Transport's DialContext. Through a proxy, see dialProxy.
// Without a lookup hook or custom dialer the net.Dialer resolves the name
// itself (its Timeout covers resolution and connect); otherwise the name's
// addresses are tried in order under one ConnectTimeout.
func (g *guard) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if g.proxy != nil {
		return g.dialProxy(ctx, network, addr)
	}
	if g.lookup == nil && g.custom == nil {
		return g.dialer.DialContext(ctx, network, addr)
	}
	host, port, err := splitPort(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, g.connTimeout)
	defer cancel()
	ips, err := g.resolve(ctx, host)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: err}
	}
	var first error
	for _, ip := range ips {
		ap := netip.AddrPortFrom(ip, port)
		var c net.Conn
		if g.custom == nil {
			c, err = g.dialer.DialContext(ctx, network, ap.String())
		} else if err = g.check(ap); err == nil {
			c, err = g.custom(ctx, network, ap.String())
		}
		if err == nil {
			return c, nil
		}
		if first == nil {
			first = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, first
}

// resolve returns host's addresses: itself when it is an IP literal.
func (g *guard) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if ip, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{ip}, nil
	}
	lookup := g.lookup
	if lookup == nil {
		lookup = net.DefaultResolver.LookupIPAddr
	}
	ips, err := lookup(ctx, host)
	if err != nil {
		return nil, fmt.Errorf("lookup %s: %w", host, err)
	}
	out := make([]netip.Addr, 0, len(ips))
	for _, a := range ips {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap().WithZone(a.Zone))
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("lookup %s: no addresses", host)
	}
	return out, nil
}

// dialProxy opens a CONNECT tunnel to addr through the proxy. The proxy
// resolves names; the guard first refuses an IP literal it forbids, and a
// name that resolves here (within half of ConnectTimeout) to an address it
// forbids. A name that does not resolve here is left to the proxy.
func (g *guard) dialProxy(ctx context.Context, network, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, g.connTimeout)
	defer cancel()
	host, port, err := splitPort(addr)
	if err != nil {
		return nil, err
	}
	lctx, lcancel := context.WithTimeout(ctx, g.connTimeout/2)
	ips, lerr := g.resolve(lctx, host)
	lcancel()
	if lerr == nil {
		for _, ip := range ips {
			if err := g.check(netip.AddrPortFrom(ip, port)); err != nil {
				if fe, ok := err.(*ForbiddenError); ok && fe.IP.String() != host {
					fe.Host = host
				}
				return nil, &net.OpError{Op: "dial", Net: network, Err: err}
			}
		}
	}

	proxyAddr := g.proxy.Host
	if g.proxy.Port() == "" {
		proxyAddr = net.JoinHostPort(g.proxy.Hostname(), "80")
	}
	var conn net.Conn
	if g.custom != nil {
		conn, err = g.custom(ctx, network, proxyAddr)
	} else {
		conn, err = g.proxyDialer.DialContext(ctx, network, proxyAddr)
	}
	if err != nil {
		return nil, fmt.Errorf("egress proxy %s: %w", proxyAddr, err)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req := "CONNECT " + addr + " HTTP/1.1\r\nHost: " + addr + "\r\n"
	if g.proxyAuth != "" {
		req += "Proxy-Authorization: " + g.proxyAuth + "\r\n"
	}
	br := bufio.NewReader(conn)
	var resp *http.Response
	if _, err = io.WriteString(conn, req+"\r\n"); err == nil {
		resp, err = http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	}
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return nil, fmt.Errorf("egress proxy %s: CONNECT %s: %w", proxyAddr, addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		conn.Close()
		return nil, fmt.Errorf("egress proxy %s refused CONNECT %s: %.64s", proxyAddr, addr, resp.Status)
	}
	if !stop() { // the deadline was set: ctx ended just now
		conn.Close()
		return nil, fmt.Errorf("egress proxy %s: CONNECT %s: %w", proxyAddr, addr, ctx.Err())
	}
	if br.Buffered() > 0 {
		return &bufferedConn{Conn: conn, r: br}, nil
	}
	return conn, nil
}

// bufferedConn reads what the CONNECT response's reader buffered first.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func splitPort(addr string) (string, uint16, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("bad port in %q", addr)
	}
	return host, uint16(port), nil
}

// dialTLS is the Transport's DialTLSContext. Doing the handshake here, rather
// than leaving it to the Transport, tells handshake failures (ErrTLS) apart
// from everything else without guessing from error strings. The Transport
// detaches dials from the request's context, so the handshake gets its own
// bound and cannot hang a goroutine forever.
func (g *guard) dialTLS(ctx context.Context, network, addr string) (net.Conn, error) {
	raw, err := g.dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		raw.Close()
		return nil, err
	}
	cfg := g.tls.Clone()
	cfg.ServerName = host // an IP literal is verified against IP SANs and sent without SNI
	tc := tls.Client(raw, cfg)
	hctx, cancel := context.WithTimeout(ctx, g.tlsTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		raw.Close()
		var op *net.OpError
		if isTimeout(err) || errors.Is(hctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("%w: TLS handshake with %s: %w", ErrTimeout, addr, err)
		}
		if errors.As(err, &op) && (op.Op == "read" || op.Op == "write") {
			return nil, err // reset mid-handshake: a connection failure, not TLS
		}
		// Alerts come as *net.OpError too ("remote error", "local error"):
		// those are TLS failures.
		return nil, fmt.Errorf("%w: %s: %w", ErrTLS, addr, err)
	}
	return tc, nil
}
