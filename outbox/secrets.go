package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Secrets at rest. txhook_endpoints.secrets holds either the plaintext JSON
// array of an endpoint's secrets (no Config.SecretCipher, or a row written
// before one was set) or, encrypted, the JSON object
//
//	{"v": 1, "kid": "<key ID>", "ct": "<base64 ciphertext of that array>"}
//
// The ciphertext is bound to the endpoint: its associated data is
// secretsAD(endpoint ID), so a ciphertext copied into another endpoint's row
// does not decrypt. Both forms are read everywhere; writes use the
// encrypted one whenever a Cipher is configured.

// sealedSecrets is the encrypted form of the secrets column.
type sealedSecrets struct {
	V   int    `json:"v"`
	Kid string `json:"kid"`
	CT  []byte `json:"ct"`
}

// secretsAD is the associated data of an endpoint's secrets ciphertext:
// the column it belongs in and the endpoint ID.
func secretsAD(endpointID string) []byte {
	return []byte("txhook_endpoints.secrets\x00" + endpointID)
}

// storedKeyID reports whether raw is the encrypted form, and its key ID.
func storedKeyID(raw []byte) (string, bool) {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 || raw[0] != '{' {
		return "", false
	}
	var env struct {
		Kid string `json:"kid"`
	}
	_ = json.Unmarshal(raw, &env)
	return env.Kid, true
}

// sealSecrets returns the stored form of an endpoint's secrets: encrypted
// with Config.SecretCipher when there is one, plaintext JSON otherwise.
func (o *Outbox) sealSecrets(ctx context.Context, endpointID string, ss []Secret) ([]byte, error) {
	plain := encodeSecrets(ss)
	c := o.cfg.SecretCipher
	if c == nil {
		return plain, nil
	}
	defer clear(plain)
	kid, ct, err := c.Encrypt(ctx, plain, secretsAD(endpointID))
	if err != nil {
		return nil, fmt.Errorf("txhook: encrypting the secrets of endpoint %.64q: %w", endpointID, err)
	}
	return json.Marshal(sealedSecrets{V: 1, Kid: kid, CT: ct})
}

// openSecrets reads the stored form of an endpoint's secrets. Errors about
// encryption are *SecretsError.
func (o *Outbox) openSecrets(ctx context.Context, endpointID string, raw []byte) ([]Secret, error) {
	if _, sealed := storedKeyID(raw); !sealed {
		return decodeSecrets(raw)
	}
	var env sealedSecrets
	if err := json.Unmarshal(raw, &env); err != nil || env.V != 1 || env.Kid == "" {
		return nil, &SecretsError{EndpointID: endpointID, KeyID: env.Kid, Err: errors.New("stored secrets are not in a known encrypted form")}
	}
	c := o.cfg.SecretCipher
	if c == nil {
		return nil, &SecretsError{EndpointID: endpointID, KeyID: env.Kid, Err: ErrNoSecretCipher}
	}
	plain, err := c.Decrypt(ctx, env.Kid, env.CT, secretsAD(endpointID))
	if err != nil {
		return nil, &SecretsError{EndpointID: endpointID, KeyID: env.Kid, Err: err}
	}
	defer clear(plain)
	return decodeSecrets(plain)
}

// checkSecretKeys fails, with a *SecretsError, when secrets are stored
// under a key this outbox cannot use: no Cipher, a key ID the Cipher does
// not have, or a different key under that ID. It decrypts one endpoint per
// key ID in use.
func (o *Outbox) checkSecretKeys(ctx context.Context) error {
	samples, err := o.st.SecretKeySamples(ctx)
	if err != nil {
		return fmt.Errorf("txhook: checking the keys of stored secrets: %w", err)
	}
	for _, s := range samples {
		if _, err := o.openSecrets(ctx, s.ID, s.Secrets); err != nil {
			return err
		}
	}
	return nil
}

// warnUnencrypted logs, once per Outbox, that secrets are stored in
// plaintext.
func (o *Outbox) warnUnencrypted() {
	if o.cfg.SecretCipher == nil {
		o.log.Warn("txhook: Config.SecretCipher is not set: endpoint signing secrets are stored unencrypted " +
			"(see \"Secrets at rest\" in txhook's README)")
	}
}

// ReencryptResult counts what ReencryptSecrets did.
type ReencryptResult struct {
	Endpoints int // endpoints read
	Encrypted int // stored in plaintext before, encrypted now
	Rekeyed   int // encrypted under another key before, under the Cipher's KeyID now
}

// reencryptBatch is how many endpoints one step of ReencryptSecrets reads,
// and at most rewrites in one transaction.
const reencryptBatch = 100

// ReencryptSecrets moves every endpoint's stored secrets to the current
// key of Config.SecretCipher: plaintext rows (written before a Cipher was
// configured) are encrypted, and rows encrypted under an older key are
// encrypted again under Cipher.KeyID(). Run it after setting a Cipher for
// the first time and after every key rotation, before the old key is
// dropped; it is idempotent and can be interrupted and run again.
//
// It works in batches of 100 endpoints, one short transaction each, in
// which the rows it rewrites are locked on PostgreSQL, so it is safe
// alongside running relays, rotations and other ReencryptSecrets calls;
// rows locked by someone else are done once they are free. Relays keep
// delivering throughout: they decrypt both forms, with every key of the
// Cipher. It fails with ErrNoSecretCipher without a Cipher, and stops at
// the first endpoint whose secrets cannot be decrypted (a *SecretsError),
// returning what it did until then.
func (o *Outbox) ReencryptSecrets(ctx context.Context) (ReencryptResult, error) {
	var res ReencryptResult
	c := o.cfg.SecretCipher
	if c == nil {
		return res, ErrNoSecretCipher
	}
	current := c.KeyID()
	stale := func(raw []byte) bool {
		kid, sealed := storedKeyID(raw)
		return !sealed || kid != current
	}
	rewrite := func(ids []string) ([]string, error) {
		var encrypted, rekeyed int
		skipped, err := o.st.RewriteSecrets(ctx, ids, func(id string, cur []byte) ([]byte, error) {
			if !stale(cur) {
				return nil, nil // done meanwhile, by a rotation or another pass
			}
			ss, err := o.openSecrets(ctx, id, cur)
			if err != nil {
				return nil, err
			}
			if _, sealed := storedKeyID(cur); sealed {
				rekeyed++
			} else {
				encrypted++
			}
			return o.sealSecrets(ctx, id, ss)
		})
		if err != nil {
			return nil, err
		}
		res.Encrypted += encrypted
		res.Rekeyed += rekeyed
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
			if stale(p.Secrets) {
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
