package signer

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultStripeHeader is the signature header of the Stripe scheme when
// Stripe.Header is empty.
const DefaultStripeHeader = "X-Webhook-Signature"

// minStripeSecret is the shortest raw secret Stripe accepts. Stripe secrets
// are used as given, so this counts characters, not entropy; it mostly
// catches placeholders like "secret" (and FIPS 140-only mode panics on HMAC
// keys under 14 bytes).
const minStripeSecret = 16

// Stripe is the Stripe-style scheme, for receivers that already verify
// Stripe-like signatures: one header (Header, "X-Webhook-Signature" by
// default) holding "t=<unix>,v1=<hex>[,v1=<hex>...]", each v1 an
// HMAC-SHA256 over "t.body" keyed with a secret string's bytes as given
// (a "whsec_..." string included, prefix and all). Sign also sets
// webhook-id to the message id for deduplication.
//
// That id is not signed: anyone replaying a captured request inside the
// tolerance window can change it. Receivers of this scheme should
// deduplicate on an id inside the signed body; the Standard scheme has no
// such gap.
//
// The zero value is ready to use; Tolerance and Now only affect Verify.
type Stripe struct {
	// Header is the name of the signature header; empty means
	// DefaultStripeHeader. The article txhook follows uses
	// "X-Kxp-Signature".
	Header string
	// Tolerance is how far t may be from Now, in either direction. Zero (or
	// negative) means DefaultTolerance.
	Tolerance time.Duration
	// Now is the verifier's clock; nil means time.Now.
	Now func() time.Time
}

var (
	_ Signer   = Stripe{}
	_ Verifier = Stripe{}
)

func (s Stripe) header() string {
	if s.Header == "" {
		return DefaultStripeHeader
	}
	return http.CanonicalHeaderKey(s.Header)
}

// checkStripeSecret refuses secrets too short to be real and Standard
// Webhooks keys: an ed25519 key used as an HMAC secret would hand the
// private key to the receiver, or let anyone who has the public key forge.
func checkStripeSecret(s string) error {
	switch {
	case strings.HasPrefix(s, prefixPublic), strings.HasPrefix(s, prefixPrivate):
		return errors.New("an ed25519 key cannot be a Stripe-scheme secret")
	case strings.ContainsAny(s, "\r\n"):
		// Most likely a secret file's trailing newline, which would sign
		// with a key the receiver does not have.
		return errors.New("contains a line break")
	case len(s) < minStripeSecret:
		return fmt.Errorf("shorter than %d bytes", minStripeSecret)
	}
	return nil
}

// Sign implements Signer. Each secret yields one v1 entry. Secrets must be at
// least 16 bytes, without line breaks, and not whsk_ or whpk_ keys; id and ts
// follow the rules of Standard.Sign. On any error h is left untouched.
func (s Stripe) Sign(h http.Header, id string, ts time.Time, body []byte, secrets []string) error {
	sec, err := signArgs(h, id, ts, secrets)
	if err != nil {
		return err
	}
	for i, secret := range secrets {
		if err := checkStripeSecret(secret); err != nil {
			return secretError(i, err)
		}
	}

	// "ts." followed by room for the MAC, as in Standard.Sign.
	buf := make([]byte, 0, 20+len(".")+sha256.Size)
	buf = strconv.AppendInt(buf, sec, 10)
	prefix := append(buf, '.')
	digits := prefix[:len(prefix)-1]

	var v strings.Builder
	v.Grow(len("t=") + len(digits) + len(secrets)*(len(",v1=")+hex.EncodedLen(sha256.Size)))
	v.WriteString("t=")
	v.Write(digits)
	for _, secret := range secrets {
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write(prefix)
		mac.Write(body)
		var enc [64]byte
		hex.Encode(enc[:], mac.Sum(prefix[len(prefix):]))
		v.WriteString(",v1=")
		v.Write(enc[:])
	}
	vals := [...]string{v.String(), id}
	h[s.header()] = vals[0:1:1]
	h[HeaderID] = vals[1:2:2]
	return nil
}

// Verify implements Verifier. secrets are raw secret strings. Elements of the
// header other than t and v1 are ignored, as are v1 values that are not 64
// hex digits; at most 32 elements are read. Message.ID is the webhook-id
// header if present, which this scheme does not sign (see Stripe).
func (s Stripe) Verify(h http.Header, body []byte, secrets []string) (Message, error) {
	if len(secrets) == 0 {
		return Message{}, fmt.Errorf("%w: no secrets", ErrInvalidSecret)
	}
	for i, secret := range secrets {
		if err := checkStripeSecret(secret); err != nil {
			return Message{}, secretError(i, err)
		}
	}
	name := s.header()
	v, err := headerValue(h, name)
	if err != nil {
		return Message{}, err
	}
	id, err := headerValue(h, HeaderID)
	switch {
	case errors.Is(err, ErrMissingHeader):
		id = ""
	case err != nil:
		return Message{}, err
	default:
		if reason := checkID(id); reason != "" {
			return Message{}, fmt.Errorf("%w: %s", ErrMalformedHeader, reason)
		}
	}
	var sigs [maxEntries][sha256.Size]byte
	tsStr, n, err := parseStripeHeader(v, &sigs)
	if err != nil {
		return Message{}, fmt.Errorf("%w (%s)", err, name)
	}
	ts, err := checkTimestamp(tsStr, s.Now, s.Tolerance)
	if err != nil {
		return Message{}, err
	}
	if n == 0 {
		return Message{}, fmt.Errorf("%w: %s has no usable v1 entry", ErrNoMatchingSignature, name)
	}

	buf := make([]byte, 0, len(tsStr)+1+sha256.Size)
	prefix := append(append(buf, tsStr...), '.')
	for _, secret := range secrets {
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write(prefix)
		mac.Write(body)
		sum := mac.Sum(prefix[len(prefix):])
		for i := range sigs[:n] {
			if hmac.Equal(sigs[i][:], sum) {
				return Message{ID: id, Timestamp: ts, Body: body}, nil
			}
		}
	}
	return Message{}, ErrNoMatchingSignature
}

// parseStripeHeader reads "t=<unix>,v1=<hex>,..." into the timestamp string
// and the decoded v1 signatures. Whitespace around elements is tolerated and
// elements without '=' or with unknown keys are skipped. A missing, empty or
// repeated t is ErrMalformedHeader: with two timestamps there is no telling
// which one was signed.
func parseStripeHeader(v string, out *[maxEntries][sha256.Size]byte) (ts string, n int, err error) {
	seenT := false
	for seen := 0; v != "" && seen < maxEntries; {
		var el string
		el, v, _ = strings.Cut(v, ",")
		el = strings.Trim(el, " \t")
		if el == "" {
			continue
		}
		seen++
		k, val, ok := strings.Cut(el, "=")
		if !ok {
			continue
		}
		switch k {
		case "t":
			if seenT {
				return "", 0, fmt.Errorf("%w: more than one t=", ErrMalformedHeader)
			}
			seenT, ts = true, val
		case "v1":
			if len(val) != hex.EncodedLen(sha256.Size) {
				continue
			}
			var src [64]byte
			copy(src[:], val)
			if _, err := hex.Decode(out[n][:], src[:]); err != nil {
				continue
			}
			n++
		}
	}
	if ts == "" {
		return "", 0, fmt.Errorf("%w: no t=", ErrMalformedHeader)
	}
	return ts, n, nil
}
