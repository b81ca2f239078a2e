package safehttp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// Sentinel errors. Every non-nil error from this package matches exactly one
// of them with errors.Is; the cause (a *net.OpError, context.DeadlineExceeded,
// a TLS error, ...) stays in the chain behind it.
var (
	// ErrInvalidURL: the URL (or a redirect's Location) is not an absolute
	// http(s) URL with a host, or carries credentials, a fragment (at
	// registration), a bad port or a legacy numeric IPv4 host.
	ErrInvalidURL = errors.New("txhook: invalid URL")
	// ErrInsecureScheme: http:// where https:// is required.
	ErrInsecureScheme = errors.New("txhook: insecure scheme (https required)")
	// ErrForbiddenAddress: the target is, or resolves to, an address that
	// Forbidden refuses. The message names the address and why.
	ErrForbiddenAddress = errors.New("txhook: forbidden address")
	// ErrTooManyRedirects: the receiver redirected more than MaxRedirects
	// times.
	ErrTooManyRedirects = errors.New("txhook: too many redirects")
	// ErrTimeout: Timeout (or ConnectTimeout, or the caller's deadline)
	// expired before the response and its capped body were read.
	ErrTimeout = errors.New("txhook: timeout")
	// ErrConnection: no usable connection or response: refused, reset,
	// DNS failure when connecting, the egress proxy refusing the tunnel,
	// malformed response, or the caller canceled ctx (context.Canceled is
	// then in the chain).
	ErrConnection = errors.New("txhook: connection failed")
	// ErrHostNotFound (CheckURL only): the host name does not exist
	// (NXDOMAIN) or has no address. Asking again will not help.
	ErrHostNotFound = errors.New("txhook: host not found")
	// ErrDNSUnavailable (CheckURL only): the name could not be resolved
	// for a reason that may pass (timeout, SERVFAIL, no DNS server
	// reachable, ctx ended): try again later.
	ErrDNSUnavailable = errors.New("txhook: DNS unavailable, try again")
	// ErrTLS: the TLS handshake failed (untrusted certificate, wrong name,
	// protocol mismatch, alert from the peer).
	ErrTLS = errors.New("txhook: TLS handshake failed")
	// ErrStatus: the final response was not 2xx. Its message is only the
	// status, e.g. "HTTP 503".
	ErrStatus = errors.New("txhook: non-2xx status")
)

// ForbiddenError names the refused address and the rule that refused it.
// It matches ErrForbiddenAddress.
type ForbiddenError struct {
	IP   netip.Addr
	Why  string // the rule: "loopback", "private", "cloud metadata", ...
	Host string // the name that resolved to IP, when there was one
}

func (e *ForbiddenError) Error() string {
	s := "txhook: forbidden address " + e.IP.String() + " (" + e.Why + ")"
	if e.Host != "" {
		s = "txhook: host " + e.Host + " resolves to forbidden address " + e.IP.String() + " (" + e.Why + ")"
	}
	return s
}

func (e *ForbiddenError) Is(target error) bool { return target == ErrForbiddenAddress }

// Target is where a failed connection was headed: e.Host when it was a
// name, else the address.
func (e *ForbiddenError) Target() string {
	if e.Host != "" {
		return e.Host + " (" + e.IP.String() + ")"
	}
	return e.IP.String()
}

// statusError is the error of a non-2xx final response.
type statusError struct{ code int }

func (e *statusError) Error() string        { return "HTTP " + strconv.Itoa(e.code) }
func (e *statusError) Is(target error) bool { return target == ErrStatus }

// origin is all of a URL that goes into an error message: scheme://host[:port].
// Userinfo is refused before any request is made, and the path and query are
// left out because receivers put secrets there too (Slack- and Discord-style
// webhook URLs carry their token in the path); the caller knows the full URL.
func origin(u *url.URL) string {
	return u.Scheme + "://" + u.Host
}

// urlReason returns the part of a url.Parse error that quotes nothing of the
// URL: *url.Error quotes the whole input, and its inner errors quote pieces
// (`invalid port ":secret" after host` from "https://user:secret/").
func urlReason(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	msg := err.Error()
	if i := strings.IndexByte(msg, '"'); i >= 0 {
		msg = strings.TrimSpace(msg[:i])
	}
	return errors.New(msg)
}

// kindOf picks the sentinel for an error from dialing, the round trip or
// reading the body; nil when err already carries one (set by the dial guard
// or the TLS dialer).
func kindOf(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, ErrForbiddenAddress), errors.Is(err, ErrTLS), errors.Is(err, ErrTimeout):
		return nil
	case isTLS(err):
		return ErrTLS
	case isTimeout(err) || errors.Is(ctx.Err(), context.DeadlineExceeded):
		return ErrTimeout
	default:
		return ErrConnection
	}
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// isTLS reports whether err is a TLS failure the Transport reported itself
// (a handshake it made, or an alert later on).
func isTLS(err error) bool {
	var (
		alert  tls.AlertError
		verify *tls.CertificateVerificationError
		header tls.RecordHeaderError
	)
	return errors.As(err, &alert) || errors.As(err, &verify) || errors.As(err, &header)
}

// dnsError classifies a failed lookup of host at registration.
func dnsError(host string, err error) error {
	var de *net.DNSError
	if errors.As(err, &de) && de.IsNotFound {
		return fmt.Errorf("%w: %s: %w", ErrHostNotFound, host, err)
	}
	return fmt.Errorf("%w: resolve %s: %w", ErrDNSUnavailable, host, err)
}
