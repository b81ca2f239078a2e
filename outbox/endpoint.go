package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/oklog/ulid/v2"

	"github.com/txhook/txhook/internal/safehttp"
	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/signer"
)

// Endpoint is a tenant's webhook receiver.
type Endpoint struct {
	ID          string
	Tenant      string
	URL         string
	Description string
	// EventTypes are the subscribed types: exact names and "prefix.*"
	// wildcards ("*" alone matches everything). Empty means every type.
	EventTypes []string
	// Secrets sign each request, newest first; expired ones are skipped.
	// There is more than one during a rotation overlap.
	Secrets        []Secret
	Enabled        bool
	DisabledReason string
	// Limits protect the receiver; see Limits.
	Limits Limits
	// Versions pins schema versions by event type: events of a pinned type
	// are converted to that version before they are sent (see Catalog).
	Versions map[string]int
	// Headers are sent with every request (see NewEndpoint.Headers),
	// read back decrypted like Secrets; nil for none.
	Headers Headers
	// ClientCert is the certificate presented to the endpoint, without its
	// key; nil for none.
	ClientCert *ClientCert
	// FailingSince is when the current run of failed attempts began (the
	// start of the first failed attempt after the last success); zero
	// when the endpoint is not failing. It is what DisableAfter measures.
	FailingSince time.Time
	// LastSuccessAt and LastFailureAt are the start of the endpoint's
	// latest successful and latest failed attempt, as the relays record
	// them from every attempt they write; zero when there was none. The
	// endpoint is failing when LastFailureAt is the later one.
	LastSuccessAt time.Time
	LastFailureAt time.Time
	CreatedAt     time.Time
	UpdatedAt     time.Time
}

// Limits protect one receiver from the relays. They are enforced by each
// relay process on its own: with several relays, an endpoint can see up to
// that many times the limits, so divide them by the number of relays.
type Limits struct {
	// RatePerSecond caps requests per second to the endpoint, with bursts
	// of Burst; zero means no cap. Deliveries that would exceed it wait,
	// spending no attempt.
	RatePerSecond float64
	// Burst is how many requests may go at once above the rate; zero means
	// the rate rounded up (at least 1).
	Burst int
	// MaxInFlight caps requests in flight to the endpoint; zero means the
	// relay's EndpointConcurrency (which also caps this).
	MaxInFlight int
}

func (l Limits) check() error {
	// Written so that NaN, which fails every comparison, is out of range.
	if !(l.RatePerSecond >= 0 && l.RatePerSecond <= 1e6) || l.Burst < 0 || l.Burst > 1e6 || l.MaxInFlight < 0 || l.MaxInFlight > 10000 {
		return fmt.Errorf("%w: limits out of range (rate 0..1e6/s, burst 0..1e6, in flight 0..10000)", ErrInvalidEndpoint)
	}
	return nil
}

// Secret is an endpoint's signing secret. Its String, LogValue and
// MarshalJSON methods mask it, so printing, logging or serialising an
// Endpoint never leaks it; read Value to show it to its owner.
type Secret struct {
	Value     string
	ExpiresAt time.Time // zero: does not expire
	// CreatedAt is when the secret was set (by CreateEndpoint or
	// RotateSecret); zero for secrets stored before txhook recorded it.
	CreatedAt time.Time
}

// Active reports whether the secret still signs at t.
func (s Secret) Active(t time.Time) bool { return s.ExpiresAt.IsZero() || t.Before(s.ExpiresAt) }

// Masked returns the secret's prefix and last four characters.
func (s Secret) Masked() string {
	v := s.Value
	prefix := ""
	if i := strings.IndexByte(v, '_'); i >= 0 && i < 6 {
		prefix, v = v[:i+1], v[i+1:]
	}
	if len(v) <= 8 {
		return prefix + "****"
	}
	return prefix + "****" + v[len(v)-4:]
}

// String returns the masked secret.
func (s Secret) String() string { return s.Masked() }

// GoString returns the masked secret, for %#v.
func (s Secret) GoString() string { return "outbox.Secret{" + s.Masked() + "}" }

// LogValue returns the masked secret for log/slog.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.Masked()) }

// MarshalJSON writes the masked secret and its expiry.
func (s Secret) MarshalJSON() ([]byte, error) {
	v := struct {
		Masked    string     `json:"masked"`
		ExpiresAt *time.Time `json:"expires_at,omitempty"`
	}{Masked: s.Masked()}
	if !s.ExpiresAt.IsZero() {
		v.ExpiresAt = &s.ExpiresAt
	}
	return json.Marshal(v)
}

// storedSecret is the database form of a Secret.
type storedSecret struct {
	Secret    string     `json:"secret"`
	ExpiresAt *time.Time `json:"expires_at"`
	CreatedAt *time.Time `json:"created_at,omitempty"`
}

func encodeSecrets(ss []Secret) []byte {
	out := make([]storedSecret, len(ss))
	for i, s := range ss {
		out[i].Secret = s.Value
		if !s.ExpiresAt.IsZero() {
			t := s.ExpiresAt.UTC()
			out[i].ExpiresAt = &t
		}
		if !s.CreatedAt.IsZero() {
			t := s.CreatedAt.UTC()
			out[i].CreatedAt = &t
		}
	}
	b, _ := json.Marshal(out)
	return b
}

func decodeSecrets(b []byte) ([]Secret, error) {
	var in []storedSecret
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, fmt.Errorf("txhook: stored secrets: %w", err)
	}
	out := make([]Secret, len(in))
	for i, s := range in {
		out[i].Value = s.Secret
		if s.ExpiresAt != nil {
			out[i].ExpiresAt = s.ExpiresAt.UTC()
		}
		if s.CreatedAt != nil {
			out[i].CreatedAt = s.CreatedAt.UTC()
		}
	}
	return out, nil
}

// NewEndpoint describes an endpoint to create.
type NewEndpoint struct {
	Tenant      string
	URL         string
	Description string
	EventTypes  []string
	// Secret signs requests. Empty means a new "whsec_" secret from
	// crypto/rand (recommended). A supplied secret is a Standard Webhooks
	// "whsec_" secret or "whsk_" ed25519 key, or, for the Stripe-style
	// scheme only, any string of 16 to 128 printable characters.
	Secret string
	// Limits protect the receiver; the zero value sets none beyond the
	// relay's EndpointConcurrency.
	Limits Limits
	// Versions pins schema versions by event type.
	Versions map[string]int
	// Headers are sent with every request, for receivers that want their
	// own credentials (an Authorization header) or routing headers. At
	// most MaxEndpointHeaders, names RFC 9110 tokens, values printable
	// ASCII (MaxEndpointHeaderValue bytes each, MaxEndpointHeaderBytes in
	// all). Names that txhook sets or that belong to the connection are
	// refused with ErrReservedHeader: Content-Type, Content-Length,
	// Content-Encoding, Transfer-Encoding, Host, User-Agent, traceparent,
	// tracestate, baggage, the hop-by-hop headers (Connection, Keep-Alive,
	// TE, Trailer, Upgrade, Expect), Proxy-*, and every Webhook-* and
	// X-Webhook-* name. Authorization is allowed. The relay sets its own
	// headers after these, so a custom signature header name configured
	// on the relay's signer also wins. Headers are stored like secrets:
	// with Config.SecretCipher, the whole set encrypted as one value bound
	// to the endpoint, decrypted by relays in memory only.
	Headers Headers
	// ClientCert, if set, is presented to the endpoint when its server
	// asks for a client certificate (mTLS); refused with
	// ErrInvalidClientCert if unreadable, mismatched or expired.
	ClientCert *ClientCert
}

// EndpointUpdate changes an endpoint; nil fields are left as they are.
type EndpointUpdate struct {
	URL         *string
	Description *string
	EventTypes  *[]string
	Limits      *Limits
	Versions    *map[string]int
	// Headers replaces every custom header; an empty map removes them.
	Headers *Headers
	// ClientCert replaces the client certificate; one with an empty
	// CertPEM removes it.
	ClientCert *ClientCert
}

func (o *Outbox) checkVersions(v map[string]int) ([]byte, error) {
	if len(v) > 1000 {
		return nil, fmt.Errorf("%w: more than 1000 pinned versions", ErrInvalidEndpoint)
	}
	for typ, n := range v {
		if !typePattern.MatchString(typ) || n < 1 || n > math.MaxInt32 {
			return nil, fmt.Errorf("%w: pinned version %.64q: %d", ErrInvalidEndpoint, typ, n)
		}
		if c := o.cfg.Catalog; c != nil && !c.has(typ, n) {
			return nil, fmt.Errorf("%w: %.64q version %d", ErrUnknownEventType, typ, n)
		}
	}
	if v == nil {
		v = map[string]int{}
	}
	return json.Marshal(v)
}

var eventTypePattern = regexp.MustCompile(`^(\*|[A-Za-z0-9][A-Za-z0-9_.:-]{0,254}|[A-Za-z0-9][A-Za-z0-9_.:-]{0,252}\.\*)$`)

func checkEventTypes(types []string) ([]byte, error) {
	if types == nil {
		types = []string{}
	}
	if len(types) > 100 {
		return nil, fmt.Errorf("%w: more than 100 event types", ErrInvalidEndpoint)
	}
	for _, t := range types {
		if !eventTypePattern.MatchString(t) {
			return nil, fmt.Errorf("%w: event type %.64q: use a name such as payment.succeeded, a wildcard such as payment.*, or *", ErrInvalidEndpoint, t)
		}
	}
	return json.Marshal(types)
}

func checkSecret(s string) error {
	if strings.HasPrefix(s, "whsec_") || strings.HasPrefix(s, "whsk_") || strings.HasPrefix(s, "whpk_") {
		return signer.ValidateSecret(s)
	}
	if len(s) < 16 || len(s) > 128 || !printable(s) || strings.ContainsAny(s, " \t") {
		return fmt.Errorf("%w: want a whsec_ secret, a whsk_ key, or 16 to 128 printable characters", ErrInvalidSecret)
	}
	return nil
}

func (o *Outbox) checkURL(ctx context.Context, u string) error {
	if len(u) > 2048 {
		return fmt.Errorf("%w: longer than 2048 bytes", ErrInvalidURL)
	}
	// url.Parse refuses control characters but passes any other byte, and
	// PostgreSQL text refuses invalid UTF-8.
	if !utf8Valid(u) {
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidURL)
	}
	return explainTarget(safehttp.CheckURL(ctx, u, o.target))
}

// checkClientCert validates c, the client certificate of endpoint
// endpointID, and returns its stored form ("" for none): the key encrypted
// when Config.SecretCipher is set.
func (o *Outbox) checkClientCert(ctx context.Context, endpointID string, c ClientCert) (certPEM, storedKey string, err error) {
	if len(c.CertPEM) == 0 {
		if len(c.KeyPEM) != 0 {
			return "", "", fmt.Errorf("%w: %w: a key without a certificate", ErrInvalidEndpoint, ErrInvalidClientCert)
		}
		return "", "", nil
	}
	if err := c.check(o.clock.Now()); err != nil {
		return "", "", err
	}
	key, err := o.seal(ctx, colClientKey, endpointID, bytes.Clone(c.KeyPEM))
	if err != nil {
		return "", "", err
	}
	return string(c.CertPEM), string(key), nil
}

// CreateEndpoint registers an endpoint. The URL is checked: absolute
// http(s), https unless Config.AllowHTTP, and, unless
// Config.AllowPrivateTargets, a host that resolves only to public
// addresses (or to Config.AllowedTargets). Errors match ErrInvalidURL,
// ErrInsecureURL, ErrForbiddenTarget, ErrHostNotFound (the name does not
// exist), ErrDNSUnavailable (the lookup failed for a passing reason: try
// again), ErrInvalidEndpoint (with ErrReservedHeader or
// ErrInvalidClientCert for those fields) or ErrInvalidSecret.
func (o *Outbox) CreateEndpoint(ctx context.Context, ne NewEndpoint) (Endpoint, error) {
	return o.createEndpoint(ctx, ne, nil)
}

// createEndpoint is CreateEndpoint; audit, if not nil, gives the audit row
// written in the endpoint's insert transaction.
func (o *Outbox) createEndpoint(ctx context.Context, ne NewEndpoint, audit func(id string) store.AuditRow) (Endpoint, error) {
	if ne.Tenant == "" || len(ne.Tenant) > 255 || !printable(ne.Tenant) {
		return Endpoint{}, fmt.Errorf("%w: tenant must be 1 to 255 printable characters", ErrInvalidEndpoint)
	}
	if len(ne.Description) > 1024 || !utf8Valid(ne.Description) {
		return Endpoint{}, fmt.Errorf("%w: description must be UTF-8 of at most 1024 bytes", ErrInvalidEndpoint)
	}
	types, err := checkEventTypes(ne.EventTypes)
	if err != nil {
		return Endpoint{}, err
	}
	versions, err := o.checkVersions(ne.Versions)
	if err != nil {
		return Endpoint{}, err
	}
	if err := ne.Limits.check(); err != nil {
		return Endpoint{}, err
	}
	headers, err := checkHeaders(ne.Headers)
	if err != nil {
		return Endpoint{}, err
	}
	now := o.clock.Now().UTC()
	id := "ep_" + ulid.MustNew(ulid.Timestamp(now), ulid.DefaultEntropy()).String()
	var certPEM, keyPEM string
	if ne.ClientCert != nil {
		if certPEM, keyPEM, err = o.checkClientCert(ctx, id, *ne.ClientCert); err != nil {
			return Endpoint{}, err
		}
	}
	if err := o.checkURL(ctx, ne.URL); err != nil {
		return Endpoint{}, err
	}
	secret := ne.Secret
	if secret == "" {
		if secret, err = signer.GenerateSecret(); err != nil {
			return Endpoint{}, err
		}
	} else if err := checkSecret(secret); err != nil {
		return Endpoint{}, err
	}
	secrets := []Secret{{Value: secret, CreatedAt: now}}
	stored, err := o.sealSecrets(ctx, id, secrets)
	if err != nil {
		return Endpoint{}, err
	}
	var plainHeaders Headers
	if err := json.Unmarshal(headers, &plainHeaders); err != nil {
		return Endpoint{}, err
	}
	if headers, err = o.sealHeaders(ctx, id, headers); err != nil {
		return Endpoint{}, err
	}
	row := store.EndpointRow{
		ID:          id,
		Tenant:      ne.Tenant,
		URL:         ne.URL,
		Description: ne.Description,
		EventTypes:  types,
		Secrets:     stored,
		Enabled:     true,
		RateLimit:   ne.Limits.RatePerSecond,
		RateBurst:   ne.Limits.Burst,
		MaxInFlight: ne.Limits.MaxInFlight,
		Versions:    versions,
		Headers:     headers,
		ClientCert:  certPEM,
		ClientKey:   keyPEM,
		CreatedAt:   now,
		UpdatedAt:   now,
	}
	if err := o.withAudit(ctx, audit, id, func(q store.Querier) error { return o.st.InsertEndpoint(ctx, q, row) }); err != nil {
		return Endpoint{}, fmt.Errorf("txhook: create endpoint: %w", err)
	}
	e, err := endpointFromRow(row)
	if err != nil {
		return Endpoint{}, err
	}
	e.Secrets = secrets
	if len(plainHeaders) > 0 {
		e.Headers = plainHeaders
	}
	return e, nil
}

// UpdateEndpoint changes an endpoint's URL, description, event types,
// limits, pinned versions, headers or client certificate. Deliveries already queued go to the new URL,
// in the pinned version, from their next attempt.
func (o *Outbox) UpdateEndpoint(ctx context.Context, id string, up EndpointUpdate) (Endpoint, error) {
	row, err := o.endpointRow(ctx, id)
	if err != nil {
		return Endpoint{}, err
	}
	return o.updateEndpoint(ctx, row, up, nil)
}

// updateEndpoint applies up to row; audit, if not nil, gives the audit row
// written in the update's transaction.
func (o *Outbox) updateEndpoint(ctx context.Context, row store.EndpointRow, up EndpointUpdate, audit func(id string) store.AuditRow) (Endpoint, error) {
	id := row.ID
	var err error
	if up.URL != nil {
		if err := o.checkURL(ctx, *up.URL); err != nil {
			return Endpoint{}, err
		}
		row.URL = *up.URL
	}
	if up.Description != nil {
		if len(*up.Description) > 1024 || !utf8Valid(*up.Description) {
			return Endpoint{}, fmt.Errorf("%w: description must be UTF-8 of at most 1024 bytes", ErrInvalidEndpoint)
		}
		row.Description = *up.Description
	}
	if up.EventTypes != nil {
		if row.EventTypes, err = checkEventTypes(*up.EventTypes); err != nil {
			return Endpoint{}, err
		}
	}
	if up.Limits != nil {
		if err := up.Limits.check(); err != nil {
			return Endpoint{}, err
		}
		row.RateLimit, row.RateBurst, row.MaxInFlight = up.Limits.RatePerSecond, up.Limits.Burst, up.Limits.MaxInFlight
	}
	if up.Versions != nil {
		if row.Versions, err = o.checkVersions(*up.Versions); err != nil {
			return Endpoint{}, err
		}
	}
	if up.Headers != nil {
		if row.Headers, err = checkHeaders(*up.Headers); err != nil {
			return Endpoint{}, err
		}
		if row.Headers, err = o.sealHeaders(ctx, id, row.Headers); err != nil {
			return Endpoint{}, err
		}
	}
	if up.ClientCert != nil {
		if row.ClientCert, row.ClientKey, err = o.checkClientCert(ctx, id, *up.ClientCert); err != nil {
			return Endpoint{}, err
		}
	}
	row.UpdatedAt = o.clock.Now().UTC()
	if err := o.withAudit(ctx, audit, id, func(q store.Querier) error { return o.st.UpdateEndpoint(ctx, q, row) }); err != nil {
		return Endpoint{}, o.endpointErr(id, err)
	}
	return o.endpointOut(ctx, row)
}

// DisableEndpoint stops deliveries to an endpoint. Its queued deliveries
// wait, spending no attempts, until it is enabled again; events enqueued
// while it is disabled are not queued for it: Recover queues them once it
// is enabled again. The reason is kept for operators: UTF-8 without NUL
// (ErrInvalidEndpoint otherwise), shortened to at most 1024 bytes at a
// character boundary.
func (o *Outbox) DisableEndpoint(ctx context.Context, id, reason string) error {
	if err := checkEndpointID(id); err != nil {
		return err
	}
	if !utf8Valid(reason) {
		return fmt.Errorf("%w: disable reason must be UTF-8 without NUL", ErrInvalidEndpoint)
	}
	reason = truncateUTF8(reason, 1024)
	return o.endpointErr(id, o.st.SetEndpointEnabled(ctx, id, false, reason, o.clock.Now()))
}

// truncateUTF8 shortens valid UTF-8 s to at most n bytes without cutting a
// character.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// EnableEndpoint resumes deliveries to an endpoint; the deliveries that
// waited while it was disabled become due at once.
func (o *Outbox) EnableEndpoint(ctx context.Context, id string) error {
	if err := checkEndpointID(id); err != nil {
		return err
	}
	err := o.st.SetEndpointEnabled(ctx, id, true, "", o.clock.Now())
	if err == nil {
		o.wake(ctx)
	}
	return o.endpointErr(id, err)
}

// DeleteEndpoint removes an endpoint and its unfinished deliveries. Its
// dead letters remain for the record but can no longer be replayed.
func (o *Outbox) DeleteEndpoint(ctx context.Context, id string) error {
	if err := checkEndpointID(id); err != nil {
		return err
	}
	return o.endpointErr(id, o.st.DeleteEndpoint(ctx, id))
}

// Endpoint returns one endpoint.
func (o *Outbox) Endpoint(ctx context.Context, id string) (Endpoint, error) {
	row, err := o.endpointRow(ctx, id)
	if err != nil {
		return Endpoint{}, err
	}
	return o.endpointOut(ctx, row)
}

// Endpoints returns a tenant's endpoints.
func (o *Outbox) Endpoints(ctx context.Context, tenant string) ([]Endpoint, error) {
	if !utf8Valid(tenant) {
		return []Endpoint{}, nil // no endpoint can have it, and PostgreSQL would refuse the query
	}
	rows, err := o.st.ListEndpoints(ctx, tenant, false)
	if err != nil {
		return nil, err
	}
	out := make([]Endpoint, 0, len(rows))
	for _, r := range rows {
		e, err := o.endpointOut(ctx, r)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

func (o *Outbox) endpointRow(ctx context.Context, id string) (store.EndpointRow, error) {
	if err := checkEndpointID(id); err != nil {
		return store.EndpointRow{}, err
	}
	row, err := o.st.GetEndpoint(ctx, o.db, id)
	return row, o.endpointErr(id, err)
}

// checkEndpointID refuses, as not found, an ID that no endpoint can have
// and that PostgreSQL would refuse to compare.
func checkEndpointID(id string) error {
	if !utf8Valid(id) {
		return fmt.Errorf("%w: %.64q", ErrEndpointNotFound, id)
	}
	return nil
}

func (o *Outbox) endpointErr(id string, err error) error {
	if err == nil {
		return nil
	}
	if store.IsNotFound(err) {
		return fmt.Errorf("%w: %.64q", ErrEndpointNotFound, id)
	}
	return err
}

// wake tells relays that deliveries became due outside Enqueue.
func (o *Outbox) wake(ctx context.Context) {
	if o.st.Dialect == store.SQLite {
		o.st.WakeLocal()
		return
	}
	if o.cfg.NotifyInterval > 0 {
		_, _ = o.db.ExecContext(ctx, "SELECT pg_notify('"+store.WakeChannel+"', '')")
	}
}

// endpointOut is the endpoint of row r with its secrets and headers
// decrypted.
func (o *Outbox) endpointOut(ctx context.Context, r store.EndpointRow) (Endpoint, error) {
	e, err := endpointFromRow(r)
	if err != nil {
		return Endpoint{}, err
	}
	if e.Secrets, err = o.openSecrets(ctx, r.ID, r.Secrets); err != nil {
		return Endpoint{}, err
	}
	if e.Headers, err = o.openHeaders(ctx, r.ID, r.Headers); err != nil {
		return Endpoint{}, err
	}
	return e, nil
}

// endpointFromRow is the endpoint of row r without its secrets and
// headers, which are stored encrypted when a Cipher is configured (see
// endpointOut).
func endpointFromRow(r store.EndpointRow) (Endpoint, error) {
	e := Endpoint{
		ID: r.ID, Tenant: r.Tenant, URL: r.URL, Description: r.Description,
		Enabled: r.Enabled, DisabledReason: r.DisabledReason, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt,
		Limits:       Limits{RatePerSecond: r.RateLimit, Burst: r.RateBurst, MaxInFlight: r.MaxInFlight},
		FailingSince: r.FailingSince, LastSuccessAt: r.LastSuccessAt, LastFailureAt: r.LastFailureAt,
	}
	if err := json.Unmarshal(r.EventTypes, &e.EventTypes); err != nil {
		return Endpoint{}, fmt.Errorf("txhook: stored event types: %w", err)
	}
	if len(r.Versions) > 0 {
		if err := json.Unmarshal(r.Versions, &e.Versions); err != nil {
			return Endpoint{}, fmt.Errorf("txhook: stored versions: %w", err)
		}
	}
	if r.ClientCert != "" {
		e.ClientCert = &ClientCert{CertPEM: []byte(r.ClientCert)}
	}
	return e, nil
}

// utf8Valid reports whether s is valid UTF-8 without NUL bytes, which
// PostgreSQL text cannot hold.
func utf8Valid(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }
