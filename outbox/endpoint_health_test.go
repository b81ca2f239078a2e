package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/clock"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// healthRig is an endpoint and several relays (not started) whose endpoint
// bookkeeping the test drives with attempts it writes to the attempt log
// itself, so it decides which relay records what, and in which order.
type healthRig struct {
	*bundle
	fake      *clock.Fake
	ep        outbox.Endpoint
	relays    []*outbox.Relay
	disabled  chan outbox.EndpointNotice
	recovered chan outbox.EndpointNotice
	delivery  atomic.Int64
}

func newHealthRig(t *testing.T, db *testdb.DB, relays int, start time.Time) *healthRig {
	fake := clock.NewFake(start)
	h := &healthRig{bundle: setup(t, db, outbox.Config{Clock: fake}), fake: fake,
		disabled: make(chan outbox.EndpointNotice, 100), recovered: make(chan outbox.EndpointNotice, 100)}
	h.ep = h.endpoint("m", "http://127.0.0.1:1/hook")
	cfg := outbox.RelayConfig{
		OnEndpointDisabled:  func(n outbox.EndpointNotice) { h.disabled <- n },
		OnEndpointRecovered: func(n outbox.EndpointNotice) { h.recovered <- n },
	}
	for i := range relays {
		// Each relay on an Outbox of its own, with a pool of its own, as
		// relays in separate processes would be.
		ob := h.ob
		if i > 0 {
			var err error
			ob, err = outbox.New(h.ctx, testdb.Reopen(t, db), outbox.Config{Clock: fake, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
		}
		r, err := ob.NewRelay(cfg)
		if err != nil {
			t.Fatal(err)
		}
		h.relays = append(h.relays, r)
	}
	return h
}

// attempt makes relay number relay write an attempt at `at` (the clock is
// moved there) and record it, as a completion batch does. status 200 is a
// success; anything else a failure.
func (h *healthRig) attempt(relay int, at time.Time, status int) {
	h.t.Helper()
	h.fake.Set(at)
	msg := ""
	if status/100 != 2 {
		msg = fmt.Sprintf("HTTP %d", status)
	}
	if _, err := h.db.ExecContext(h.ctx, h.rebind(`INSERT INTO txhook_attempts
(delivery_id, endpoint_id, attempt, started_at, duration_us, status, response_excerpt, error) VALUES (?, ?, 1, ?, 1000, ?, '', ?)`),
		h.delivery.Add(1), h.ep.ID, h.ts(at), status, msg); err != nil {
		h.t.Fatal(err)
	}
	outbox.RecordAttempts(h.ctx, h.relays[relay], []outbox.TestAttempt{{EndpointID: h.ep.ID, Tenant: h.ep.Tenant, StartedAt: at, Status: status, Error: msg}})
}

func (h *healthRig) endpointNow() outbox.Endpoint {
	h.t.Helper()
	ep, err := h.ob.Endpoint(h.ctx, h.ep.ID)
	if err != nil {
		h.t.Fatal(err)
	}
	return ep
}

// A failure recorded by one relay after another relay saw the endpoint
// succeed, followed by successes only, used to leave failing_since set; a
// failure days later then disabled the healthy endpoint at once.
func TestEndpointHealthIsRightWhicheverRelayRecordsIt(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
		h := newHealthRig(t, db, 2, start)
		const a, b = 0, 1
		h.attempt(b, start, 200)
		h.attempt(a, start.Add(time.Second), 502)
		h.attempt(b, start.Add(2*time.Second), 200)
		h.attempt(b, start.Add(3*time.Second), 200)
		got := h.endpointNow()
		if !got.FailingSince.IsZero() {
			t.Fatalf("failing since %v after later successes", got.FailingSince)
		}
		if !got.LastSuccessAt.Equal(start.Add(3*time.Second)) || !got.LastFailureAt.Equal(start.Add(time.Second)) {
			t.Errorf("last success %v, last failure %v", got.LastSuccessAt, got.LastFailureAt)
		}
		if len(h.recovered) != 1 {
			t.Errorf("%d recovery notices, want 1", len(h.recovered))
		}

		// Days later, one failure starts a run; it disables nothing.
		later := start.Add(6 * 24 * time.Hour)
		h.attempt(a, later, 502)
		got = h.endpointNow()
		if !got.Enabled || len(h.disabled) != 0 {
			t.Fatalf("endpoint disabled by its first failure in days: %+v", got)
		}
		if !got.FailingSince.Equal(later) || !got.LastFailureAt.Equal(later) {
			t.Errorf("failing since %v, last failure %v; want %v", got.FailingSince, got.LastFailureAt, later)
		}

		// Batches that land out of order: a success that started earlier
		// but is recorded last does not end the run.
		h.attempt(a, later.Add(2*time.Second), 502)
		h.attempt(b, later.Add(time.Second), 200)
		got = h.endpointNow()
		if !got.FailingSince.Equal(later.Add(2*time.Second)) || !got.LastSuccessAt.Equal(later.Add(time.Second)) {
			t.Errorf("after a late success: failing since %v, last success %v", got.FailingSince, got.LastSuccessAt)
		}
	})
}

// DisableAfter measures the run of failures as the attempt log shows it:
// successes recorded by another relay end it, and a real run disables the
// endpoint once, with one notice, even when relays record its last
// failures at the same moment.
func TestDisableAfterCountsEveryRelaysAttempts(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
		h := newHealthRig(t, db, 3, start)
		day := 24 * time.Hour
		// Six days of failures from relay 0 every six hours, with a
		// success from relay 1 or 2 a second after each.
		at := start
		for i := range 6 * 4 {
			h.attempt(0, at, 503)
			h.attempt(1+i%2, at.Add(time.Second), 200)
			at = at.Add(6 * time.Hour)
		}
		if got := h.endpointNow(); !got.Enabled || len(h.disabled) != 0 || !got.FailingSince.IsZero() {
			t.Fatalf("endpoint with successes every six hours: %+v", got)
		}

		// Now only failures, from every relay, for five days.
		runStart := at
		for at.Sub(runStart) < 5*day-6*time.Hour {
			for r := range h.relays {
				h.attempt(r, at.Add(time.Duration(r)*time.Second), 500)
			}
			at = at.Add(6 * time.Hour)
		}
		if got := h.endpointNow(); !got.Enabled || !got.FailingSince.Equal(runStart) {
			t.Fatalf("before five days: %+v", got)
		}
		// The last failures, five days in, recorded by all relays at once.
		at = runStart.Add(5 * day)
		h.fake.Set(at)
		var wg sync.WaitGroup
		gate := make(chan struct{})
		for r := range h.relays {
			if _, err := h.db.ExecContext(h.ctx, h.rebind(`INSERT INTO txhook_attempts
(delivery_id, endpoint_id, attempt, started_at, duration_us, status, error) VALUES (?, ?, 1, ?, 1000, 500, 'HTTP 500')`),
				h.delivery.Add(1), h.ep.ID, h.ts(at)); err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				outbox.RecordAttempts(h.ctx, h.relays[r], []outbox.TestAttempt{{EndpointID: h.ep.ID, Tenant: "m", StartedAt: at, Status: 500, Error: "HTTP 500"}})
			}()
		}
		close(gate)
		wg.Wait()
		if got := h.endpointNow(); got.Enabled || !strings.Contains(got.DisabledReason, "failed since") {
			t.Fatalf("endpoint failing for five days: %+v", got)
		}
		if n := len(h.disabled); n != 1 {
			t.Fatalf("%d disabled notices, want 1", n)
		}
		if n := <-h.disabled; n.EndpointID != h.ep.ID || !n.FailingSince.Equal(runStart) {
			t.Errorf("notice %+v", n)
		}
	})
}

// Relays record the health of the same endpoints, listed in different
// orders, at the same time: nothing deadlocks (40P01 was seen with three
// relays) and nothing fails.
func TestRecordingEndpointHealthNeverDeadlocks(t *testing.T) {
	for _, be := range testdb.PostgresBackends {
		t.Run(be.Name, func(t *testing.T) {
			t.Parallel()
			db := testdb.Open(t, be)
			var logs logBuffer
			b := setup(t, db, outbox.Config{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
			var eps []outbox.Endpoint
			for i := range 12 {
				eps = append(eps, b.endpoint("m", fmt.Sprintf("http://127.0.0.1:1/%d", i)))
			}
			const relays, rounds = 6, 150
			var wg sync.WaitGroup
			for i := range relays {
				r, err := b.ob.NewRelay(outbox.RelayConfig{})
				if err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(i), 7))
					for range rounds {
						if logs.wrote.Load() {
							return // a warning is already a failure
						}
						var batch []outbox.TestAttempt
						for _, k := range rng.Perm(len(eps)) {
							a := outbox.TestAttempt{EndpointID: eps[k].ID, Tenant: "m", StartedAt: time.Now(), Status: 200}
							if rng.IntN(2) == 0 {
								a.Status, a.Error = 500, "HTTP 500"
							}
							batch = append(batch, a)
						}
						outbox.RecordAttempts(context.Background(), r, batch)
					}
				}()
			}
			wg.Wait()
			out := logs.String()
			if strings.Contains(out, "deadlock") || strings.Contains(out, "40P01") || strings.Contains(out, "recording endpoint health failed") {
				t.Fatalf("recording health failed:\n%.3000s", out)
			}
		})
	}
}
