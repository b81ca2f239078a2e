package outbox_test

import (
	"context"
	"database/sql"
	"encoding/csv"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	_ "modernc.org/sqlite" // pure Go; mattn/go-sqlite3 ("sqlite3") works the same

	"github.com/txhook/txhook/outbox"
)

// exampleOutbox opens a migrated outbox on a new SQLite file.
func exampleOutbox(ctx context.Context) (*outbox.Outbox, func()) {
	dir, _ := os.MkdirTemp("", "txhook-example-")
	db, err := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	if err != nil {
		panic(err)
	}
	ob, err := outbox.New(ctx, db, outbox.Config{})
	if err != nil {
		panic(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		panic(err)
	}
	return ob, func() { db.Close(); os.RemoveAll(dir) }
}

// A merchant's own view: every call is scoped to the tenant in SQL, so
// another merchant's IDs are not found, and changes are audited with the
// actor the host names.
func ExampleOutbox_Tenant() {
	ctx := context.Background()
	ob, done := exampleOutbox(ctx)
	defer done()

	acme := ob.Tenant("acme")
	ctx = outbox.WithActor(ctx, outbox.Actor{Name: "alice@acme.example", Addr: "203.0.113.9"})
	ep, err := acme.CreateEndpoint(ctx, outbox.NewEndpoint{URL: "https://93.184.215.14/webhooks"})
	if err != nil {
		panic(err)
	}
	if err := acme.DisableEndpoint(ctx, ep.ID, "receiver moving"); err != nil {
		panic(err)
	}

	// Another merchant naming acme's endpoint gets not found.
	_, err = ob.Tenant("globex").Endpoint(ctx, ep.ID)
	fmt.Println(errors.Is(err, outbox.ErrEndpointNotFound))

	log, err := acme.AuditLog(ctx, outbox.AuditFilter{})
	if err != nil {
		panic(err)
	}
	for _, e := range log.Entries {
		fmt.Println(e.Action, e.Actor, string(e.Detail))
	}
	// Output:
	// true
	// endpoint.disable alice@acme.example {"reason":"receiver moving"}
	// endpoint.create alice@acme.example {"url":"https://93.184.215.14/webhooks"}
}

// Export a month of events with their final outcome as CSV, streamed row
// by row (write to the HTTP response in a handler).
func ExampleTenantView_Export() {
	ctx := context.Background()
	ob, done := exampleOutbox(ctx)
	defer done()

	w := csv.NewWriter(os.Stdout)
	w.Write([]string{"event_id", "type", "created_at", "endpoint_id", "state", "attempts", "last_status", "delivered_at"})
	since := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	err := ob.Tenant("acme").Export(ctx, outbox.ExportFilter{Since: since, Until: since.AddDate(0, 1, 0)}, func(r outbox.ExportRow) error {
		delivered := ""
		if !r.DeliveredAt.IsZero() {
			delivered = r.DeliveredAt.Format(time.RFC3339)
		}
		return w.Write([]string{r.EventID, r.EventType, r.CreatedAt.Format(time.RFC3339), r.EndpointID, r.State,
			strconv.Itoa(r.Attempts), strconv.Itoa(r.LastStatus), delivered})
	})
	if err != nil {
		panic(err)
	}
	w.Flush()
	// Output:
	// event_id,type,created_at,endpoint_id,state,attempts,last_status,delivered_at
}
