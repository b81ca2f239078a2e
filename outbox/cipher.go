package outbox

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Cipher encrypts endpoint signing secrets, client certificate keys and
// custom headers at rest (Config.SecretCipher).
// AESGCM is the implementation txhook ships; a host can put its KMS behind
// this interface instead.
//
// Every ciphertext is stored beside the ID of the key that made it, so a
// Cipher can hold several keys at once: the newest encrypts, and any of
// them decrypts what it made. associatedData binds a ciphertext to the
// endpoint and the column it belongs to; Decrypt must fail unless it is the value given to
// Encrypt (authenticated encryption with associated data, such as AES-GCM,
// does that). Implementations must be safe for concurrent use, and their
// errors must not contain plaintext.
type Cipher interface {
	// KeyID names the key Encrypt uses now. The re-encrypt pass
	// (Outbox.ReencryptSecrets) moves every ciphertext made under another
	// key to this one.
	KeyID() string
	// Encrypt seals plaintext bound to associatedData and returns the ID
	// of the key it used with the ciphertext.
	Encrypt(ctx context.Context, plaintext, associatedData []byte) (keyID string, ciphertext []byte, err error)
	// Decrypt opens a ciphertext made by Encrypt under keyID with the same
	// associatedData. An unknown key ID should fail with an error matching
	// ErrUnknownKey, and a ciphertext that does not authenticate (wrong
	// key, altered, or another endpoint's) with one matching ErrDecrypt.
	Decrypt(ctx context.Context, keyID string, ciphertext, associatedData []byte) ([]byte, error)
}

// Errors of secrets at rest; see SecretsError.
var (
	// ErrSecretKey: an endpoint's stored secrets, client certificate key
	// or custom headers cannot be decrypted. Every SecretsError matches
	// it; its Err says why.
	ErrSecretKey = errors.New("txhook: cannot decrypt endpoint secrets")
	// ErrNoSecretCipher: secrets, client keys or headers are stored
	// encrypted but Config.SecretCipher is not set (or ReencryptSecrets
	// was called without one).
	ErrNoSecretCipher = errors.New("txhook: Config.SecretCipher is not set")
	// ErrUnknownKey: the Cipher has no key with the stored key ID.
	ErrUnknownKey = errors.New("txhook: no key with this ID")
	// ErrDecrypt: the ciphertext does not authenticate: the key under its
	// ID is not the one that made it, or the ciphertext was altered or
	// copied from another endpoint or column.
	ErrDecrypt = errors.New("txhook: ciphertext does not authenticate (wrong key, altered, or another endpoint's)")
)

// SecretsError reports an endpoint whose stored secrets, client
// certificate key or custom headers cannot be read. errors.Is matches
// ErrSecretKey and Err.
// It names the endpoint, the column and the key ID, never a secret.
type SecretsError struct {
	EndpointID string
	Column     string // the txhook_endpoints column: "secrets", "client_key" or "headers"
	KeyID      string // the key ID stored with the ciphertext; "" if none
	Err        error  // ErrNoSecretCipher, ErrUnknownKey, ErrDecrypt or the Cipher's error
}

func (e *SecretsError) Error() string {
	return fmt.Sprintf("txhook: cannot decrypt the %s of endpoint %.64q (key ID %.64q): %v", columnNoun(e.Column), e.EndpointID, e.KeyID, e.Err)
}

// columnNoun names what column col holds, for messages.
func columnNoun(col string) string {
	switch col {
	case colClientKey:
		return "client certificate key"
	case colHeaders:
		return "custom headers"
	}
	return "secrets"
}

// Unwrap returns ErrSecretKey and Err.
func (e *SecretsError) Unwrap() []error { return []error{ErrSecretKey, e.Err} }

// AESKey is one key of an AESGCM keyring.
type AESKey struct {
	// ID is stored beside every ciphertext the key makes: 1 to 64 letters,
	// digits, '.', '_' or '-'. Never reuse an ID for another key.
	ID string
	// Key is 32 random bytes (AES-256), such as `openssl rand -base64 32`
	// decoded.
	Key []byte
}

// AESGCM is a Cipher with AES-256-GCM keys held in memory: the first key
// encrypts, every key decrypts. Each ciphertext is a random 96-bit nonce
// followed by the sealed data. Printing it shows the key IDs only.
type AESGCM struct {
	ids   []string
	aeads map[string]cipher.AEAD
}

var keyIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// NewAESGCM returns a keyring of keys, the first of which encrypts. To
// rotate keys: add the new one last everywhere (it then decrypts, so no
// process fails on what another encrypts with it), then move it first,
// run Outbox.ReencryptSecrets, and finally drop the old one.
func NewAESGCM(keys ...AESKey) (*AESGCM, error) {
	if len(keys) == 0 {
		return nil, errors.New("txhook: NewAESGCM: no key")
	}
	c := &AESGCM{aeads: make(map[string]cipher.AEAD, len(keys))}
	for _, k := range keys {
		if !keyIDPattern.MatchString(k.ID) {
			return nil, fmt.Errorf("txhook: NewAESGCM: key ID %.64q: want 1 to 64 letters, digits, '.', '_' or '-'", k.ID)
		}
		if _, dup := c.aeads[k.ID]; dup {
			return nil, fmt.Errorf("txhook: NewAESGCM: key ID %q given twice", k.ID)
		}
		if len(k.Key) != 32 {
			return nil, fmt.Errorf("txhook: NewAESGCM: key %q is %d bytes, want 32 (AES-256)", k.ID, len(k.Key))
		}
		block, err := aes.NewCipher(k.Key)
		if err != nil {
			return nil, err
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, err
		}
		c.ids = append(c.ids, k.ID)
		c.aeads[k.ID] = aead
	}
	return c, nil
}

// ParseAESGCMKeys returns the keyring described by s, as one would keep it
// in an environment variable or a secret store: comma-separated
// "id:base64-key" pairs, the encrypting key first, such as
// "k2:3q2+7w…=,k1:q83v…=". Keys are standard or URL-safe base64, with or
// without padding. Errors name the key ID, never key material.
func ParseAESGCMKeys(s string) (*AESGCM, error) {
	var keys []AESKey
	for _, part := range strings.Split(s, ",") {
		id, b64, ok := strings.Cut(strings.TrimSpace(part), ":")
		if !ok {
			return nil, errors.New(`txhook: ParseAESGCMKeys: want comma-separated "id:base64-key" pairs`)
		}
		key, err := decodeKey(strings.TrimSpace(b64))
		if err != nil {
			return nil, fmt.Errorf("txhook: ParseAESGCMKeys: key %.64q is not base64", id)
		}
		keys = append(keys, AESKey{ID: id, Key: key})
	}
	return NewAESGCM(keys...)
}

func decodeKey(s string) ([]byte, error) {
	var err error
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		var b []byte
		if b, err = enc.DecodeString(s); err == nil {
			return b, nil
		}
	}
	return nil, err
}

// KeyID returns the ID of the encrypting key, the first one given.
func (c *AESGCM) KeyID() string { return c.ids[0] }

// Encrypt seals plaintext with the first key.
func (c *AESGCM) Encrypt(_ context.Context, plaintext, associatedData []byte) (string, []byte, error) {
	aead := c.aeads[c.ids[0]]
	out := make([]byte, aead.NonceSize(), aead.NonceSize()+len(plaintext)+aead.Overhead())
	if _, err := rand.Read(out); err != nil {
		return "", nil, err
	}
	return c.ids[0], aead.Seal(out, out, plaintext, associatedData), nil
}

// Decrypt opens a ciphertext made under keyID.
func (c *AESGCM) Decrypt(_ context.Context, keyID string, ciphertext, associatedData []byte) ([]byte, error) {
	aead, ok := c.aeads[keyID]
	if !ok {
		return nil, fmt.Errorf("%w %.64q (the keyring has %s)", ErrUnknownKey, keyID, strings.Join(c.ids, ", "))
	}
	n := aead.NonceSize()
	if len(ciphertext) < n+aead.Overhead() {
		return nil, ErrDecrypt
	}
	out, err := aead.Open(nil, ciphertext[:n], ciphertext[n:], associatedData)
	if err != nil {
		return nil, ErrDecrypt
	}
	return out, nil
}

// String lists the key IDs, encrypting key first.
func (c *AESGCM) String() string { return "outbox.AESGCM(" + strings.Join(c.ids, ", ") + ")" }

// GoString is String, for %#v.
func (c *AESGCM) GoString() string { return c.String() }
