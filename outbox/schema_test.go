package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/txhook/txhook/dlq"
	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/metrics"
)

// Using the outbox before migrating says to migrate, on every path that
// touches the tables: Enqueue, CreateEndpoint, Relay.Start, CheckSchema. A
// schema that lacks a migration is named.
func TestNotMigratedSaysSo(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		ob, err := outbox.New(ctx, db.DB, outbox.Config{Logger: quietLogger(), AllowHTTP: true, AllowPrivateTargets: true})
		if err != nil {
			t.Fatal(err)
		}
		defer ob.Close()
		says := func(what string, err error, detail string) {
			t.Helper()
			if !errors.Is(err, outbox.ErrNotMigrated) {
				t.Fatalf("%s: %v, want ErrNotMigrated", what, err)
			}
			for _, s := range []string{"Migrate", "outbox/migrations", detail} {
				if !strings.Contains(err.Error(), s) {
					t.Fatalf("%s: %q does not mention %q", what, err, s)
				}
			}
		}

		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = ob.Enqueue(ctx, tx, outbox.Event{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{}`)})
		tx.Rollback()
		says("Enqueue", err, "txhook_events")
		_, err = ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "m", URL: "http://127.0.0.1:1/hook"})
		says("CreateEndpoint", err, "txhook_endpoints")
		says("CheckSchema", ob.CheckSchema(ctx), "no txhook tables")
		relay, err := ob.NewRelay(outbox.RelayConfig{})
		if err != nil {
			t.Fatal(err)
		}
		says("Relay.Start", relay.Start(ctx), "no txhook tables")

		// A schema one migration behind.
		if err := ob.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		ms, err := store.Migrations(dialect(db))
		if err != nil {
			t.Fatal(err)
		}
		last := ms[len(ms)-1]
		if _, err := db.ExecContext(ctx, last.Down); err != nil {
			t.Fatal(err)
		}
		says("Relay.Start one behind", relay.Start(ctx), "lacks "+last.Name)

		if err := ob.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if err := relay.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if err := relay.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

func dialect(db *testdb.DB) store.Dialect {
	if db.Backend.Postgres() {
		return store.Postgres
	}
	return store.SQLite
}

func TestInvalidSchemaRefused(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		name := "Web-Hooks"
		if !db.Backend.Postgres() {
			name = "webhooks" // valid, but SQLite has no schemas
		}
		_, err := outbox.New(context.Background(), db.DB, outbox.Config{Schema: name})
		if !errors.Is(err, outbox.ErrInvalidSchema) {
			t.Fatalf("New with Schema %q: %v, want ErrInvalidSchema", name, err)
		}
	})
}

// With Config.Schema, deliveries, dead letters, the operations UI and the
// metrics all use the tables in that schema; nothing lands where the
// connections' search_path points, nor in public.
func TestCustomSchemaEndToEnd(t *testing.T) {
	for _, be := range testdb.Backends {
		if !be.Postgres() {
			continue
		}
		t.Run(be.Name, func(t *testing.T) {
			t.Parallel()
			db := testdb.Open(t, be)
			var rnd [6]byte
			_, _ = rand.Read(rnd[:])
			schema := "txhook_custom_" + hex.EncodeToString(rnd[:])
			t.Cleanup(func() { _, _ = db.Exec(`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`) })
			inPublic := func() int {
				var n int
				if err := db.QueryRow(`SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'txhook%'`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			publicBefore := inPublic()

			b := setup(t, db, outbox.Config{Schema: schema})
			got := make(chan string, 10)
			okSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got <- r.Header.Get("Webhook-Id")
			}))
			defer okSrv.Close()
			failSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "down", http.StatusInternalServerError)
			}))
			defer failSrv.Close()
			b.endpoint("m", okSrv.URL)
			failing := b.endpoint("m", failSrv.URL)
			b.relay(outbox.RelayConfig{Retry: fastRetryAttempts(1), PollInterval: 20 * time.Millisecond})
			id := b.enqueue(outbox.Event{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"amount":1200}`)})
			select {
			case h := <-got:
				if h != id {
					t.Fatalf("receiver got %q, want %q", h, id)
				}
			case <-time.After(waitFor):
				t.Fatal("timed out waiting for the delivery")
			}
			q := dlq.New(b.ob)
			b.eventually("the dead letter", func() bool {
				n, err := q.Count(b.ctx, dlq.Filter{EndpointID: failing.ID})
				if err != nil {
					t.Fatal(err)
				}
				return n == 1
			})

			ui, err := dlq.NewUI(b.ob, dlq.UIConfig{Authorize: func(*http.Request) bool { return true }})
			if err != nil {
				t.Fatal(err)
			}
			rec := httptest.NewRecorder()
			ui.ServeHTTP(rec, httptest.NewRequest("GET", "/dead", nil))
			if body, _ := io.ReadAll(rec.Body); rec.Code != 200 || !strings.Contains(string(body), failing.ID) {
				t.Fatalf("dead-letter page: %d, lists %s: %v", rec.Code, failing.ID, strings.Contains(string(body), failing.ID))
			}

			reg := prometheus.NewRegistry()
			reg.MustRegister(metrics.New(b.ob, metrics.Options{}))
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			dead := -1.0
			for _, mf := range mfs {
				if mf.GetName() == "txhook_dead_letters" {
					dead = 0
					for _, m := range mf.GetMetric() {
						dead += m.GetGauge().GetValue()
					}
				}
			}
			if dead != 1 {
				t.Fatalf("txhook_dead_letters gauge: %s", strconv.FormatFloat(dead, 'f', -1, 64))
			}

			if err := b.ob.CheckSchema(b.ctx); err != nil {
				t.Fatal(err)
			}
			if got := db.SchemaDump(t); got != "" {
				t.Fatalf("txhook objects in the search_path's schema:\n%s", got)
			}
			if n := inPublic(); n != publicBefore {
				t.Fatalf("txhook tables in public: %d, before %d", n, publicBefore)
			}
			var n int
			// txhook's eleven tables; partitions and what Partition adds for
			// them (TXHOOK_TEST_PARTITIONED=1) are not counted.
			if err := db.QueryRow(`SELECT count(*) FROM pg_class c JOIN pg_namespace ns ON ns.oid = c.relnamespace
WHERE ns.nspname = $1 AND c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND c.relname NOT IN ('txhook_partitions', 'txhook_events_keys')`, schema).Scan(&n); err != nil || n != 11 {
				t.Fatalf("tables in %s: %d %v, want 11", schema, n, err)
			}
		})
	}
}
