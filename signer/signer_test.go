package signer_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/signer"
)

// scheme pairs a Signer/Verifier with a secret it takes, so that behaviour
// both schemes share is tested once for both.
type scheme struct {
	name      string
	sign      signer.Signer
	signWith  string
	verify    func(tolerance time.Duration, now func() time.Time) signer.Verifier
	checkWith string
}

var schemes = []scheme{
	{"Standard v1", signer.Standard{}, specSecret, func(tol time.Duration, now func() time.Time) signer.Verifier {
		return signer.Standard{Tolerance: tol, Now: now}
	}, specSecret},
	{"Standard v1a", signer.Standard{}, edSeedKey, func(tol time.Duration, now func() time.Time) signer.Verifier {
		return signer.Standard{Tolerance: tol, Now: now}
	}, edPubKey},
	{"Stripe", signer.Stripe{}, stripeSecret1, func(tol time.Duration, now func() time.Time) signer.Verifier {
		return signer.Stripe{Tolerance: tol, Now: now}
	}, stripeSecret1},
}

func TestTolerance(t *testing.T) {
	t.Parallel()
	const signedAt = 1700000000
	tests := []struct {
		name      string
		tolerance time.Duration
		clock     time.Duration // verifier's clock minus the signing time
		wantErr   error
	}{
		{"same second", 0, 0, nil},
		{"exactly 5m later", 0, 5 * time.Minute, nil},
		{"5m1s later", 0, 5*time.Minute + time.Second, signer.ErrTimestampTooOld},
		{"5m and a nanosecond later", 0, 5*time.Minute + 1, signer.ErrTimestampTooOld},
		{"exactly 5m earlier", 0, -5 * time.Minute, nil},
		{"5m1s earlier", 0, -5*time.Minute - time.Second, signer.ErrTimestampTooNew},
		{"a day later", 0, 24 * time.Hour, signer.ErrTimestampTooOld},
		{"negative tolerance means default", -time.Second, 5 * time.Minute, nil},
		{"custom 10s, 10s later", 10 * time.Second, 10 * time.Second, nil},
		{"custom 10s, 11s later", 10 * time.Second, 11 * time.Second, signer.ErrTimestampTooOld},
		{"custom 10s, 11s earlier", 10 * time.Second, -11 * time.Second, signer.ErrTimestampTooNew},
		{"custom 1h, 59m later", time.Hour, 59 * time.Minute, nil},
	}
	for _, sc := range schemes {
		h := sign(t, sc.sign, "msg_1", signedAt, "body", sc.signWith)
		for _, tt := range tests {
			t.Run(sc.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				now := time.Unix(signedAt, 0).Add(tt.clock)
				msg, err := sc.verify(tt.tolerance, func() time.Time { return now }).Verify(h, []byte("body"), []string{sc.checkWith})
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				if err == nil && !msg.Timestamp.Equal(time.Unix(signedAt, 0)) {
					t.Errorf("Timestamp = %v", msg.Timestamp)
				}
			})
		}
	}
}

// With Now unset, Verify uses the wall clock.
func TestDefaultClock(t *testing.T) {
	t.Parallel()
	for _, sc := range schemes {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			for _, age := range []time.Duration{0, -10 * time.Minute} {
				h := http.Header{}
				if err := sc.sign.Sign(h, "msg_1", time.Now().Add(age), []byte("b"), []string{sc.signWith}); err != nil {
					t.Fatal(err)
				}
				_, err := sc.verify(0, nil).Verify(h, []byte("b"), []string{sc.checkWith})
				if age == 0 && err != nil {
					t.Errorf("fresh: %v", err)
				}
				if age != 0 && !errors.Is(err, signer.ErrTimestampTooOld) {
					t.Errorf("10 minutes old: %v", err)
				}
			}
		})
	}
}

// Every error either scheme can return, for requests signed with known
// secrets, must not contain any secret, key or signature, whole or encoded.
func TestErrorsDoNotLeakSecrets(t *testing.T) {
	t.Parallel()
	secrets := []string{specSecret, rustSecret, edSeedKey, edFullKey, edPubKey, stripeSecret1, stripeSecret2}
	var forbidden []string
	for _, s := range secrets {
		forbidden = append(forbidden, s)
		if _, rest, ok := strings.Cut(s, "_"); ok && len(s) > 10 {
			forbidden = append(forbidden, rest)
			if b, err := base64.StdEncoding.DecodeString(rest); err == nil {
				forbidden = append(forbidden, string(b))
			}
		}
	}
	badKeys := []string{
		"whsec_AAAAAAAAAAAAAAAAAAAAAA==", "whsec_" + strings.Repeat("Q", 100), "whsec_!!!!" + rustSecret[10:],
		edBadHalf, "whsk_" + edPubKey[5:len(edPubKey)-3], "whpk_" + edPubKey[5:len(edPubKey)-3],
		"short-" + stripeSecret2[:6],
	}
	for _, k := range badKeys {
		forbidden = append(forbidden, k, k[6:])
	}

	var errs []error
	collect := func(_ signer.Message, err error) { errs = append(errs, err) }
	body := []byte("body")
	ts := time.Unix(1700000000, 0)
	now := clockAt(1700000000)
	std, stdOld := http.Header{}, http.Header{}
	if err := (signer.Standard{}).Sign(std, "msg_1", ts, body, []string{specSecret, edFullKey}); err != nil {
		t.Fatal(err)
	}
	if err := (signer.Standard{}).Sign(stdOld, "msg_1", ts.Add(-time.Hour), body, []string{specSecret, edFullKey}); err != nil {
		t.Fatal(err)
	}
	str := http.Header{}
	if err := (signer.Stripe{}).Sign(str, "msg_1", ts, body, []string{stripeSecret1, stripeSecret2}); err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(std.Get("webhook-signature")) {
		forbidden = append(forbidden, f, f[strings.IndexByte(f, ',')+1:])
	}
	forbidden = append(forbidden, stripeSig1, stripeSig2, str.Get("X-Webhook-Signature"))
	for _, f := range strings.Split(str.Get("X-Webhook-Signature"), ",") {
		forbidden = append(forbidden, strings.TrimPrefix(f, "v1="))
	}

	for _, k := range append(badKeys, secrets...) {
		for _, list := range [][]string{{k}, {specSecret, k}} {
			errs = append(errs, signer.Standard{}.Sign(http.Header{}, "msg_1", ts, body, list))
			errs = append(errs, signer.Stripe{}.Sign(http.Header{}, "msg_1", ts, body, list))
			collect(signer.Standard{Now: now}.Verify(std, body, list))
			collect(signer.Standard{Now: now}.Verify(std, []byte("tampered"), list))
			collect(signer.Standard{Now: now}.Verify(stdOld, body, list))
			collect(signer.Stripe{Now: now}.Verify(str, body, list))
			collect(signer.Stripe{Now: now}.Verify(str, []byte("tampered"), list))
		}
		errs = append(errs, signer.ValidateSecret(k))
		_, err := signer.PublicKey(k)
		errs = append(errs, err)
	}
	// Malformed headers whose contents are signatures.
	for _, v := range []string{std.Get("webhook-signature") + " v1," + stripeSig1, "v1" + std.Get("webhook-signature")} {
		h := std.Clone()
		h.Set("webhook-signature", v)
		h.Add("webhook-timestamp", "x")
		collect(signer.Standard{Now: now}.Verify(h, body, []string{specSecret}))
	}
	for _, v := range []string{"v1=" + stripeSig1, "t=1,t=2,v1=" + stripeSig1, "t=x" + stripeSig1 + ",v1=" + stripeSig2} {
		h := http.Header{"X-Webhook-Signature": {v}}
		collect(signer.Stripe{Now: now}.Verify(h, body, []string{stripeSecret1}))
	}

	n := 0
	for _, err := range errs {
		if err == nil {
			continue
		}
		n++
		msg := err.Error()
		for _, f := range forbidden {
			if len(f) >= 8 && strings.Contains(msg, f) {
				t.Errorf("error %q contains secret material %q", msg, f)
			}
		}
	}
	if n < 100 {
		t.Fatalf("only %d errors produced; the test lost its teeth", n)
	}
}

func TestGenerateSecret(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 100 {
		s, err := signer.GenerateSecret()
		if err != nil {
			t.Fatal(err)
		}
		rest, ok := strings.CutPrefix(s, "whsec_")
		if !ok {
			t.Fatalf("%q lacks the whsec_ prefix", s)
		}
		if b, err := base64.StdEncoding.DecodeString(rest); err != nil || len(b) != 32 {
			t.Fatalf("decodes to %d bytes, %v", len(b), err)
		}
		if err := signer.ValidateSecret(s); err != nil {
			t.Fatal(err)
		}
		if seen[s] {
			t.Fatal("repeated secret")
		}
		seen[s] = true
	}
}

func TestGenerateKeyPair(t *testing.T) {
	t.Parallel()
	priv, pub, err := signer.GenerateKeyPair()
	if err != nil {
		t.Fatal(err)
	}
	privB, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(priv, "whsk_"))
	if err != nil || !strings.HasPrefix(priv, "whsk_") || len(privB) != ed25519.PrivateKeySize {
		t.Fatalf("private key %d bytes, %v", len(privB), err)
	}
	pubB, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(pub, "whpk_"))
	if err != nil || !strings.HasPrefix(pub, "whpk_") || len(pubB) != ed25519.PublicKeySize {
		t.Fatalf("public key %d bytes, %v", len(pubB), err)
	}
	if got, err := signer.PublicKey(priv); err != nil || got != pub {
		t.Fatalf("PublicKey = %q, %v; want %q", got, err, pub)
	}
	if err := signer.ValidateSecret(priv); err != nil {
		t.Fatal(err)
	}
	// The pair works with stock crypto/ed25519, nothing txhook-specific.
	sig := ed25519.Sign(ed25519.PrivateKey(privB), []byte("m"))
	if !ed25519.Verify(ed25519.PublicKey(pubB), []byte("m"), sig) {
		t.Fatal("pair does not match")
	}
	priv2, pub2, _ := signer.GenerateKeyPair()
	if priv2 == priv || pub2 == pub {
		t.Fatal("repeated key")
	}
}

func TestPublicKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    string
		wantErr error
	}{
		{edSeedKey, edPubKey, nil},
		{edFullKey, edPubKey, nil},
		{edPubKey, "", signer.ErrInvalidSecret},
		{specSecret, "", signer.ErrInvalidSecret},
		{"whsk_", "", signer.ErrInvalidSecret},
		{"whsk_%%%", "", signer.ErrInvalidSecret},
		{edBadHalf, "", signer.ErrInvalidSecret},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := signer.PublicKey(tt.in)
			if got != tt.want || !errors.Is(err, tt.wantErr) {
				t.Fatalf("PublicKey = %q, %v; want %q, %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestValidateSecret(t *testing.T) {
	t.Parallel()
	b64 := func(n int) string { return base64.StdEncoding.EncodeToString(make([]byte, n)) }
	tests := []struct {
		name string
		in   string
		ok   bool
	}{
		{"spec secret, 24 bytes", specSecret, true},
		{"32 bytes", "whsec_" + b64(32), true},
		{"64 bytes", "whsec_" + b64(64), true},
		{"23 bytes", "whsec_" + b64(23), false},
		{"65 bytes", "whsec_" + b64(65), false},
		{"no prefix", strings.TrimPrefix(specSecret, "whsec_"), false},
		{"other prefix", "whsecret_" + b64(32), false},
		{"unpadded", "whsec_" + strings.TrimRight(b64(32), "="), false},
		{"url alphabet", "whsec_" + strings.Repeat("_-", 16), false},
		{"whitespace", "whsec_" + b64(32) + "\n", false},
		{"empty", "", false},
		{"prefix only", "whsec_", false},
		{"private seed", edSeedKey, true},
		{"private seed||public", edFullKey, true},
		{"private, bad public half", edBadHalf, false},
		{"private, 48 bytes", "whsk_" + b64(48), false},
		{"public key", edPubKey, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := signer.ValidateSecret(tt.in)
			if tt.ok && err != nil {
				t.Fatalf("ValidateSecret: %v", err)
			}
			if !tt.ok && !errors.Is(err, signer.ErrInvalidSecret) {
				t.Fatalf("ValidateSecret = %v, want ErrInvalidSecret", err)
			}
		})
	}
}

// Whatever ValidateSecret accepts, Standard.Sign accepts too.
func TestValidateSecretAgreesWithSign(t *testing.T) {
	t.Parallel()
	for _, s := range []string{specSecret, rustSecret, edSeedKey, edFullKey, "whsec_" + strings.Repeat("A", 88)} {
		valid := signer.ValidateSecret(s) == nil
		signs := signer.Standard{}.Sign(http.Header{}, "m", time.Unix(1, 0), nil, []string{s}) == nil
		if valid && !signs {
			t.Errorf("%.12s: valid but Sign fails", s)
		}
	}
}
