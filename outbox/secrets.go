package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/txhook/txhook/internal/store"
)

// Secrets at rest. Three columns of txhook_endpoints hold what can forge,
// impersonate or authenticate: secrets (the JSON array of an endpoint's
// signing secrets), client_key (the PEM private key of its TLS client
// certificate, "" for none) and headers (the JSON object of its custom
// request headers, which can carry an Authorization token; "{}" for none,
// never encrypted). Each holds either that plaintext (no
// Config.SecretCipher, or a row written before one was set) or, encrypted,
// the JSON object
//
//	{"v": 1, "kid": "<key ID>", "ct": "<base64 ciphertext of the plaintext>"}
//
// In the headers column both forms are JSON objects: the encrypted one is
// told apart by its member "v" holding a number, where every value of a
// header object is a string (Headers is a map of strings, and checkHeaders
// stores names canonicalised, so not even the name "v" occurs).
//
// The ciphertext is bound to its column and endpoint: its associated data
// is sealedAD(column, endpoint ID), so a ciphertext copied into another
// endpoint's row, or into the other column, does not decrypt. Both forms
// are read everywhere; writes use the encrypted one whenever a Cipher is
// configured.

// The txhook_endpoints columns stored encrypted.
const (
	colSecrets   = "secrets"
	colClientKey = "client_key"
	colHeaders   = "headers"
)

// sealedValue is the encrypted form of a column.
type sealedValue struct {
	V   int    `json:"v"`
	Kid string `json:"kid"`
	CT  []byte `json:"ct"`
}

// sealedAD is the associated data of the ciphertext in column col of an
// endpoint's row: the column it belongs in and the endpoint ID.
func sealedAD(col, endpointID string) []byte {
	return []byte("txhook_endpoints." + col + "\x00" + endpointID)
}

// storedKeyID reports whether raw, stored in column col, is the encrypted
// form, and its key ID. Neither plaintext form of secrets or client_key
// starts with '{': secrets are a JSON array, and checkClientCert refuses
// such a key. A header object is encrypted when its member "v" is a number.
func storedKeyID(col string, raw []byte) (string, bool) {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 || raw[0] != '{' {
		return "", false
	}
	if col == colHeaders {
		var members map[string]json.RawMessage
		if json.Unmarshal(raw, &members) != nil {
			return "", false // not an object: decoding the headers reports it
		}
		v := members["v"]
		if len(v) == 0 || !(v[0] == '-' || '0' <= v[0] && v[0] <= '9') {
			return "", false
		}
	}
	var env struct {
		Kid string `json:"kid"`
	}
	_ = json.Unmarshal(raw, &env)
	return env.Kid, true
}

// seal returns the stored form of plain in column col of an endpoint's
// row: with Config.SecretCipher, the encrypted form, and plain is cleared;
// without, plain itself.
func (o *Outbox) seal(ctx context.Context, col, endpointID string, plain []byte) ([]byte, error) {
	c := o.cfg.SecretCipher
	if c == nil {
		return plain, nil
	}
	defer clear(plain)
	kid, ct, err := c.Encrypt(ctx, plain, sealedAD(col, endpointID))
	if err != nil {
		return nil, fmt.Errorf("txhook: encrypting the %s of endpoint %.64q: %w", columnNoun(col), endpointID, err)
	}
	return json.Marshal(sealedValue{V: 1, Kid: kid, CT: ct})
}

// open returns the plaintext of raw, the stored form of column col of an
// endpoint's row, and whether it was encrypted: then plain is a new buffer
// the caller clears once done; otherwise it is raw. Errors are
// *SecretsError.
func (o *Outbox) open(ctx context.Context, col, endpointID string, raw []byte) (plain []byte, sealed bool, err error) {
	if _, sealed := storedKeyID(col, raw); !sealed {
		return raw, false, nil
	}
	var env sealedValue
	if err := json.Unmarshal(raw, &env); err != nil || env.V != 1 || env.Kid == "" {
		return nil, true, &SecretsError{EndpointID: endpointID, Column: col, KeyID: env.Kid, Err: errors.New("stored value is not in a known encrypted form")}
	}
	c := o.cfg.SecretCipher
	if c == nil {
		return nil, true, &SecretsError{EndpointID: endpointID, Column: col, KeyID: env.Kid, Err: ErrNoSecretCipher}
	}
	plain, err = c.Decrypt(ctx, env.Kid, env.CT, sealedAD(col, endpointID))
	if err != nil {
		return nil, true, &SecretsError{EndpointID: endpointID, Column: col, KeyID: env.Kid, Err: err}
	}
	return plain, true, nil
}

// sealSecrets returns the stored form of an endpoint's secrets: encrypted
// with Config.SecretCipher when there is one, plaintext JSON otherwise.
func (o *Outbox) sealSecrets(ctx context.Context, endpointID string, ss []Secret) ([]byte, error) {
	return o.seal(ctx, colSecrets, endpointID, encodeSecrets(ss))
}

// openSecrets reads the stored form of an endpoint's secrets. Errors about
// encryption are *SecretsError.
func (o *Outbox) openSecrets(ctx context.Context, endpointID string, raw []byte) ([]Secret, error) {
	plain, sealed, err := o.open(ctx, colSecrets, endpointID, raw)
	if err != nil {
		return nil, err
	}
	if sealed {
		defer clear(plain)
	}
	return decodeSecrets(plain)
}

// sealHeaders returns the stored form of an endpoint's custom headers,
// plain being checkHeaders' result: encrypted with Config.SecretCipher when
// there is one and there are headers, plain otherwise ("{}" for none is
// stored as is: it holds nothing secret).
func (o *Outbox) sealHeaders(ctx context.Context, endpointID string, plain []byte) ([]byte, error) {
	if noHeaders(plain) {
		return plain, nil
	}
	return o.seal(ctx, colHeaders, endpointID, plain)
}

// openHeaders reads the stored form of an endpoint's custom headers (nil
// for none). Errors about encryption are *SecretsError.
func (o *Outbox) openHeaders(ctx context.Context, endpointID string, raw []byte) (Headers, error) {
	if noHeaders(raw) {
		return nil, nil
	}
	plain, sealed, err := o.open(ctx, colHeaders, endpointID, raw)
	if err != nil {
		return nil, err
	}
	if sealed {
		defer clear(plain)
	}
	var h Headers
	if err := json.Unmarshal(plain, &h); err != nil {
		// json's message quotes no more than a type name and an offset.
		return nil, fmt.Errorf("txhook: stored headers of endpoint %.64q: %w", endpointID, err)
	}
	return h, nil
}

// noHeaders reports whether raw, a stored headers column, holds none.
func noHeaders(raw []byte) bool { return len(raw) == 0 || string(raw) == "{}" }

// checkSecretKeys fails, with a *SecretsError, when secrets, client keys
// or custom headers are stored under a key this outbox cannot use: no
// Cipher, a key ID the Cipher does not have, or a different key under that
// ID. It decrypts one endpoint per key ID in use in each column.
func (o *Outbox) checkSecretKeys(ctx context.Context) error {
	samples, err := o.st.SecretKeySamples(ctx)
	if err != nil {
		return fmt.Errorf("txhook: checking the keys of stored secrets: %w", err)
	}
	for _, s := range samples {
		if _, err := o.openSecrets(ctx, s.ID, s.Secrets); err != nil {
			return err
		}
		plain, sealed, err := o.open(ctx, colClientKey, s.ID, s.ClientKey)
		if err != nil {
			return err
		}
		if sealed {
			clear(plain)
		}
		if _, err := o.openHeaders(ctx, s.ID, s.Headers); err != nil {
			return err
		}
	}
	return nil
}

// warnUnencrypted logs, once per Outbox, that secrets are stored in
// plaintext.
func (o *Outbox) warnUnencrypted() {
	if o.cfg.SecretCipher == nil {
		o.log.Warn("txhook: Config.SecretCipher is not set: endpoint signing secrets, client certificate keys and custom headers are stored unencrypted " +
			"(see txhook's docs/security.md, Secrets at rest)")
	}
}

// ReencryptResult counts what ReencryptSecrets did.
type ReencryptResult struct {
	Endpoints int // endpoints read
	Encrypted int // endpoints whose secrets were stored in plaintext before, encrypted now
	Rekeyed   int // endpoints whose secrets were encrypted under another key before, under the Cipher's KeyID now

	ClientKeysEncrypted int // client certificate keys stored in plaintext before, encrypted now
	ClientKeysRekeyed   int // client certificate keys encrypted under another key before, under the Cipher's KeyID now

	HeadersEncrypted int // endpoints whose custom headers were stored in plaintext before, encrypted now
	HeadersRekeyed   int // endpoints whose custom headers were encrypted under another key before, under the Cipher's KeyID now
}

// reencryptBatch is how many endpoints one step of ReencryptSecrets reads,
// and at most rewrites in one transaction.
const reencryptBatch = 100

// ReencryptSecrets moves every endpoint's stored secrets, client
// certificate key and custom headers to the current key of
// Config.SecretCipher: plaintext
// values (written before a Cipher was configured) are encrypted, and values
// encrypted under an older key are encrypted again under Cipher.KeyID().
// Run it after setting a Cipher for the first time and after every key
// rotation, before the old key is dropped; it is idempotent and can be
// interrupted and run again.
//
// It works in batches of 100 endpoints, one short transaction each, in
// which the rows it rewrites are locked on PostgreSQL, so it is safe
// alongside running relays, rotations and other ReencryptSecrets calls;
// rows locked by someone else are done once they are free. Relays keep
// delivering throughout: they decrypt both forms, with every key of the
// Cipher. It fails with ErrNoSecretCipher without a Cipher, and stops at
// the first endpoint whose secrets, client key or headers cannot be
// decrypted (a *SecretsError), returning what it did until then.
func (o *Outbox) ReencryptSecrets(ctx context.Context) (ReencryptResult, error) {
	var res ReencryptResult
	c := o.cfg.SecretCipher
	if c == nil {
		return res, ErrNoSecretCipher
	}
	current := c.KeyID()
	stale := func(col string, raw []byte) bool {
		if col == colHeaders && noHeaders(raw) {
			return false
		}
		kid, sealed := storedKeyID(col, raw)
		return len(raw) > 0 && (!sealed || kid != current)
	}
	rewrite := func(ids []string) ([]string, error) {
		var done ReencryptResult
		// reseal returns the value of column col encrypted under the
		// current key, or nil if it is already.
		reseal := func(col, id string, raw []byte, encrypted, rekeyed *int) ([]byte, error) {
			if !stale(col, raw) {
				return nil, nil // none, or done meanwhile by a rotation or another pass
			}
			plain, sealed, err := o.open(ctx, col, id, raw)
			if err != nil {
				return nil, err
			}
			if sealed {
				*rekeyed++
			} else {
				*encrypted++
			}
			return o.seal(ctx, col, id, plain) // clears plain: the row's buffer, or the decrypted copy
		}
		skipped, err := o.st.RewriteSecrets(ctx, ids, func(cur store.EndpointSecrets) (next store.EndpointSecrets, err error) {
			next.ID = cur.ID
			if next.Secrets, err = reseal(colSecrets, cur.ID, cur.Secrets, &done.Encrypted, &done.Rekeyed); err != nil {
				return next, err
			}
			if next.ClientKey, err = reseal(colClientKey, cur.ID, cur.ClientKey, &done.ClientKeysEncrypted, &done.ClientKeysRekeyed); err != nil {
				return next, err
			}
			next.Headers, err = reseal(colHeaders, cur.ID, cur.Headers, &done.HeadersEncrypted, &done.HeadersRekeyed)
			return next, err
		})
		if err != nil {
			return nil, err
		}
		res.Encrypted += done.Encrypted
		res.Rekeyed += done.Rekeyed
		res.ClientKeysEncrypted += done.ClientKeysEncrypted
		res.ClientKeysRekeyed += done.ClientKeysRekeyed
		res.HeadersEncrypted += done.HeadersEncrypted
		res.HeadersRekeyed += done.HeadersRekeyed
		return skipped, nil
	}

	var busy []string
	after := ""
	for {
		page, err := o.st.SecretsPage(ctx, after, reencryptBatch)
		if err != nil {
			return res, err
		}
		if len(page) == 0 {
			break
		}
		after = page[len(page)-1].ID
		res.Endpoints += len(page)
		var ids []string
		for _, p := range page {
			if stale(colSecrets, p.Secrets) || stale(colClientKey, p.ClientKey) || stale(colHeaders, p.Headers) {
				ids = append(ids, p.ID)
			}
		}
		if len(ids) > 0 {
			skipped, err := rewrite(ids)
			if err != nil {
				return res, err
			}
			busy = append(busy, skipped...)
		}
	}
	// The rows that were locked: again, until they are free.
	for wait := 10 * time.Millisecond; len(busy) > 0; wait = min(wait*2, time.Second) {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return res, ctx.Err()
		case <-t.C:
		}
		var still []string
		for chunk := range slices.Chunk(busy, reencryptBatch) {
			skipped, err := rewrite(chunk)
			if err != nil {
				return res, err
			}
			still = append(still, skipped...)
		}
		busy = still
	}
	return res, nil
}
