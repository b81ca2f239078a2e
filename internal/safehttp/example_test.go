package safehttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

	"github.com/txhook/txhook/internal/safehttp"
)

func ExampleCheckURL() {
	ctx := context.Background()
	for _, u := range []string{
		"https://93.184.215.14/hooks/in",
		"http://93.184.215.14/hooks/in",
		"https://10.0.0.5/",
		"https://169.254.169.254/latest/meta-data/",
		"https://[::ffff:127.0.0.1]/",
		"https://0x7f.1/",
		"https://user:pw@93.184.215.14/",
	} {
		fmt.Println(safehttp.CheckURL(ctx, u, safehttp.Config{}))
	}
	// Output:
	// <nil>
	// txhook: insecure scheme (https required)
	// txhook: forbidden address 10.0.0.5 (private)
	// txhook: forbidden address 169.254.169.254 (cloud metadata)
	// txhook: forbidden address ::ffff:127.0.0.1 (loopback)
	// txhook: invalid URL: host "0x7f.1" is a non-canonical numeric IPv4 form
	// txhook: invalid URL: credentials in URL
}

func ExampleClient_Post() {
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, "got %s", body)
	}))
	defer receiver.Close()
	ctx := context.Background()
	header := http.Header{"Content-Type": {"application/json"}}

	// Production settings: the receiver is on loopback, so it is refused
	// at connect time and never sees the request.
	res := safehttp.New(safehttp.Config{AllowHTTP: true}).Post(ctx, receiver.URL, header, []byte(`{"id":"evt_1"}`))
	fmt.Println(res.OK(), res.Status, errors.Is(res.Err, safehttp.ErrForbiddenAddress))

	// AllowPrivate is for tests and self-hosted receivers.
	res = safehttp.New(safehttp.Config{AllowHTTP: true, AllowPrivate: true}).Post(ctx, receiver.URL, header, []byte(`{"id":"evt_1"}`))
	fmt.Println(res.OK(), res.Status, string(res.Excerpt))
	// Output:
	// false 0 true
	// true 202 got {"id":"evt_1"}
}
