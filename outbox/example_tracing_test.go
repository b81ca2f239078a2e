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
	"time"

	_ "github.com/mattn/go-sqlite3"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/txhook/txhook/outbox"
)

// With a TracerProvider, the webhook joins the trace of the payment that
// caused it: Enqueue stores its span's context with the event, each
// attempt's span is its child, and the request's traceparent header lets
// the merchant's receiver continue the same trace.
func ExampleConfig_tracing() {
	ctx := context.Background()
	tp := sdktrace.NewTracerProvider() // yours, with its exporter
	defer tp.Shutdown(ctx)

	dir, _ := os.MkdirTemp("", "txhook-example-")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	ob, err := outbox.New(ctx, db, outbox.Config{TracerProvider: tp,
		AllowHTTP: true, AllowPrivateTargets: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		panic(err)
	}

	// The merchant's receiver reads the trace context as any
	// OpenTelemetry HTTP server instrumentation would.
	traces := make(chan trace.TraceID, 1)
	merchant := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		traces <- trace.SpanContextFromContext(rctx).TraceID()
	}))
	defer merchant.Close()
	if _, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "merchant_42", URL: merchant.URL}); err != nil {
		panic(err)
	}
	relay, _ := ob.NewRelay(outbox.RelayConfig{})
	relay.Start(ctx)
	defer func() {
		stop, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		relay.Stop(stop)
	}()

	// The payment handler's span is active when it enqueues.
	ctx, span := tp.Tracer("payments").Start(ctx, "capture payment")
	tx, _ := db.BeginTx(ctx, nil)
	if _, err := ob.Enqueue(ctx, tx, outbox.Event{Tenant: "merchant_42", Type: "payment.succeeded",
		Payload: []byte(`{"payment_id":"pay_1"}`)}); err != nil {
		panic(err)
	}
	tx.Commit()
	span.End()

	fmt.Println("receiver continues the payment's trace:", <-traces == span.SpanContext().TraceID())
	// Output: receiver continues the payment's trace: true
}
