package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/txhook/txhook/outbox"
)

// Send every webhook through an HTTP CONNECT egress proxy, such as
// smokescreen, so that receivers see the proxy's static addresses; the
// merchant's endpoint also asked for its own Authorization header.
func ExampleRelayConfig_proxy() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "txhook-example-")
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	// The demo receiver runs on 127.0.0.1 over http.
	ob, err := outbox.New(ctx, db, outbox.Config{AllowHTTP: true, AllowPrivateTargets: true,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		panic(err)
	}

	got := make(chan string, 1)
	merchant := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Authorization")
	}))
	defer merchant.Close()
	proxy := startConnectProxy("Basic cmVsYXk6czNjcmV0") // relay:s3cret; stands in for smokescreen
	defer proxy.Close()

	if _, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "merchant_42", URL: merchant.URL,
		Headers: outbox.Headers{"Authorization": "Bearer merchant-token"}}); err != nil {
		panic(err)
	}

	proxyURL, _ := url.Parse(proxy.URL) // http://host:port
	proxyURL.User = url.UserPassword("relay", "s3cret")
	relay, err := ob.NewRelay(outbox.RelayConfig{Proxy: proxyURL})
	if err != nil {
		panic(err)
	}
	relay.Start(ctx)
	defer func() {
		stop, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		relay.Stop(stop)
	}()

	tx, _ := db.BeginTx(ctx, nil)
	if _, err := ob.Enqueue(ctx, tx, outbox.Event{Tenant: "merchant_42", Type: "payment.succeeded",
		Payload: []byte(`{"payment_id":"pay_1"}`)}); err != nil {
		panic(err)
	}
	tx.Commit()

	fmt.Println("merchant got Authorization:", <-got)
	tunnels, _, _ := proxy.stats()
	fmt.Println("tunnels through the proxy:", tunnels)
	// Output:
	// merchant got Authorization: Bearer merchant-token
	// tunnels through the proxy: 1
}
