package broker_test

import (
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testob"
	"github.com/txhook/txhook/outbox"
)

// TestForwarderRepollsAfterWork: Enqueue sends at most one NOTIFY per
// NotifyInterval, so of a steady stream only some events wake the
// forwarder. An event committed without one, just after one that did, is
// forwarded by the forwarder's re-polls after a round that found work,
// long before its PollInterval.
func TestForwarderRepollsAfterWork(t *testing.T) {
	testdb.EachPostgres(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db)
		// One NOTIFY an hour: the first Enqueue's.
		b.ob, b.ctx = testob.NewOutboxWith(t, db, outbox.Config{Broker: true, Logger: logger(t), NotifyInterval: time.Hour})
		b.cfg.PollInterval = time.Minute
		recv := newReceiver(t, 0)
		ep := b.endpoint("merchant_a", recv.srv.URL)
		recv.secret(t, ep)
		f := b.forwarder()
		testob.Eventually(t, "the forwarder holds the cursor", func() bool { return f.Stats().HoldsCursor })

		events := func() uint64 { return f.Stats().Events }
		first := b.enqueue("merchant_a", "payment.succeeded", 1) // notifies
		waitFor := func(what string, n uint64, within time.Duration) {
			t.Helper()
			deadline := time.Now().Add(within)
			for events() < n {
				if time.Now().After(deadline) {
					t.Fatalf("%s: %d events forwarded after %s, want %d (stats %+v)", what, events(), within, n, f.Stats())
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		waitFor("the event that sent a NOTIFY", 1, 20*time.Second)
		time.Sleep(100 * time.Millisecond)
		second := b.enqueue("merchant_a", "payment.succeeded", 1) // no NOTIFY
		// Re-polls back off from 2 ms, doubling: the second event is found
		// within a few hundred ms of its commit; a minute without them.
		waitFor("the event committed without a NOTIFY", 2, 10*time.Second)

		b.worker()
		testob.Eventually(t, "both delivered", func() bool { return recv.received(append(first, second...)) })
	})
}
