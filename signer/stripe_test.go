package signer_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/signer"
)

// Computed outside Go:
//
//	printf '%s' '1700000000.{"event_id":"evt_1","type":"payment.succeeded"}' |
//		openssl dgst -sha256 -hmac "$secret"
const (
	stripeSecret1 = "7c4b3a9e2f1d8c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b" // 32 random bytes, hex, as in the source article
	stripeSecret2 = "whsec_second_secret_for_rotation"                                 // used as given, prefix and all
	stripeTS      = 1700000000
	stripeBody    = `{"event_id":"evt_1","type":"payment.succeeded"}`
	stripeSig1    = "73aaaf1467acbe56d4ac54d3a6bc1861726585c7ec22741b9bb2f5353cab855e"
	stripeSig2    = "2e9b2fd0bf1c961f96f294f9feb00281a53fa61c811e6a2731e2df71432798bc"
	stripeOther   = "0000000000000000000000000000000000000000000000000000000000000000"
)

func TestStripeKnownVector(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		scheme  signer.Stripe
		header  string
		secrets []string
		want    string
	}{
		{"default header", signer.Stripe{}, "X-Webhook-Signature", []string{stripeSecret1}, "t=1700000000,v1=" + stripeSig1},
		{"article's header, lower case", signer.Stripe{Header: "x-kxp-signature"}, "X-Kxp-Signature", []string{stripeSecret1}, "t=1700000000,v1=" + stripeSig1},
		{"rotation", signer.Stripe{}, "X-Webhook-Signature", []string{stripeSecret1, stripeSecret2}, "t=1700000000,v1=" + stripeSig1 + ",v1=" + stripeSig2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := sign(t, tt.scheme, "evt_1", stripeTS, stripeBody, tt.secrets...)
			if got := h[tt.header]; len(got) != 1 || got[0] != tt.want {
				t.Errorf("%s = %q, want %q", tt.header, got, tt.want)
			}
			if got := h.Get("webhook-id"); got != "evt_1" {
				t.Errorf("webhook-id = %q", got)
			}
			if len(h) != 2 {
				t.Errorf("headers = %v, want the signature and webhook-id only", h)
			}
			for _, secret := range tt.secrets {
				msg, err := signer.Stripe{Header: tt.scheme.Header, Now: clockAt(stripeTS)}.Verify(h, []byte(stripeBody), []string{secret})
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if msg.ID != "evt_1" || msg.Timestamp.Unix() != stripeTS || string(msg.Body) != stripeBody {
					t.Errorf("Verify = %+v", msg)
				}
			}
		})
	}
}

func TestStripeVerify(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		header  string // value of X-Webhook-Signature; "-" for absent
		id      string // webhook-id; "" for absent
		secrets []string
		wantErr error
	}{
		{"one v1", "t=1700000000,v1=" + stripeSig1, "evt_1", []string{stripeSecret1}, nil},
		{"no webhook-id", "t=1700000000,v1=" + stripeSig1, "", []string{stripeSecret1}, nil},
		{"matching v1 second", "t=1700000000,v1=" + stripeOther + ",v1=" + stripeSig1, "evt_1", []string{stripeSecret1}, nil},
		{"second secret matches second v1", "t=1700000000,v1=" + stripeSig1 + ",v1=" + stripeSig2, "evt_1", []string{"a-stranger-secret-of-some-length", stripeSecret2}, nil},
		{"v1 before t", "v1=" + stripeSig1 + ",t=1700000000", "evt_1", []string{stripeSecret1}, nil},
		{"unknown keys ignored", "t=1700000000,v0=abc,foo=bar,v1=" + stripeSig1 + ",scheme=hmac", "evt_1", []string{stripeSecret1}, nil},
		{"element without =", "t=1700000000,junk,v1=" + stripeSig1, "evt_1", []string{stripeSecret1}, nil},
		{"spaces around elements", " t=1700000000 , v1=" + stripeSig1 + " ,", "evt_1", []string{stripeSecret1}, nil},
		{"upper-case hex", "t=1700000000,v1=" + strings.ToUpper(stripeSig1), "evt_1", []string{stripeSecret1}, nil},
		{"wrong secret", "t=1700000000,v1=" + stripeSig1, "evt_1", []string{stripeSecret2}, signer.ErrNoMatchingSignature},
		{"wrong signature", "t=1700000000,v1=" + stripeOther, "evt_1", []string{stripeSecret1}, signer.ErrNoMatchingSignature},
		{"no v1", "t=1700000000,v0=" + stripeSig1, "evt_1", []string{stripeSecret1}, signer.ErrNoMatchingSignature},
		{"v1 not hex", "t=1700000000,v1=" + strings.Repeat("zz", 32), "evt_1", []string{stripeSecret1}, signer.ErrNoMatchingSignature},
		{"v1 truncated", "t=1700000000,v1=" + stripeSig1[:62], "evt_1", []string{stripeSecret1}, signer.ErrNoMatchingSignature},
		{"v1 too long", "t=1700000000,v1=" + stripeSig1 + "00", "evt_1", []string{stripeSecret1}, signer.ErrNoMatchingSignature},
		{"v1 empty", "t=1700000000,v1=", "evt_1", []string{stripeSecret1}, signer.ErrNoMatchingSignature},
		{"timestamp changed", "t=1700000001,v1=" + stripeSig1, "evt_1", []string{stripeSecret1}, signer.ErrNoMatchingSignature},
		{"good v1 past the cap", "t=1700000000," + strings.Repeat("x=1,", 31) + "v1=" + stripeSig1, "evt_1", []string{stripeSecret1}, signer.ErrNoMatchingSignature},
		{"good v1 at the cap", "t=1700000000," + strings.Repeat("x=1,", 30) + "v1=" + stripeSig1, "evt_1", []string{stripeSecret1}, nil},
		{"absent", "-", "evt_1", []string{stripeSecret1}, signer.ErrMissingHeader},
		{"empty", "", "evt_1", []string{stripeSecret1}, signer.ErrMissingHeader},
		{"no t", "v1=" + stripeSig1, "evt_1", []string{stripeSecret1}, signer.ErrMalformedHeader},
		{"t empty", "t=,v1=" + stripeSig1, "evt_1", []string{stripeSecret1}, signer.ErrMalformedHeader},
		{"t twice", "t=1700000000,t=1700000000,v1=" + stripeSig1, "evt_1", []string{stripeSecret1}, signer.ErrMalformedHeader},
		{"t not a number", "t=now,v1=" + stripeSig1, "evt_1", []string{stripeSecret1}, signer.ErrMalformedHeader},
		{"t negative", "t=-1700000000,v1=" + stripeSig1, "evt_1", []string{stripeSecret1}, signer.ErrMalformedHeader},
		{"t overflows", "t=99999999999999999999,v1=" + stripeSig1, "evt_1", []string{stripeSecret1}, signer.ErrMalformedHeader},
		{"t in the far future", "t=9223372036854775807,v1=" + stripeSig1, "evt_1", []string{stripeSecret1}, signer.ErrTimestampTooNew},
		{"t old", "t=1600000000,v1=" + stripeSig1, "evt_1", []string{stripeSecret1}, signer.ErrTimestampTooOld},
		{"only commas", ",,,,", "evt_1", []string{stripeSecret1}, signer.ErrMalformedHeader},
		{"huge", strings.Repeat("v1=00,", 1<<18), "evt_1", []string{stripeSecret1}, signer.ErrMalformedHeader},
		{"webhook-id with dot", "t=1700000000,v1=" + stripeSig1, "evt.1", []string{stripeSecret1}, signer.ErrMalformedHeader},
		{"no secrets", "t=1700000000,v1=" + stripeSig1, "evt_1", nil, signer.ErrInvalidSecret},
		{"short secret", "t=1700000000,v1=" + stripeSig1, "evt_1", []string{"secret"}, signer.ErrInvalidSecret},
		{"ed25519 public key as secret", "t=1700000000,v1=" + stripeSig1, "evt_1", []string{edPubKey}, signer.ErrInvalidSecret},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			if tt.header != "-" {
				h.Set("X-Webhook-Signature", tt.header)
			}
			if tt.id != "" {
				h.Set("Webhook-Id", tt.id)
			}
			msg, err := signer.Stripe{Now: clockAt(stripeTS)}.Verify(h, []byte(stripeBody), tt.secrets)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err == nil && msg.ID != tt.id {
				t.Errorf("ID = %q, want %q", msg.ID, tt.id)
			}
		})
	}
}

// A Standard header is not a Stripe header and the other way round: a
// receiver configured for one scheme reports the other as missing.
func TestSchemesDoNotCrossVerify(t *testing.T) {
	t.Parallel()
	std := sign(t, signer.Standard{}, "msg_1", stripeTS, "b", specSecret)
	if _, err := (signer.Stripe{Now: clockAt(stripeTS)}).Verify(std, []byte("b"), []string{specSecret}); !errors.Is(err, signer.ErrMissingHeader) {
		t.Errorf("Stripe.Verify(Standard headers) = %v", err)
	}
	str := sign(t, signer.Stripe{}, "msg_1", stripeTS, "b", specSecret)
	if _, err := (signer.Standard{Now: clockAt(stripeTS)}).Verify(str, []byte("b"), []string{specSecret}); !errors.Is(err, signer.ErrMissingHeader) {
		t.Errorf("Standard.Verify(Stripe headers) = %v", err)
	}
}

func TestStripeSignErrors(t *testing.T) {
	t.Parallel()
	ts := time.Unix(stripeTS, 0)
	tests := []struct {
		name    string
		h       http.Header
		id      string
		ts      time.Time
		secrets []string
		wantErr error
	}{
		{"no secrets", http.Header{}, "evt_1", ts, nil, signer.ErrInvalidSecret},
		{"empty secret", http.Header{}, "evt_1", ts, []string{""}, signer.ErrInvalidSecret},
		{"short secret", http.Header{}, "evt_1", ts, []string{stripeSecret1, "hunter2"}, signer.ErrInvalidSecret},
		{"private key", http.Header{}, "evt_1", ts, []string{edFullKey}, signer.ErrInvalidSecret},
		{"trailing newline", http.Header{}, "evt_1", ts, []string{stripeSecret1 + "\n"}, signer.ErrInvalidSecret},
		{"public key", http.Header{}, "evt_1", ts, []string{edPubKey}, signer.ErrInvalidSecret},
		{"nil header", nil, "evt_1", ts, []string{stripeSecret1}, nil},
		{"bad id", http.Header{}, "evt\n1", ts, []string{stripeSecret1}, nil},
		{"before 1970", http.Header{}, "evt_1", time.Unix(-10, 0), []string{stripeSecret1}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := signer.Stripe{}.Sign(tt.h, tt.id, tt.ts, []byte("b"), tt.secrets)
			if err == nil {
				t.Fatal("Sign succeeded")
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if len(tt.h) != 0 {
				t.Errorf("Sign failed but set headers: %v", tt.h)
			}
		})
	}
}
