package outbox_test

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// headersKeyID is the key ID of an endpoint's stored custom headers, ""
// for a plaintext header object.
func (b *bundle) headersKeyID(id string) string {
	b.t.Helper()
	return b.queryString(`SELECT CASE WHEN json_type(headers, '$.v') = 'integer' THEN json_extract(headers, '$.kid') ELSE '' END FROM txhook_endpoints WHERE id = ?`,
		`SELECT CASE WHEN jsonb_typeof(headers->'v') = 'number' THEN headers->>'kid' ELSE '' END FROM txhook_endpoints WHERE id = ?`, id)
}

// A custom headers ciphertext is bound to its endpoint: copied to another
// endpoint's row, it does not decrypt, for reads, for the relay (which
// sends nothing for that endpoint and spends no attempt, even with the
// first endpoint's headers cached) and for ReencryptSecrets.
func TestSecretsHeadersBoundToEndpoint(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		logs := newLogRecorder()
		k1 := aesKey(t, "k1")
		b := setup(t, db, outbox.Config{SecretCipher: keyring(t, k1), Logger: slog.New(logs)})
		rc := newReceiver(t, nil)
		tokA, tokB := bearerToken(t), bearerToken(t)
		// first has the lower ID: it is the one Start checks.
		first, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m", URL: rc.URL + "/first", EventTypes: []string{"a"},
			Headers: outbox.Headers{"Authorization": "Bearer " + tokA}})
		if err != nil {
			t.Fatal(err)
		}
		second, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m", URL: rc.URL + "/second", EventTypes: []string{"b"},
			Headers: outbox.Headers{"Authorization": "Bearer " + tokB}})
		if err != nil {
			t.Fatal(err)
		}
		if first.ID > second.ID {
			t.Fatal("endpoint IDs are not increasing")
		}
		if first.Headers["Authorization"] != "Bearer "+tokA {
			t.Fatalf("CreateEndpoint returned headers %v", first.Headers)
		}
		if kid := b.headersKeyID(second.ID); kid != "k1" {
			t.Fatalf("headers stored under %q", kid)
		}
		if _, err := b.db.ExecContext(b.ctx, b.rebind(`UPDATE txhook_endpoints SET headers = (SELECT headers FROM txhook_endpoints WHERE id = ?) WHERE id = ?`), first.ID, second.ID); err != nil {
			t.Fatal(err)
		}

		_, err = b.ob.Endpoint(b.ctx, second.ID)
		var se *outbox.SecretsError
		if !errors.Is(err, outbox.ErrSecretKey) || !errors.Is(err, outbox.ErrDecrypt) || !errors.As(err, &se) ||
			se.EndpointID != second.ID || se.Column != "headers" || se.KeyID != "k1" {
			t.Fatalf("reading the endpoint with a copied headers ciphertext: %v", err)
		}
		if strings.Contains(err.Error(), tokA) || strings.Contains(err.Error(), tokB) {
			t.Fatal("the error shows a token")
		}
		if _, err := b.ob.Endpoints(b.ctx, "m"); !errors.Is(err, outbox.ErrDecrypt) {
			t.Fatalf("listing the endpoints: %v", err)
		}

		// The relay sends first's headers to first (cached), and never to
		// second: its delivery waits, unspent, and nothing is sent.
		b.relay(outbox.RelayConfig{})
		b.enqueue(outbox.Event{Tenant: "m", Type: "a", Payload: []byte(`1`)})
		if got := <-rc.got; got.Header.Get("Authorization") != "Bearer "+tokA {
			t.Fatal("first's delivery does not carry its Authorization header")
		}
		b.enqueue(outbox.Event{Tenant: "m", Type: "b", Payload: []byte(`2`)})
		b.waitsForKey(logs, second.ID, "custom headers")
		if len(rc.requests()) != 1 {
			t.Fatalf("%d requests sent, want 1 (first's)", len(rc.requests()))
		}
		if msg, ok := logs.holding(tokA, tokB); ok {
			t.Fatalf("a log line shows a token: %s", msg)
		}

		// The re-encrypt pass stops at it, naming the endpoint and column.
		rekey := b.reopen(outbox.Config{SecretCipher: keyring(t, aesKey(t, "k2"), k1)})
		_, err = rekey.ob.ReencryptSecrets(b.ctx)
		if !errors.Is(err, outbox.ErrDecrypt) || !errors.As(err, &se) || se.EndpointID != second.ID || se.Column != "headers" || se.KeyID != "k1" {
			t.Fatalf("ReencryptSecrets over copied headers: %v", err)
		}

		// Writing the headers again repairs the endpoint.
		if _, err := b.ob.UpdateEndpoint(b.ctx, second.ID, outbox.EndpointUpdate{Headers: &outbox.Headers{"Authorization": "Bearer " + tokB}}); err != nil {
			t.Fatal(err)
		}
		if ep, err := b.ob.Endpoint(b.ctx, second.ID); err != nil || ep.Headers["Authorization"] != "Bearer "+tokB {
			t.Fatalf("after UpdateEndpoint: %v, %v", ep.Headers, err)
		}
	})
}

// Custom headers keep working with encryption on: a plaintext header
// object written before the key was set (one with the member names of the
// encrypted form, as a row written by hand could have, so that only the
// type of "v" tells them apart), its
// encryption by ReencryptSecrets, new and updated headers written
// encrypted, and the move to another key, the old one dropped.
func TestSecretsHeadersRotation(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		rc := newReceiver(t, nil)
		tokOld, tokNew, tokUpd := bearerToken(t), bearerToken(t), bearerToken(t)
		plain := setup(t, db, outbox.Config{})
		old, err := plain.ob.CreateEndpoint(plain.ctx, outbox.NewEndpoint{Tenant: "m", URL: rc.URL,
			Headers: outbox.Headers{"X-Path": "old", "Authorization": "Bearer " + tokOld}})
		if err != nil {
			t.Fatal(err)
		}
		lookalike := `{"v":"1","kid":"k1","ct":"AAAA","X-Path":"old","Authorization":"Bearer ` + tokOld + `"}`
		if _, err := plain.db.ExecContext(plain.ctx, plain.rebind(`UPDATE txhook_endpoints SET headers = ? WHERE id = ?`), lookalike, old.ID); err != nil {
			t.Fatal(err)
		}
		if stored := plain.stored("headers", old.ID); !strings.Contains(stored, tokOld) || plain.headersKeyID(old.ID) != "" {
			t.Fatal("without a cipher the headers are not stored in plaintext")
		}
		// deliver sends an event to every endpoint of tenant m and returns
		// the Authorization header each X-Path received.
		deliver := func(b *bundle, n int) map[string]string {
			t.Helper()
			before := len(rc.requests())
			b.enqueue(outbox.Event{Tenant: "m", Type: "a", Payload: []byte(`{}`)})
			for range n {
				<-rc.got
			}
			got := map[string]string{}
			for _, r := range rc.requests()[before:] {
				got[r.Header.Get("X-Path")] = r.Header.Get("Authorization")
				if r.Header.Get("Kid") != "" && r.Header.Get("Kid") != "k1" {
					t.Errorf("header Kid is %q", r.Header.Get("Kid"))
				}
			}
			return got
		}

		k1, k2 := aesKey(t, "k1"), aesKey(t, "k2")
		enc := plain.reopen(outbox.Config{SecretCipher: keyring(t, k1)})
		r := enc.relay(outbox.RelayConfig{})
		if got := deliver(enc, 1); got["old"] != "Bearer "+tokOld {
			t.Fatalf("plaintext headers with a cipher set: %v", got)
		}
		if ep, err := enc.ob.Endpoint(enc.ctx, old.ID); err != nil || len(ep.Headers) != 5 || ep.Headers["kid"] != "k1" {
			t.Fatalf("plaintext headers read back: %v, %v", ep.Headers, err)
		}
		res, err := enc.ob.ReencryptSecrets(enc.ctx)
		if err != nil || res != (outbox.ReencryptResult{Endpoints: 1, Encrypted: 1, HeadersEncrypted: 1}) {
			t.Fatalf("first pass: %+v, %v", res, err)
		}
		if kid := enc.headersKeyID(old.ID); kid != "k1" {
			t.Fatalf("after the pass the headers are stored under %q", kid)
		}
		added, err := enc.ob.CreateEndpoint(enc.ctx, outbox.NewEndpoint{Tenant: "m", URL: rc.URL,
			Headers: outbox.Headers{"X-Path": "new", "Authorization": "Bearer " + tokNew}})
		if err != nil {
			t.Fatal(err)
		}
		if kid := enc.headersKeyID(added.ID); kid != "k1" {
			t.Fatalf("new headers are stored under %q", kid)
		}
		if got := deliver(enc, 2); got["old"] != "Bearer "+tokOld || got["new"] != "Bearer "+tokNew {
			t.Fatalf("encrypted headers: %v", got)
		}
		if err := r.Stop(enc.ctx); err != nil {
			t.Fatal(err)
		}

		// k2 encrypts: updated headers are stored under it, and the pass
		// moves the rest.
		step2 := plain.reopen(outbox.Config{SecretCipher: keyring(t, k2, k1)})
		if _, err := step2.ob.UpdateEndpoint(step2.ctx, added.ID, outbox.EndpointUpdate{
			Headers: &outbox.Headers{"X-Path": "new", "Authorization": "Bearer " + tokUpd}}); err != nil {
			t.Fatal(err)
		}
		if kid := step2.headersKeyID(added.ID); kid != "k2" {
			t.Fatalf("updated headers are stored under %q", kid)
		}
		res, err = step2.ob.ReencryptSecrets(step2.ctx)
		if err != nil || res != (outbox.ReencryptResult{Endpoints: 2, Rekeyed: 2, HeadersRekeyed: 1}) {
			t.Fatalf("rekey pass: %+v, %v", res, err)
		}
		eps, err := step2.ob.Endpoints(step2.ctx, "m")
		if err != nil || len(eps) != 2 {
			t.Fatalf("endpoints: %v", err)
		}
		for _, ep := range eps {
			if kid := step2.headersKeyID(ep.ID); kid != "k2" {
				t.Fatalf("%s: headers stored under %q after the pass", ep.ID, kid)
			}
			if ep.Headers["Authorization"] == "" || ep.Headers["X-Path"] == "" {
				t.Fatalf("%s read back with headers %v", ep.ID, ep.Headers)
			}
		}

		// k1 dropped: a relay with k2 alone starts and sends both.
		step3 := plain.reopen(outbox.Config{SecretCipher: keyring(t, k2)})
		step3.relay(outbox.RelayConfig{})
		if got := deliver(step3, 2); got["old"] != "Bearer "+tokOld || got["new"] != "Bearer "+tokUpd {
			t.Fatalf("after the rotation: %v", got)
		}
		// A relay without k2 does not start: the check covers headers.
		plain.startRefusedFor(keyring(t, k1), old.ID, "headers", "k2")
	})
}
