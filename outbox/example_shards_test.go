package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/txhook/txhook/outbox"
)

// shard is one database of a sharded deployment: its own Outbox and its
// own relays, which deliver only what was enqueued in that database.
type shard struct {
	db    *sql.DB
	ob    *outbox.Outbox
	relay *outbox.Relay
}

// Tenants sharded across databases (docs/SCALING.md): each tenant's
// business data and its outbox live in one database, chosen by the host's
// routing; every database has its own Outbox and relays. Two SQLite files
// stand in here for two PostgreSQL databases.
func Example_shards() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "txhook-example-")
	defer os.RemoveAll(dir)

	var mu sync.Mutex
	var got []string
	merchants := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.URL.Path)
		mu.Unlock()
	}))
	defer merchants.Close()

	cfg := outbox.Config{AllowHTTP: true, AllowPrivateTargets: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	shards := map[string]*shard{}
	for _, name := range []string{"eu", "us"} {
		db, _ := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, name+".db")))
		defer db.Close()
		ob, _ := outbox.New(ctx, db, cfg)
		ob.Migrate(ctx)
		relay, _ := ob.NewRelay(outbox.RelayConfig{ID: "relay-" + name})
		relay.Start(ctx)
		defer func() {
			stop, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			relay.Stop(stop)
		}()
		shards[name] = &shard{db: db, ob: ob, relay: relay}
	}
	// The host's routing: which database holds a tenant.
	shardOf := map[string]string{"merchant_berlin": "eu", "merchant_boston": "us"}

	for tenant, name := range shardOf {
		s := shards[name]
		// Endpoints live with their tenant too.
		s.ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: tenant, URL: merchants.URL + "/" + tenant})
		// The payment and its event commit in the tenant's database.
		tx, _ := s.db.BeginTx(ctx, nil)
		if _, err := s.ob.Enqueue(ctx, tx, outbox.Event{Tenant: tenant, Type: "payment.succeeded", Payload: []byte(`{"amount":1200}`)}); err != nil {
			tx.Rollback()
			panic(err)
		}
		tx.Commit()
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if shards["eu"].relay.Stats().Succeeded+shards["us"].relay.Stats().Succeeded == 2 || time.Now().After(deadline) {
			break
		}
	}
	mu.Lock()
	sort.Strings(got)
	fmt.Println(got)
	mu.Unlock()
	fmt.Println("eu relay delivered", shards["eu"].relay.Stats().Succeeded, "and us relay", shards["us"].relay.Stats().Succeeded)
	// Output:
	// [/merchant_berlin /merchant_boston]
	// eu relay delivered 1 and us relay 1
}
