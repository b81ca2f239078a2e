package signer_test

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/txhook/txhook/signer"
)

// The official Go library checks timestamps against the wall clock, so these
// tests sign at time.Now.

func TestInteropOfficialVerifiesOurs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		signWith  []string
		checkWith string
		body      string
	}{
		{"one secret", []string{specSecret}, specSecret, specBody},
		{"bare secret", []string{strings.TrimPrefix(rustSecret, "whsec_")}, rustSecret, rustBody},
		{"rotation, old", []string{specSecret, rustSecret}, specSecret, `{"a":1}`},
		{"rotation, new", []string{specSecret, rustSecret}, rustSecret, `{"a":1}`},
		{"v1a entry alongside", []string{edFullKey, specSecret}, specSecret, `{"a":1}`},
		{"empty body", []string{specSecret}, specSecret, ""},
		{"binary body", []string{specSecret}, specSecret, "\x00\xff\n."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			if err := (signer.Standard{}).Sign(h, "msg_interop", time.Now(), []byte(tt.body), tt.signWith); err != nil {
				t.Fatal(err)
			}
			wh, err := standardwebhooks.NewWebhook(tt.checkWith)
			if err != nil {
				t.Fatal(err)
			}
			if err := wh.Verify([]byte(tt.body), h); err != nil {
				t.Fatalf("official Verify: %v (header %q)", err, h.Get("webhook-signature"))
			}
			if err := wh.Verify([]byte(tt.body+"x"), h); err == nil {
				t.Fatal("official Verify accepted a tampered body")
			}
		})
	}
}

func TestInteropWeVerifyOfficial(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		signWith  string
		checkWith []string
		wantErr   error
	}{
		{"same secret", specSecret, []string{specSecret}, nil},
		{"bare on their side", strings.TrimPrefix(specSecret, "whsec_"), []string{specSecret}, nil},
		{"bare on ours", specSecret, []string{strings.TrimPrefix(specSecret, "whsec_")}, nil},
		{"among others", rustSecret, []string{specSecret, edPubKey, rustSecret}, nil},
		{"other secret", rustSecret, []string{specSecret}, signer.ErrNoMatchingSignature},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			wh, err := standardwebhooks.NewWebhook(tt.signWith)
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			sig, err := wh.Sign("msg_official", now, []byte(specBody))
			if err != nil {
				t.Fatal(err)
			}
			h := http.Header{}
			h.Set(standardwebhooks.HeaderWebhookID, "msg_official")
			h.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(now.Unix(), 10))
			h.Set(standardwebhooks.HeaderWebhookSignature, sig)
			msg, err := signer.Standard{}.Verify(h, []byte(specBody), tt.checkWith)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Verify err = %v, want %v", err, tt.wantErr)
			}
			if err == nil && (msg.ID != "msg_official" || msg.Timestamp.Unix() != now.Unix()) {
				t.Errorf("Verify = %+v", msg)
			}
		})
	}
}

// Both sides produce the same bytes for the same input, not just signatures
// the other side accepts.
func TestInteropSameSignature(t *testing.T) {
	t.Parallel()
	for _, secret := range []string{specSecret, rustSecret} {
		wh, err := standardwebhooks.NewWebhook(secret)
		if err != nil {
			t.Fatal(err)
		}
		for _, ts := range []int64{0, 1, specTS, 1 << 40} {
			want, err := wh.Sign("msg_same", time.Unix(ts, 0), []byte(specBody))
			if err != nil {
				t.Fatal(err)
			}
			h := sign(t, signer.Standard{}, "msg_same", ts, specBody, secret)
			if got := h.Get("webhook-signature"); got != want {
				t.Errorf("ts %d: ours %q, official %q", ts, got, want)
			}
		}
	}
}
