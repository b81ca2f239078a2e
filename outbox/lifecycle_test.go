package outbox_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

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

// A stopped relay closes its kept-alive connections: the receiver sees
// every connection the relay opened end, instead of holding it (and the
// relay its two goroutines per connection) until an idle timeout.
func TestStoppedRelayClosesItsConnections(t *testing.T) {
	b := setup(t, testdb.SQLite(t), outbox.Config{})
	var mu sync.Mutex
	open := map[net.Conn]bool{}
	closed := make(chan struct{}, 1024)
	got := make(chan struct{}, 1024)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		got <- struct{}{}
	}))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		switch s {
		case http.StateNew:
			open[c] = true
		case http.StateClosed, http.StateHijacked:
			if open[c] {
				delete(open, c)
				closed <- struct{}{}
			}
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	b.endpoint("t1", srv.URL)
	r := b.relay(outbox.RelayConfig{Concurrency: 4})
	const n = 20
	for i := 0; i < n; i++ {
		b.enqueue(outbox.Event{Tenant: "t1", Type: "payment.succeeded", Payload: []byte(`{}`)})
	}
	for i := 0; i < n; i++ {
		select {
		case <-got:
		case <-time.After(waitFor):
			t.Fatalf("%d of %d deliveries reached the receiver", i, n)
		}
	}
	mu.Lock()
	opened := len(open)
	mu.Unlock()
	if opened == 0 {
		t.Fatal("the receiver saw no open connection after the deliveries")
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// The receiver has no idle timeout, so only the relay can end them.
	deadline := time.After(waitFor)
	for {
		mu.Lock()
		left := len(open)
		mu.Unlock()
		if left == 0 {
			return
		}
		select {
		case <-closed:
		case <-deadline:
			t.Fatalf("%d of the relay's connections still open after Stop", left)
		}
	}
}
