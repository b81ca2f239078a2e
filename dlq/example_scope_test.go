package dlq_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite" // pure Go SQLite, registered as "sqlite"

	"github.com/txhook/txhook/dlq"
	"github.com/txhook/txhook/outbox"
)

// Support staff who look after one merchant get the operations UI limited
// to it with Scope: another merchant's endpoint is 404 on every page and
// action. Each operator action is in the audit log under the actor the
// host puts in the request's context.
func ExampleUIConfig_scope() {
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
	acme, _ := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "acme", URL: "https://93.184.215.14/acme"})
	globex, _ := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "globex", URL: "https://93.184.215.14/globex"})

	ui, err := dlq.NewUI(ob, dlq.UIConfig{
		Authorize: func(r *http.Request) bool { return r.Header.Get("X-Staff") != "" }, // your session check
		// Bob supports acme only; other staff see every tenant.
		Scope: func(r *http.Request) (string, bool) { return "acme", r.Header.Get("X-Staff") == "bob" },
		PortalLink: func(tenant string) (string, error) {
			return "https://portal.example/" + tenant, nil // e.g. a signed link from outbox/portal
		},
	})
	if err != nil {
		panic(err)
	}
	for _, ep := range []string{acme.ID, globex.ID} {
		req := httptest.NewRequest("GET", "/endpoints/"+ep, nil)
		req.Header.Set("X-Staff", "bob")
		rec := httptest.NewRecorder()
		ui.ServeHTTP(rec, req)
		fmt.Println(rec.Code)
	}
	// Output:
	// 200
	// 404
}
