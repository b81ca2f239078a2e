// Package safehttp is the HTTP transport txhook uses to POST webhooks to
// customer URLs, with the guard that keeps those URLs from reaching our own
// network (SSRF), and the URL check run when an endpoint is registered.
//
// A webhook sender lets strangers choose where our servers connect. Without a
// guard, "https://169.254.169.254/latest/meta-data/" as an endpoint reads the
// cloud credentials of the relay, and "http://10.0.0.5:6379/" talks to
// internal services; the delivery log then hands the answer back to the
// attacker as the response excerpt. Every rule below exists to close one such
// path without making normal receivers slower.
//
// The shortest correct use:
//
//	// at registration
//	if err := safehttp.CheckURL(ctx, endpointURL, safehttp.Config{}); err != nil {
//		return err // show it to the customer
//	}
//	// in the relay, one Client per process
//	client := safehttp.New(safehttp.Config{})
//	res := client.Post(ctx, endpointURL, signedHeader, body)
//	if !res.OK() {
//		// schedule a retry; res.Status, res.RetryAfter and res.Excerpt
//		// go to the delivery log, errors.Is(res.Err, safehttp.ErrTimeout)
//		// and friends say what happened
//	}
//
// # Addresses
//
// Forbidden lists what is refused: loopback, RFC 1918 and unique-local
// private ranges, link-local, CGNAT (100.64.0.0/10), unspecified, multicast,
// broadcast, documentation, benchmarking and reserved ranges, cloud metadata
// endpoints (169.254.169.254, fd00:ec2::254, 100.100.100.200, 192.0.0.192,
// and Azure's 168.63.129.16, which is public address space), and for IPv6
// anything outside global unicast 2000::/3. IPv4-mapped, NAT64 and 6to4
// addresses are judged by the IPv4 address they carry, because that is where
// the packets end up. Config.AllowPrivate turns all of this off.
//
// # When it is checked
//
// CheckURL resolves the host at registration and refuses it if any address
// is forbidden, so customers learn of a bad URL at once. That alone is not a
// defence: DNS can answer differently minutes later (DNS rebinding). The real
// check is at connect time: every connection the Client makes goes through a
// net.Dialer whose Control hook judges the very IP being connected to, before
// the connect system call, so a refused address never sees a packet.
// Environment proxies are ignored (Transport.Proxy is nil), since a proxy
// would do the connecting for us, past the hook. Config.Proxy is the
// exception the operator chooses: every connection becomes a CONNECT tunnel
// through it, the guard first refusing IP literals it forbids and names that
// resolve here to forbidden addresses; what only the proxy can resolve, the
// proxy must judge.
//
// Hosts in legacy numeric IPv4 forms ("2130706433", "0x7f.1", "127.1") are
// refused outright, as the WHATWG URL standard would read them as addresses
// and C resolvers do too: different parsers disagreeing is how filters are
// bypassed. URLs with userinfo are refused because credentials in URLs end up
// in logs.
//
// # Redirects
//
// At most Config.MaxRedirects (default 2) redirects are followed, then Post
// stops with ErrTooManyRedirects. Each target passes the same URL rules as a
// registered URL (https unless AllowHTTP, no userinfo, ...) and the same
// connect-time guard, so a public receiver cannot bounce us into the private
// network. A webhook is not a browser form: on every redirect code (301, 302,
// 303, 307, 308) the same POST is repeated with the same body and headers,
// to whatever host the Location names, since customers move endpoints.
// No header is stripped on a change of host: the caller's headers carry only
// this message's signature, which is worthless for any other body.
//
// # Time and size limits
//
// Config.Timeout (default 5 s) bounds the whole Post: connect, redirects and
// reading the body, so a receiver that hangs, or sends its response a byte
// at a time, costs at most that long and yields ErrTimeout, even after a 2xx
// status line (a response that never finishes is not a working receiver,
// and a retry is harmless since receivers deduplicate on the event id).
// Config.ConnectTimeout (default 3 s) bounds resolution plus TCP connect.
//
// At most Config.MaxBodyBytes (default 64 KiB) of a response are read and the
// first Config.ExcerptBytes (default 4096) kept, made valid UTF-8 without NUL
// bytes so the delivery log can store and show it. A body within the cap is
// read to its end so its connection is reused; a longer one is abandoned
// (HTTP/1.1: the connection is closed; HTTP/2: the stream is reset), so a
// 50 MB answer costs 64 KiB. Compression is off: we never ask for gzip and
// never inflate a gzip bomb. Response headers are capped at 64 KiB. There
// are no cookies.
//
// # Errors
//
// Post never returns a Go error: Result carries the status, Retry-After,
// excerpt, duration and Err, which matches one of ErrInvalidURL,
// ErrInsecureScheme, ErrForbiddenAddress, ErrTooManyRedirects, ErrTimeout,
// ErrConnection, ErrTLS or ErrStatus (message "HTTP 503"); CheckURL also
// returns ErrHostNotFound and ErrDNSUnavailable. A URL appears in
// a message only as scheme://host[:port]: never userinfo, and never the path
// or query, where receivers also keep secrets (chat-style webhook URLs carry
// a token in the path). Header values never appear.
//
// # Performance
//
// One Client holds one http.Transport with a keep-alive pool of
// MaxIdleConnsPerHost connections per host, and HTTP/2 when TLS ALPN offers
// it. The guard costs nothing per request, only per new connection; per
// request, Post adds a timeout context and reuses pooled read buffers.
package safehttp
