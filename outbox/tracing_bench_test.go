package outbox

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/txhook/txhook/internal/store"
)

// BenchmarkAttempt measures one delivery attempt, signing and a request
// to a loopback receiver included, without tracing and with it (an SDK
// provider that samples every span and exports none). Compare its allocs
// without tracing with those of the same benchmark before tracing existed.
func BenchmarkAttempt(b *testing.B) {
	b.Run("off", func(b *testing.B) { benchAttempt(b, Config{}) })
	b.Run("on", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider()
		defer tp.Shutdown(context.Background())
		benchAttempt(b, Config{TracerProvider: tp})
	})
}

// BenchmarkEnqueue measures Enqueue on SQLite, one event per
// transaction, without tracing and with it.
func BenchmarkEnqueue(b *testing.B) {
	b.Run("off", func(b *testing.B) { benchEnqueue(b, Config{}) })
	b.Run("on", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider()
		defer tp.Shutdown(context.Background())
		benchEnqueue(b, Config{TracerProvider: tp})
	})
}

func benchEnqueue(b *testing.B, cfg Config) {
	o, db := benchOutbox(b, cfg)
	ctx := context.Background()
	if err := o.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	ev := Event{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"payment_id":"pay_123","amount":1200}`)}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := o.Enqueue(ctx, tx, ev); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
}

func benchOutbox(b *testing.B, cfg Config) (*Outbox, *sql.DB) {
	db, err := sql.Open("sqlite3", SQLiteDSN(filepath.Join(b.TempDir(), "bench.db")))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	cfg.AllowHTTP, cfg.AllowPrivateTargets = true, true
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	o, err := New(context.Background(), db, cfg)
	if err != nil {
		b.Fatal(err)
	}
	return o, db
}

func benchAttempt(b *testing.B, cfg Config) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
	}))
	defer srv.Close()
	o, _ := benchOutbox(b, cfg)
	r, err := o.NewRelay(RelayConfig{})
	if err != nil {
		b.Fatal(err)
	}
	r.httpCtx = context.Background()
	c := store.Claimed{
		ID: 1, Attempt: 1, EventID: "evt_1", Tenant: "m", Type: "payment.succeeded", Version: 1,
		Payload: []byte(`{"payment_id":"pay_123","amount":1200}`), EventTime: time.Now(), EndpointID: "ep_1",
		EndpointFound: true, URL: srv.URL, Enabled: true,
		Secrets: encodeSecrets([]Secret{{Value: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}),
	}
	lease := leaseWindow(time.Now().Add(time.Hour), time.Minute, time.Second)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		j := &job{c: c, lease: lease}
		out, _ := r.process(j)
		r.endAttempt(j, &out)
		if out.State != store.StateSucceeded {
			b.Fatalf("attempt: %s %s", out.State, out.Error)
		}
	}
}
