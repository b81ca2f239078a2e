package safehttp

import (
	"context"
	"errors"
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
	// DNS failure, malformed response, or the caller canceled ctx
	// (context.Canceled is then in the chain).
	ErrConnection = errors.New("txhook: connection failed")
	// ErrTLS: the TLS handshake failed (untrusted certificate, wrong name,
	// protocol mismatch, alert from the peer).
	ErrTLS = errors.New("txhook: TLS handshake failed")
	// ErrStatus: the final response was not 2xx. Its message is only the
	// status, e.g. "HTTP 503".
	ErrStatus = errors.New("txhook: non-2xx status")
)

// forbiddenError names the refused address and the rule that refused it.
type forbiddenError struct {
	ip   netip.Addr
	why  string
	host string // the name that resolved to ip, when there was one
}

func (e *forbiddenError) Error() string {
	s := "txhook: forbidden address " + e.ip.String() + " (" + e.why + ")"
	if e.host != "" {
		s = "txhook: host " + e.host + " resolves to forbidden address " + e.ip.String() + " (" + e.why + ")"
	}
	return s
}

func (e *forbiddenError) Is(target error) bool { return target == ErrForbiddenAddress }

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
