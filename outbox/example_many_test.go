package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/txhook/txhook/outbox"
)

// A settlement run announces many payments in one transaction and one
// statement. Events repeated from an earlier run are reported as
// duplicates; an invalid event fails the whole call, named by its index.
func ExampleOutbox_EnqueueMany() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "txhook-example-")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	ob, _ := outbox.New(ctx, db, outbox.Config{})
	ob.Migrate(ctx)

	settled := func(payment string) outbox.Event {
		return outbox.Event{
			Tenant:         "merchant_42",
			Type:           "payment.settled",
			IdempotencyKey: payment + ":settled",
			Payload:        fmt.Appendf(nil, `{"payment_id":%q}`, payment),
		}
	}
	for _, run := range [][]outbox.Event{
		{settled("pay_1"), settled("pay_2")},
		{settled("pay_2"), settled("pay_3")},
		{settled("pay_4"), {Tenant: "merchant_42", Type: "payment.settled", Payload: []byte(`{"payment_id":`)}},
	} {
		tx, _ := db.BeginTx(ctx, nil)
		res, err := ob.EnqueueMany(ctx, tx, run)
		var be *outbox.BatchError
		if errors.As(err, &be) {
			fmt.Println("refused event", be.Index, errors.Is(err, outbox.ErrInvalidPayload))
			tx.Rollback()
			continue
		}
		if err != nil {
			tx.Rollback()
			panic(err)
		}
		tx.Commit()
		for i, r := range res {
			fmt.Println(string(run[i].Payload), "duplicate:", r.Duplicate)
		}
	}
	// Output:
	// {"payment_id":"pay_1"} duplicate: false
	// {"payment_id":"pay_2"} duplicate: false
	// {"payment_id":"pay_2"} duplicate: true
	// {"payment_id":"pay_3"} duplicate: false
	// refused event 1 true
}

// A reminder enqueued with the business transaction but sent an hour
// later: until then its delivery waits, pending, due at DeliverAt.
func ExampleEvent_deliverAt() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "txhook-example-")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	ob, _ := outbox.New(ctx, db, outbox.Config{AllowHTTP: true, AllowPrivateTargets: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ob.Migrate(ctx)
	merchant := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer merchant.Close()
	ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "merchant_42", URL: merchant.URL})
	relay, _ := ob.NewRelay(outbox.RelayConfig{})
	relay.Start(ctx)
	defer func() {
		stop, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		relay.Stop(stop)
	}()

	at := time.Now().Add(time.Hour).Truncate(time.Second)
	tx, _ := db.BeginTx(ctx, nil)
	id, err := ob.Enqueue(ctx, tx, outbox.Event{
		Tenant:    "merchant_42",
		Type:      "invoice.reminder",
		Payload:   []byte(`{"invoice_id":"inv_7"}`),
		DeliverAt: at,
	})
	if err != nil {
		tx.Rollback()
		panic(err)
	}
	tx.Commit()

	// The relay dispatches the event at once; its delivery waits.
	for {
		ds, err := ob.EventDeliveries(ctx, id)
		if err != nil {
			panic(err)
		}
		if len(ds) > 0 {
			fmt.Println(ds[0].State, ds[0].Attempts, ds[0].NextAttemptAt.Equal(at))
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Output: pending 0 true
}
