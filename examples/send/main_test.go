package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/txhook/txhook/signer"
)

func TestSendExitStatus(t *testing.T) {
	t.Parallel()
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		var err error
		if r.URL.Path == "/stripe" {
			_, err = signer.Stripe{Header: "X-Kxp-Signature"}.Verify(r.Header, body, []string{"a-shared-secret-of-sorts"})
		} else {
			_, err = signer.Standard{}.Verify(r.Header, body, []string{secret})
		}
		switch {
		case err != nil:
			http.Error(w, err.Error(), http.StatusUnauthorized)
		case r.URL.Path == "/fail":
			http.Error(w, "nope", http.StatusInternalServerError)
		default:
			w.WriteHeader(http.StatusOK)
		}
	}))
	defer srv.Close()

	cases := []struct {
		name string
		args []string
		code int
		out  string
	}{
		{"standard ok", []string{"-url", srv.URL + "/ok", "-secret", secret, "-allow-private"}, 0, "delivered"},
		{"stripe ok", []string{"-url", srv.URL + "/stripe", "-secret", "a-shared-secret-of-sorts", "-scheme", "stripe", "-header", "X-Kxp-Signature", "-allow-private", "-type", "payment.succeeded", "-data", `{"id":"pay_1"}`}, 0, "delivered"},
		{"receiver fails twice", []string{"-url", srv.URL + "/fail", "-secret", secret, "-allow-private", "-attempts", "2"}, 1, "attempt 2: HTTP 500"},
		{"wrong secret", []string{"-url", srv.URL + "/ok", "-secret", "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", "-allow-private"}, 1, "HTTP 401"},
		{"private without flag", []string{"-url", srv.URL + "/ok", "-secret", secret}, 2, ""},
		{"bad json", []string{"-url", srv.URL + "/ok", "-allow-private", "-data", "{"}, 2, ""},
		{"no url", []string{}, 2, ""},
		{"bad scheme", []string{"-url", srv.URL, "-scheme", "md5"}, 2, ""},
	}
	for _, c := range cases {
		var out, errOut bytes.Buffer
		code := run(c.args, &out, &errOut)
		if code != c.code {
			t.Errorf("%s: exit %d, want %d\nstdout: %s\nstderr: %s", c.name, code, c.code, out.String(), errOut.String())
		}
		if !strings.Contains(out.String(), c.out) {
			t.Errorf("%s: output lacks %q:\n%s", c.name, c.out, out.String())
		}
		if strings.Contains(errOut.String(), secret) || strings.Contains(out.String(), secret) {
			t.Errorf("%s: secret printed", c.name)
		}
	}
	if calls.Load() < 5 {
		t.Fatalf("receiver saw %d requests", calls.Load())
	}
}
