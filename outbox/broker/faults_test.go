package broker_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testob"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/broker"
)

// JetStream down when the forwarder starts: Start fails with
// ErrUnavailable, Enqueue keeps working and the events wait in the outbox;
// a forwarder started once the server is back delivers them all.
func TestBrokerUnavailableAtStart(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db)
		r := newReceiver(t, 0)
		b.endpoint("m", r.srv.URL)
		b.srv.Stop()
		f, err := broker.NewForwarder(b.ob, b.cfg)
		if err != nil {
			t.Fatal(err)
		}
		sctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
		err = f.Start(sctx)
		cancel()
		if !errors.Is(err, broker.ErrUnavailable) {
			t.Fatalf("Start with JetStream down: %v, want ErrUnavailable", err)
		}
		ids := b.enqueue("m", "payment.succeeded", 5)
		b.srv.Restart()
		b.forwarder()
		b.worker()
		testob.Eventually(t, "the events enqueued while JetStream was down", func() bool { return r.received(ids) })
	})
}

// JetStream stopped while forwarder and worker run: forwarding pauses (the
// forwarder reports why), events enqueued meanwhile wait in the outbox,
// and once the server is back every event is delivered.
func TestBrokerDownMidRun(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db)
		r := newReceiver(t, 0)
		b.endpoint("m", r.srv.URL)
		f := b.forwarder()
		b.worker()
		first := b.enqueue("m", "payment.succeeded", 10)
		testob.Eventually(t, "the first events", func() bool { return r.received(first) })
		b.srv.Stop()
		second := b.enqueue("m", "payment.succeeded", 10)
		testob.Eventually(t, "the forwarder to report JetStream unavailable", func() bool {
			return errors.Is(f.Err(), broker.ErrUnavailable)
		})
		b.srv.Restart()
		testob.Eventually(t, "the events enqueued while JetStream was down", func() bool { return r.received(second) })
		testob.Eventually(t, "the forwarder to report health", func() bool { return f.Err() == nil })
	})
}

// A stream set up by hand with settings that would lose deliveries is
// refused at Start with ErrStreamConfig naming the setting.
func TestBrokerRefusesMisconfiguredStream(t *testing.T) {
	b := setup(t, testdb.Open(t, testdb.SQLiteBackends[0]))
	cases := []struct {
		name string
		cfg  jetstream.StreamConfig
	}{
		{"limits retention", jetstream.StreamConfig{Name: "TXHOOK", Subjects: []string{"txhook.>"}, AllowMsgSchedules: true, AllowDirect: true}},
		{"max age", jetstream.StreamConfig{Name: "TXHOOK", Subjects: []string{"txhook.>"}, Retention: jetstream.WorkQueuePolicy, MaxAge: time.Hour, AllowMsgSchedules: true, AllowDirect: true}},
		{"no schedules", jetstream.StreamConfig{Name: "TXHOOK", Subjects: []string{"txhook.>"}, Retention: jetstream.WorkQueuePolicy, AllowDirect: true}},
		{"other subjects", jetstream.StreamConfig{Name: "TXHOOK", Subjects: []string{"other.>"}, Retention: jetstream.WorkQueuePolicy, AllowMsgSchedules: true, AllowDirect: true}},
	}
	for _, c := range cases {
		if _, err := b.js.CreateStream(b.ctx, c.cfg); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		f, err := broker.NewForwarder(b.ob, b.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Start(b.ctx); !errors.Is(err, broker.ErrStreamConfig) {
			t.Errorf("%s: Start: %v, want ErrStreamConfig", c.name, err)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
		w, err := broker.NewWorker(b.ob, b.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(b.ctx); !errors.Is(err, broker.ErrStreamConfig) {
			t.Errorf("%s: worker Start: %v, want ErrStreamConfig", c.name, err)
		}
		if err := b.js.DeleteStream(b.ctx, "TXHOOK"); err != nil {
			t.Fatal(err)
		}
	}
}

// The stream deleted by hand while everything runs: the forwarder stops
// forwarding and says so (ErrStreamMissing), events wait in the outbox,
// and once Setup has created the stream again they are delivered.
func TestBrokerStreamDeletedMidRun(t *testing.T) {
	testdb.EachPostgres(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db)
		r := newReceiver(t, 0)
		b.endpoint("m", r.srv.URL)
		f := b.forwarder()
		b.worker()
		first := b.enqueue("m", "payment.succeeded", 5)
		testob.Eventually(t, "the first events", func() bool { return r.received(first) })
		if err := b.js.DeleteStream(b.ctx, b.cfg.Stream+""); err != nil {
			if err := b.js.DeleteStream(b.ctx, broker.DefaultStream); err != nil {
				t.Fatal(err)
			}
		}
		second := b.enqueue("m", "payment.succeeded", 5)
		testob.Eventually(t, "the forwarder to report the stream missing", func() bool {
			return errors.Is(f.Err(), broker.ErrStreamMissing)
		})
		t.Logf("forwarder reports: %v", f.Err())
		if err := broker.Setup(b.ctx, b.cfg); err != nil {
			t.Fatal(err)
		}
		// The worker fetched from the deleted consumer: a new one, as a
		// restart would make, picks the work up.
		b.worker()
		testob.Eventually(t, "the events enqueued after the deletion", func() bool { return r.received(second) })
	})
}

// Messages on the delivery subjects that no forwarder published (garbage,
// a well-formed delivery without the key's MAC, one with a MAC moved to
// another subject) are never delivered: each is set aside on the rejected
// subject with the reason.
func TestBrokerRejectsForeignMessages(t *testing.T) {
	b := setup(t, testdb.Open(t, testdb.SQLiteBackends[0]))
	var hits atomic.Int64
	srv := newReceiver(t, 0)
	ep := b.endpoint("m", srv.srv.URL)
	srv.secret(t, ep)
	f := b.forwarder()
	w := b.worker()
	ids := b.enqueue("m", "payment.succeeded", 1)
	testob.Eventually(t, "a genuine event", func() bool { return srv.received(ids) })
	hits.Store(int64(len(srv.requests)))

	// A genuine message, copied off the stream before a worker takes it:
	// stop the worker, enqueue, read it.
	_ = w.Stop(context.Background())
	ids2 := b.enqueue("m", "payment.succeeded", 1)
	st, err := b.js.Stream(b.ctx, broker.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	var genuine *jetstream.RawStreamMsg
	testob.Eventually(t, "the forwarded message", func() bool {
		genuine, err = st.GetLastMsgForSubject(b.ctx, "txhook.q.e."+ids2[0]+"."+ep.ID)
		return err == nil
	})
	_ = f
	forge := func(subject string, data []byte, mac string) {
		m := nats.NewMsg(subject)
		m.Data = data
		if mac != "" {
			m.Header.Set("Txhook-Mac", mac)
		}
		if _, err := b.js.PublishMsg(b.ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	forged := []byte(`{"v":1,"k":"e.evil.` + ep.ID + `","b":0,"a":1,"ep":"` + ep.ID + `","e":{"id":"evil","t":"m","ty":"payment.succeeded","v":1,"c":0},"p":{"steal":true}}`)
	forge("txhook.q.e.evil."+ep.ID, forged, "")                                      // no MAC
	forge("txhook.q.e.evil."+ep.ID, forged, genuine.Header.Get("Txhook-Mac"))        // another message's MAC
	forge("txhook.q.e.moved."+ep.ID, genuine.Data, genuine.Header.Get("Txhook-Mac")) // genuine, wrong subject
	forge("txhook.q.garbage", []byte("\x00\xffnot json"), "bogus")
	b.worker()
	testob.Eventually(t, "the genuine event after the forgeries", func() bool { return srv.received(ids2) })
	var rejected []*jetstream.RawStreamMsg
	testob.Eventually(t, "four rejected messages", func() bool {
		info, err := st.Info(b.ctx, jetstream.WithSubjectFilter("txhook.rejected"))
		return err == nil && info.State.Subjects["txhook.rejected"] == 4
	})
	for seq := uint64(1); ; seq++ {
		m, err := st.GetMsg(b.ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			if seq > 1000 {
				break
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject == "txhook.rejected" {
			rejected = append(rejected, m)
			if m.Header.Get("Txhook-Rejected") == "" {
				t.Errorf("rejected message without a reason: %v", m.Header)
			}
		}
		if len(rejected) == 4 {
			break
		}
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.requests["evil"] != 0 || srv.bad != 0 || len(srv.requests) != 2 {
		t.Errorf("receiver saw %v (bad %d); want only the two genuine events", srv.requests, srv.bad)
	}
}

// Broker mode does not order deliveries: Enqueue refuses an ordering key,
// and a forwarder refuses to start over ordered events that wait to be
// dispatched (enqueued before broker mode).
func TestBrokerRefusesOrdering(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db)
		tx, err := db.BeginTx(b.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = b.ob.Enqueue(b.ctx, tx, outbox.Event{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{}`), OrderingKey: "pay_1"})
		if !errors.Is(err, outbox.ErrOrderingBroker) {
			t.Fatalf("Enqueue with an ordering key in broker mode: %v", err)
		}
		// The transaction is still usable.
		if _, err := b.ob.Enqueue(b.ctx, tx, outbox.Event{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		// An ordered event from before broker mode.
		table, err := outbox.New(b.ctx, db.DB, outbox.Config{Logger: logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		tx, _ = db.BeginTx(b.ctx, nil)
		if _, err := table.Enqueue(b.ctx, tx, outbox.Event{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{}`), OrderingKey: "pay_2"}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		f, err := broker.NewForwarder(b.ob, b.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Start(b.ctx); !errors.Is(err, outbox.ErrOrderingBroker) {
			t.Fatalf("forwarder Start over a waiting ordered event: %v", err)
		}
		if _, err := b.ob.NewRelay(outbox.RelayConfig{}); !errors.Is(err, outbox.ErrBrokerMode) {
			t.Fatalf("NewRelay on a broker-mode outbox: %v", err)
		}
	})
}

var _ = http.StatusOK
