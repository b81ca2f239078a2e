package outbox_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/clock"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/retry"
)

// runRelay runs a relay of b until stop is called.
func (b *bundle) runRelay(cfg outbox.RelayConfig) (stop func()) {
	b.t.Helper()
	r, err := b.ob.NewRelay(roomy(cfg))
	if err != nil {
		b.t.Fatal(err)
	}
	if err := r.Start(b.ctx); err != nil {
		b.t.Fatal(err)
	}
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := r.Stop(ctx); err != nil {
			b.t.Errorf("relay stop: %v", err)
		}
	}
	b.t.Cleanup(stop)
	return stop
}

func (b *bundle) tableExists(name string) bool {
	b.t.Helper()
	var ok bool
	if err := b.db.QueryRowContext(b.ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&ok); err != nil {
		b.t.Fatal(err)
	}
	return ok
}

// Retention on partitioned tables drops a whole expired partition only
// after moving out every row retention keeps: an old pending delivery
// waiting for its retry, a delayed event's delivery, a dead letter's
// delivery, attempts and event, an event no relay has dispatched yet.
// What was moved is then delivered as if nothing happened. A partition
// with more such rows than the mover takes is kept and reported, and
// row-by-row pruning thins it.
func TestPartitionedRetentionDropsOnlyFinishedRows(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		day0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
		fake := clock.NewFake(day0)
		b := setupWith(t, db, outbox.Config{Clock: fake}, false)
		err := b.ob.Partition(b.ctx, outbox.PartitionConfig{Interval: 24 * time.Hour, Ahead: 1})
		if !db.Backend.Postgres() {
			if !errors.Is(err, outbox.ErrPartitionUnsupported) {
				t.Fatalf("Partition on SQLite: %v", err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		var slowFails atomic.Bool
		slowFails.Store(true)
		ok := newReceiver(t, nil)
		bad := newReceiver(t, func(int, *http.Request) int { return http.StatusInternalServerError })
		slow := newReceiver(t, func(int, *http.Request) int {
			if slowFails.Load() {
				return http.StatusServiceUnavailable
			}
			return http.StatusOK
		})
		b.endpoint("good", ok.URL)
		b.endpoint("bad", bad.URL)
		b.endpoint("slow", slow.URL)
		b.endpoint("late", ok.URL)
		noPrune := outbox.Retention{Interval: -1}

		// Day 0. Two deliveries succeed; one is dead-lettered (dead letters
		// are kept until purged).
		stop := b.runRelay(outbox.RelayConfig{Retry: retry.Intervals(), Retention: noPrune})
		b.enqueue(outbox.Event{Tenant: "good", Type: "a", Payload: []byte(`{}`)})
		b.enqueue(outbox.Event{Tenant: "good", Type: "a", Payload: []byte(`{}`)})
		b.enqueue(outbox.Event{Tenant: "bad", Type: "a", Payload: []byte(`{}`)})
		b.eventually("day 0 finished", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded'") == 2 &&
				b.count("SELECT count(*) FROM txhook_dead_letters") == 1
		})
		stop()
		// One fails and waits 20 days for its retry; one is delayed 20
		// days; one is not dispatched at all (no relay runs).
		stop = b.runRelay(outbox.RelayConfig{Retry: retry.Intervals(20 * 24 * time.Hour), Retention: noPrune})
		b.enqueue(outbox.Event{Tenant: "slow", Type: "a", Payload: []byte(`{}`)})
		b.enqueue(outbox.Event{Tenant: "good", Type: "delayed", Payload: []byte(`{}`), DeliverAt: day0.Add(20 * 24 * time.Hour)})
		b.eventually("slow attempt failed", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'pending' AND attempts = 1") == 1 &&
				b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'pending' AND attempts = 0") == 1
		})
		stop()
		b.enqueue(outbox.Event{Tenant: "late", Type: "a", Payload: []byte(`{}`)})
		if n := b.count("SELECT count(*) FROM txhook_deliveries_p20261130t0000"); n != 5 {
			t.Fatalf("day 0 partition holds %d deliveries, want 5", n)
		}

		// Ten days on, the day-0 partitions are past the 7-day retention.
		// With room to move one row only, none is dropped: each has more
		// to keep (the attempts partition holds just the two failed
		// attempts: first attempts that succeed are kept in their delivery
		// rows). Row-by-row pruning still removes the finished rows.
		fake.Advance(10 * 24 * time.Hour)
		outbox.SetMaxMovedPerPartition(b.ob, 1)
		p, err := b.ob.Prune(b.ctx, outbox.Retention{})
		outbox.SetMaxMovedPerPartition(b.ob, 0)
		if err != nil {
			t.Fatal(err)
		}
		// (Day 1's partitions, empty, are dropped.)
		if p.Partitions != 3 || p.Moved != 0 || p.KeptPartitions != 3 || p.Deliveries != 2 || p.Attempts != 2 || p.Events != 2 {
			t.Fatalf("pruned with a small mover: %+v", p)
		}
		if !b.tableExists("txhook_deliveries_p20261130t0000") {
			t.Fatal("kept partition was dropped")
		}
		// Now the partitions go, their keepers moved to DEFAULT: three
		// deliveries (dead, pending retry, delayed), two attempts (the dead
		// and the failed one) and four events (those three and the
		// undispatched one).
		p, err = b.ob.Prune(b.ctx, outbox.Retention{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Partitions != 3 || p.Moved != 9 || p.KeptPartitions != 0 {
			t.Fatalf("pruned: %+v", p)
		}
		for _, name := range []string{"txhook_deliveries_p20261130t0000", "txhook_attempts_p20261130t0000", "txhook_events_p20261130t0000"} {
			if b.tableExists(name) {
				t.Errorf("%s not dropped", name)
			}
		}
		if n := b.count("SELECT count(*) FROM txhook_deliveries_default WHERE state IN ('pending', 'dead')"); n != 3 {
			t.Errorf("DEFAULT holds %d of the kept deliveries, want 3", n)
		}
		if n := b.count("SELECT count(*) FROM txhook_attempts_default"); n != 2 {
			t.Errorf("DEFAULT holds %d attempts, want 2", n)
		}
		if n := b.count("SELECT count(*) FROM txhook_events_default WHERE dispatched_at IS NULL"); n != 1 {
			t.Errorf("DEFAULT holds %d undispatched events, want 1", n)
		}
		if n := b.count("SELECT count(*) FROM txhook_dead_letters"); n != 1 {
			t.Errorf("%d dead letters", n)
		}
		// The dropped events' IDs and keys are free again; the kept ones'
		// are not.
		if n, m := b.count("SELECT count(*) FROM txhook_events_keys"), b.count("SELECT count(*) FROM txhook_events"); n != m || n != 4 {
			t.Errorf("%d keys for %d events, want 4 each", n, m)
		}
		// Maintenance created today's partition and the next.
		for _, name := range []string{"txhook_events_p20261210t0000", "txhook_events_p20261211t0000", "txhook_attempts_p20261211t0000"} {
			if !b.tableExists(name) {
				t.Errorf("%s was not created ahead", name)
			}
		}
		// The moved rows' keys still hold: the undispatched event's ID
		// cannot be enqueued again.
		var lateID string
		if err := b.db.QueryRowContext(b.ctx, "SELECT id FROM txhook_events WHERE dispatched_at IS NULL").Scan(&lateID); err != nil {
			t.Fatal(err)
		}
		tx, err := b.db.BeginTx(b.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = b.ob.Enqueue(b.ctx, tx, outbox.Event{ID: lateID, Tenant: "late", Type: "other", Payload: []byte(`{}`)})
		tx.Rollback()
		if !errors.Is(err, outbox.ErrEventConflict) {
			t.Fatalf("re-enqueue of a moved event: %v", err)
		}

		// What was kept is delivered: the undispatched event now, the
		// failed and the delayed one when due, whatever partition holds
		// them.
		slowFails.Store(false)
		b.runRelay(outbox.RelayConfig{Retry: retry.Intervals(20 * 24 * time.Hour), Retention: noPrune})
		b.eventually("undispatched event delivered", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries d JOIN txhook_events e ON e.id = d.event_id WHERE e.tenant = 'late' AND d.state = 'succeeded'") == 1
		})
		fake.Set(day0.Add(21 * 24 * time.Hour))
		b.eventually("kept deliveries delivered", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded'") == 3
		})
		if n := len(slow.requests()); n != 2 {
			t.Errorf("slow endpoint got %d requests, want 2", n)
		}
	})
}

// An event enqueued past the last partition (maintenance fell behind)
// lands in the DEFAULT partition, is delivered from there, and moves into
// its own partition when maintenance creates it.
func TestPartitionedEnqueuePastTheLastPartition(t *testing.T) {
	for _, be := range testdb.Backends {
		if !be.Postgres() {
			continue
		}
		t.Run(be.Name, func(t *testing.T) {
			t.Parallel()
			db := testdb.Open(t, be)
			day0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
			fake := clock.NewFake(day0)
			b := setupWith(t, db, outbox.Config{Clock: fake}, false)
			if err := b.ob.Partition(b.ctx, outbox.PartitionConfig{Interval: time.Hour, Ahead: 2}); err != nil {
				t.Fatal(err)
			}
			ok := newReceiver(t, nil)
			b.endpoint("m", ok.URL)
			far := day0.Add(30 * 24 * time.Hour)
			fake.Set(far)
			id := b.enqueue(outbox.Event{Tenant: "m", Type: "a", Payload: []byte(`{}`)})
			if n := b.count("SELECT count(*) FROM txhook_events_default WHERE id = ?", id); n != 1 {
				t.Fatalf("event past the last partition: %d rows in DEFAULT", n)
			}
			// Maintenance (Partition again here; relays run the same at
			// start and every 5 minutes) creates the partitions ahead and
			// moves the event into its own; then a relay delivers it. (It
			// runs before the relay: creating a partition while a relay
			// writes rows of its range into DEFAULT can fail, with a
			// deadlock or a partition constraint error, and is then retried
			// at the next check; the rows wait in DEFAULT meanwhile and are
			// delivered from there.)
			if err := b.ob.Partition(b.ctx, outbox.PartitionConfig{Interval: time.Hour, Ahead: 2}); err != nil {
				t.Fatal(err)
			}
			part := "txhook_events_p" + far.Truncate(time.Hour).Format("20060102t1504")
			if !b.tableExists(part) {
				t.Fatalf("partition %s not created", part)
			}
			b.runRelay(outbox.RelayConfig{Retention: outbox.Retention{Interval: -1}})
			b.eventually("delivered", func() bool {
				return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded'") == 1
			})
			if n := b.count("SELECT count(*) FROM "+part+" WHERE id = ?", id); n != 1 {
				t.Errorf("event not moved into its partition")
			}
			if n := b.count("SELECT count(*) FROM txhook_events_default"); n != 0 {
				t.Errorf("DEFAULT still holds %d events", n)
			}
			// Its keys moved with it.
			tx, err := b.db.BeginTx(b.ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if _, err := b.ob.Enqueue(b.ctx, tx, outbox.Event{ID: id, Tenant: "m", Type: "b", Payload: []byte(`{}`)}); !errors.Is(err, outbox.ErrEventConflict) {
				t.Fatalf("re-enqueue after the move: %v", err)
			}
		})
	}
}

func TestPartitionRefusesBadConfig(t *testing.T) {
	db := testdb.Open(t, testdb.Backends[0])
	b := setupWith(t, db, outbox.Config{}, false)
	for _, cfg := range []outbox.PartitionConfig{{Interval: time.Minute}, {Interval: 90 * time.Second}, {Ahead: -1}} {
		if err := b.ob.Partition(b.ctx, cfg); !errors.Is(err, outbox.ErrInvalidConfig) && !errors.Is(err, outbox.ErrPartitionUnsupported) {
			t.Errorf("Partition(%+v) = %v", cfg, err)
		}
	}
}
