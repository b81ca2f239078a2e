package signer

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Signer signs outgoing webhook requests.
type Signer interface {
	// Sign sets the scheme's headers on h for one delivery attempt of message
	// id with body, signed at ts, with every secret in secrets (an endpoint
	// has more than one during a rotation overlap: one signature per secret
	// in one header).
	Sign(h http.Header, id string, ts time.Time, body []byte, secrets []string) error
}

// Verifier checks incoming webhook requests.
type Verifier interface {
	// Verify checks h and the raw body against secrets (whsec_ secrets, whpk_
	// public keys, or for Stripe raw secret strings). Any one matching
	// signature is enough (rotation overlap).
	Verify(h http.Header, body []byte, secrets []string) (Message, error)
}

// Message is what Verify vouches for.
type Message struct {
	// ID is the webhook-id header. It is covered by the signature in the
	// Standard scheme but not in the Stripe scheme.
	ID        string
	Timestamp time.Time // UTC, whole seconds
	Body      []byte    // the body passed to Verify, not a copy
}

// Header names as http.Header stores them. The Standard Webhooks spec writes
// them in lower case; header names are case-insensitive on the wire.
const (
	HeaderID        = "Webhook-Id"
	HeaderTimestamp = "Webhook-Timestamp"
	HeaderSignature = "Webhook-Signature"
)

// DefaultTolerance is how far a signed timestamp may be from the verifier's
// clock, in either direction, when a scheme's Tolerance is zero.
const DefaultTolerance = 5 * time.Minute

// maxEntries caps how many signature entries Verify reads from one header.
// Matching a v1a entry costs an ed25519 verification per public key, so an
// attacker must not be able to choose how many of them we do. A sender puts
// one entry per secret in use, which is two during a rotation.
const maxEntries = 32

var (
	// ErrMissingHeader: a header the scheme needs is absent or empty.
	ErrMissingHeader = errors.New("signer: missing header")
	// ErrMalformedHeader: a header is present but cannot be read.
	ErrMalformedHeader = errors.New("signer: malformed header")
	// ErrTimestampTooOld: the signed timestamp is further in the past than
	// the tolerance allows.
	ErrTimestampTooOld = errors.New("signer: timestamp too old")
	// ErrTimestampTooNew: the signed timestamp is further in the future than
	// the tolerance allows.
	ErrTimestampTooNew = errors.New("signer: timestamp too new")
	// ErrNoMatchingSignature: the headers are well formed but no signature
	// in them was made with any of the given secrets over this body.
	ErrNoMatchingSignature = errors.New("signer: no matching signature")
	// ErrInvalidSecret: a secret or key is unusable for the operation, or
	// none was given. This is a configuration error, not a bad request.
	ErrInvalidSecret = errors.New("signer: invalid secret")
)

// checkTimestamp parses a unix-seconds header value and checks it against the
// clock. Only canonical decimal is accepted (no sign, no leading zeros, no
// spaces), so the string that is signed can only be spelled one way.
func checkTimestamp(s string, now func() time.Time, tolerance time.Duration) (time.Time, error) {
	if !canonicalUint(s) {
		return time.Time{}, fmt.Errorf("%w: timestamp is not a non-negative integer in canonical form", ErrMalformedHeader)
	}
	sec, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: timestamp out of range", ErrMalformedHeader)
	}
	if sec > maxUnix {
		// time.Unix would wrap around into the past.
		return time.Time{}, fmt.Errorf("%w: timestamp after year 9999", ErrTimestampTooNew)
	}
	ts := time.Unix(sec, 0).UTC()
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	var t time.Time
	if now != nil {
		t = now()
	} else {
		t = time.Now()
	}
	// time.Time.Sub saturates instead of overflowing, so absurd timestamps
	// land on the right side of the window.
	if d := t.Sub(ts); d > tolerance {
		return time.Time{}, fmt.Errorf("%w: %s behind the verifier's clock, tolerance %s", ErrTimestampTooOld, d.Truncate(time.Second), tolerance)
	}
	if d := ts.Sub(t); d > tolerance {
		return time.Time{}, fmt.Errorf("%w: %s ahead of the verifier's clock, tolerance %s", ErrTimestampTooNew, d.Truncate(time.Second), tolerance)
	}
	return ts, nil
}

// maxUnix is 9999-12-31T23:59:59Z.
const maxUnix = 253402300799

func canonicalUint(s string) bool {
	if s == "" || len(s) > 19 || (s[0] == '0' && len(s) > 1) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// headerValue returns the single value of header name. http.Header from
// net/http is already canonical; the fallback scan serves headers that callers
// assembled by hand, e.g. from a serverless event. Repeated headers are
// refused: with two ids or two timestamps there is no telling which one the
// sender signed.
func headerValue(h http.Header, name string) (string, error) {
	vals := h[name]
	if len(vals) == 0 {
		for k, v := range h {
			if len(v) > 0 && strings.EqualFold(k, name) {
				if len(vals) > 0 {
					return "", fmt.Errorf("%w: %s appears more than once", ErrMalformedHeader, name)
				}
				vals = v
			}
		}
	}
	switch len(vals) {
	case 0:
		return "", fmt.Errorf("%w: %s", ErrMissingHeader, name)
	case 1:
	default:
		return "", fmt.Errorf("%w: %s appears more than once", ErrMalformedHeader, name)
	}
	v := strings.Trim(vals[0], " \t")
	if v == "" {
		return "", fmt.Errorf("%w: %s is empty", ErrMissingHeader, name)
	}
	return v, nil
}

// checkID refuses ids that would make the signed content ambiguous or that an
// HTTP client would refuse to send. The Standard Webhooks spec forbids '.'
// in ids because "id.timestamp.body" must split only one way.
// It returns a reason for the caller to wrap, or "".
func checkID(id string) string {
	if id == "" {
		return "empty message id"
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c >= 0x7f || c == '.' {
			return fmt.Sprintf("message id %q: only printable ASCII without spaces or '.' is allowed", truncate(id, 64))
		}
	}
	return ""
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// unixSeconds formats ts for signing; negative values are refused because
// no verifier accepts them.
func unixSeconds(ts time.Time) (int64, error) {
	sec := ts.Unix()
	if sec < 0 {
		return 0, fmt.Errorf("signer: timestamp %s is before 1970", ts.UTC().Format(time.RFC3339))
	}
	return sec, nil
}

// signArgs checks what every scheme's Sign takes and returns ts in unix
// seconds.
func signArgs(h http.Header, id string, ts time.Time, secrets []string) (int64, error) {
	if h == nil {
		return 0, errors.New("signer: nil http.Header")
	}
	if reason := checkID(id); reason != "" {
		return 0, errors.New("signer: " + reason)
	}
	sec, err := unixSeconds(ts)
	if err != nil {
		return 0, err
	}
	if len(secrets) == 0 {
		return 0, fmt.Errorf("%w: no secrets", ErrInvalidSecret)
	}
	return sec, nil
}
