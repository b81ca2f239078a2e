package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite" // pure Go; mattn/go-sqlite3 ("sqlite3") works the same

	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/signer"
)

// Enqueue an event in the same transaction as the payment it announces; a
// relay delivers it signed to the merchant's endpoint.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "txhook-example-")
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	db.Exec(`CREATE TABLE payments (id TEXT PRIMARY KEY, amount INTEGER)`)

	// The demo receiver runs on 127.0.0.1 over http, which production
	// settings refuse.
	ob, err := outbox.New(ctx, db, outbox.Config{AllowHTTP: true, AllowPrivateTargets: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		panic(err)
	}

	var secret string
	got := make(chan string, 1)
	merchant := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if _, err := (signer.Standard{}).Verify(r.Header, body, []string{secret}); err != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		var ev struct {
			Type string          `json:"type"`
			Data json.RawMessage `json:"data"`
		}
		json.Unmarshal(body, &ev)
		got <- ev.Type + " " + string(ev.Data)
	}))
	defer merchant.Close()

	ep, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "merchant_42", URL: merchant.URL, EventTypes: []string{"payment.*"}})
	if err != nil {
		panic(err)
	}
	secret = ep.Secrets[0].Value

	relay, err := ob.NewRelay(outbox.RelayConfig{})
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
	tx.ExecContext(ctx, `INSERT INTO payments VALUES ('pay_1', 1200)`)
	if _, err := ob.Enqueue(ctx, tx, outbox.Event{
		Tenant:         "merchant_42",
		Type:           "payment.succeeded",
		IdempotencyKey: "pay_1:succeeded",
		Payload:        []byte(`{"payment_id":"pay_1","amount":1200}`),
	}); err != nil {
		tx.Rollback()
		panic(err)
	}
	tx.Commit()

	fmt.Println(<-got)
	// Output: payment.succeeded {"payment_id":"pay_1","amount":1200}
}

// Endpoint URLs are checked when they are registered: a URL that reaches
// the relay's own network is refused.
func ExampleOutbox_CreateEndpoint() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "txhook-example-")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	ob, _ := outbox.New(ctx, db, outbox.Config{})
	ob.Migrate(ctx)

	for _, url := range []string{
		"https://169.254.169.254/latest/meta-data/", // cloud metadata
		"https://10.0.0.7/hooks",                    // private network
		"http://93.184.216.34/hooks",                // plain http
		"https://user:pass@example.com/hooks",       // credentials in the URL
	} {
		_, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "m", URL: url})
		fmt.Println(errors.Is(err, outbox.ErrForbiddenTarget), errors.Is(err, outbox.ErrInsecureURL), errors.Is(err, outbox.ErrInvalidURL))
	}
	// Output:
	// true false false
	// true false false
	// false true false
	// false false true
}
