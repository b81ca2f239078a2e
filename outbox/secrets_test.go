package outbox_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/signer"
	"github.com/txhook/txhook/verify"
)

// aesKey is a fresh random AES-256 key named id.
func aesKey(t testing.TB, id string) outbox.AESKey {
	t.Helper()
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return outbox.AESKey{ID: id, Key: k}
}

func keyring(t testing.TB, keys ...outbox.AESKey) *outbox.AESGCM {
	t.Helper()
	c, err := outbox.NewAESGCM(keys...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// reopen returns another Outbox on b's database with cfg (a process that
// was restarted with another configuration).
func (b *bundle) reopen(cfg outbox.Config) *bundle {
	b.t.Helper()
	return setup(b.t, b.db, cfg)
}

// stored reads column col (secrets or client_key) of an endpoint as
// stored.
func (b *bundle) stored(col, id string) string {
	b.t.Helper()
	var s string
	if err := b.db.QueryRowContext(b.ctx, b.rebind(`SELECT `+col+` FROM txhook_endpoints WHERE id = ?`), id).Scan(&s); err != nil {
		b.t.Fatal(err)
	}
	return s
}

// storedKeyID is the key ID of an endpoint's stored secrets, "" for
// plaintext.
func (b *bundle) storedKeyID(id string) string {
	b.t.Helper()
	return b.queryString(`SELECT COALESCE(json_extract(secrets, '$.kid'), '') FROM txhook_endpoints WHERE id = ?`,
		`SELECT COALESCE(secrets->>'kid', '') FROM txhook_endpoints WHERE id = ?`, id)
}

// queryString runs the query of b's dialect, sqlite or postgres, and
// returns its one text value.
func (b *bundle) queryString(sqlite, postgres string, args ...any) string {
	b.t.Helper()
	q := sqlite
	if b.db.Backend.Postgres() {
		q = postgres
	}
	var s string
	if err := b.db.QueryRowContext(b.ctx, b.rebind(q), args...).Scan(&s); err != nil {
		b.t.Fatal(err)
	}
	return s
}

// dump returns every column of every row of every txhook table as text,
// and, on SQLite, the raw bytes of the database files; on PostgreSQL also
// pg_dump's output of the test's schema when pg_dump is installed.
func (b *bundle) dump() string {
	b.t.Helper()
	var out strings.Builder
	var tables []string
	q := `SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'txhook%'`
	if b.db.Backend.Postgres() {
		q = `SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_name LIKE 'txhook%'`
	}
	rows, err := b.db.QueryContext(b.ctx, q)
	if err != nil {
		b.t.Fatal(err)
	}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			b.t.Fatal(err)
		}
		tables = append(tables, name)
	}
	rows.Close()
	if len(tables) < 5 {
		b.t.Fatalf("found only the tables %v", tables)
	}
	for _, tbl := range tables {
		rows, err := b.db.QueryContext(b.ctx, `SELECT * FROM `+tbl)
		if err != nil {
			b.t.Fatal(err)
		}
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				b.t.Fatal(err)
			}
			for i, v := range vals {
				if bs, ok := v.([]byte); ok {
					v = string(bs)
				}
				fmt.Fprintf(&out, "%s.%s=%v\n", tbl, cols[i], v)
			}
		}
		rows.Close()
		if b.db.Backend.Postgres() {
			// The row as PostgreSQL renders it, whatever the column types.
			rows, err := b.db.QueryContext(b.ctx, `SELECT t::text FROM `+tbl+` t`)
			if err != nil {
				b.t.Fatal(err)
			}
			for rows.Next() {
				var s string
				if err := rows.Scan(&s); err != nil {
					b.t.Fatal(err)
				}
				out.WriteString(s + "\n")
			}
			rows.Close()
		}
	}
	if !b.db.Backend.Postgres() {
		var file string
		if err := b.db.QueryRowContext(b.ctx, `SELECT file FROM pragma_database_list WHERE name = 'main'`).Scan(&file); err != nil {
			b.t.Fatal(err)
		}
		for _, f := range []string{file, file + "-wal"} {
			raw, err := os.ReadFile(f)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				b.t.Fatal(err)
			}
			out.Write(raw)
		}
	} else if pgDump, err := exec.LookPath("pg_dump"); err == nil {
		var schema string
		if err := b.db.QueryRowContext(b.ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
			b.t.Fatal(err)
		}
		cmd := exec.CommandContext(b.ctx, pgDump, "--data-only", "--schema="+schema, "--dbname="+os.Getenv(testdb.EnvDSN))
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &stderr
		if err := cmd.Run(); err != nil {
			// A pg_dump older than the server refuses to run: the rows
			// above are the same data.
			b.t.Logf("pg_dump not used: %v: %s", err, stderr.String())
		}
	}
	return out.String()
}

// secretNeedles are the forms in which a secret could show in a dump: as
// is, its base64 body, and the key bytes in other encodings.
func secretNeedles(t *testing.T, secret string) []string {
	t.Helper()
	_, body, ok := strings.Cut(secret, "_")
	if !ok {
		t.Fatalf("secret without prefix")
	}
	raw, err := base64.StdEncoding.DecodeString(body)
	if err != nil {
		t.Fatal(err)
	}
	needles := []string{secret, body, hex.EncodeToString(raw), base64.RawURLEncoding.EncodeToString(raw), base64.RawStdEncoding.EncodeToString(raw)}
	if strings.HasPrefix(secret, "whsk_") {
		seed := raw[:32] // the private half of the 64-byte ed25519 key
		needles = append(needles, hex.EncodeToString(seed), base64.RawStdEncoding.EncodeToString(seed)[:40])
	}
	return needles
}

// bearerToken is a fresh random token for an Authorization header.
func bearerToken(t testing.TB) string {
	t.Helper()
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	return "tok_" + hex.EncodeToString(raw)
}

// keyNeedles are the forms in which a PEM private key could show in a
// dump: the PEM, its base64 body (whole, and its first line), the DER and
// the private scalar, raw and encoded.
func keyNeedles(t *testing.T, keyPEM []byte) []string {
	t.Helper()
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		t.Fatal("key is not PEM")
	}
	body := base64.StdEncoding.EncodeToString(block.Bytes)
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	scalar, err := key.(*ecdsa.PrivateKey).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	return []string{string(keyPEM), body, body[:64], hex.EncodeToString(block.Bytes), string(block.Bytes),
		hex.EncodeToString(scalar), base64.StdEncoding.EncodeToString(scalar)[:40], string(scalar)}
}

func TestSecretsDumpHoldsNoSecret(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		for _, encrypted := range []bool{false, true} {
			t.Run(fmt.Sprintf("encrypted=%v", encrypted), func(t *testing.T) {
				if encrypted {
					// A second schema or file: the plaintext run left secrets behind.
					db = testdb.Open(t, db.Backend)
				}
				cfg := outbox.Config{}
				if encrypted {
					cfg.SecretCipher = keyring(t, aesKey(t, "k1"))
				}
				b := setup(t, db, cfg)
				rc := newReceiver(t, func(n int, r *http.Request) int {
					if strings.HasSuffix(r.URL.Path, "/dead") {
						return http.StatusInternalServerError
					}
					return http.StatusOK
				})
				private, public, err := signer.GenerateKeyPair()
				if err != nil {
					t.Fatal(err)
				}
				hmacEp := b.endpoint("m", rc.URL+"/hmac")
				edEp, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m", URL: rc.URL + "/ed", Secret: private})
				if err != nil {
					t.Fatal(err)
				}
				deadEp := b.endpoint("m", rc.URL+"/dead")
				// An endpoint behind mutual TLS: its client key is a secret too.
				mtls := newMTLSServer(t)
				cert := mtls.clientCert(t, "relay-for-m")
				if _, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m", URL: mtls.URL, ClientCert: cert}); err != nil {
					t.Fatal(err)
				}
				rotated, err := b.ob.RotateSecret(b.ctx, hmacEp.ID, outbox.Rotation{})
				if err != nil {
					t.Fatal(err)
				}
				// A receiver's own credential in a custom header is a secret too.
				token := bearerToken(t)
				hdrEp, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m", URL: rc.URL + "/hdr",
					Headers: outbox.Headers{"Authorization": "Bearer " + token, "X-Route": "eu"}})
				if err != nil {
					t.Fatal(err)
				}
				secrets := []string{hmacEp.Secrets[0].Value, rotated.Secrets[0].Value, private, deadEp.Secrets[0].Value, hdrEp.Secrets[0].Value}

				// Deliveries, attempts and a dead letter, so every table has rows.
				b.relay(outbox.RelayConfig{Retry: fastRetryAttempts(1), RootCAs: mtls.roots})
				b.enqueue(outbox.Event{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"amount":1}`)})
				b.eventually("delivered and dead-lettered", func() bool {
					return b.count(`SELECT COUNT(*) FROM txhook_deliveries WHERE state IN ('succeeded', 'dead')`) == 5
				})
				if cn := recv(t, mtls.peers, "the mTLS delivery"); cn != "relay-for-m" {
					t.Fatalf("the mTLS server saw client %q", cn)
				}
				withHeader := 0
				for _, got := range rc.requests() {
					if got.Header.Get("Authorization") == "Bearer "+token && got.Header.Get("X-Route") == "eu" {
						withHeader++
					}
					v, err := verify.New(verify.Config{Secrets: []string{rotated.Secrets[0].Value, public, deadEp.Secrets[0].Value, hdrEp.Secrets[0].Value}})
					if err != nil {
						t.Fatal(err)
					}
					if _, err := v.Verify(got.Header, got.Body); err != nil {
						t.Errorf("delivery does not verify: %v", err)
					}
				}
				if withHeader != 1 {
					t.Fatalf("%d requests carried the endpoint's headers, want 1", withHeader)
				}
				if ep, err := b.ob.Endpoint(b.ctx, edEp.ID); err != nil || ep.Secrets[0].Value != private {
					t.Fatalf("endpoint read back: %v", err)
				}
				if ep, err := b.ob.Endpoint(b.ctx, hdrEp.ID); err != nil || ep.Headers["Authorization"] != "Bearer "+token || len(ep.Headers) != 2 {
					t.Fatalf("headers read back: %v, %v", ep.Headers, err)
				}

				dump := b.dump()
				found := 0
				for _, s := range secrets {
					for _, n := range secretNeedles(t, s) {
						if strings.Contains(dump, n) {
							found++
							if encrypted {
								t.Errorf("the dump holds a secret (%s…, as %d characters)", s[:8], len(n))
							}
						}
					}
				}
				if !encrypted && found == 0 {
					t.Fatal("control: the plaintext dump holds no secret; the dump misses the secrets column")
				}
				found = 0
				for _, n := range keyNeedles(t, cert.KeyPEM) {
					if strings.Contains(dump, n) {
						found++
						if encrypted {
							t.Errorf("the dump holds the client certificate's private key (as %d bytes)", len(n))
						}
					}
				}
				if !encrypted && found == 0 {
					t.Fatal("control: the plaintext dump holds no client key; the dump misses the client_key column")
				}
				if strings.Contains(dump, token) {
					if encrypted {
						t.Error("the dump holds the Authorization header's token")
					}
				} else if !encrypted {
					t.Fatal("control: the plaintext dump holds no header token; the dump misses the headers column")
				}
			})
		}
	})
}

func TestSecretsCiphertextBoundToEndpoint(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		logs := newLogRecorder()
		b := setup(t, db, outbox.Config{SecretCipher: keyring(t, aesKey(t, "k1")), Logger: slog.New(logs)})
		rc := newReceiver(t, nil)
		// first has the lower ID: it is the one Start checks.
		first, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m", URL: rc.URL + "/first", EventTypes: []string{"a", "c"}})
		if err != nil {
			t.Fatal(err)
		}
		second, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m", URL: rc.URL + "/second", EventTypes: []string{"b", "c"}})
		if err != nil {
			t.Fatal(err)
		}
		if first.ID > second.ID {
			first, second = second, first
			t.Fatal("endpoint IDs are not increasing")
		}
		if _, err := b.db.ExecContext(b.ctx, b.rebind(`UPDATE txhook_endpoints SET secrets = (SELECT secrets FROM txhook_endpoints WHERE id = ?) WHERE id = ?`), first.ID, second.ID); err != nil {
			t.Fatal(err)
		}

		_, err = b.ob.Endpoint(b.ctx, second.ID)
		var se *outbox.SecretsError
		if !errors.Is(err, outbox.ErrSecretKey) || !errors.Is(err, outbox.ErrDecrypt) || !errors.As(err, &se) || se.EndpointID != second.ID || se.KeyID != "k1" {
			t.Fatalf("reading the endpoint with a copied ciphertext: %v", err)
		}
		if strings.Contains(err.Error(), first.Secrets[0].Value) || strings.Contains(err.Error(), second.Secrets[0].Value) {
			t.Fatal("the error shows a secret")
		}
		if _, err := b.ob.RotateSecret(b.ctx, second.ID, outbox.Rotation{}); !errors.Is(err, outbox.ErrDecrypt) {
			t.Fatalf("rotating over a copied ciphertext: %v", err)
		}

		// The relay signs with first's secrets (cached), and never with
		// them for second: its delivery waits, unspent, and nothing is sent.
		b.relay(outbox.RelayConfig{})
		b.enqueue(outbox.Event{Tenant: "m", Type: "a", Payload: []byte(`1`)})
		got := rc.next(t)
		if err := verifyWith(got, first.Secrets[0].Value); err != nil {
			t.Fatalf("first's delivery: %v", err)
		}
		b.enqueue(outbox.Event{Tenant: "m", Type: "b", Payload: []byte(`2`)})
		b.waitsForKey(logs, second.ID, "secrets")
		if len(rc.requests()) != 1 {
			t.Fatalf("%d requests sent, want 1 (first's)", len(rc.requests()))
		}
		if msg, ok := logs.holding(first.Secrets[0].Value, second.Secrets[0].Value); ok {
			t.Fatalf("a log line shows a secret: %s", msg)
		}
	})
}

// holding returns the message of a log record with an attribute that
// contains one of needles.
func (l *logRecorder) holding(needles ...string) (string, bool) {
	for _, r := range l.records() {
		for _, v := range r.Attrs {
			for _, n := range needles {
				if strings.Contains(v, n) {
					return r.Msg, true
				}
			}
		}
	}
	return "", false
}

// startRefusedFor empties every endpoint's secrets, so that only column
// col is stored under key kid, and checks that a relay with Cipher c,
// which lacks kid, fails Start naming endpoint id, col and kid.
func (b *bundle) startRefusedFor(c outbox.Cipher, id, col, kid string) {
	b.t.Helper()
	if _, err := b.db.ExecContext(b.ctx, `UPDATE txhook_endpoints SET secrets = '[]'`); err != nil {
		b.t.Fatal(err)
	}
	r, err := b.reopen(outbox.Config{SecretCipher: c}).ob.NewRelay(outbox.RelayConfig{})
	if err != nil {
		b.t.Fatal(err)
	}
	err = r.Start(b.ctx)
	if err == nil {
		r.Stop(b.ctx)
	}
	var se *outbox.SecretsError
	if !errors.Is(err, outbox.ErrUnknownKey) || !errors.As(err, &se) || se.EndpointID != id || se.Column != col || se.KeyID != kid {
		b.t.Fatalf("Start without the key of %s: %v", col, err)
	}
}

// waitsForKey waits until the relay has logged that it cannot decrypt
// what (the secrets or client key) of endpoint id, and has given the
// endpoint's one delivery back without spending an attempt.
func (b *bundle) waitsForKey(logs *logRecorder, id, what string) {
	b.t.Helper()
	b.eventually("the key error logged", func() bool {
		for _, r := range logs.records() {
			if r.Level == slog.LevelError && strings.Contains(r.Msg, "cannot decrypt") &&
				strings.Contains(r.Attrs["error"], id) && strings.Contains(r.Attrs["error"], what) {
				return true
			}
		}
		return false
	})
	b.eventually("the delivery given back unspent", func() bool {
		return b.count(`SELECT COUNT(*) FROM txhook_deliveries WHERE endpoint_id = ? AND state = 'pending' AND attempts = 0`, id) == 1
	})
	if n := b.count(`SELECT COUNT(*) FROM txhook_attempt_log a JOIN txhook_deliveries d ON d.id = a.delivery_id WHERE d.endpoint_id = ?`, id); n != 0 {
		b.t.Fatalf("%d attempts recorded for %s", n, id)
	}
}

// verifyWith checks a received request with package verify and with the
// Standard Webhooks library.
func verifyWith(got received, secret string) error {
	v, err := verify.New(verify.Config{Secrets: []string{secret}})
	if err != nil {
		return err
	}
	if _, err := v.Verify(got.Header, got.Body); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	if strings.HasPrefix(secret, "whsec_") {
		wh, err := standardwebhooks.NewWebhook(secret)
		if err != nil {
			return err
		}
		if err := wh.Verify(got.Body, got.Header); err != nil {
			return fmt.Errorf("standard webhooks library: %w", err)
		}
	}
	return nil
}

func TestSecretsMissingKeyFailsStart(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		k1 := aesKey(t, "k1")
		b := setup(t, db, outbox.Config{SecretCipher: keyring(t, k1)})
		rc := newReceiver(t, nil)
		ep := b.endpoint("m", rc.URL)
		b.enqueue(outbox.Event{Tenant: "m", Type: "a", Payload: []byte(`1`)})

		wrong := aesKey(t, "k1") // same ID, other key
		for _, tc := range []struct {
			name   string
			cipher outbox.Cipher
			want   error
		}{
			{"no cipher", nil, outbox.ErrNoSecretCipher},
			{"only a newer key", keyring(t, aesKey(t, "k2")), outbox.ErrUnknownKey},
			{"another key under the same ID", keyring(t, wrong), outbox.ErrDecrypt},
		} {
			t.Run(tc.name, func(t *testing.T) {
				other := b.reopen(outbox.Config{SecretCipher: tc.cipher})
				r, err := other.ob.NewRelay(outbox.RelayConfig{})
				if err != nil {
					t.Fatal(err)
				}
				err = r.Start(b.ctx)
				if err == nil {
					r.Stop(b.ctx)
					t.Fatal("Start succeeded")
				}
				var se *outbox.SecretsError
				if !errors.Is(err, outbox.ErrSecretKey) || !errors.Is(err, tc.want) || !errors.As(err, &se) || se.EndpointID != ep.ID || se.KeyID != "k1" {
					t.Fatalf("Start: %v, want %v for %s", err, tc.want, ep.ID)
				}
				if strings.Contains(err.Error(), ep.Secrets[0].Value) {
					t.Fatal("the error shows the secret")
				}
				if _, err := other.ob.Endpoint(b.ctx, ep.ID); !errors.Is(err, tc.want) {
					t.Fatalf("Endpoint: %v", err)
				}
				if err := r.Stop(b.ctx); err != nil {
					t.Fatal(err)
				}
			})
		}
		if len(rc.requests()) != 0 {
			t.Fatal("a relay that failed to start sent a request")
		}
		if n := b.count(`SELECT COUNT(*) FROM txhook_attempt_log`); n != 0 {
			t.Fatalf("%d attempts recorded", n)
		}

		// The old key beside a new one starts, and delivers.
		both := b.reopen(outbox.Config{SecretCipher: keyring(t, aesKey(t, "k2"), k1)})
		both.relay(outbox.RelayConfig{})
		if err := verifyWith(<-rc.got, ep.Secrets[0].Value); err != nil {
			t.Fatal(err)
		}
	})
}

func TestSecretsPlaintextRowsKeepWorking(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		logs := newLogRecorder()
		plain := setup(t, db, outbox.Config{Logger: slog.New(logs)})
		warned := 0
		for _, r := range logs.records() {
			if strings.Contains(r.Msg, "stored unencrypted") {
				if r.Level != slog.LevelWarn {
					t.Errorf("unencrypted warning at %v", r.Level)
				}
				warned++
			}
		}
		if warned != 1 {
			t.Fatalf("%d warnings that secrets are unencrypted, want 1", warned)
		}
		rc := newReceiver(t, nil)
		var eps []outbox.Endpoint
		for i := range 3 {
			eps = append(eps, plain.endpoint(fmt.Sprint("m", i), rc.URL))
			if !strings.HasPrefix(plain.stored("secrets", eps[i].ID), "[") {
				t.Fatal("a plaintext outbox stored secrets in another form")
			}
		}

		logs2 := newLogRecorder()
		enc := plain.reopen(outbox.Config{SecretCipher: keyring(t, aesKey(t, "k1")), Logger: slog.New(logs2)})
		for _, r := range logs2.records() {
			if strings.Contains(r.Msg, "unencrypted") {
				t.Fatal("warned about unencrypted secrets with a cipher set")
			}
		}
		enc.relay(outbox.RelayConfig{})
		enc.enqueue(outbox.Event{Tenant: "m0", Type: "a", Payload: []byte(`1`)})
		if err := verifyWith(<-rc.got, eps[0].Secrets[0].Value); err != nil {
			t.Fatalf("plaintext row: %v", err)
		}

		// A rotation is the next write: it encrypts.
		rotated, err := enc.ob.RotateSecret(enc.ctx, eps[1].ID, outbox.Rotation{})
		if err != nil {
			t.Fatal(err)
		}
		if kid := enc.storedKeyID(eps[1].ID); kid != "k1" {
			t.Fatalf("after rotation the row's key ID is %q", kid)
		}
		if len(rotated.Secrets) != 2 || rotated.Secrets[1].Value != eps[1].Secrets[0].Value {
			t.Fatalf("rotation lost the old secret: %v", rotated.Secrets)
		}

		// The pass encrypts the others, once.
		res, err := enc.ob.ReencryptSecrets(enc.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res != (outbox.ReencryptResult{Endpoints: 3, Encrypted: 2}) {
			t.Fatalf("first pass: %+v", res)
		}
		if res, err := enc.ob.ReencryptSecrets(enc.ctx); err != nil || res != (outbox.ReencryptResult{Endpoints: 3}) {
			t.Fatalf("second pass: %+v, %v", res, err)
		}
		for _, ep := range eps {
			if kid := enc.storedKeyID(ep.ID); kid != "k1" {
				t.Fatalf("%s stored under %q", ep.ID, kid)
			}
			got, err := enc.ob.Endpoint(enc.ctx, ep.ID)
			if err != nil || got.Secrets[len(got.Secrets)-1].Value != ep.Secrets[0].Value {
				t.Fatalf("read back %s: %v", ep.ID, err)
			}
		}
		enc.enqueue(outbox.Event{Tenant: "m2", Type: "a", Payload: []byte(`2`)})
		if err := verifyWith(<-rc.got, eps[2].Secrets[0].Value); err != nil {
			t.Fatalf("encrypted row: %v", err)
		}
		if _, err := plain.ob.ReencryptSecrets(plain.ctx); !errors.Is(err, outbox.ErrNoSecretCipher) {
			t.Fatalf("ReencryptSecrets without a cipher: %v", err)
		}
	})
}

// rotationReceiver verifies every request with the secret of the endpoint
// its path names, with package verify and the Standard Webhooks library.
type rotationReceiver struct {
	*httptest.Server
	secrets  sync.Map // path -> secret
	ok, bad  atomic.Int64
	mu       sync.Mutex
	failures []string
}

func newRotationReceiver(t *testing.T) *rotationReceiver {
	rr := &rotationReceiver{}
	rr.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		secret, _ := rr.secrets.Load(r.URL.Path)
		s, _ := secret.(string)
		if err := verifyWith(received{Header: r.Header, Body: body}, s); err != nil {
			rr.bad.Add(1)
			rr.mu.Lock()
			rr.failures = append(rr.failures, r.URL.Path+": "+err.Error())
			rr.mu.Unlock()
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		rr.ok.Add(1)
	}))
	t.Cleanup(rr.Close)
	return rr
}

func TestSecretsKeyRotationWhileDelivering(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		k1, k2 := aesKey(t, "k1"), aesKey(t, "k2")
		old := setup(t, db, outbox.Config{SecretCipher: keyring(t, k1)})
		rr := newRotationReceiver(t)
		const n = 250 // more than two batches of the pass
		var ids []string
		for i := range n {
			path := fmt.Sprintf("/ep/%d", i)
			ne := outbox.NewEndpoint{Tenant: fmt.Sprint("m", i%10), URL: rr.URL + path}
			if i%5 == 0 {
				private, public, err := signer.GenerateKeyPair()
				if err != nil {
					t.Fatal(err)
				}
				ne.Secret = private
				rr.secrets.Store(path, public)
			}
			ep, err := old.ob.CreateEndpoint(old.ctx, ne)
			if err != nil {
				t.Fatal(err)
			}
			if ne.Secret == "" {
				rr.secrets.Store(path, ep.Secrets[0].Value)
			}
			ids = append(ids, ep.ID)
		}

		// Step 1, everywhere: k2 known. Step 2: k2 encrypts. The relay
		// runs with step 2's keyring, delivering while the pass and
		// rotations run.
		step2 := old.reopen(outbox.Config{SecretCipher: keyring(t, k2, k1)})
		step2.relay(outbox.RelayConfig{})
		var sent atomic.Int64
		enqueue := func() {
			step2.enqueue(outbox.Event{Tenant: fmt.Sprint("m", sent.Add(1)%10), Type: "payment.succeeded", Payload: []byte(`{}`)})
		}
		for range 5 {
			enqueue()
		}
		done := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { // events all along (up to 40)
			defer wg.Done()
			for range 40 {
				select {
				case <-done:
					return
				default:
					enqueue()
				}
			}
		}()
		go func() { // rotations all along (up to 60), with an overlap: the old secret keeps signing
			defer wg.Done()
			for i := 1; i < 60*7; i += 7 {
				select {
				case <-done:
					return
				default:
				}
				if _, err := step2.ob.RotateSecret(step2.ctx, ids[i%n], outbox.Rotation{}); err != nil {
					t.Errorf("rotation: %v", err)
					return
				}
			}
		}()
		res, err := step2.ob.ReencryptSecrets(step2.ctx)
		close(done)
		wg.Wait()
		if err != nil {
			t.Fatal(err)
		}
		if res.Endpoints != n || res.Encrypted != 0 || res.Rekeyed > n || res.Rekeyed < 1 {
			t.Fatalf("pass: %+v", res)
		}
		for range 5 {
			enqueue()
		}
		for _, id := range ids {
			if kid := step2.storedKeyID(id); kid != "k2" {
				t.Fatalf("%s stored under %q after the pass", id, kid)
			}
		}

		// Step 3: k1 dropped. A relay with k2 alone starts and delivers.
		step3 := old.reopen(outbox.Config{SecretCipher: keyring(t, k2)})
		step3.relay(outbox.RelayConfig{})
		for range 5 {
			enqueue()
		}
		// Every event goes to the 25 endpoints of its tenant.
		want := sent.Load() * n / 10
		step2.eventually("every delivery made", func() bool {
			return rr.ok.Load()+rr.bad.Load() >= want
		})
		if rr.bad.Load() != 0 {
			rr.mu.Lock()
			t.Fatalf("%d of %d deliveries did not verify: %v", rr.bad.Load(), want, rr.failures[:min(5, len(rr.failures))])
		}
		if _, err := step3.ob.Endpoint(step3.ctx, ids[1]); err != nil {
			t.Fatal(err)
		}
	})
}

func TestAESGCMKeyring(t *testing.T) {
	k1, k2 := aesKey(t, "k1"), aesKey(t, "k2")
	ctx := context.Background()
	ring := keyring(t, k2, k1)
	if ring.KeyID() != "k2" {
		t.Fatalf("KeyID %q", ring.KeyID())
	}
	kid, ct, err := keyring(t, k1).Encrypt(ctx, []byte("secret"), []byte("ad"))
	if err != nil || kid != "k1" {
		t.Fatal(kid, err)
	}
	if pt, err := ring.Decrypt(ctx, kid, ct, []byte("ad")); err != nil || string(pt) != "secret" {
		t.Fatalf("decrypt with the old key in the ring: %q %v", pt, err)
	}
	if _, err := ring.Decrypt(ctx, kid, ct, []byte("other")); !errors.Is(err, outbox.ErrDecrypt) {
		t.Fatalf("other associated data: %v", err)
	}
	if _, err := ring.Decrypt(ctx, "k2", ct, []byte("ad")); !errors.Is(err, outbox.ErrDecrypt) {
		t.Fatalf("under another key's ID: %v", err)
	}
	if _, err := keyring(t, k2).Decrypt(ctx, kid, ct, []byte("ad")); !errors.Is(err, outbox.ErrUnknownKey) {
		t.Fatalf("unknown key: %v", err)
	}
	if _, err := ring.Decrypt(ctx, kid, ct[:10], []byte("ad")); !errors.Is(err, outbox.ErrDecrypt) {
		t.Fatalf("short ciphertext: %v", err)
	}

	b64 := base64.StdEncoding.EncodeToString
	parsed, err := outbox.ParseAESGCMKeys("k2:" + b64(k2.Key) + ", k1:" + base64.RawURLEncoding.EncodeToString(k1.Key))
	if err != nil {
		t.Fatal(err)
	}
	if pt, err := parsed.Decrypt(ctx, kid, ct, []byte("ad")); err != nil || string(pt) != "secret" || parsed.KeyID() != "k2" {
		t.Fatalf("parsed keyring: %v", err)
	}
	if s := fmt.Sprintf("%v %+v %#v", parsed, parsed, parsed); strings.Contains(s, b64(k1.Key)[:8]) || !strings.Contains(s, "k2, k1") {
		t.Fatalf("printed keyring: %s", s)
	}
	for _, bad := range []string{"", "k1", "k1:!!", "k1:" + b64(k1.Key[:16]), "k 1:" + b64(k1.Key), "k1:" + b64(k1.Key) + ",k1:" + b64(k2.Key)} {
		_, err := outbox.ParseAESGCMKeys(bad)
		if err == nil {
			t.Errorf("ParseAESGCMKeys(%q) accepted", bad)
		} else if strings.Contains(err.Error(), b64(k1.Key)[:8]) {
			t.Errorf("error shows key material: %v", err)
		}
	}
	if _, err := outbox.NewAESGCM(); err == nil {
		t.Error("NewAESGCM() without keys accepted")
	}
}

// TestSecretsNeverLogged runs a failing, retried and
// dead-lettered delivery with every log level on and looks for the secret
// in what was logged.
func TestSecretsNeverLogged(t *testing.T) {
	var logs logBuffer
	db := testdb.SQLite(t)
	b := setup(t, db, outbox.Config{SecretCipher: keyring(t, aesKey(t, "k1")),
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	rc := newReceiver(t, func(int, *http.Request) int { return http.StatusInternalServerError })
	ep := b.endpoint("m", rc.URL)
	b.relay(outbox.RelayConfig{Retry: fastRetryAttempts(2)})
	b.enqueue(outbox.Event{Tenant: "m", Type: "a", Payload: []byte(`1`)})
	b.eventually("dead-lettered", func() bool { return b.count(`SELECT COUNT(*) FROM txhook_dead_letters`) == 1 })
	for _, n := range secretNeedles(t, ep.Secrets[0].Value) {
		if strings.Contains(logs.String(), n) {
			t.Fatal("the logs show the secret")
		}
	}
}
