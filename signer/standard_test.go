package signer_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/signer"
)

// Published test vectors of the official Standard Webhooks libraries
// (libraries v0.0.1: go/webhook_test.go, shared by the C#, Java, PHP, Python,
// Ruby and JavaScript tests; rust/src/lib.rs).
const (
	specSecret  = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	specID      = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	specTS      = 1614265330
	specBody    = `{"test": 2432232314}`
	specSigGo   = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	rustSecret  = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"
	rustID      = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk"
	rustTS      = 1649367553
	rustBody    = `{"email":"test@example.com","username":"test_user"}`
	rustSigWant = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="
)

// An ed25519 vector made outside Go: the key is RFC 8032's test 1 seed; the
// id, timestamp and body are the spec's own example; the signature was made
// with `openssl pkeyutl -sign -rawin` over "id.timestamp.body".
const (
	edSeedKey = "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A="                                             // 32-byte seed form
	edFullKey = "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2DXWpgBgrEKt9VL/tPJZAc6DuFy89qmIyWvAhpo9wdRGg==" // seed||public form
	edPubKey  = "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="
	edBadHalf = "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==" // the seed with a zero public half
	edID      = "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"
	edTS      = 1674087231
	edBody    = `{"type":"contact.created","timestamp":"2022-11-03T20:26:10.344522Z","data":{"id":"1f81eb52-5198-4599-803e-771906343485"}}`
	edSigWant = "v1a,pbpYBMlty2hExn4zt0UTGb6BaP2Vq5AfyzjB9GGV3x/wCJKd8UjOCf8Qhaji6TKY9C5eNMnlF0GG4udaO6B7Ag=="
)

func clockAt(sec int64) func() time.Time {
	t := time.Unix(sec, 0)
	return func() time.Time { return t }
}

// sign returns the headers Standard.Sign sets, failing the test on error.
func sign(t testing.TB, s signer.Signer, id string, ts int64, body string, secrets ...string) http.Header {
	t.Helper()
	h := http.Header{}
	if err := s.Sign(h, id, time.Unix(ts, 0), []byte(body), secrets); err != nil {
		t.Fatalf("Sign: %v", err)
	}
	return h
}

func TestStandardKnownVectors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		signWith     []string
		verifyWith   []string
		id           string
		ts           int64
		body         string
		wantSig      string
		wantTSHeader string
	}{
		{"go library vector", []string{specSecret}, []string{specSecret}, specID, specTS, specBody, specSigGo, "1614265330"},
		{"secret without whsec_ prefix", []string{strings.TrimPrefix(specSecret, "whsec_")}, []string{strings.TrimPrefix(specSecret, "whsec_")}, specID, specTS, specBody, specSigGo, "1614265330"},
		{"prefixed signs, bare verifies", []string{specSecret}, []string{strings.TrimPrefix(specSecret, "whsec_")}, specID, specTS, specBody, specSigGo, "1614265330"},
		{"rust library vector", []string{rustSecret}, []string{rustSecret}, rustID, rustTS, rustBody, rustSigWant, "1649367553"},
		{"ed25519 seed key", []string{edSeedKey}, []string{edPubKey}, edID, edTS, edBody, edSigWant, "1674087231"},
		{"ed25519 seed||public key", []string{edFullKey}, []string{edPubKey}, edID, edTS, edBody, edSigWant, "1674087231"},
		// The second signature was computed with openssl dgst -sha256 -mac HMAC.
		{"rotation: two secrets in one header", []string{specSecret, rustSecret}, []string{rustSecret}, specID, specTS, specBody,
			specSigGo + " v1,78nXHjpFP0tVJQW5D0SBwmVyyW87BV/rL6MgfM/Bw44=", "1614265330"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := sign(t, signer.Standard{}, tt.id, tt.ts, tt.body, tt.signWith...)
			if got := h.Get("webhook-signature"); got != tt.wantSig {
				t.Errorf("webhook-signature = %q, want %q", got, tt.wantSig)
			}
			if got := h.Get("webhook-id"); got != tt.id {
				t.Errorf("webhook-id = %q, want %q", got, tt.id)
			}
			if got := h.Get("webhook-timestamp"); got != tt.wantTSHeader {
				t.Errorf("webhook-timestamp = %q, want %q", got, tt.wantTSHeader)
			}
			v := signer.Standard{Now: clockAt(tt.ts)}
			msg, err := v.Verify(h, []byte(tt.body), tt.verifyWith)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if msg.ID != tt.id || !msg.Timestamp.Equal(time.Unix(tt.ts, 0)) || string(msg.Body) != tt.body {
				t.Errorf("Verify = %+v", msg)
			}
		})
	}
}

func TestStandardRotation(t *testing.T) {
	t.Parallel()
	const (
		oldSecret = specSecret
		newSecret = rustSecret
		stranger  = "whsec_c3RyYW5nZXItc3RyYW5nZXItc3RyYW5nZXI="
	)
	h := sign(t, signer.Standard{}, "msg_rot", 1700000000, `{"a":1}`, oldSecret, newSecret)
	if n := len(strings.Fields(h.Get("webhook-signature"))); n != 2 {
		t.Fatalf("want 2 signatures in one header, got %d: %q", n, h.Get("webhook-signature"))
	}
	if n := len(h.Values("webhook-signature")); n != 1 {
		t.Fatalf("want one webhook-signature header, got %d", n)
	}
	tests := []struct {
		name    string
		secrets []string
		wantErr error
	}{
		{"old only", []string{oldSecret}, nil},
		{"new only", []string{newSecret}, nil},
		{"both", []string{newSecret, oldSecret}, nil},
		{"stranger then new", []string{stranger, newSecret}, nil},
		{"stranger only", []string{stranger}, signer.ErrNoMatchingSignature},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := signer.Standard{Now: clockAt(1700000000)}.Verify(h, []byte(`{"a":1}`), tt.secrets)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Verify err = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

// Re-signing for a retry must replace the previous attempt's headers, not add
// to them.
func TestStandardSignReplacesHeaders(t *testing.T) {
	t.Parallel()
	h := sign(t, signer.Standard{}, "msg_1", 1700000000, "x", specSecret)
	if err := (signer.Standard{}).Sign(h, "msg_1", time.Unix(1700000060, 0), []byte("x"), []string{specSecret}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"webhook-id", "webhook-timestamp", "webhook-signature"} {
		if n := len(h.Values(k)); n != 1 {
			t.Errorf("%s has %d values", k, n)
		}
	}
	if got := h.Get("webhook-timestamp"); got != "1700000060" {
		t.Errorf("webhook-timestamp = %q", got)
	}
}

func TestStandardV1a(t *testing.T) {
	t.Parallel()
	otherPriv, otherPub, err := signer.GenerateKeyPair()
	if err != nil {
		t.Fatal(err)
	}
	const ts = 1700000000
	const body = `{"amount":100}`
	mixed := sign(t, signer.Standard{}, "msg_ed", ts, body, specSecret, edFullKey)
	onlyEd := sign(t, signer.Standard{}, "msg_ed", ts, body, edSeedKey)
	tests := []struct {
		name    string
		h       http.Header
		body    string
		secrets []string
		wantErr error
	}{
		{"whpk verifies", onlyEd, body, []string{edPubKey}, nil},
		{"tampered body", onlyEd, `{"amount":1000}`, []string{edPubKey}, signer.ErrNoMatchingSignature},
		{"other public key", onlyEd, body, []string{otherPub}, signer.ErrNoMatchingSignature},
		{"other key then ours", onlyEd, body, []string{otherPub, edPubKey}, nil},
		{"whsec cannot check v1a", onlyEd, body, []string{specSecret}, signer.ErrNoMatchingSignature},
		{"mixed header, whpk", mixed, body, []string{edPubKey}, nil},
		{"mixed header, whsec", mixed, body, []string{specSecret}, nil},
		{"mixed header, tampered body", mixed, body + " ", []string{specSecret, edPubKey}, signer.ErrNoMatchingSignature},
		{"private key refused by Verify", onlyEd, body, []string{edSeedKey}, signer.ErrInvalidSecret},
		{"other private key refused by Verify", onlyEd, body, []string{otherPriv}, signer.ErrInvalidSecret},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := signer.Standard{Now: clockAt(ts)}.Verify(tt.h, []byte(tt.body), tt.secrets)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Verify err = %v, want %v", err, tt.wantErr)
			}
		})
	}
	if got := strings.Fields(mixed.Get("webhook-signature")); len(got) != 2 || !strings.HasPrefix(got[0], "v1,") || !strings.HasPrefix(got[1], "v1a,") {
		t.Errorf("mixed header = %q, want a v1 then a v1a entry", got)
	}
}

func TestStandardTamperedFields(t *testing.T) {
	t.Parallel()
	const ts = 1700000000
	base := sign(t, signer.Standard{}, "msg_1", ts, "body", specSecret)
	tests := []struct {
		name string
		edit func(http.Header)
		body string
	}{
		{"body", func(http.Header) {}, "Body"},
		{"id", func(h http.Header) { h.Set("webhook-id", "msg_2") }, "body"},
		{"timestamp", func(h http.Header) { h.Set("webhook-timestamp", "1700000001") }, "body"},
		{"one signature byte", func(h http.Header) {
			s := []byte(h.Get("webhook-signature"))
			s[5] ^= 1
			h.Set("webhook-signature", string(s))
		}, "body"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := base.Clone()
			tt.edit(h)
			_, err := signer.Standard{Now: clockAt(ts)}.Verify(h, []byte(tt.body), []string{specSecret})
			if !errors.Is(err, signer.ErrNoMatchingSignature) {
				t.Fatalf("err = %v, want ErrNoMatchingSignature", err)
			}
		})
	}
}

func TestStandardMalformedHeaders(t *testing.T) {
	t.Parallel()
	const ts = 1700000000
	valid := sign(t, signer.Standard{}, "msg_1", ts, "body", specSecret)
	good := valid.Get("webhook-signature")
	junk := strings.Repeat("v2,AAAA ", 32)
	tests := []struct {
		name    string
		edit    func(h http.Header)
		wantErr error
	}{
		{"untouched", func(http.Header) {}, nil},
		{"no webhook-id", func(h http.Header) { h.Del("webhook-id") }, signer.ErrMissingHeader},
		{"empty webhook-id", func(h http.Header) { h.Set("webhook-id", "") }, signer.ErrMissingHeader},
		{"blank webhook-id", func(h http.Header) { h.Set("webhook-id", "  ") }, signer.ErrMissingHeader},
		{"no webhook-timestamp", func(h http.Header) { h.Del("webhook-timestamp") }, signer.ErrMissingHeader},
		{"no webhook-signature", func(h http.Header) { h.Del("webhook-signature") }, signer.ErrMissingHeader},
		{"empty header", func(h http.Header) { clear(h) }, signer.ErrMissingHeader},
		{"id with dot", func(h http.Header) { h.Set("webhook-id", "msg.1") }, signer.ErrMalformedHeader},
		{"id with space", func(h http.Header) { h.Set("webhook-id", "msg 1") }, signer.ErrMalformedHeader},
		{"two ids", func(h http.Header) { h.Add("webhook-id", "msg_2") }, signer.ErrMalformedHeader},
		{"two timestamps", func(h http.Header) { h.Add("webhook-timestamp", "1700000000") }, signer.ErrMalformedHeader},
		{"two signature headers", func(h http.Header) { h.Add("webhook-signature", good) }, signer.ErrMalformedHeader},
		{"timestamp not a number", func(h http.Header) { h.Set("webhook-timestamp", "yesterday") }, signer.ErrMalformedHeader},
		{"timestamp negative", func(h http.Header) { h.Set("webhook-timestamp", "-1700000000") }, signer.ErrMalformedHeader},
		{"timestamp with plus", func(h http.Header) { h.Set("webhook-timestamp", "+1700000000") }, signer.ErrMalformedHeader},
		{"timestamp leading zero", func(h http.Header) { h.Set("webhook-timestamp", "01700000000") }, signer.ErrMalformedHeader},
		{"timestamp float", func(h http.Header) { h.Set("webhook-timestamp", "1700000000.0") }, signer.ErrMalformedHeader},
		{"timestamp in ms", func(h http.Header) { h.Set("webhook-timestamp", "1700000000000") }, signer.ErrTimestampTooNew},
		{"timestamp overflows int64", func(h http.Header) { h.Set("webhook-timestamp", "9223372036854775808") }, signer.ErrMalformedHeader},
		{"timestamp 20 digits", func(h http.Header) { h.Set("webhook-timestamp", "99999999999999999999") }, signer.ErrMalformedHeader},
		{"timestamp max int64", func(h http.Header) { h.Set("webhook-timestamp", "9223372036854775807") }, signer.ErrTimestampTooNew},
		{"timestamp year 10000", func(h http.Header) { h.Set("webhook-timestamp", "253402300800") }, signer.ErrTimestampTooNew},
		{"timestamp zero", func(h http.Header) { h.Set("webhook-timestamp", "0") }, signer.ErrTimestampTooOld},
		{"signature without comma", func(h http.Header) { h.Set("webhook-signature", "garbage") }, signer.ErrMalformedHeader},
		{"signature version only", func(h http.Header) { h.Set("webhook-signature", "v1,") }, signer.ErrMalformedHeader},
		{"signature value only", func(h http.Header) { h.Set("webhook-signature", ",abc") }, signer.ErrMalformedHeader},
		{"only unknown version", func(h http.Header) { h.Set("webhook-signature", "v2,"+good[3:]) }, signer.ErrNoMatchingSignature},
		{"unknown version before good", func(h http.Header) { h.Set("webhook-signature", "v2,abc "+good) }, nil},
		{"extra spaces", func(h http.Header) { h.Set("webhook-signature", "  v2,abc   "+good+"  ") }, nil},
		{"v1 not base64", func(h http.Header) { h.Set("webhook-signature", "v1,"+strings.Repeat("!", 44)) }, signer.ErrNoMatchingSignature},
		{"v1 truncated", func(h http.Header) { h.Set("webhook-signature", good[:20]) }, signer.ErrNoMatchingSignature},
		{"v1 without padding", func(h http.Header) { h.Set("webhook-signature", strings.TrimSuffix(good, "=")) }, signer.ErrNoMatchingSignature},
		{"v1 non-zero padding bits", func(h http.Header) { h.Set("webhook-signature", flipPaddingBits(good)) }, signer.ErrNoMatchingSignature},
		{"v1a garbage", func(h http.Header) { h.Set("webhook-signature", "v1a,"+strings.Repeat("A", 88)) }, signer.ErrNoMatchingSignature},
		{"good entry past the cap", func(h http.Header) { h.Set("webhook-signature", junk+good) }, signer.ErrNoMatchingSignature},
		{"good entry at the cap", func(h http.Header) { h.Set("webhook-signature", junk[8:]+good) }, nil},
		{"huge header, one token", func(h http.Header) { h.Set("webhook-signature", strings.Repeat("x", 1<<20)) }, signer.ErrMalformedHeader},
		{"huge header, many entries", func(h http.Header) { h.Set("webhook-signature", strings.Repeat("v1,x ", 1<<20)) }, signer.ErrNoMatchingSignature},
		{"v1a garbage of decodable length", func(h http.Header) { h.Set("webhook-signature", "v1a,"+strings.Repeat("A", 86)+"==") }, signer.ErrNoMatchingSignature},
		{"v1 of 33 bytes", func(h http.Header) { h.Set("webhook-signature", "v1,"+strings.Repeat("A", 44)) }, signer.ErrNoMatchingSignature},
		{"lower-case keys built by hand", func(h http.Header) {
			for _, k := range []string{"Webhook-Id", "Webhook-Timestamp", "Webhook-Signature"} {
				h[strings.ToLower(k)] = h[k]
				delete(h, k)
			}
		}, nil},
		{"canonical and lower-case both", func(h http.Header) { h["webhook-id"] = []string{"msg_1"} }, nil},
		{"two lower-case spellings", func(h http.Header) {
			h["webhook-id"] = h["Webhook-Id"]
			h["WEBHOOK-ID"] = h["Webhook-Id"]
			delete(h, "Webhook-Id")
		}, signer.ErrMalformedHeader},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := valid.Clone()
			tt.edit(h)
			_, err := signer.Standard{Now: clockAt(ts)}.Verify(h, []byte("body"), []string{specSecret})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

// flipPaddingBits changes the unused low bits of the last base64 digit, which
// lenient decoders ignore.
func flipPaddingBits(entry string) string {
	b := []byte(entry)
	i := strings.LastIndexFunc(entry, func(r rune) bool { return r != '=' })
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	b[i] = alphabet[strings.IndexByte(alphabet, b[i])^1]
	return string(b)
}

func TestStandardSignErrors(t *testing.T) {
	t.Parallel()
	ts := time.Unix(1700000000, 0)
	tests := []struct {
		name    string
		h       http.Header
		id      string
		ts      time.Time
		secrets []string
		wantErr error // nil: any error will do, but not one of the sentinels
	}{
		{"nil secrets", http.Header{}, "msg_1", ts, nil, signer.ErrInvalidSecret},
		{"empty secrets", http.Header{}, "msg_1", ts, []string{}, signer.ErrInvalidSecret},
		{"empty string", http.Header{}, "msg_1", ts, []string{""}, signer.ErrInvalidSecret},
		{"prefix only", http.Header{}, "msg_1", ts, []string{"whsec_"}, signer.ErrInvalidSecret},
		{"not base64", http.Header{}, "msg_1", ts, []string{"whsec_not base64 at all!"}, signer.ErrInvalidSecret},
		{"16 bytes", http.Header{}, "msg_1", ts, []string{"whsec_AAAAAAAAAAAAAAAAAAAAAA=="}, signer.ErrInvalidSecret},
		{"65 bytes", http.Header{}, "msg_1", ts, []string{"whsec_" + strings.Repeat("A", 88)}, signer.ErrInvalidSecret},
		{"huge", http.Header{}, "msg_1", ts, []string{"whsec_" + strings.Repeat("A", 1<<20)}, signer.ErrInvalidSecret},
		{"public key", http.Header{}, "msg_1", ts, []string{edPubKey}, signer.ErrInvalidSecret},
		{"good then public key", http.Header{}, "msg_1", ts, []string{specSecret, edPubKey}, signer.ErrInvalidSecret},
		{"private key of 31 bytes", http.Header{}, "msg_1", ts, []string{"whsk_" + strings.Repeat("A", 42) + "=="}, signer.ErrInvalidSecret},
		{"private key with wrong public half", http.Header{}, "msg_1", ts, []string{edBadHalf}, signer.ErrInvalidSecret},
		{"nil header", nil, "msg_1", ts, []string{specSecret}, nil},
		{"empty id", http.Header{}, "", ts, []string{specSecret}, nil},
		{"id with dot", http.Header{}, "msg.1", ts, []string{specSecret}, nil},
		{"id with newline", http.Header{}, "msg_1\r\nX-Evil: 1", ts, []string{specSecret}, nil},
		{"zero time", http.Header{}, "msg_1", time.Time{}, []string{specSecret}, nil},
		{"before 1970", http.Header{}, "msg_1", time.Unix(-1, 0), []string{specSecret}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := signer.Standard{}.Sign(tt.h, tt.id, tt.ts, []byte("body"), tt.secrets)
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

func TestStandardVerifySecretErrors(t *testing.T) {
	t.Parallel()
	h := sign(t, signer.Standard{}, "msg_1", 1700000000, "body", specSecret)
	tests := []struct {
		name    string
		secrets []string
	}{
		{"nil", nil},
		{"empty", []string{}},
		{"empty string", []string{""}},
		{"short secret", []string{"whsec_AAAAAAAAAAAAAAAAAAAAAA=="}},
		{"bad base64 after a good one", []string{specSecret, "whsec_%%%"}},
		{"private key", []string{edFullKey}},
		{"public key of 31 bytes", []string{"whpk_" + strings.Repeat("A", 42) + "=="}},
		{"public key not base64", []string{"whpk_???"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// Configuration errors come first, even before a missing header.
			for _, hdr := range []http.Header{h, {}} {
				_, err := signer.Standard{Now: clockAt(1700000000)}.Verify(hdr, []byte("body"), tt.secrets)
				if !errors.Is(err, signer.ErrInvalidSecret) {
					t.Fatalf("err = %v, want ErrInvalidSecret", err)
				}
			}
		})
	}
}

// The body is authenticated byte for byte, whatever it holds.
func TestStandardBodies(t *testing.T) {
	t.Parallel()
	bodies := map[string][]byte{
		"nil":     nil,
		"empty":   {},
		"binary":  {0, 0xff, '.', '\n', 0x80},
		"1 MiB":   []byte(strings.Repeat("x", 1<<20)),
		"dots":    []byte("1700000000.msg_1."),
		"unicode": []byte("支付成功 ✓"),
	}
	for name, body := range bodies {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			if err := (signer.Standard{}).Sign(h, "msg_1", time.Unix(1700000000, 0), body, []string{specSecret, edSeedKey}); err != nil {
				t.Fatal(err)
			}
			for _, secret := range []string{specSecret, edPubKey} {
				msg, err := signer.Standard{Now: clockAt(1700000000)}.Verify(h, body, []string{secret})
				if err != nil {
					t.Fatalf("Verify with %.6s: %v", secret, err)
				}
				if string(msg.Body) != string(body) {
					t.Fatal("body changed")
				}
			}
			if _, err := (signer.Standard{Now: clockAt(1700000000)}).Verify(h, append([]byte("x"), body...), []string{specSecret, edPubKey}); !errors.Is(err, signer.ErrNoMatchingSignature) {
				t.Fatalf("prefixed body: err = %v", err)
			}
		})
	}
}
