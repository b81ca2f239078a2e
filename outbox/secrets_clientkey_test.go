package outbox_test

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// clientKeyID is the key ID of an endpoint's stored client key, "" for
// plaintext PEM.
func (b *bundle) clientKeyID(id string) string {
	b.t.Helper()
	stored := b.stored("client_key", id)
	if !strings.HasPrefix(stored, "{") {
		if !strings.HasPrefix(stored, "-----BEGIN PRIVATE KEY-----") {
			b.t.Fatalf("%s: client_key is neither PEM nor encrypted", id)
		}
		return ""
	}
	return b.queryString(`SELECT json_extract(client_key, '$.kid') FROM txhook_endpoints WHERE id = ?`,
		`SELECT client_key::jsonb->>'kid' FROM txhook_endpoints WHERE id = ?`, id)
}

// A client key's ciphertext is bound to its endpoint and column: copied to
// another endpoint (with the certificate, so that only the binding stops
// it), or into the client_key column from secrets, it does not decrypt;
// the relay sends nothing for that endpoint and spends no attempt.
func TestSecretsClientKeyBoundToEndpoint(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		logs := newLogRecorder()
		k1 := aesKey(t, "k1")
		b := setup(t, db, outbox.Config{SecretCipher: keyring(t, k1), Logger: slog.New(logs)})
		srv := newMTLSServer(t)
		firstCert, secondCert := srv.clientCert(t, "first"), srv.clientCert(t, "second")
		// first has the lower ID: it is the one Start checks.
		first, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m", URL: srv.URL + "/first", EventTypes: []string{"a"}, ClientCert: firstCert})
		if err != nil {
			t.Fatal(err)
		}
		second, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m", URL: srv.URL + "/second", EventTypes: []string{"b"}, ClientCert: secondCert})
		if err != nil {
			t.Fatal(err)
		}
		if first.ID > second.ID {
			t.Fatal("endpoint IDs are not increasing")
		}
		if kid := b.clientKeyID(first.ID); kid != "k1" {
			t.Fatalf("client key stored under %q", kid)
		}
		if _, err := b.db.ExecContext(b.ctx, b.rebind(`UPDATE txhook_endpoints SET
client_cert = (SELECT client_cert FROM txhook_endpoints WHERE id = ?),
client_key = (SELECT client_key FROM txhook_endpoints WHERE id = ?) WHERE id = ?`), first.ID, first.ID, second.ID); err != nil {
			t.Fatal(err)
		}

		// The relay presents first's certificate for first, and none for
		// second: its delivery waits, unspent, and nothing is sent.
		b.relay(outbox.RelayConfig{RootCAs: srv.roots})
		b.enqueue(outbox.Event{Tenant: "m", Type: "a", Payload: []byte(`1`)})
		if cn := recv(t, srv.peers, "first's delivery"); cn != "first" {
			t.Fatalf("first's delivery presented %q", cn)
		}
		b.enqueue(outbox.Event{Tenant: "m", Type: "b", Payload: []byte(`2`)})
		b.waitsForKey(logs, second.ID, "client certificate key")
		if len(srv.peers) != 0 {
			t.Fatal("a request for second reached the server")
		}
		if msg, ok := logs.holding("PRIVATE KEY", string(firstCert.KeyPEM[28:90])); ok {
			t.Fatalf("a log line shows a private key: %s", msg)
		}

		// The re-encrypt pass stops at it, naming the endpoint and column.
		rekey := b.reopen(outbox.Config{SecretCipher: keyring(t, aesKey(t, "k2"), k1)})
		_, err = rekey.ob.ReencryptSecrets(b.ctx)
		var se *outbox.SecretsError
		if !errors.Is(err, outbox.ErrDecrypt) || !errors.As(err, &se) || se.EndpointID != second.ID || se.Column != "client_key" || se.KeyID != "k1" {
			t.Fatalf("ReencryptSecrets over a copied client key: %v", err)
		}
		if strings.Contains(err.Error(), "PRIVATE KEY") {
			t.Fatal("the error shows a key")
		}

		// The secrets ciphertext of the same endpoint, moved into its
		// client_key column, does not decrypt either.
		move := `UPDATE txhook_endpoints SET client_key = secrets WHERE id = ?`
		if db.Backend.Postgres() {
			move = `UPDATE txhook_endpoints SET client_key = secrets::text WHERE id = ?`
		}
		if _, err := b.db.ExecContext(b.ctx, b.rebind(move), second.ID); err != nil {
			t.Fatal(err)
		}
		if kid := b.clientKeyID(second.ID); kid != "k1" {
			t.Fatalf("moved ciphertext has key ID %q", kid)
		}
		_, err = rekey.ob.ReencryptSecrets(b.ctx)
		if !errors.Is(err, outbox.ErrDecrypt) || !errors.As(err, &se) || se.EndpointID != second.ID || se.Column != "client_key" {
			t.Fatalf("ReencryptSecrets over the secrets in client_key: %v", err)
		}
	})
}

// mTLS keeps working with encryption on: a plaintext client key written
// before the key was set, its encryption by ReencryptSecrets, a new key
// written encrypted, and the move to another key, the old one dropped.
func TestSecretsClientKeyRotation(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		srv := newMTLSServer(t)
		plain := setup(t, db, outbox.Config{})
		old, err := plain.ob.CreateEndpoint(plain.ctx, outbox.NewEndpoint{Tenant: "m", URL: srv.URL + "/old", ClientCert: srv.clientCert(t, "old")})
		if err != nil {
			t.Fatal(err)
		}
		if kid := plain.clientKeyID(old.ID); kid != "" {
			t.Fatalf("without a cipher the client key is stored under %q", kid)
		}
		// deliver sends an event to every endpoint of tenant m and returns
		// the client names the server saw.
		deliver := func(b *bundle, n int) map[string]bool {
			t.Helper()
			b.enqueue(outbox.Event{Tenant: "m", Type: "a", Payload: []byte(`{}`)})
			seen := map[string]bool{}
			for range n {
				seen[recv(t, srv.peers, "an mTLS delivery")] = true
			}
			return seen
		}

		k1, k2 := aesKey(t, "k1"), aesKey(t, "k2")
		enc := plain.reopen(outbox.Config{SecretCipher: keyring(t, k1)})
		r := enc.relay(outbox.RelayConfig{RootCAs: srv.roots})
		if seen := deliver(enc, 1); !seen["old"] {
			t.Fatalf("plaintext client key with a cipher set: the server saw %v", seen)
		}
		res, err := enc.ob.ReencryptSecrets(enc.ctx)
		if err != nil || res != (outbox.ReencryptResult{Endpoints: 1, Encrypted: 1, ClientKeysEncrypted: 1}) {
			t.Fatalf("first pass: %+v, %v", res, err)
		}
		if kid := enc.clientKeyID(old.ID); kid != "k1" {
			t.Fatalf("after the pass the client key is stored under %q", kid)
		}
		added, err := enc.ob.CreateEndpoint(enc.ctx, outbox.NewEndpoint{Tenant: "m", URL: srv.URL + "/new", ClientCert: srv.clientCert(t, "new")})
		if err != nil {
			t.Fatal(err)
		}
		if kid := enc.clientKeyID(added.ID); kid != "k1" {
			t.Fatalf("a new client key is stored under %q", kid)
		}
		if seen := deliver(enc, 2); !seen["old"] || !seen["new"] {
			t.Fatalf("encrypted client keys: the server saw %v", seen)
		}
		if err := r.Stop(enc.ctx); err != nil {
			t.Fatal(err)
		}

		// k2 encrypts; the pass moves every client key to it.
		step2 := plain.reopen(outbox.Config{SecretCipher: keyring(t, k2, k1)})
		res, err = step2.ob.ReencryptSecrets(step2.ctx)
		if err != nil || res != (outbox.ReencryptResult{Endpoints: 2, Rekeyed: 2, ClientKeysRekeyed: 2}) {
			t.Fatalf("rekey pass: %+v, %v", res, err)
		}
		for _, id := range []string{old.ID, added.ID} {
			if kid := step2.clientKeyID(id); kid != "k2" {
				t.Fatalf("%s: client key stored under %q after the pass", id, kid)
			}
		}

		// k1 dropped: a relay with k2 alone starts and presents both.
		step3 := plain.reopen(outbox.Config{SecretCipher: keyring(t, k2)})
		step3.relay(outbox.RelayConfig{RootCAs: srv.roots})
		if seen := deliver(step3, 2); !seen["old"] || !seen["new"] {
			t.Fatalf("after the rotation: the server saw %v", seen)
		}

		// A relay without k2 does not start: the check covers client keys.
		plain.startRefusedFor(keyring(t, k1), old.ID, "client_key", "k2")
	})
}
