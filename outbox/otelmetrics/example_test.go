package otelmetrics_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/otelmetrics"

	_ "modernc.org/sqlite" // pure Go; mattn/go-sqlite3 ("sqlite3") works the same
)

// The gauges are read from the database at each collection: here, an
// event that no relay has dispatched yet.
func ExampleNew() {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader() // in production, a periodic reader and an exporter
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)

	dir, _ := os.MkdirTemp("", "txhook-example-")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	ob, _ := outbox.New(ctx, db, outbox.Config{})
	if err := ob.Migrate(ctx); err != nil {
		panic(err)
	}

	m, err := otelmetrics.New(ob, otelmetrics.Options{MeterProvider: mp})
	if err != nil {
		panic(err)
	}
	defer m.Close()
	// relay, err := ob.NewRelay(outbox.RelayConfig{OnAttempt: m.Observe}); m.AddRelay(relay)

	ob.Enqueue(ctx, db, outbox.Event{Tenant: "merchant_42", Type: "payment.succeeded", Payload: []byte(`{}`)})

	var rm metricdata.ResourceMetrics
	reader.Collect(ctx, &rm)
	for _, sm := range rm.ScopeMetrics {
		for _, x := range sm.Metrics {
			if g, ok := x.Data.(metricdata.Gauge[int64]); ok && x.Name == "txhook.undispatched" {
				fmt.Println(x.Name, g.DataPoints[0].Value)
			}
		}
	}
	// Output: txhook.undispatched 1
}
