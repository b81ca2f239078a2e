package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

func TestEndpointLifecycle(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		ep, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m", URL: "https://93.184.216.34/a", Description: "main", EventTypes: []string{"payment.*"}})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(ep.ID, "ep_") || !ep.Enabled || len(ep.Secrets) != 1 || !strings.HasPrefix(ep.Secrets[0].Value, "whsec_") {
			t.Fatalf("created %+v", ep)
		}
		got, err := b.ob.Endpoint(b.ctx, ep.ID)
		if err != nil || got.URL != ep.URL || got.Secrets[0].Value != ep.Secrets[0].Value || got.EventTypes[0] != "payment.*" {
			t.Fatalf("read back %+v, %v", got, err)
		}

		url, desc, types := "https://93.184.216.34/b", "moved", []string{}
		up, err := b.ob.UpdateEndpoint(b.ctx, ep.ID, outbox.EndpointUpdate{URL: &url, Description: &desc, EventTypes: &types})
		if err != nil || up.URL != url || up.Description != desc || len(up.EventTypes) != 0 {
			t.Fatalf("update: %+v %v", up, err)
		}
		bad := "https://127.0.0.1/"
		strict, _ := outbox.New(b.ctx, db.DB, outbox.Config{Logger: quietLogger()})
		if _, err := strict.UpdateEndpoint(b.ctx, ep.ID, outbox.EndpointUpdate{URL: &bad}); !errors.Is(err, outbox.ErrForbiddenTarget) {
			t.Fatalf("update to loopback: %v", err)
		}

		if err := b.ob.DisableEndpoint(b.ctx, ep.ID, "too many failures"); err != nil {
			t.Fatal(err)
		}
		got, _ = b.ob.Endpoint(b.ctx, ep.ID)
		if got.Enabled || got.DisabledReason != "too many failures" {
			t.Fatalf("after disable: %+v", got)
		}
		if err := b.ob.EnableEndpoint(b.ctx, ep.ID); err != nil {
			t.Fatal(err)
		}
		list, err := b.ob.Endpoints(b.ctx, "m")
		if err != nil || len(list) != 1 || !list[0].Enabled {
			t.Fatalf("list: %+v %v", list, err)
		}
		if err := b.ob.DeleteEndpoint(b.ctx, ep.ID); err != nil {
			t.Fatal(err)
		}
		for _, err := range []error{
			func() error { _, err := b.ob.Endpoint(b.ctx, ep.ID); return err }(),
			b.ob.DeleteEndpoint(b.ctx, ep.ID),
			b.ob.DisableEndpoint(b.ctx, ep.ID, ""),
			func() error { _, err := b.ob.UpdateEndpoint(b.ctx, ep.ID, outbox.EndpointUpdate{}); return err }(),
		} {
			if !errors.Is(err, outbox.ErrEndpointNotFound) {
				t.Errorf("after delete: %v, want ErrEndpointNotFound", err)
			}
		}
	})
}

func TestSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	ep := outbox.Endpoint{ID: "ep_1", Secrets: []outbox.Secret{{Value: "whsec_c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTIz"}}}
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("endpoint", "ep", ep, "secret", ep.Secrets[0])
	j, _ := json.Marshal(ep)
	for _, s := range []string{fmt.Sprint(ep), fmt.Sprintf("%+v", ep), fmt.Sprintf("%#v", ep), string(j), logged.String()} {
		if strings.Contains(s, "c2VjcmV0") {
			t.Errorf("secret leaked: %s", s)
		}
		if !strings.Contains(s, "MTIz") {
			t.Errorf("masked secret lacks its last four characters: %s", s)
		}
	}
}

func TestDisabledEndpointWaitsWithoutSpendingAttempts(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		var healthy atomic.Bool
		rc := newReceiver(t, func(n int, r *http.Request) int {
			if healthy.Load() {
				return http.StatusOK
			}
			return http.StatusServiceUnavailable
		})
		ep := b.endpoint("m", rc.URL)
		b.relay(outbox.RelayConfig{})
		b.enqueue(outbox.Event{Tenant: "m", Type: "a", Payload: []byte(`1`)})
		// The first attempt fails; the retry is due in about ten seconds.
		b.eventually("first attempt", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'pending' AND attempts = 1") == 1
		})
		if err := b.ob.DisableEndpoint(b.ctx, ep.ID, "maintenance"); err != nil {
			t.Fatal(err)
		}
		if n := b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'paused' AND attempts = 1"); n != 1 {
			t.Fatalf("paused deliveries = %d, want 1", n)
		}
		// Enqueued while disabled: no delivery for it at all.
		b.enqueue(outbox.Event{Tenant: "m", Type: "a", Payload: []byte(`2`)})
		b.eventually("second event dispatched", func() bool {
			return b.count("SELECT count(*) FROM txhook_events WHERE dispatched_at IS NULL") == 0
		})
		if n := b.count("SELECT count(*) FROM txhook_deliveries"); n != 1 {
			t.Fatalf("deliveries = %d, want 1", n)
		}
		healthy.Store(true)
		if err := b.ob.EnableEndpoint(b.ctx, ep.ID); err != nil {
			t.Fatal(err)
		}
		// Due at once on enabling, not ten seconds after the failure.
		b.eventually("delivery after enable", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded' AND attempts = 2") == 1
		})
		if n := len(rc.requests()); n != 2 {
			t.Fatalf("receiver got %d requests, want 2", n)
		}
	})
}

func TestRelayWokenByEnqueueWithoutPolling(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		rc := newReceiver(t, nil)
		b.endpoint("m", rc.URL)
		// An hour between polls, from the first one on: only a wake-up
		// can explain a delivery.
		r, err := b.ob.NewRelay(outbox.RelayConfig{PollInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		outbox.SetPollFloor(r, time.Hour)
		if err := r.Start(b.ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Stop(context.Background()) })
		// The first look happens at Start; wait for it to come back empty.
		b.eventually("the relay's first claim", func() bool { return r.Stats().Polls > 0 })
		for i := range 3 {
			b.enqueue(outbox.Event{Tenant: "m", Type: "a", Payload: []byte(fmt.Sprint(i))})
			select {
			case <-rc.got:
			case <-time.After(waitFor):
				t.Fatalf("event %d not delivered: relay not woken", i)
			}
			// Enqueue sends at most one NOTIFY per NotifyInterval (25 ms).
			time.Sleep(2 * outbox.DefaultNotifyInterval)
		}
	})
}

func TestStopReleasesQueuedAndFinishesInFlight(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		arrived := make(chan struct{}, 10)
		release := make(chan struct{})
		var once sync.Once
		rc := newReceiver(t, func(n int, r *http.Request) int {
			arrived <- struct{}{}
			<-release
			return http.StatusOK
		})
		b.endpoint("m", rc.URL)
		for i := range 5 {
			b.enqueue(outbox.Event{Tenant: "m", Type: "a", Payload: []byte(fmt.Sprint(i))})
		}
		r, err := b.ob.NewRelay(outbox.RelayConfig{Concurrency: 1})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(b.ctx); err != nil {
			t.Fatal(err)
		}
		<-arrived
		stopped := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			stopped <- r.Stop(ctx)
		}()
		// Stop waits for the request in flight…
		select {
		case err := <-stopped:
			t.Fatalf("Stop returned %v with a request in flight", err)
		case <-time.After(100 * time.Millisecond):
		}
		once.Do(func() { close(release) })
		if err := <-stopped; err != nil {
			t.Fatal(err)
		}
		// …which completes; the four queued deliveries go back unspent.
		if n := b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded'"); n != 1 {
			t.Fatalf("succeeded = %d, want 1", n)
		}
		if n := b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'pending' AND attempts = 0"); n != 4 {
			t.Fatalf("released unspent = %d, want 4", n)
		}
		if n := len(rc.requests()); n != 1 {
			t.Fatalf("receiver got %d requests", n)
		}
	})
}

func TestStopDeadlineCancelsInFlightAndRetriesLater(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		arrived := make(chan struct{}, 10)
		rc := newReceiver(t, func(n int, r *http.Request) int {
			arrived <- struct{}{}
			<-r.Context().Done()
			return http.StatusOK
		})
		b.endpoint("m", rc.URL)
		b.enqueue(outbox.Event{Tenant: "m", Type: "a", Payload: []byte(`1`)})
		r, err := b.ob.NewRelay(outbox.RelayConfig{})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(b.ctx); err != nil {
			t.Fatal(err)
		}
		<-arrived
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if err := r.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Stop = %v, want deadline exceeded", err)
		}
		// The cancelled attempt counts (it may have reached the receiver) and
		// the delivery waits for its retry.
		if n := b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'pending' AND attempts = 1"); n != 1 {
			t.Fatalf("pending after cancelled attempt = %d", n)
		}
		if n := b.count("SELECT count(*) FROM txhook_attempt_log WHERE error LIKE 'relay stopped%'"); n != 1 {
			t.Fatalf("attempt records of the cancelled request = %d", n)
		}
	})
}
