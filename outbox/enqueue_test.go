package outbox_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/signer"
)

func TestEnqueueRollbackLeavesNothingCommitDeliversOnce(t *testing.T) {
	testdb.Each(t, enqueueRollbackThenCommit)
}

// enqueueRollbackThenCommit: a rolled-back Enqueue leaves nothing, a
// committed one is delivered once, signed.
func enqueueRollbackThenCommit(t *testing.T, db *testdb.DB) {
	b := setup(t, db, outbox.Config{})
	rc := newReceiver(t, nil)
	ep := b.endpoint("merchant_1", rc.URL)

	// Rolled back: nothing remains.
	tx, err := db.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ob.Enqueue(b.ctx, tx, outbox.Event{Tenant: "merchant_1", Type: "payment.succeeded", Payload: []byte(`{"amount":100}`)}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := b.count("SELECT count(*) FROM txhook_events"); n != 0 {
		t.Fatalf("events after rollback = %d", n)
	}
	if n := b.count("SELECT count(*) FROM txhook_deliveries"); n != 0 {
		t.Fatalf("deliveries after rollback = %d", n)
	}

	b.relay(outbox.RelayConfig{})
	id := b.enqueue(outbox.Event{Tenant: "merchant_1", Type: "payment.succeeded", Payload: []byte(`{"amount":100}`)})

	got := rc.next(t)
	if got.Header.Get("Webhook-Id") != id {
		t.Fatalf("webhook-id %q, want %q", got.Header.Get("Webhook-Id"), id)
	}
	if ct := got.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content type %q", ct)
	}
	if et := got.Header.Get(outbox.HeaderEventType); et != "payment.succeeded" {
		t.Fatalf("event type header %q", et)
	}
	if ua := got.Header.Get("User-Agent"); !strings.Contains(ua, "txhook") {
		t.Fatalf("user agent %q", ua)
	}
	if _, err := (signer.Standard{}).Verify(got.Header, got.Body, []string{ep.Secrets[0].Value}); err != nil {
		t.Fatalf("signature does not verify: %v", err)
	}
	var env struct {
		ID, Type, Timestamp string
		Data                json.RawMessage
	}
	if err := json.Unmarshal(got.Body, &env); err != nil {
		t.Fatalf("body %s: %v", got.Body, err)
	}
	if env.ID != id || env.Type != "payment.succeeded" || string(env.Data) != `{"amount":100}` || env.Timestamp == "" {
		t.Fatalf("envelope %s", got.Body)
	}

	b.eventually("delivery recorded as succeeded", func() bool {
		return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded'") == 1
	})
	if n := b.count("SELECT count(*) FROM txhook_attempt_log WHERE status = 200 AND attempt = 1"); n != 1 {
		t.Fatalf("attempt records = %d", n)
	}
	if n := len(rc.requests()); n != 1 {
		t.Fatalf("receiver got %d requests, want 1", n)
	}
}

func TestEnqueueWithSqlxTx(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		b.endpoint("m", "http://127.0.0.1:9/")
		x := sqlx.NewDb(db.DB, db.Backend.Driver)
		tx, err := x.BeginTxx(b.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.ob.Enqueue(b.ctx, tx, outbox.Event{Tenant: "m", Type: "a.b", Payload: []byte(`[]`)}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if n := b.count("SELECT count(*) FROM txhook_events"); n != 1 {
			t.Fatalf("events = %d", n)
		}
	})
}

func TestEnqueueIdempotent(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		b.endpoint("m", "http://127.0.0.1:9/")

		id1 := b.enqueue(outbox.Event{ID: "evt_fixed", Tenant: "m", Type: "a", Payload: []byte(`1`)})
		id2 := b.enqueue(outbox.Event{ID: "evt_fixed", Tenant: "m", Type: "a", Payload: []byte(`1`)}) // the same event again
		if id1 != "evt_fixed" || id2 != "evt_fixed" {
			t.Fatalf("ids %q %q", id1, id2)
		}
		k1 := b.enqueue(outbox.Event{IdempotencyKey: "pay_1:succeeded", Tenant: "m", Type: "a", Payload: []byte(`1`)})
		k2 := b.enqueue(outbox.Event{IdempotencyKey: "pay_1:succeeded", Tenant: "m", Type: "a", Payload: []byte(`1`)})
		if k1 != k2 || k1 == "" {
			t.Fatalf("idempotency key gave %q then %q", k1, k2)
		}
		// The same key for another tenant is another event.
		b.endpoint("other", "http://127.0.0.1:9/")
		k3 := b.enqueue(outbox.Event{IdempotencyKey: "pay_1:succeeded", Tenant: "other", Type: "a", Payload: []byte(`1`)})
		if k3 == k1 {
			t.Fatal("idempotency key shared across tenants")
		}
		if n := b.count("SELECT count(*) FROM txhook_events"); n != 3 {
			t.Fatalf("events = %d, want 3", n)
		}
	})
}

func TestDispatchMatchesSubscriptions(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		rc := newReceiver(t, nil)
		all := b.endpoint("m", rc.URL+"/all")
		exact := b.endpoint("m", rc.URL+"/exact", "payment.succeeded")
		wild := b.endpoint("m", rc.URL+"/wild", "payment.*")
		star := b.endpoint("m", rc.URL+"/star", "*")
		refunds := b.endpoint("m", rc.URL+"/refund", "refund.created", "refund.*")
		disabled := b.endpoint("m", rc.URL+"/disabled")
		if err := b.ob.DisableEndpoint(b.ctx, disabled.ID, "test"); err != nil {
			t.Fatal(err)
		}
		b.endpoint("other-tenant", rc.URL+"/other")

		cases := []struct {
			typ  string
			want []string
		}{
			{"payment.succeeded", []string{all.ID, exact.ID, wild.ID, star.ID}},
			{"payment.refund.failed", []string{all.ID, wild.ID, star.ID}},
			{"paymentX", []string{all.ID, star.ID}},
			{"refund.created", []string{all.ID, star.ID, refunds.ID}},
		}
		ids := make([]string, len(cases))
		for i, c := range cases {
			ids[i] = b.enqueue(outbox.Event{Tenant: "m", Type: c.typ, Payload: []byte(`{}`)})
		}
		b.relay(outbox.RelayConfig{})
		b.eventually("all deliveries made", func() bool {
			return b.count("SELECT count(*) FROM txhook_events WHERE dispatched_at IS NULL") == 0 &&
				b.count("SELECT count(*) FROM txhook_deliveries WHERE state <> 'succeeded'") == 0
		})
		for i, c := range cases {
			ds, err := b.ob.EventDeliveries(b.ctx, ids[i])
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]bool{}
			for _, d := range ds {
				got[d.EndpointID] = true
			}
			if len(ds) != len(c.want) {
				t.Errorf("%s: got %d deliveries, want %d", c.typ, len(ds), len(c.want))
			}
			for _, w := range c.want {
				if !got[w] {
					t.Errorf("%s: no delivery for %s", c.typ, w)
				}
			}
		}
		if n := len(rc.requests()); n != 12 {
			t.Fatalf("receiver got %d requests, want 12", n)
		}
	})
}

func TestEnqueueRejectsBadEventsWritingNothing(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{MaxPayloadBytes: 1024})
		b.endpoint("m", "http://127.0.0.1:9/")
		big := `{"x":"` + strings.Repeat("a", 1100) + `"}`
		cases := []struct {
			name string
			ev   outbox.Event
			want error
		}{
			{"empty type", outbox.Event{Tenant: "m", Payload: []byte(`{}`)}, outbox.ErrInvalidEvent},
			{"wildcard type", outbox.Event{Tenant: "m", Type: "payment.*", Payload: []byte(`{}`)}, outbox.ErrInvalidEvent},
			{"empty tenant", outbox.Event{Type: "a", Payload: []byte(`{}`)}, outbox.ErrInvalidEvent},
			{"control char tenant", outbox.Event{Tenant: "m\x00", Type: "a", Payload: []byte(`{}`)}, outbox.ErrInvalidEvent},
			{"bad id", outbox.Event{ID: "has space", Tenant: "m", Type: "a", Payload: []byte(`{}`)}, outbox.ErrInvalidEvent},
			{"not json", outbox.Event{Tenant: "m", Type: "a", Payload: []byte(`{"a":`)}, outbox.ErrInvalidPayload},
			{"empty payload", outbox.Event{Tenant: "m", Type: "a"}, outbox.ErrInvalidPayload},
			{"too large", outbox.Event{Tenant: "m", Type: "a", Payload: []byte(big)}, outbox.ErrPayloadTooLarge},
		}
		for _, c := range cases {
			tx, err := db.BeginTx(b.ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = b.ob.Enqueue(b.ctx, tx, c.ev)
			if !errors.Is(err, c.want) {
				t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
			}
			// The transaction is still usable: nothing was sent to the database.
			if err := tx.Commit(); err != nil {
				t.Errorf("%s: commit after refused enqueue: %v", c.name, err)
			}
		}
		if n := b.count("SELECT count(*) FROM txhook_events"); n != 0 {
			t.Fatalf("events = %d after refused enqueues", n)
		}
	})
}
