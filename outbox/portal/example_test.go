package portal_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite"

	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/portal"
)

// A host without a merchant login of its own hands a merchant a signed
// link; opening it lands on the merchant's endpoints, on a URL without the
// token.
func ExamplePortal_Link() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "portal-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "outbox.db")))
	defer db.Close()
	ob, err := outbox.New(ctx, db, outbox.Config{Dialect: "sqlite", AllowHTTP: true, AllowPrivateTargets: true})
	if err != nil {
		panic(err)
	}
	defer ob.Close()
	if err := ob.Migrate(ctx); err != nil {
		panic(err)
	}
	if _, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "merchant_42", URL: "http://127.0.0.1:9/webhooks"}); err != nil {
		panic(err)
	}

	p, err := portal.New(ob, portal.Config{
		Prefix:   "/merchant/webhooks/",
		LinkKeys: [][]byte{[]byte("a portal key of at least 32 bytes, from your secret store")},
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/merchant/webhooks/", p)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	link, err := p.Link("merchant_42", 15*time.Minute)
	if err != nil {
		panic(err)
	}
	jar, _ := cookiejar.New(nil)
	res, err := (&http.Client{Jar: jar}).Get(srv.URL + link)
	if err != nil {
		panic(err)
	}
	res.Body.Close()
	fmt.Println(res.StatusCode, res.Request.URL.Path)
	fmt.Println(res.Header.Get("Content-Security-Policy"))
	// Output:
	// 200 /merchant/webhooks/endpoints
	// default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'
}
