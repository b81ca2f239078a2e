package natstest_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txhook/txhook/internal/natstest"
)

// TestStopRestartKeepsStreamAndPort publishes to a file-backed stream,
// stops the server under a connected client, checks that a publish fails
// while it is down, restarts it on the same port and store, and checks the
// client reconnected by itself and the stream kept every acknowledged
// message.
func TestStopRestartKeepsStreamAndPort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := natstest.Start(t, natstest.Options{})
	if !strings.HasPrefix(s.URL(), "nats://127.0.0.1:") || s.Port() == 4222 {
		t.Fatalf("URL %s: want a free port on 127.0.0.1, never 4222", s.URL())
	}
	disconnected := make(chan struct{}, 10)
	reconnected := make(chan struct{}, 10)
	nc, js := s.JetStream(t,
		nats.DisconnectErrHandler(func(*nats.Conn, error) { disconnected <- struct{}{} }),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "EV", Subjects: []string{"ev.>"}, Storage: jetstream.FileStorage,
	}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := js.Publish(ctx, fmt.Sprintf("ev.%d", i), []byte("x"), jetstream.WithMsgID(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	port := s.Port()

	s.Stop()
	if s.Running() || s.Server() != nil {
		t.Fatal("Running after Stop")
	}
	waitFor(t, ctx, disconnected, "disconnect")
	// A publish during the outage times out, but the client keeps it in
	// its reconnect buffer and sends it after the reconnect: it may be
	// stored even though the caller saw an error. Its ID makes the retry
	// below a duplicate.
	pctx, pcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := js.Publish(pctx, "ev.down", []byte("x"), jetstream.WithMsgID("down"))
	pcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("publish with the server stopped: %v, want context.DeadlineExceeded", err)
	}
	s.Stop() // a second Stop does nothing

	s.Restart()
	if s.Port() != port {
		t.Fatalf("port after restart %d, before %d", s.Port(), port)
	}
	waitFor(t, ctx, reconnected, "reconnect")
	if !nc.IsConnected() {
		t.Fatal("client not connected after the reconnect handler ran")
	}
	// The reconnect buffer is flushed before anything else, so the retry
	// of the publish that timed out is the duplicate.
	ack, err := js.Publish(ctx, "ev.down", []byte("x"), jetstream.WithMsgID("down"))
	if err != nil || !ack.Duplicate {
		t.Fatalf("retry of the publish that timed out during the outage: %+v, %v; want Duplicate", ack, err)
	}
	// The dedup window survived the restart: republishing ID 3 is a
	// duplicate.
	ack, err = js.Publish(ctx, "ev.3", []byte("x"), jetstream.WithMsgID("3"))
	if err != nil || !ack.Duplicate {
		t.Fatalf("republish of ID 3 after restart: %+v, %v; want Duplicate", ack, err)
	}
	st, err := js.Stream(ctx, "EV")
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != 11 {
		t.Fatalf("stream holds %d messages after restart, want 11 (10 before, 1 sent during the outage)", n)
	}
	if !strings.Contains(s.Log(), "Server is ready") {
		t.Errorf("server log lacks the ready notice:\n%s", s.Log())
	}
}

// TestRestartWaitsForPortHeldByAnother holds the server's port with
// another listener while it is stopped: Restart retries until the port is
// free instead of failing or moving.
func TestRestartWaitsForPortHeldByAnother(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := natstest.Start(t, natstest.Options{})
	port := s.Port()
	s.Stop()
	l, err := net.Listen("tcp", s.URL()[len("nats://"):])
	if err != nil {
		t.Fatalf("hold port %d: %v", port, err)
	}
	released := make(chan struct{})
	go func() {
		defer close(released)
		// Release the port once Restart has failed to bind at least once.
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for !strings.Contains(s.Log(), "address already in use") {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
		l.Close()
	}()
	s.Restart()
	<-released
	if s.Port() != port {
		t.Fatalf("port after restart %d, want %d", s.Port(), port)
	}
	nc := s.Connect(t)
	if err := nc.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestConnectToStoppedServer: without RetryOnFailedConnect, a connect to a
// stopped server fails at once with nats.ErrNoServers; with it, Connect
// returns a connection that connects when the server comes back.
func TestConnectToStoppedServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := natstest.Start(t, natstest.Options{})
	s.Stop()
	_, err := nats.Connect(s.URL(), natstest.ConnectOptions(t.Name(), t.Logf)...)
	if !errors.Is(err, nats.ErrNoServers) {
		t.Fatalf("connect to a stopped server: %v, want nats.ErrNoServers", err)
	}
	connected := make(chan struct{}, 1)
	nc, err := nats.Connect(s.URL(), append(natstest.ConnectOptions(t.Name(), t.Logf),
		nats.RetryOnFailedConnect(true),
		nats.ConnectHandler(func(*nats.Conn) { connected <- struct{}{} }))...)
	if err != nil {
		t.Fatalf("connect with RetryOnFailedConnect: %v", err)
	}
	defer nc.Close()
	if nc.IsConnected() {
		t.Fatal("connected to a stopped server")
	}
	s.Restart()
	waitFor(t, ctx, connected, "connect")
	if err := nc.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, ctx context.Context, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatalf("no %s: %v", what, ctx.Err())
	}
}
