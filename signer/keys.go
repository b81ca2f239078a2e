package signer

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// Prefixes of the Standard Webhooks secret formats. They tell a secret's
// algorithm and role at a glance, in configuration and in code review alike.
const (
	prefixSecret  = "whsec_" // HMAC-SHA256 key, shared by sender and receiver
	prefixPrivate = "whsk_"  // ed25519 private key, sender only
	prefixPublic  = "whpk_"  // ed25519 public key, given to receivers
)

// The spec asks for at least 192 bits and at most 512 bits of key.
const (
	minSecretBytes = 24
	maxSecretBytes = 64
)

type keyKind uint8

const (
	kindHMAC keyKind = iota + 1
	kindPrivate
	kindPublic
)

type key struct {
	kind keyKind
	b    []byte // HMAC key, ed25519.PrivateKey or ed25519.PublicKey
}

// secretError reports secret number i as unusable. It names the secret by
// position only: error strings end up in logs, and reason never quotes the
// secret.
func secretError(i int, reason error) error {
	return fmt.Errorf("%w: secrets[%d]: %v", ErrInvalidSecret, i, reason)
}

// parseKey reads one Standard Webhooks secret. A string without a known
// prefix is taken as the base64 part of a whsec_ secret, as the official Go
// library does (it strips an optional "whsec_" before decoding): secrets
// copied from dashboards that show them bare keep working.
//
// The error states the reason only; callers wrap it with ErrInvalidSecret.
func parseKey(s string) (key, error) {
	// encoding/base64 skips line breaks; a secret read from a file with its
	// trailing newline should fail here, not work here and fail elsewhere.
	if strings.ContainsAny(s, "\r\n") {
		return key{}, errors.New("contains a line break")
	}
	switch {
	case strings.HasPrefix(s, prefixPrivate):
		priv, err := decodePrivate(s[len(prefixPrivate):])
		if err != nil {
			return key{}, fmt.Errorf("whsk_ key: %w", err)
		}
		return key{kind: kindPrivate, b: priv}, nil
	case strings.HasPrefix(s, prefixPublic):
		b, err := base64.StdEncoding.DecodeString(s[len(prefixPublic):])
		if err != nil {
			return key{}, errors.New("whpk_ key is not valid base64")
		}
		if len(b) != ed25519.PublicKeySize {
			return key{}, fmt.Errorf("whpk_ key decodes to %d bytes, want %d", len(b), ed25519.PublicKeySize)
		}
		return key{kind: kindPublic, b: b}, nil
	}
	enc := strings.TrimPrefix(s, prefixSecret)
	if enc == "" {
		return key{}, errors.New("empty")
	}
	// Checked before decoding so that a huge string is not decoded at all.
	if len(enc) > base64.StdEncoding.EncodedLen(maxSecretBytes) {
		return key{}, fmt.Errorf("whsec_ secret longer than %d bytes", maxSecretBytes)
	}
	b, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		return key{}, errors.New("whsec_ secret is not valid base64")
	}
	if len(b) < minSecretBytes || len(b) > maxSecretBytes {
		return key{}, fmt.Errorf("whsec_ secret decodes to %d bytes, want %d to %d", len(b), minSecretBytes, maxSecretBytes)
	}
	return key{kind: kindHMAC, b: b}, nil
}

// decodePrivate accepts the 32-byte seed (RFC 8032's private key) and the
// 64-byte seed||public form that Go's crypto/ed25519 and the Svix server use.
// GenerateKeyPair writes the 64-byte form.
func decodePrivate(enc string) (ed25519.PrivateKey, error) {
	if strings.ContainsAny(enc, "\r\n") {
		return nil, errors.New("contains a line break")
	}
	b, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		return nil, errors.New("not valid base64")
	}
	switch len(b) {
	case ed25519.SeedSize:
		return ed25519.NewKeyFromSeed(b), nil
	case ed25519.PrivateKeySize:
		priv := ed25519.NewKeyFromSeed(b[:ed25519.SeedSize])
		// A stale public half would make every signature invalid, and
		// silently so: ed25519.Sign trusts it.
		if !bytes.Equal(priv[ed25519.SeedSize:], b[ed25519.SeedSize:]) {
			return nil, errors.New("public half does not belong to the seed")
		}
		return priv, nil
	default:
		return nil, fmt.Errorf("decodes to %d bytes, want %d or %d", len(b), ed25519.SeedSize, ed25519.PrivateKeySize)
	}
}

// GenerateSecret returns a new "whsec_" secret of 32 random bytes.
func GenerateSecret() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("signer: reading randomness: %w", err)
	}
	return prefixSecret + base64.StdEncoding.EncodeToString(b[:]), nil
}

// GenerateKeyPair returns a new ed25519 key pair for v1a signatures: the
// "whsk_" private key signs and stays with the sender, the "whpk_" public key
// goes to receivers. The private key is base64 of the 64-byte seed||public
// form; see PublicKey for the forms accepted.
func GenerateKeyPair() (private, public string, err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("signer: generating ed25519 key: %w", err)
	}
	return prefixPrivate + base64.StdEncoding.EncodeToString(priv),
		prefixPublic + base64.StdEncoding.EncodeToString(pub), nil
}

// PublicKey derives the "whpk_" public key from a "whsk_" private key. The
// private key may hold the 32-byte seed or the 64-byte seed||public form.
func PublicKey(private string) (string, error) {
	if !strings.HasPrefix(private, prefixPrivate) {
		return "", fmt.Errorf("%w: not a whsk_ private key", ErrInvalidSecret)
	}
	priv, err := decodePrivate(private[len(prefixPrivate):])
	if err != nil {
		return "", fmt.Errorf("%w: whsk_ key: %s", ErrInvalidSecret, err)
	}
	return prefixPublic + base64.StdEncoding.EncodeToString(priv.Public().(ed25519.PublicKey)), nil
}

// ValidateSecret reports whether s can sign in the Standard scheme: a whsec_
// secret of 24 to 64 bytes or a whsk_ private key. It is stricter than Sign,
// which also takes a bare base64 secret for compatibility: a secret txhook
// stores must name its algorithm. A whpk_ public key is refused, since it can
// only verify. Errors wrap ErrInvalidSecret.
func ValidateSecret(s string) error {
	if !strings.HasPrefix(s, prefixSecret) && !strings.HasPrefix(s, prefixPrivate) {
		if strings.HasPrefix(s, prefixPublic) {
			return fmt.Errorf("%w: a whpk_ public key can only verify", ErrInvalidSecret)
		}
		return fmt.Errorf("%w: want a whsec_ secret or a whsk_ private key", ErrInvalidSecret)
	}
	if _, err := parseKey(s); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidSecret, err)
	}
	return nil
}
