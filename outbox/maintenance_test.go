package outbox_test

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/clock"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/retry"
)

// advanceToRetry moves the fake clock to the single pending delivery's next
// attempt once the given number of attempts is on record.
func (b *bundle) advanceToRetry(fake *clock.Fake, attempts int) {
	b.t.Helper()
	b.eventually("attempt recorded", func() bool {
		return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'pending' AND attempts = ?", attempts) == 1
	})
	var next store_time
	if err := b.db.QueryRowContext(b.ctx, "SELECT next_attempt_at FROM txhook_deliveries WHERE state = 'pending'").Scan(&next); err != nil {
		b.t.Fatal(err)
	}
	fake.Set(next.Time)
}

func TestEndpointFailingFiveDaysIsDisabledThenRecovers(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
		fake := clock.NewFake(start)
		b := setup(t, db, outbox.Config{Clock: fake})
		var healthy atomic.Bool
		rc := newReceiver(t, func(n int, r *http.Request) int {
			if healthy.Load() {
				return http.StatusOK
			}
			return http.StatusBadGateway
		})
		ep := b.endpoint("m", rc.URL)
		day := 24 * time.Hour
		disabled := make(chan outbox.EndpointNotice, 1)
		recovered := make(chan outbox.EndpointNotice, 1)
		b.relay(outbox.RelayConfig{
			Retry:               retry.Intervals(day, day, day, day, day, day, day, day, day),
			OnEndpointDisabled:  func(n outbox.EndpointNotice) { disabled <- n },
			OnEndpointRecovered: func(n outbox.EndpointNotice) { recovered <- n },
		})
		b.enqueue(outbox.Event{Tenant: "m", Type: "a", Payload: []byte(`{}`)})
		// Attempts on days 0..4 fail; the endpoint stays enabled.
		for attempt := 1; attempt <= 5; attempt++ {
			b.advanceToRetry(fake, attempt)
		}
		var n outbox.EndpointNotice
		select {
		case n = <-disabled:
		case <-time.After(waitFor):
			t.Fatal("endpoint not disabled after failing for five days")
		}
		if n.EndpointID != ep.ID || n.Tenant != "m" || !n.FailingSince.Equal(start) || !strings.Contains(n.Reason, "failed since") {
			t.Fatalf("notice %+v", n)
		}
		got, _ := b.ob.Endpoint(b.ctx, ep.ID)
		if got.Enabled || got.DisabledReason == "" {
			t.Fatalf("endpoint after auto-disable: %+v", got)
		}
		// Its delivery waits without spending attempts.
		b.eventually("delivery paused", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'paused' AND attempts = 6") == 1
		})
		fake.Advance(3 * day)
		if n := len(rc.requests()); n != 6 {
			t.Fatalf("receiver saw %d requests while disabled, want 6 in all", n)
		}

		healthy.Store(true)
		if err := b.ob.EnableEndpoint(b.ctx, ep.ID); err != nil {
			t.Fatal(err)
		}
		select {
		case n = <-recovered:
		case <-time.After(waitFor):
			t.Fatal("no recovery notice")
		}
		if n.EndpointID != ep.ID || !n.FailingSince.Equal(start) {
			t.Fatalf("recovery notice %+v", n)
		}
		b.eventually("delivered", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded' AND attempts = 7") == 1
		})
	})
}

func TestGoneDisablesOnlyWhenAskedTo(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		rc := newReceiver(t, func(int, *http.Request) int { return http.StatusGone })
		polite := b.endpoint("a", rc.URL+"/a")
		disabled := make(chan outbox.EndpointNotice, 2)
		b.relay(outbox.RelayConfig{DisableOnGone: true, OnEndpointDisabled: func(n outbox.EndpointNotice) { disabled <- n }})
		b.enqueue(outbox.Event{Tenant: "a", Type: "x", Payload: []byte(`{}`)})
		n := <-disabled
		if n.EndpointID != polite.ID || !strings.Contains(n.Reason, "410") {
			t.Fatalf("notice %+v", n)
		}
		b.eventually("paused", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'paused'") == 1
		})

		// A relay without the option keeps retrying.
		b2 := setup(t, testdb.Open(t, db.Backend), outbox.Config{})
		ep2 := b2.endpoint("b", rc.URL+"/b")
		b2.relay(outbox.RelayConfig{})
		b2.enqueue(outbox.Event{Tenant: "b", Type: "x", Payload: []byte(`{}`)})
		b2.eventually("retry scheduled", func() bool {
			return b2.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'pending' AND attempts = 1") == 1
		})
		if got, _ := b2.ob.Endpoint(b2.ctx, ep2.ID); !got.Enabled {
			t.Fatal("endpoint disabled on 410 without DisableOnGone")
		}
	})
}

func TestRetentionPrunesFinishedWorkKeepsDeadLetters(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		fake := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
		b := setup(t, db, outbox.Config{Clock: fake})
		ok := newReceiver(t, nil)
		bad := newReceiver(t, func(int, *http.Request) int { return http.StatusInternalServerError })
		b.endpoint("good", ok.URL)
		b.endpoint("bad", bad.URL)
		// Pruning in the relay is off here: the test calls Prune itself.
		b.relay(outbox.RelayConfig{Retry: retry.Intervals(), Retention: outbox.Retention{Interval: -1}})
		for range 3 {
			b.enqueue(outbox.Event{Tenant: "good", Type: "a", Payload: []byte(`{}`)})
		}
		b.enqueue(outbox.Event{Tenant: "bad", Type: "a", Payload: []byte(`{}`)})
		b.eventually("all finished", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded'") == 3 &&
				b.count("SELECT count(*) FROM txhook_dead_letters") == 1
		})

		// Six days on, nothing is old enough.
		fake.Advance(6 * 24 * time.Hour)
		p, err := b.ob.Prune(b.ctx, outbox.Retention{BatchSize: 2})
		if err != nil || p != (outbox.Pruned{}) {
			t.Fatalf("early prune: %+v %v", p, err)
		}
		// Past seven days: succeeded work goes, in batches of two; the dead
		// letter, its delivery and its event stay.
		fake.Advance(2 * 24 * time.Hour)
		p, err = b.ob.Prune(b.ctx, outbox.Retention{BatchSize: 2})
		if err != nil {
			t.Fatal(err)
		}
		if p.Deliveries != 3 || p.Attempts != 3 || p.Events != 3 || p.DeadLetters != 0 {
			t.Fatalf("pruned %+v", p)
		}
		if b.count("SELECT count(*) FROM txhook_dead_letters") != 1 || b.count("SELECT count(*) FROM txhook_deliveries") != 1 ||
			b.count("SELECT count(*) FROM txhook_events") != 1 || b.count("SELECT count(*) FROM txhook_attempt_log") != 1 {
			t.Fatal("the dead letter's records were pruned")
		}
		// With a dead-letter age, the dead letter and then the rest go too.
		p, err = b.ob.Prune(b.ctx, outbox.Retention{DeadLetters: 24 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if p.DeadLetters != 1 || p.Deliveries != 1 || p.Attempts != 1 || p.Events != 1 {
			t.Fatalf("pruned %+v", p)
		}
		for _, table := range []string{"txhook_events", "txhook_deliveries", "txhook_attempts", "txhook_dead_letters"} {
			if n := b.count("SELECT count(*) FROM " + table); n != 0 {
				t.Errorf("%s has %d rows", table, n)
			}
		}
	})
}
