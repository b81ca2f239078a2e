package outbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// Per-endpoint transport settings: the merchant's own request headers and
// a TLS client certificate.

// Limits on NewEndpoint.Headers.
const (
	MaxEndpointHeaders     = 20   // headers per endpoint
	MaxEndpointHeaderName  = 64   // bytes in a name
	MaxEndpointHeaderValue = 1024 // bytes in a value
	MaxEndpointHeaderBytes = 4096 // names and values of an endpoint together
)

// ErrReservedHeader: an endpoint header names one that txhook sets, or that
// belongs to the HTTP connection rather than to the request (see
// NewEndpoint.Headers). It also matches ErrInvalidEndpoint.
var ErrReservedHeader = errors.New("txhook: reserved header name")

// ErrInvalidClientCert: an endpoint's client certificate or key cannot be
// used: not PEM, the key does not match the certificate, or the
// certificate has expired. It also matches ErrInvalidEndpoint.
var ErrInvalidClientCert = errors.New("txhook: invalid client certificate")

// reservedHeaders are refused as endpoint headers, lower case: what txhook
// sets (content type, user agent, trace context), what the connection
// owns (framing, hop-by-hop, proxy), and, by prefix, the Webhook-* and
// X-Webhook-* headers of the signers and of the event.
var reservedHeaders = map[string]bool{
	"content-type": true, "content-length": true, "content-encoding": true, "transfer-encoding": true,
	"host": true, "user-agent": true, "traceparent": true, "tracestate": true, "baggage": true,
	"connection": true, "keep-alive": true, "te": true, "trailer": true, "upgrade": true, "expect": true,
	"proxy-connection": true, "proxy-authorization": true, "proxy-authenticate": true,
}

var reservedPrefixes = []string{"webhook-", "x-webhook-"}

// Headers are an endpoint's custom request headers, name to value. Values
// can be credentials (an Authorization header), so String, GoString,
// LogValue and MarshalJSON mask them; read the map to get them. With
// Config.SecretCipher they are stored encrypted, like signing secrets.
type Headers map[string]string

// String lists the names with masked values.
func (h Headers) String() string {
	names := make([]string, 0, len(h))
	for n := range h {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("map[")
	for i, n := range names {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(n + ":****")
	}
	b.WriteByte(']')
	return b.String()
}

// GoString is String, for %#v.
func (h Headers) GoString() string { return "outbox.Headers" + h.String() }

// LogValue is String, for log/slog.
func (h Headers) LogValue() slog.Value { return slog.StringValue(h.String()) }

// MarshalJSON writes the names with masked values.
func (h Headers) MarshalJSON() ([]byte, error) {
	m := make(map[string]string, len(h))
	for n := range h {
		m[n] = "****"
	}
	return json.Marshal(m)
}

// checkHeaders validates endpoint headers and returns their stored form,
// names canonicalised as net/http writes them.
func checkHeaders(h Headers) ([]byte, error) {
	if len(h) > MaxEndpointHeaders {
		return nil, fmt.Errorf("%w: more than %d headers", ErrInvalidEndpoint, MaxEndpointHeaders)
	}
	out := make(map[string]string, len(h))
	total := 0
	for name, value := range h {
		if name == "" || len(name) > MaxEndpointHeaderName || !isToken(name) {
			return nil, fmt.Errorf("%w: header name %.64q: want 1 to %d letters, digits or !#$%%&'*+-.^_`|~", ErrInvalidEndpoint, name, MaxEndpointHeaderName)
		}
		lower := strings.ToLower(name)
		reserved := reservedHeaders[lower]
		for _, p := range reservedPrefixes {
			reserved = reserved || strings.HasPrefix(lower, p)
		}
		if reserved {
			return nil, fmt.Errorf("%w: %w: %s is set by txhook or by the connection", ErrInvalidEndpoint, ErrReservedHeader, name)
		}
		if len(value) > MaxEndpointHeaderValue || !headerValueOK(value) {
			// The value is not quoted: it may be a credential.
			return nil, fmt.Errorf("%w: header %s: value must be at most %d bytes of printable ASCII, without leading or trailing spaces", ErrInvalidEndpoint, name, MaxEndpointHeaderValue)
		}
		canon := http.CanonicalHeaderKey(name)
		if _, dup := out[canon]; dup {
			return nil, fmt.Errorf("%w: header %s given twice", ErrInvalidEndpoint, canon)
		}
		out[canon] = value
		total += len(name) + len(value)
	}
	if total > MaxEndpointHeaderBytes {
		return nil, fmt.Errorf("%w: headers longer than %d bytes in all", ErrInvalidEndpoint, MaxEndpointHeaderBytes)
	}
	return json.Marshal(out)
}

// isToken reports whether s is an RFC 9110 token.
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// headerValueOK reports whether v is printable ASCII with inner spaces and
// tabs only: nothing a receiver's parser could read differently.
func headerValueOK(v string) bool {
	if v != strings.TrimSpace(v) {
		return false
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < 0x20 && c != '\t') || c > 0x7e {
			return false
		}
	}
	return true
}

// ClientCert is a TLS client certificate that relays present to an
// endpoint (mutual TLS), on https URLs only. String, GoString, LogValue and
// MarshalJSON leave the key out.
type ClientCert struct {
	// CertPEM is the certificate chain, leaf first, PEM-encoded.
	CertPEM []byte
	// KeyPEM is the leaf's private key, PEM-encoded (PKCS #1, PKCS #8 or
	// SEC 1). It is write-only: endpoints read back carry the certificate
	// without it. With Config.SecretCipher set it is stored encrypted, like
	// signing secrets, and decrypted by relays in memory only.
	KeyPEM []byte
}

// MaxClientCertBytes bounds CertPEM and KeyPEM together.
const MaxClientCertBytes = 64 << 10

// String names the leaf's subject and expiry, never the key.
func (c ClientCert) String() string {
	leaf, err := c.leaf()
	if err != nil {
		return "ClientCert{unreadable}"
	}
	return fmt.Sprintf("ClientCert{%s, expires %s}", leaf.Subject, leaf.NotAfter.UTC().Format(time.RFC3339))
}

// GoString is String, for %#v.
func (c ClientCert) GoString() string { return "outbox." + c.String() }

// LogValue is String, for log/slog.
func (c ClientCert) LogValue() slog.Value { return slog.StringValue(c.String()) }

// MarshalJSON writes the certificate chain, never the key.
func (c ClientCert) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		CertPEM string `json:"cert_pem"`
	}{string(c.CertPEM)})
}

func (c ClientCert) leaf() (*x509.Certificate, error) {
	cert, err := tls.X509KeyPair(c.CertPEM, c.KeyPEM)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(cert.Certificate[0])
}

// check validates c at now: a chain and a matching key, not expired.
func (c ClientCert) check(now time.Time) error {
	if len(c.CertPEM)+len(c.KeyPEM) > MaxClientCertBytes {
		return fmt.Errorf("%w: %w: longer than %d bytes", ErrInvalidEndpoint, ErrInvalidClientCert, MaxClientCertBytes)
	}
	// A key starting with '{' would read as the encrypted form (secrets.go).
	if !utf8Valid(string(c.CertPEM)) || !utf8Valid(string(c.KeyPEM)) || bytes.HasPrefix(bytes.TrimLeft(c.KeyPEM, " \t\r\n"), []byte("{")) {
		return fmt.Errorf("%w: %w: not PEM", ErrInvalidEndpoint, ErrInvalidClientCert)
	}
	leaf, err := c.leaf()
	if err != nil {
		// crypto/tls's messages name the problem, never the key's bytes.
		return fmt.Errorf("%w: %w: %w", ErrInvalidEndpoint, ErrInvalidClientCert, err)
	}
	if now.After(leaf.NotAfter) {
		return fmt.Errorf("%w: %w: expired %s", ErrInvalidEndpoint, ErrInvalidClientCert, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// transportCache decodes endpoints' headers and client certificates once
// per distinct stored value, for the relay. Both maps are keyed by a
// digest of the endpoint ID and what its row holds (encrypted or not), so
// that the keys hold no secret, and an entry serves only the endpoint
// whose row it was read from, as a ciphertext is bound to it. The values
// are decrypted headers and parsed certificates, in memory only.
type transportCache struct {
	mu      sync.Mutex
	headers map[[sha256.Size]byte]map[string]string
	certs   map[[sha256.Size]byte]*tls.Certificate
}

// cacheKey is a digest of fields, each length-prefixed.
func cacheKey(fields ...string) [sha256.Size]byte {
	d := sha256.New()
	for _, f := range fields {
		d.Write(binary.BigEndian.AppendUint64(nil, uint64(len(f))))
		d.Write([]byte(f))
	}
	var k [sha256.Size]byte
	d.Sum(k[:0])
	return k
}

// header returns the headers of an endpoint (nil for none) from raw, its
// stored headers column, decrypting them in memory if need be. Headers
// that do not decrypt are a *SecretsError.
func (tc *transportCache) header(ctx context.Context, o *Outbox, endpointID string, raw []byte) (map[string]string, error) {
	if noHeaders(raw) {
		return nil, nil
	}
	k := cacheKey(endpointID, string(raw))
	tc.mu.Lock()
	h, ok := tc.headers[k]
	tc.mu.Unlock()
	if ok {
		return h, nil
	}
	h, err := o.openHeaders(ctx, endpointID, raw)
	if err != nil {
		return nil, err
	}
	tc.mu.Lock()
	if tc.headers == nil || len(tc.headers) > 10000 {
		tc.headers = map[[sha256.Size]byte]map[string]string{}
	}
	tc.headers[k] = h
	tc.mu.Unlock()
	return h, nil
}

// cert returns the parsed client certificate of an endpoint (nil for
// none), decrypting its stored key in memory if need be. A key that does
// not decrypt is a *SecretsError.
func (tc *transportCache) cert(ctx context.Context, o *Outbox, endpointID, certPEM, storedKey string) (*tls.Certificate, error) {
	if certPEM == "" {
		return nil, nil
	}
	k := cacheKey(endpointID, certPEM, storedKey)
	tc.mu.Lock()
	c, ok := tc.certs[k]
	tc.mu.Unlock()
	if ok {
		return c, nil
	}
	keyPEM, _, err := o.open(ctx, colClientKey, endpointID, []byte(storedKey))
	if err != nil {
		return nil, err
	}
	parsed, err := tls.X509KeyPair([]byte(certPEM), keyPEM)
	clear(keyPEM) // decrypted, or this function's copy
	if err != nil {
		return nil, fmt.Errorf("stored client certificate: %w", err)
	}
	c = &parsed
	tc.mu.Lock()
	if tc.certs == nil || len(tc.certs) > 1000 {
		tc.certs = map[[sha256.Size]byte]*tls.Certificate{}
	}
	tc.certs[k] = c
	tc.mu.Unlock()
	return c, nil
}
