package broker_test

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

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	_ "modernc.org/sqlite"

	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/broker"
)

// A payment service in broker mode: events enqueued in the business
// transaction reach the merchant through JetStream. JetStream here is an
// embedded server; in production, jetstream.New on a connection to your
// cluster.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "txhook-broker-example")
	defer os.RemoveAll(dir)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	ns, _ := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: filepath.Join(dir, "js"), NoLog: true})
	ns.Start()
	defer ns.Shutdown()
	ns.ReadyForConnections(10 * time.Second)
	nc, _ := nats.Connect(ns.ClientURL())
	defer nc.Close()
	js, _ := jetstream.New(nc)

	db, _ := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "pay.db")))
	defer db.Close()
	ob, err := outbox.New(ctx, db, outbox.Config{Broker: true, AllowHTTP: true, AllowPrivateTargets: true, Logger: quiet})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := ob.Migrate(ctx); err != nil {
		fmt.Println(err)
		return
	}

	got := make(chan string, 1)
	merchant := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Webhook-Event-Type")
	}))
	defer merchant.Close()
	_, _ = ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "merchant_42", URL: merchant.URL})

	cfg := broker.Config{JetStream: js, Logger: quiet}
	fwd, _ := broker.NewForwarder(ob, cfg)
	if err := fwd.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer fwd.Stop(ctx)
	worker, _ := broker.NewWorker(ob, cfg)
	if err := worker.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer worker.Stop(ctx)

	tx, _ := db.BeginTx(ctx, nil)
	_, _ = ob.Enqueue(ctx, tx, outbox.Event{Tenant: "merchant_42", Type: "payment.succeeded", Payload: []byte(`{"amount":1200}`)})
	_ = tx.Commit()

	select {
	case typ := <-got:
		fmt.Println("merchant received", typ)
	case <-time.After(30 * time.Second):
		fmt.Println("nothing received")
	}
	// Output: merchant received payment.succeeded
}
