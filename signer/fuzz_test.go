package signer

import (
	"bytes"
	"errors"
	"net/http"
	"testing"
	"time"
)

// Fuzz targets live in the package so that the header parser can be fuzzed
// on its own. Seed corpora are under testdata/fuzz/<target>/.

const (
	fuzzSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	fuzzPriv   = "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A="
	fuzzPub    = "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="
	fuzzStripe = "7c4b3a9e2f1d8c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b"
	fuzzNow    = 1700000000
)

// requestErrors are what Verify may return for a hostile request when its
// secrets are fine.
var requestErrors = []error{ErrMissingHeader, ErrMalformedHeader, ErrTimestampTooOld, ErrTimestampTooNew, ErrNoMatchingSignature}

func checkRequestError(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	for _, want := range requestErrors {
		if errors.Is(err, want) {
			return
		}
	}
	t.Fatalf("unexpected error %v", err)
}

// signable maps fuzzed input onto what Sign accepts: a unix time in range
// and a valid id (or reports that the id is not one).
func signable(id string, unix int64) (time.Time, bool) {
	if unix < 0 {
		unix = -(unix + 1)
	}
	return time.Unix(unix%(maxUnix+1), 0), checkID(id) == ""
}

func FuzzParseStandardHeader(f *testing.F) {
	f.Add("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
	f.Fuzz(func(t *testing.T, v string) {
		var out [maxEntries]sigEntry
		n, err := parseStandardSignatures(v, &out)
		if err != nil {
			if !errors.Is(err, ErrMalformedHeader) || n != 0 {
				t.Fatalf("n = %d, err = %v", n, err)
			}
			return
		}
		if n < 0 || n > maxEntries {
			t.Fatalf("n = %d", n)
		}
		for _, e := range out[:n] {
			if e.kind != kindHMAC && e.kind != kindPublic {
				t.Fatalf("entry of kind %d", e.kind)
			}
		}
	})
}

func FuzzVerifyStandard(f *testing.F) {
	f.Add("msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", []byte(`{"test": 2432232314}`), int64(1614265330))
	f.Fuzz(func(t *testing.T, id, tsHeader, sigHeader string, body []byte, unix int64) {
		// Hostile headers: never a panic, only request errors.
		h := http.Header{}
		h.Set(HeaderID, id)
		h.Set(HeaderTimestamp, tsHeader)
		h.Set(HeaderSignature, sigHeader)
		v := Standard{Now: func() time.Time { return time.Unix(fuzzNow, 0) }}
		_, err := v.Verify(h, body, []string{fuzzSecret, fuzzPub})
		checkRequestError(t, err)

		// What Sign makes, Verify takes.
		ts, ok := signable(id, unix)
		h = http.Header{}
		err = Standard{}.Sign(h, id, ts, body, []string{fuzzSecret, fuzzPriv})
		if !ok {
			if err == nil {
				t.Fatalf("Sign accepted id %q", id)
			}
			return
		}
		if err != nil {
			t.Fatalf("Sign: %v", err)
		}
		v.Now = func() time.Time { return ts }
		for _, secret := range []string{fuzzSecret, fuzzPub} {
			msg, err := v.Verify(h, body, []string{secret})
			if err != nil {
				t.Fatalf("Verify(Sign(...)) with %.6s: %v", secret, err)
			}
			if msg.ID != id || !msg.Timestamp.Equal(ts) || !bytes.Equal(msg.Body, body) {
				t.Fatalf("Verify = %+v", msg)
			}
		}
	})
}

func FuzzVerifyStripe(f *testing.F) {
	f.Add("evt_1", "t=1700000000,v1=73aaaf1467acbe56d4ac54d3a6bc1861726585c7ec22741b9bb2f5353cab855e", []byte(`{"event_id":"evt_1","type":"payment.succeeded"}`), int64(1700000000))
	f.Fuzz(func(t *testing.T, id, sigHeader string, body []byte, unix int64) {
		h := http.Header{}
		h.Set(HeaderID, id)
		h.Set(DefaultStripeHeader, sigHeader)
		v := Stripe{Now: func() time.Time { return time.Unix(fuzzNow, 0) }}
		_, err := v.Verify(h, body, []string{fuzzStripe})
		checkRequestError(t, err)

		ts, ok := signable(id, unix)
		h = http.Header{}
		err = Stripe{}.Sign(h, id, ts, body, []string{fuzzStripe, fuzzSecret})
		if !ok {
			if err == nil {
				t.Fatalf("Sign accepted id %q", id)
			}
			return
		}
		if err != nil {
			t.Fatalf("Sign: %v", err)
		}
		v.Now = func() time.Time { return ts }
		for _, secret := range []string{fuzzStripe, fuzzSecret} {
			msg, err := v.Verify(h, body, []string{secret})
			if err != nil {
				t.Fatalf("Verify(Sign(...)): %v", err)
			}
			if msg.ID != id || !msg.Timestamp.Equal(ts) || !bytes.Equal(msg.Body, body) {
				t.Fatalf("Verify = %+v", msg)
			}
		}
	})
}
