package verify_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/signer"
	"github.com/txhook/txhook/verify"
)

// FuzzMiddleware sends hostile requests through the middleware: headers as
// given, or (sign) the body properly signed, so that hostile bodies reach
// the envelope parser and the store. signer fuzzes its header parsing on
// its own; this covers what verify adds. The middleware must not panic,
// must answer one of its documented statuses, must pass only signed events
// to the handler, and must answer the same delivery again as a duplicate
// (or, after the handler failed, pass it again).
func FuzzMiddleware(f *testing.F) {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }

	f.Add("evt_1", "1800000000", "v1,abc", []byte(`{"type":"payment.succeeded","data":{}}`), true, false)
	f.Add("evt_1", "1800000000", "v1,abc", []byte(`{"type":"payment.succeeded","data":{}}`), false, false)
	f.Add("evt_2", "1800000000", "", []byte(`{"type":"a","id":7}`), true, true)
	f.Add("evt_3", "0", "v1a,"+strings.Repeat("A", 86)+"==", []byte(`{"type":"a","timestamp":"x"}`), true, false)
	f.Add("", "", "", []byte(nil), false, false)
	f.Add("evt_4", "1800000000", "v1,", []byte(`[{"type":"a"}]`), true, false)
	f.Add("evt_5", "1800000000", "v1,", []byte(`{"type":"a","type":"b"}`), true, false)
	f.Add("evt_6", "1800000000", "v1,", []byte(strings.Repeat("[", 5000)), true, false)

	f.Fuzz(func(t *testing.T, id, ts, sig string, body []byte, sign, fail bool) {
		// A fresh store per input keeps each run independent of the
		// previous ones, which the fuzzer's minimisation relies on.
		v, err := verify.New(verify.Config{
			Secrets:      []string{secret},
			Now:          clock,
			Store:        verify.NewMemoryStore(verify.MemoryConfig{Now: clock}),
			MaxBodyBytes: 4096,
			Types:        []string{"payment.succeeded", "a"},
		})
		if err != nil {
			t.Fatal(err)
		}
		var got *verify.Event
		h := v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ev, ok := verify.EventFrom(r.Context())
			if !ok {
				t.Fatal("no event in the context")
			}
			got = &ev
			if fail {
				w.WriteHeader(http.StatusInternalServerError)
			}
		}))

		hdr := http.Header{}
		hdr.Set("Webhook-Id", id)
		hdr.Set("Webhook-Timestamp", ts)
		hdr.Set("Webhook-Signature", sig)
		signedOK := sign && (signer.Standard{}).Sign(hdr, id, now, body, []string{secret}) == nil
		for _, vs := range hdr {
			if strings.ContainsAny(vs[0], "\r\n") {
				return // not a header a client could send
			}
		}
		serve := func() *httptest.ResponseRecorder {
			req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
			req.Header = hdr.Clone()
			got = nil
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			return rec
		}

		rec := serve()
		switch rec.Code {
		case 200, 400, 401, 413:
		case 500:
			if got == nil {
				t.Fatalf("500 without the handler: %q", rec.Body.String())
			}
		default:
			t.Fatalf("status %d", rec.Code)
		}
		if strings.Contains(rec.Body.String(), strings.TrimPrefix(secret, "whsec_")) {
			t.Fatal("secret in response")
		}
		if got == nil {
			return
		}
		if !signedOK {
			t.Fatalf("an unsigned request reached the handler: %q", body)
		}
		if got.ID != id || got.Type == "" || !bytes.Equal(got.Body, body) || len(body) > 4096 {
			t.Fatalf("event %+v for id %q body %q", got, id, body)
		}

		again := serve()
		switch {
		case fail && (again.Code != 500 || got == nil):
			t.Fatalf("retry after a failure: %d, handler ran: %v", again.Code, got != nil)
		case !fail && (again.Code != 200 || got != nil || strings.TrimSpace(again.Body.String()) != "duplicate"):
			t.Fatalf("retry after success: %d %q, handler ran: %v", again.Code, again.Body.String(), got != nil)
		}
	})
}
