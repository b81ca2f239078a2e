package broker_test

import (
	"testing"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testob"
	"github.com/txhook/txhook/outbox/broker"
)

// A forwarder that dies before saving its cursor leaves the next one to
// forward again what it sent since. JetStream drops those copies by their
// Nats-Msg-Id only while its duplicate window remembers them, and a
// server rebuilds the window from the messages its stream still holds: in
// a work-queue stream, not those already delivered and acknowledged. So
// after a restart (on a cluster: once a node that restarted leads the
// stream) the copy of a delivery that was made is stored and handed to a
// worker again, as a new message. The worker finds the delivery's row
// and sends nothing: the receiver gets each event once.
func TestBrokerCopyOfDoneDeliveryNotSent(t *testing.T) {
	testdb.EachPostgres(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db)
		r := newReceiver(t, 0)
		ep := b.endpoint("m", r.srv.URL)
		r.secret(t, ep)
		f := b.forwarder()
		b.worker()
		ids := b.enqueue("m", "payment.succeeded", 5)
		testob.Eventually(t, "the events delivered and recorded", func() bool {
			n := 0
			for _, s := range deliveryStates(t, db, ep.ID) {
				if s[0] == "succeeded" {
					n++
				}
			}
			return r.received(ids) && n == len(ids)
		})
		if err := f.Stop(b.ctx); err != nil {
			t.Fatal(err)
		}
		// A worker acknowledges a message after it recorded the delivery:
		// wait until the stream let go of them all, so that the window the
		// restarted server rebuilds from what the stream holds is empty.
		streamEmpty := func() bool {
			stream, err := b.js.Stream(b.ctx, broker.DefaultStream)
			if err != nil {
				return false
			}
			si, err := stream.Info(b.ctx)
			return err == nil && si.State.Msgs == 0
		}
		testob.Eventually(t, "the stream emptied by the workers' acknowledgements", streamEmpty)
		// The server restarts: its duplicate window now holds what the
		// stream holds, nothing.
		b.srv.Restart()
		// The cursor as a forwarder that died before saving it leaves it.
		if _, err := db.ExecContext(b.ctx, `UPDATE txhook_forwarders SET position = ''`); err != nil {
			t.Fatal(err)
		}
		again := b.forwarder()
		testob.Eventually(t, "the events forwarded again", func() bool { return again.Stats().Messages >= uint64(len(ids)) })
		if st := again.Stats(); st.Duplicates != 0 {
			t.Fatalf("JetStream dropped %d of the copies as duplicates; this test needs them stored (stats %+v)", st.Duplicates, st)
		}
		stream, err := b.js.Stream(b.ctx, broker.DefaultStream)
		if err != nil {
			t.Fatal(err)
		}
		cons, err := stream.Consumer(b.ctx, "txhook-workers")
		if err != nil {
			t.Fatal(err)
		}
		testob.Eventually(t, "the copies settled", func() bool {
			si, err := stream.Info(b.ctx)
			if err != nil {
				return false
			}
			ci, err := cons.Info(b.ctx)
			return err == nil && si.State.Msgs == 0 && ci.NumPending == 0 && ci.NumAckPending == 0
		})
		for _, id := range ids {
			if req, ok := r.count(id); req != 1 || ok != 1 {
				t.Errorf("event %s: %d requests, %d answered 2xx; want 1", id, req, ok)
			}
		}
		for id, s := range deliveryStates(t, db, ep.ID) {
			if s[0] != "succeeded" || s[1] != 1 {
				t.Errorf("event %s: %v, want succeeded after 1 attempt", id, s)
			}
		}
	})
}
