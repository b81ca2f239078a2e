package verify_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/signer"
	"github.com/txhook/txhook/verify"
	"github.com/txhook/txhook/verify/internal/storetest"
)

func TestNew(t *testing.T) {
	t.Parallel()
	secret, _ := signer.GenerateSecret()
	priv, pub, _ := signer.GenerateKeyPair()
	for name, c := range map[string]verify.Config{
		"no secrets":          {},
		"bad secret":          {Secrets: []string{secret, "whsec_!!notbase64!!"}},
		"private key":         {Secrets: []string{priv}},
		"short stripe secret": {Scheme: verify.Stripe, Secrets: []string{"short"}},
	} {
		_, err := verify.New(c)
		if !errors.Is(err, verify.ErrInvalidSecret) {
			t.Errorf("%s: %v, want ErrInvalidSecret", name, err)
		} else if strings.Contains(err.Error(), priv) || strings.Contains(err.Error(), secret) {
			t.Errorf("%s: error quotes a secret: %v", name, err)
		}
	}
	for name, c := range map[string]verify.Config{
		"unknown scheme":     {Scheme: 7, Secrets: []string{secret}},
		"negative lease":     {Secrets: []string{secret}, Lease: -1},
		"negative body size": {Secrets: []string{secret}, MaxBodyBytes: -1},
	} {
		if _, err := verify.New(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := verify.New(verify.Config{Secrets: []string{secret, pub}}); err != nil {
		t.Errorf("secret and public key: %v", err)
	}
}

func TestVerify(t *testing.T) {
	t.Parallel()
	secret, _ := signer.GenerateSecret()
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	v, err := verify.New(verify.Config{Secrets: []string{secret}, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"id":"evt_1","type":"payment.succeeded","timestamp":"2026-01-02T03:04:05.123456Z","data":{"amount":100}}`)
	d := storetest.Sign(t, secret, "evt_1", now.Add(-time.Minute), body)

	ev, err := v.Verify(d.Header, body)
	if err != nil {
		t.Fatal(err)
	}
	want := verify.Event{ID: "evt_1", Type: "payment.succeeded",
		Timestamp: time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC), SignedAt: now.Add(-time.Minute).UTC()}
	if ev.ID != want.ID || ev.Type != want.Type || !ev.Timestamp.Equal(want.Timestamp) || !ev.SignedAt.Equal(want.SignedAt) ||
		string(ev.Data) != `{"amount":100}` || string(ev.Body) != string(body) {
		t.Fatalf("event %+v", ev)
	}

	// Each error is testable with both packages' names.
	cases := map[string]struct {
		mod  func(h http.Header, body []byte) []byte
		want error
	}{
		"missing id":    {func(h http.Header, b []byte) []byte { h.Del("Webhook-Id"); return b }, verify.ErrMissingHeader},
		"malformed":     {func(h http.Header, b []byte) []byte { h.Set("Webhook-Timestamp", "soon"); return b }, verify.ErrMalformedHeader},
		"tampered":      {func(h http.Header, b []byte) []byte { return []byte(strings.Replace(string(b), "100", "999", 1)) }, verify.ErrNoMatchingSignature},
		"not an object": {nil, verify.ErrMalformedBody},
	}
	for name, c := range cases {
		h := d.Header.Clone()
		b := body
		if c.mod != nil {
			b = c.mod(h, append([]byte(nil), body...))
		} else {
			b = []byte(`[1,2]`)
			h = storetest.Sign(t, secret, "evt_1", now, b).Header
		}
		_, err := v.Verify(h, b)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	late, _ := verify.New(verify.Config{Secrets: []string{secret}, Now: func() time.Time { return now.Add(5 * time.Minute) }})
	if _, err := late.Verify(d.Header, body); !errors.Is(err, verify.ErrTimestampTooOld) || !errors.Is(err, signer.ErrTimestampTooOld) {
		t.Errorf("6 minutes late: %v", err)
	}
	tight, _ := verify.New(verify.Config{Secrets: []string{secret}, Now: clock, Tolerance: 30 * time.Second})
	if _, err := tight.Verify(d.Header, body); !errors.Is(err, verify.ErrTimestampTooOld) {
		t.Errorf("tolerance 30s, 1 minute late: %v", err)
	}
	early, _ := verify.New(verify.Config{Secrets: []string{secret}, Now: func() time.Time { return now.Add(-7 * time.Minute) }})
	if _, err := early.Verify(d.Header, body); !errors.Is(err, verify.ErrTimestampTooNew) {
		t.Errorf("6 minutes early: %v", err)
	}
}

// Envelope bodies: what is accepted and what is ErrMalformedBody.
func TestVerifyEnvelope(t *testing.T) {
	t.Parallel()
	secret, _ := signer.GenerateSecret()
	v, _ := verify.New(verify.Config{Secrets: []string{secret}})
	for body, ok := range map[string]bool{
		`{"type":"a"}`: true,
		`{"type":"a","timestamp":12,"data":null}`: true, // an odd timestamp is not the signature's business
		` {"type":"a","id":"other"} `:             true, // Standard: the header id is the signed one
		`{"type":""}`:                             false,
		`{"type":null}`:                           false,
		`{"TYPE":"a"}`:                            false,
		`{"type":1}`:                              false,
		`{"type":"a","id":1}`:                     false,
		`{"type":"a"} {}`:                         false,
		`null`:                                    false,
		`"type"`:                                  false,
		``:                                        false,
		`{"type":"a"`:                             false,
	} {
		d := storetest.Sign(t, secret, "evt_1", time.Now(), []byte(body))
		ev, err := v.Verify(d.Header, d.Body)
		switch {
		case ok && (err != nil || ev.ID != "evt_1"):
			t.Errorf("%s: %v %+v", body, err, ev)
		case !ok && !errors.Is(err, verify.ErrMalformedBody):
			t.Errorf("%s: %v, want ErrMalformedBody", body, err)
		}
	}
}

// The Stripe scheme does not sign webhook-id, so the ID comes from the body.
func TestVerifyStripe(t *testing.T) {
	t.Parallel()
	const secret = "sk_test_0123456789abcdef"
	v, err := verify.New(verify.Config{Scheme: verify.Stripe, StripeHeader: "X-Kxp-Signature", Secrets: []string{secret}})
	if err != nil {
		t.Fatal(err)
	}
	sign := func(body string) http.Header {
		h := http.Header{}
		if err := (signer.Stripe{Header: "X-Kxp-Signature"}).Sign(h, "hdr_1", time.Now(), []byte(body), []string{secret}); err != nil {
			t.Fatal(err)
		}
		return h
	}
	body := `{"id":"evt_body","type":"payment.succeeded"}`
	h := sign(body)
	ev, err := v.Verify(h, []byte(body))
	if err != nil || ev.ID != "evt_body" {
		t.Fatalf("%+v %v", ev, err)
	}
	h.Set("Webhook-Id", "forged")
	if ev, err := v.Verify(h, []byte(body)); err != nil || ev.ID != "evt_body" {
		t.Fatalf("changed header id: %+v %v", ev, err)
	}
	body = `{"type":"payment.succeeded"}`
	if _, err := v.Verify(sign(body), []byte(body)); !errors.Is(err, verify.ErrMalformedBody) {
		t.Fatalf("no id in body: %v", err)
	}
	if _, err := v.Verify(storetest.Sign(t, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "evt_1", time.Now(), []byte(body)).Header, []byte(body)); !errors.Is(err, verify.ErrMissingHeader) {
		t.Fatalf("Standard headers to a Stripe receiver: %v", err)
	}
}

// A receiver holding only the whpk_ public key verifies v1a signatures.
func TestVerifyPublicKey(t *testing.T) {
	t.Parallel()
	priv, pub, err := signer.GenerateKeyPair()
	if err != nil {
		t.Fatal(err)
	}
	v, err := verify.New(verify.Config{Secrets: []string{pub}})
	if err != nil {
		t.Fatal(err)
	}
	body := storetest.Envelope("evt_1", "payment.succeeded", "{}")
	d := storetest.Sign(t, priv, "evt_1", time.Now(), body)
	if !strings.HasPrefix(d.Header.Get("Webhook-Signature"), "v1a,") {
		t.Fatalf("signature %q", d.Header.Get("Webhook-Signature"))
	}
	if _, err := v.Verify(d.Header, body); err != nil {
		t.Fatal(err)
	}
	otherPriv, _, _ := signer.GenerateKeyPair()
	d = storetest.Sign(t, otherPriv, "evt_1", time.Now(), body)
	if _, err := v.Verify(d.Header, body); !errors.Is(err, verify.ErrNoMatchingSignature) {
		t.Fatalf("other key: %v", err)
	}
}

// During a rotation overlap both secrets verify; after it only the new one.
func TestRotation(t *testing.T) {
	t.Parallel()
	oldS, _ := signer.GenerateSecret()
	newS, _ := signer.GenerateSecret()
	_, pub, _ := signer.GenerateKeyPair()
	overlap := setup(t, func(c *verify.Config) { c.Secrets = []string{oldS, pub, newS} }, nil)
	after := setup(t, func(c *verify.Config) { c.Secrets = []string{newS} }, nil)
	for _, c := range []struct {
		name         string
		signWith     []string
		overlap, aft int
	}{
		{"old only", []string{oldS}, 200, 401},
		{"new only", []string{newS}, 200, 200},
		{"sender signs with both", []string{oldS, newS}, 200, 200},
	} {
		for _, r := range []struct {
			name string
			b    *bundle
			want int
		}{{"during the overlap", overlap, c.overlap}, {"after it", after, c.aft}} {
			id := storetest.ID()
			body := storetest.Envelope(id, "payment.succeeded", "{}")
			d := storetest.Sign(t, c.signWith[0], id, r.b.clk.Now(), body, c.signWith[1:]...)
			before := r.b.calls.Load()
			code, text := r.b.post(t, d)
			if code != r.want {
				t.Errorf("%s, %s: %d %q, want %d", c.name, r.name, code, text, r.want)
			}
			if ran := r.b.calls.Load() - before; (ran == 1) != (r.want == 200) {
				t.Errorf("%s: handler ran %d times", c.name, ran)
			}
		}
	}
}
