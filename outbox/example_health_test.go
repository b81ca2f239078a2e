package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite" // pure Go; mattn/go-sqlite3 ("sqlite3") works the same

	"github.com/txhook/txhook/outbox"
)

// Show each merchant the health of their own endpoints. The host resolves
// the tenant from its own authentication (here, an API key); the handler
// never shows another tenant's endpoints.
func ExampleHealthHandler() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "txhook-example-")
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ob, err := outbox.New(ctx, db, outbox.Config{})
	if err != nil {
		panic(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		panic(err)
	}
	for _, tenant := range []string{"merchant_42", "merchant_7"} {
		// Registration checks that the host resolves to public addresses;
		// an IP literal needs no DNS.
		if _, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: tenant, URL: "https://93.184.215.14/webhooks"}); err != nil {
			panic(err)
		}
	}

	apiKeys := map[string]string{"sk_live_42": "merchant_42"} // your own auth
	health := outbox.HealthHandler(ob, func(r *http.Request) (string, bool) {
		tenant, ok := apiKeys[r.Header.Get("X-Api-Key")]
		return tenant, ok
	})

	for _, key := range []string{"", "sk_live_42"} {
		req := httptest.NewRequest("GET", "/v1/webhook-health?window=1h", nil)
		req.Header.Set("X-Api-Key", key)
		rec := httptest.NewRecorder()
		health.ServeHTTP(rec, req)
		var doc struct {
			Tenant    string `json:"tenant"`
			Endpoints []struct {
				Tenant      string  `json:"tenant"`
				Attempts    int     `json:"attempts"`
				SuccessRate float64 `json:"success_rate"`
			} `json:"endpoints"`
		}
		json.Unmarshal(rec.Body.Bytes(), &doc)
		fmt.Println(rec.Code, doc.Tenant, len(doc.Endpoints))
	}
	// Output:
	// 403  0
	// 200 merchant_42 1
}
