package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/txhook/txhook/outbox"
)

// Encrypt endpoint signing secrets (and client certificate keys and custom
// headers) at rest
// with a keyring from the environment, and move existing rows to its
// current key.
func ExampleAESGCM() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "txhook-example-")
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	if err != nil {
		panic(err)
	}
	defer db.Close()

	// In production: os.Getenv("TXHOOK_SECRET_KEYS"), made with
	// `echo "k1:$(openssl rand -base64 32)"`; the first key encrypts.
	keys := "k1:WmwPaHfqW3Iz3G1fJ8sO8ZV1JYbm0r9NdpR1m3b7x9s="
	cipher, err := outbox.ParseAESGCMKeys(keys)
	if err != nil {
		panic(err)
	}
	ob, err := outbox.New(ctx, db, outbox.Config{SecretCipher: cipher,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		panic(err)
	}
	ep, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "merchant_42", URL: "https://93.184.215.14/webhooks",
		Headers: outbox.Headers{"Authorization": "Bearer merchant-token"}})
	if err != nil {
		panic(err)
	}

	var stored, headers string
	db.QueryRow(`SELECT json_extract(secrets, '$.kid'), json_extract(headers, '$.kid') FROM txhook_endpoints WHERE id = ?`, ep.ID).Scan(&stored, &headers)
	fmt.Println("stored under key", stored, headers)
	read, _ := ob.Endpoint(ctx, ep.ID)
	fmt.Println("read back:", read.Secrets[0].Value == ep.Secrets[0].Value, read.Headers["Authorization"])

	// After adding a key (or setting the first one over plaintext rows):
	res, err := ob.ReencryptSecrets(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%+v\n", res)
	// Output:
	// stored under key k1 k1
	// read back: true Bearer merchant-token
	// {Endpoints:1 Encrypted:0 Rekeyed:0 ClientKeysEncrypted:0 ClientKeysRekeyed:0 HeadersEncrypted:0 HeadersRekeyed:0}
}
