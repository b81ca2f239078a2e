package signer

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Standard is the Standard Webhooks scheme (https://www.standardwebhooks.com),
// txhook's default. Sign sets webhook-id, webhook-timestamp (unix seconds)
// and webhook-signature, a space-separated list with one entry per secret:
// "v1,<base64 HMAC-SHA256>" for a whsec_ secret (keyed with its decoded
// bytes) and "v1a,<base64 ed25519 signature>" for a whsk_ private key, both
// over "id.timestamp.body".
//
// Verify takes whsec_ secrets and whpk_ public keys. Like the official Go
// library it also takes a whsec_ secret without its prefix. Entries with
// other versions are skipped, so senders can add schemes receivers do not
// know yet. At most 32 entries of a header are read.
//
// The zero value is ready to use; the fields only affect Verify.
type Standard struct {
	// Tolerance is how far webhook-timestamp may be from Now, in either
	// direction. Zero (or negative) means DefaultTolerance; there is no way
	// to switch the check off, because it is what stops replays.
	Tolerance time.Duration
	// Now is the verifier's clock; nil means time.Now.
	Now func() time.Time
}

var (
	_ Signer   = Standard{}
	_ Verifier = Standard{}
)

// Lengths of the padded base64 forms in a webhook-signature header.
const (
	b64HMACLen    = (sha256.Size + 2) / 3 * 4           // 44
	b64Ed25519Len = (ed25519.SignatureSize + 2) / 3 * 4 // 88
)

// b64Strict refuses non-zero padding bits, so each signature has exactly one
// spelling, the one every Standard Webhooks library writes.
var b64Strict = base64.StdEncoding.Strict()

// Sign implements Signer. The secrets may be whsec_ secrets (24 to 64 bytes)
// and whsk_ private keys, in any mix; a whpk_ public key is an error. The id
// must be printable ASCII without spaces or '.' (the spec forbids '.' so that
// "id.timestamp.body" splits only one way) and ts must not be before 1970.
// On any error h is left untouched.
func (Standard) Sign(h http.Header, id string, ts time.Time, body []byte, secrets []string) error {
	sec, err := signArgs(h, id, ts, secrets)
	if err != nil {
		return err
	}
	var keyBuf [4]key
	keys := keyBuf[:0]
	hdrLen := len(secrets) - 1 // separating spaces
	for i, s := range secrets {
		k, err := parseKey(s)
		if err != nil {
			return secretError(i, err)
		}
		switch k.kind {
		case kindHMAC:
			hdrLen += len("v1,") + b64HMACLen
		case kindPrivate:
			hdrLen += len("v1a,") + b64Ed25519Len
		default:
			return secretError(i, errors.New("a whpk_ public key can only verify"))
		}
		keys = append(keys, k)
	}

	// One buffer holds "id.ts." and, after it, room for the MAC that
	// hmac.Sum appends; the body is written to the MAC as is, never copied.
	buf := make([]byte, 0, len(id)+len(".")+20+len(".")+sha256.Size)
	buf = append(buf, id...)
	buf = append(buf, '.')
	buf = strconv.AppendInt(buf, sec, 10)
	tsDigits := buf[len(id)+1:]
	prefix := append(buf, '.')

	var msg []byte // the whole signed content, built only for ed25519, which cannot stream
	// The timestamp and signature header values are built as one string and
	// sliced, which saves an allocation per Sign.
	var sig strings.Builder
	sig.Grow(len(tsDigits) + hdrLen)
	sig.Write(tsDigits)
	for i, k := range keys {
		if i > 0 {
			sig.WriteByte(' ')
		}
		switch k.kind {
		case kindHMAC:
			mac := hmac.New(sha256.New, k.b)
			mac.Write(prefix)
			mac.Write(body)
			var enc [b64HMACLen]byte
			base64.StdEncoding.Encode(enc[:], mac.Sum(prefix[len(prefix):]))
			sig.WriteString("v1,")
			sig.Write(enc[:])
		case kindPrivate:
			if msg == nil {
				msg = make([]byte, 0, len(prefix)+len(body))
				msg = append(append(msg, prefix...), body...)
			}
			var enc [b64Ed25519Len]byte
			base64.StdEncoding.Encode(enc[:], ed25519.Sign(k.b, msg))
			sig.WriteString("v1a,")
			sig.Write(enc[:])
		}
	}
	both := sig.String()
	// One backing array for the three value slices; the full slice
	// expressions keep an Add on one header from overwriting the next.
	vals := [...]string{id, both[:len(tsDigits)], both[len(tsDigits):]}
	h[HeaderID] = vals[0:1:1]
	h[HeaderTimestamp] = vals[1:2:2]
	h[HeaderSignature] = vals[2:3:3]
	return nil
}

// Verify implements Verifier. The secrets may be whsec_ secrets (24 to 64
// bytes, prefix optional) and whpk_ public keys, in any mix. A whsk_ private
// key is refused: it belongs with the sender only. A webhook-id that Sign
// would refuse is a malformed header.
//
// Errors are checked in this order: the secrets (ErrInvalidSecret), missing
// headers, malformed headers, the timestamp window, the signatures. A
// header is malformed when it cannot be read at all; a signature entry that
// is merely undecodable is skipped, and if nothing matches the error is
// ErrNoMatchingSignature.
func (s Standard) Verify(h http.Header, body []byte, secrets []string) (Message, error) {
	if len(secrets) == 0 {
		return Message{}, fmt.Errorf("%w: no secrets", ErrInvalidSecret)
	}
	var keyBuf [4]key
	keys := keyBuf[:0]
	for i, sec := range secrets {
		k, err := parseKey(sec)
		if err != nil {
			return Message{}, secretError(i, err)
		}
		if k.kind == kindPrivate {
			return Message{}, secretError(i, errors.New("a whsk_ private key must stay with the sender; verify with its whpk_ public key"))
		}
		keys = append(keys, k)
	}

	id, err := headerValue(h, HeaderID)
	if err != nil {
		return Message{}, err
	}
	tsStr, err := headerValue(h, HeaderTimestamp)
	if err != nil {
		return Message{}, err
	}
	sigHdr, err := headerValue(h, HeaderSignature)
	if err != nil {
		return Message{}, err
	}
	if reason := checkID(id); reason != "" {
		return Message{}, fmt.Errorf("%w: %s", ErrMalformedHeader, reason)
	}
	var entries [maxEntries]sigEntry
	n, err := parseStandardSignatures(sigHdr, &entries)
	if err != nil {
		return Message{}, err
	}
	ts, err := checkTimestamp(tsStr, s.Now, s.Tolerance)
	if err != nil {
		return Message{}, err
	}

	buf := make([]byte, 0, len(id)+len(tsStr)+2+sha256.Size)
	buf = append(buf, id...)
	buf = append(buf, '.')
	buf = append(buf, tsStr...)
	prefix := append(buf, '.')
	var msg []byte
	for _, k := range keys {
		switch k.kind {
		case kindHMAC:
			mac := hmac.New(sha256.New, k.b)
			mac.Write(prefix)
			mac.Write(body)
			sum := mac.Sum(prefix[len(prefix):])
			for i := range entries[:n] {
				if e := &entries[i]; e.kind == kindHMAC && hmac.Equal(e.sig[:sha256.Size], sum) {
					return Message{ID: id, Timestamp: ts, Body: body}, nil
				}
			}
		case kindPublic:
			for i := range entries[:n] {
				e := &entries[i]
				if e.kind != kindPublic {
					continue
				}
				if msg == nil {
					msg = make([]byte, 0, len(prefix)+len(body))
					msg = append(append(msg, prefix...), body...)
				}
				if ed25519.Verify(k.b, msg, e.sig[:]) {
					return Message{ID: id, Timestamp: ts, Body: body}, nil
				}
			}
		}
	}
	return Message{}, ErrNoMatchingSignature
}

// sigEntry is one decoded webhook-signature entry: kindHMAC for v1 (the first
// 32 bytes of sig are used), kindPublic for v1a.
type sigEntry struct {
	kind keyKind
	sig  [ed25519.SignatureSize]byte
}

// parseStandardSignatures decodes the v1 and v1a entries of a
// webhook-signature value into out and returns how many it stored. Entries of
// other versions, and v1/v1a entries that do not decode to a signature of the
// right size, are skipped. It reads at most maxEntries entries and fails with
// ErrMalformedHeader only if none of them has the "version,signature" shape.
func parseStandardSignatures(v string, out *[maxEntries]sigEntry) (int, error) {
	n, seen, shaped := 0, 0, 0
	for v != "" && seen < maxEntries {
		var tok string
		tok, v, _ = strings.Cut(v, " ")
		if tok == "" {
			continue
		}
		seen++
		version, sig, ok := strings.Cut(tok, ",")
		if !ok || version == "" || sig == "" {
			continue
		}
		shaped++
		var kind keyKind
		var size int
		switch {
		case version == "v1" && len(sig) == b64HMACLen:
			kind, size = kindHMAC, sha256.Size
		case version == "v1a" && len(sig) == b64Ed25519Len:
			kind, size = kindPublic, ed25519.SignatureSize
		default:
			continue
		}
		// Decoding from a copy on the stack spares converting the string;
		// dst has room for what 88 characters can decode to, with or without
		// padding, because Decode panics on a short dst.
		var src [b64Ed25519Len]byte
		var dst [b64Ed25519Len / 4 * 3]byte
		copy(src[:], sig)
		if m, err := b64Strict.Decode(dst[:], src[:len(sig)]); err != nil || m != size {
			continue
		}
		out[n].kind = kind
		copy(out[n].sig[:], dst[:size])
		n++
	}
	if shaped == 0 {
		return 0, fmt.Errorf("%w: %s has no \"version,signature\" entry", ErrMalformedHeader, HeaderSignature)
	}
	return n, nil
}
