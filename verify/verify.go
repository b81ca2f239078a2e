package verify

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/txhook/txhook/signer"
)

// Scheme is the signature format a sender uses.
type Scheme int

const (
	// Standard is Standard Webhooks (webhook-id, webhook-timestamp,
	// webhook-signature), txhook's default. It signs the message id.
	Standard Scheme = iota
	// Stripe is one "t=<unix>,v1=<hex>" header. It does not sign the
	// message id, so the event ID is taken from the signed body.
	Stripe
)

func (s Scheme) String() string {
	switch s {
	case Standard:
		return "standard"
	case Stripe:
		return "stripe"
	}
	return fmt.Sprintf("Scheme(%d)", int(s))
}

// Errors of verification. The signature errors are signer's own values, so
// errors.Is works with either package's names.
var (
	ErrMissingHeader       = signer.ErrMissingHeader
	ErrMalformedHeader     = signer.ErrMalformedHeader
	ErrTimestampTooOld     = signer.ErrTimestampTooOld
	ErrTimestampTooNew     = signer.ErrTimestampTooNew
	ErrNoMatchingSignature = signer.ErrNoMatchingSignature
	// ErrInvalidSecret: a configured secret is unusable (New reports it).
	ErrInvalidSecret = signer.ErrInvalidSecret
	// ErrMalformedBody: the signature is good but the body is not an event
	// envelope: a JSON object with a string "type" (and, for Stripe, "id").
	ErrMalformedBody = errors.New("verify: body is not a webhook event")
)

// DefaultMaxBodyBytes is the middleware's body limit when
// Config.MaxBodyBytes is zero.
const DefaultMaxBodyBytes = 1 << 20

// DefaultLease is how long the middleware's dedup claim lasts when
// Config.Lease is zero.
const DefaultLease = 5 * time.Minute

// Config configures a Verifier. Only Secrets is required.
type Config struct {
	// Scheme is the sender's signature format; the zero value is Standard.
	Scheme Scheme
	// StripeHeader names the Stripe scheme's header; "" means
	// signer.DefaultStripeHeader ("X-Webhook-Signature").
	StripeHeader string
	// Secrets are the keys a signature may match: whsec_ secrets and whpk_
	// public keys (v1a, ed25519) for Standard, raw strings for Stripe. List
	// the old and the new one during a rotation; any match is enough.
	Secrets []string
	// Tolerance is how far the signed timestamp may be from Now, in either
	// direction; zero means 5 minutes. It is what stops replays.
	Tolerance time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	// The fields below only affect Middleware.

	// MaxBodyBytes caps the request body (413 over it); zero means
	// DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Types, if not empty, lists the event types the handler takes; others
	// are answered 200 without reaching it, so the sender stops retrying.
	Types []string
	// Store deduplicates deliveries by event ID; nil means no dedup.
	Store Store
	// Lease is how long a claim protects an event being processed, from
	// the start of the handler to Complete or Release; zero means
	// DefaultLease. If a receiver dies mid-way, retries get 409 until it
	// ends. Keep it above the slowest processing, asynchronous work included.
	Lease time.Duration
	// Logger receives rejections (at Info) and store failures (at Error);
	// nil means no logging. Secrets and signatures are never logged.
	Logger *slog.Logger
}

// Event is a verified delivery.
type Event struct {
	// ID is the deduplication key: the signed webhook-id header (Standard),
	// or the "id" member of the signed body (Stripe, whose header id is not
	// signed and could be changed by whoever replays a request).
	ID string
	// Type is the body's "type", such as "payment.succeeded". (The
	// Webhook-Event-Type header that txhook also sends is not signed, and
	// not used.)
	Type string
	// Timestamp is the body's "timestamp", when the event happened; zero if
	// absent or not RFC 3339.
	Timestamp time.Time
	// SignedAt is the signature's timestamp: when this attempt was sent.
	SignedAt time.Time
	// Data is the body's "data" member, as sent.
	Data json.RawMessage
	// Body is the raw body that was verified.
	Body []byte
}

// Verifier checks webhook requests against a Config. It is safe for
// concurrent use.
type Verifier struct {
	cfg     Config
	scheme  signer.Verifier
	secrets []string
	types   map[string]bool
	log     *slog.Logger
}

// New checks cfg and returns a Verifier. An unusable secret (including a
// whsk_ private key, which belongs with the sender only) is an error
// matching ErrInvalidSecret that names the secret by position only.
func New(cfg Config) (*Verifier, error) {
	v := &Verifier{cfg: cfg, secrets: append([]string(nil), cfg.Secrets...)}
	switch cfg.Scheme {
	case Standard:
		v.scheme = signer.Standard{Tolerance: cfg.Tolerance, Now: cfg.Now}
	case Stripe:
		v.scheme = signer.Stripe{Header: cfg.StripeHeader, Tolerance: cfg.Tolerance, Now: cfg.Now}
	default:
		return nil, fmt.Errorf("verify: unknown scheme %v", cfg.Scheme)
	}
	// signer checks the secrets before anything else, so verifying an
	// empty request reports exactly the configuration errors.
	if _, err := v.scheme.Verify(http.Header{}, nil, v.secrets); errors.Is(err, ErrInvalidSecret) {
		return nil, fmt.Errorf("verify: %w", err)
	}
	if cfg.MaxBodyBytes < 0 || cfg.Lease < 0 || cfg.Tolerance < 0 {
		return nil, errors.New("verify: MaxBodyBytes, Lease and Tolerance must not be negative")
	}
	if v.cfg.MaxBodyBytes == 0 {
		v.cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if v.cfg.Lease == 0 {
		v.cfg.Lease = DefaultLease
	}
	if len(cfg.Types) > 0 {
		v.types = make(map[string]bool, len(cfg.Types))
		for _, t := range cfg.Types {
			v.types[t] = true
		}
	}
	v.log = cfg.Logger
	if v.log == nil {
		v.log = slog.New(slog.DiscardHandler)
	}
	return v, nil
}

// Verify checks the signature headers h against the raw body, exactly as
// received, then reads the event envelope from it. Errors match the Err
// variables of this package and never contain a secret or a signature.
func (v *Verifier) Verify(h http.Header, body []byte) (Event, error) {
	msg, err := v.scheme.Verify(h, body, v.secrets)
	if err != nil {
		return Event{}, err
	}
	env, err := parseEnvelope(body)
	if err != nil {
		return Event{}, err
	}
	ev := Event{ID: msg.ID, Type: env.typ, Timestamp: env.ts, SignedAt: msg.Timestamp, Data: env.data, Body: body}
	if v.cfg.Scheme == Stripe {
		if env.id == "" {
			return Event{}, fmt.Errorf("%w: no \"id\" in the body, and the Stripe scheme does not sign the header id", ErrMalformedBody)
		}
		ev.ID = env.id
	}
	return ev, nil
}

type envelope struct {
	id, typ string
	ts      time.Time
	data    json.RawMessage
}

// parseEnvelope reads {"id","type","timestamp","data"}. Keys are matched
// exactly (encoding/json's struct decoding would also take "TYPE").
func parseEnvelope(body []byte) (envelope, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil || m == nil {
		return envelope{}, fmt.Errorf("%w: not a JSON object", ErrMalformedBody)
	}
	var env envelope
	if err := json.Unmarshal(m["type"], &env.typ); err != nil || env.typ == "" {
		return envelope{}, fmt.Errorf("%w: \"type\" is missing or not a string", ErrMalformedBody)
	}
	if raw, ok := m["id"]; ok {
		if err := json.Unmarshal(raw, &env.id); err != nil {
			return envelope{}, fmt.Errorf("%w: \"id\" is not a string", ErrMalformedBody)
		}
	}
	var ts string
	if json.Unmarshal(m["timestamp"], &ts) == nil {
		env.ts, _ = time.Parse(time.RFC3339Nano, ts)
	}
	env.data = m["data"]
	return env, nil
}
