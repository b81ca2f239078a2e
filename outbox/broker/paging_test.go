package broker_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testob"
	"github.com/txhook/txhook/outbox"
)

// TestForwarderPagesBothRanges: with a batch of 3 the forwarder pages
// through the events of a transaction that was running at the cursor and
// committed later, then through events of transactions that started after
// it. Every event is
// forwarded once and delivered once.
func TestForwarderPagesBothRanges(t *testing.T) {
	testdb.EachPostgres(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db)
		b.cfg.BatchSize = 3
		recv := newReceiver(t, 0)
		ep := b.endpoint("merchant_a", recv.srv.URL)
		recv.secret(t, ep)

		// A transaction that stays open across the forwarder's rounds.
		long, err := b.db.BeginTx(b.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer long.Rollback()
		var longIDs []string
		for i := range 5 {
			id, err := b.ob.Enqueue(b.ctx, long, outbox.Event{Tenant: "merchant_a", Type: "payment.succeeded", Payload: []byte(fmt.Sprintf(`{"long":%d}`, i))})
			if err != nil {
				t.Fatal(err)
			}
			longIDs = append(longIDs, id)
		}

		f := b.forwarder()
		testob.Eventually(t, "the forwarder holds the cursor", func() bool { return f.Stats().HoldsCursor })
		first := b.enqueue("merchant_a", "payment.succeeded", 10)
		testob.Eventually(t, "the first 10 events forwarded", func() bool { return f.Stats().Events >= 10 })
		time.Sleep(50 * time.Millisecond) // a round or two with the long transaction running

		if err := long.Commit(); err != nil {
			t.Fatal(err)
		}
		after := b.enqueue("merchant_a", "payment.succeeded", 4)
		b.forwarder() // a second one stands by
		b.worker()
		all := append(append(append([]string{}, first...), longIDs...), after...)
		testob.Eventually(t, "every event delivered", func() bool { return recv.received(all) })
		testob.Eventually(t, "19 events forwarded", func() bool { return f.Stats().Events >= 19 })
		for _, id := range all {
			if req, ok := recv.count(id); req != 1 || ok != 1 {
				t.Errorf("event %s: %d requests, %d ok", id, req, ok)
			}
		}
		if st := f.Stats(); st.Events != 19 || st.Duplicates != 0 {
			t.Errorf("forwarder stats %+v, want 19 events and no duplicates", st)
		}
	})
}
