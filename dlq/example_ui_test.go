package dlq_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	_ "github.com/mattn/go-sqlite3"

	"github.com/txhook/txhook/dlq"
	"github.com/txhook/txhook/outbox"
)

// operatorRole stands for the host's own session lookup.
func operatorRole(r *http.Request) string {
	if c, err := r.Cookie("session"); err == nil && c.Value == "s3cr3t-session-of-alice" {
		return "payments-ops"
	}
	return ""
}

// Mount the operations UI under a path of an admin server. Authorize is
// required: here only operators whose session has the payments-ops role
// get in; everyone else gets 403 on every page and form.
func ExampleNewUI() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "txhook-example-")
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite3", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
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

	ui, err := dlq.NewUI(ob, dlq.UIConfig{
		Prefix:    "/admin/webhooks/",
		Authorize: func(r *http.Request) bool { return operatorRole(r) == "payments-ops" },
	})
	if err != nil {
		panic(err)
	}
	admin := http.NewServeMux()
	admin.Handle("/admin/webhooks/", ui)

	for _, session := range []string{"", "s3cr3t-session-of-alice"} {
		req := httptest.NewRequest("GET", "/admin/webhooks/dead", nil)
		req.AddCookie(&http.Cookie{Name: "session", Value: session})
		rec := httptest.NewRecorder()
		admin.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("X-Frame-Options"))
	}
	// Output:
	// 403 DENY
	// 200 DENY
}
