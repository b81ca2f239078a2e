package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/txhook/txhook/dlq"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

func TestStartAfterStopSaysStopped(t *testing.T) {
	b := setup(t, testdb.SQLite(t), outbox.Config{})
	r, err := b.ob.NewRelay(outbox.RelayConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(b.ctx); !errors.Is(err, outbox.ErrRelayStarted) {
		t.Fatalf("second Start: %v, want ErrRelayStarted", err)
	}
	if err := r.Stop(b.ctx); err != nil {
		t.Fatal(err)
	}
	err = r.Start(b.ctx)
	if !errors.Is(err, outbox.ErrRelayStopped) || errors.Is(err, outbox.ErrRelayStarted) {
		t.Fatalf("Start after Stop: %v, want ErrRelayStopped", err)
	}

	// A relay whose Start context ended is stopped too.
	ctx, cancel := context.WithCancel(b.ctx)
	r2, err := b.ob.NewRelay(outbox.RelayConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := r2.Stop(b.ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if err := r2.Start(b.ctx); !errors.Is(err, outbox.ErrRelayStopped) {
		t.Fatalf("Start after its context ended: %v, want ErrRelayStopped", err)
	}
}

// Every page cursor error is the one outbox.ErrInvalidCursor.
func TestOneInvalidCursorError(t *testing.T) {
	b := setup(t, testdb.SQLite(t), outbox.Config{})
	ep := b.endpoint("t1", "http://127.0.0.1:1/")
	_, err := b.ob.EndpointDeliveries(b.ctx, ep.ID, "not a cursor", 10)
	if !errors.Is(err, outbox.ErrInvalidCursor) {
		t.Fatalf("EndpointDeliveries: %v", err)
	}
	_, err = dlq.New(b.ob).List(b.ctx, dlq.Filter{}, "not a cursor", 10)
	if !errors.Is(err, outbox.ErrInvalidCursor) || !errors.Is(err, dlq.ErrInvalidCursor) {
		t.Fatalf("dlq List: %v", err)
	}
}
