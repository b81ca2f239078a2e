package outbox_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// many runs EnqueueMany in a transaction of its own, committed when it
// succeeds and rolled back otherwise.
func (b *bundle) many(evs []outbox.Event) ([]outbox.Enqueued, error) {
	b.t.Helper()
	tx, err := b.db.BeginTx(b.ctx, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	res, err := b.ob.EnqueueMany(b.ctx, tx, evs)
	if err != nil {
		tx.Rollback()
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		b.t.Fatal(err)
	}
	return res, nil
}

func payEvent(tenant string, n int) outbox.Event {
	return outbox.Event{Tenant: tenant, Type: "payment.succeeded", Payload: fmt.Appendf(nil, `{"n":%d}`, n)}
}

func TestEnqueueManyDeliversEveryEventOnce(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		rc := newReceiver(t, nil)
		b.endpoint("m", rc.URL)
		b.relay(outbox.RelayConfig{})
		const n = 120
		evs := make([]outbox.Event, n)
		for i := range evs {
			evs[i] = payEvent("m", i)
		}
		evs[7].ID = "evt_explicit_7"
		res, err := b.many(evs)
		if err != nil {
			t.Fatal(err)
		}
		if len(res) != n {
			t.Fatalf("%d results for %d events", len(res), n)
		}
		want := map[string]string{}
		for i, r := range res {
			if r.ID == "" || r.Duplicate {
				t.Fatalf("result %d: %+v", i, r)
			}
			if _, dup := want[r.ID]; dup {
				t.Fatalf("ID %s returned twice", r.ID)
			}
			want[r.ID] = string(evs[i].Payload)
		}
		if res[7].ID != "evt_explicit_7" {
			t.Fatalf("explicit ID came back as %s", res[7].ID)
		}
		for range n {
			got := rc.next(t)
			id := got.Header.Get("Webhook-Id")
			p, ok := want[id]
			if !ok {
				t.Fatalf("unexpected or repeated delivery of %q", id)
			}
			if !strings.Contains(string(got.Body), `"data":`+p) {
				t.Fatalf("event %s: body %s, want data %s", id, got.Body, p)
			}
			delete(want, id)
		}
		b.eventually("deliveries recorded", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded'") == n
		})
		if got := len(rc.requests()); got != n {
			t.Fatalf("receiver got %d requests, want %d", got, n)
		}
	})
}

func TestEnqueueManyRefusesAnInvalidEventByIndexAndWritesNothing(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		bad := []struct {
			name   string
			mangle func(*outbox.Event)
			want   error
		}{
			{"no tenant", func(e *outbox.Event) { e.Tenant = "" }, outbox.ErrInvalidEvent},
			{"bad payload", func(e *outbox.Event) { e.Payload = []byte(`{"a":`) }, outbox.ErrInvalidPayload},
			{"bad ID", func(e *outbox.Event) { e.ID = "evt.1" }, outbox.ErrInvalidEvent},
		}
		for _, c := range bad {
			evs := []outbox.Event{payEvent("m", 0), payEvent("m", 1), payEvent("m", 2)}
			c.mangle(&evs[2])
			tx, err := db.BeginTx(b.ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = b.ob.EnqueueMany(b.ctx, tx, evs)
			var be *outbox.BatchError
			if !errors.As(err, &be) || be.Index != 2 || !errors.Is(err, c.want) {
				t.Fatalf("%s: error %v, want a BatchError at index 2 matching %v", c.name, err, c.want)
			}
			if !strings.Contains(err.Error(), "event 2 of the batch") {
				t.Fatalf("%s: error %q does not name the event", c.name, err)
			}
			// The transaction is still usable, and nothing was written.
			if _, err := b.ob.Enqueue(b.ctx, tx, payEvent("m", 9)); err != nil {
				t.Fatalf("%s: transaction unusable after the refusal: %v", c.name, err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		if n := b.count("SELECT count(*) FROM txhook_events"); n != len(bad) {
			t.Fatalf("%d events stored, want only the %d enqueued after each refusal", n, len(bad))
		}
	})
}

func TestEnqueueManyDuplicatesAndConflictsAsSequentialEnqueues(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		stored := b.enqueue(outbox.Event{ID: "evt_stored", Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"a":1}`)})
		keyed := b.enqueue(outbox.Event{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"k":1}`), IdempotencyKey: "k1"})

		// Repeats of stored events and of events earlier in the batch.
		evs := []outbox.Event{
			{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"new":1}`), IdempotencyKey: "k2"},
			{ID: "evt_stored", Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"a":1}`)},
			{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"k":1}`), IdempotencyKey: "k1"},
			{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"new":1}`), IdempotencyKey: "k2"},
			{ID: "evt_twice", Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"t":1}`)},
			{ID: "evt_twice", Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"t":1}`)},
			{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"k":1}`), IdempotencyKey: "k1"},
		}
		res, err := b.many(evs)
		if err != nil {
			t.Fatal(err)
		}
		want := []outbox.Enqueued{
			{ID: res[0].ID},
			{ID: stored, Duplicate: true},
			{ID: keyed, Duplicate: true},
			{ID: res[0].ID, Duplicate: true},
			{ID: "evt_twice"},
			{ID: "evt_twice", Duplicate: true},
			{ID: keyed, Duplicate: true},
		}
		for i := range want {
			if res[i] != want[i] {
				t.Errorf("result %d = %+v, want %+v", i, res[i], want[i])
			}
		}
		if n := b.count("SELECT count(*) FROM txhook_events"); n != 4 {
			t.Fatalf("%d events stored, want 4", n)
		}

		// Refusals name the first offending event; the rows the call had
		// inserted are taken back and the transaction stays usable.
		for _, c := range []struct {
			name  string
			evs   []outbox.Event
			index int
			want  error
		}{
			{"ID of another tenant's event", []outbox.Event{payEvent("m", 1), payEvent("m", 2),
				{ID: "evt_stored", Tenant: "other", Type: "payment.succeeded", Payload: []byte(`{"a":1}`)}}, 2, outbox.ErrEventConflict},
			{"stored ID, other content", []outbox.Event{payEvent("m", 1),
				{ID: "evt_stored", Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"a":2}`)}, payEvent("m", 3)}, 1, outbox.ErrEventConflict},
			{"stored key, other content", []outbox.Event{payEvent("m", 1), payEvent("m", 2), payEvent("m", 3),
				{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"k":2}`), IdempotencyKey: "k1"}}, 3, outbox.ErrIdempotencyConflict},
			{"key repeated in the batch, other content", []outbox.Event{
				{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"x":1}`), IdempotencyKey: "k9"},
				{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"x":2}`), IdempotencyKey: "k9"}}, 1, outbox.ErrIdempotencyConflict},
			{"ID repeated in the batch, other tenant", []outbox.Event{
				{ID: "evt_new", Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"x":1}`)},
				{ID: "evt_new", Tenant: "n", Type: "payment.succeeded", Payload: []byte(`{"x":1}`)}}, 1, outbox.ErrEventConflict},
		} {
			tx, err := db.BeginTx(b.ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = b.ob.EnqueueMany(b.ctx, tx, c.evs)
			var be *outbox.BatchError
			if !errors.As(err, &be) || be.Index != c.index || !errors.Is(err, c.want) {
				t.Fatalf("%s: error %v, want a BatchError at index %d matching %v", c.name, err, c.index, c.want)
			}
			if _, err := b.ob.Enqueue(b.ctx, tx, outbox.Event{Tenant: "m", Type: "after", Payload: []byte(`{}`)}); err != nil {
				t.Fatalf("%s: transaction unusable: %v", c.name, err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if n := b.count("SELECT count(*) FROM txhook_events WHERE type <> 'after'"); n != 4 {
				t.Fatalf("%s: %d events stored, want the 4 from before", c.name, n)
			}
		}
	})
}

func TestEnqueueManyLargerThanOneStatement(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		n := store.MaxBatchRows*2 + 17
		evs := make([]outbox.Event, n)
		for i := range evs {
			evs[i] = payEvent("m", i)
			evs[i].IdempotencyKey = fmt.Sprint("key_", i)
		}
		if got := len(chunks(evs)); got != 3 {
			t.Fatalf("test bug: %d statements, want 3", got)
		}
		// A conflict in the last statement: the first two are taken back.
		b.enqueue(outbox.Event{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"other":1}`), IdempotencyKey: "key_" + fmt.Sprint(n-1)})
		_, err := b.many(evs)
		var be *outbox.BatchError
		if !errors.As(err, &be) || be.Index != n-1 || !errors.Is(err, outbox.ErrIdempotencyConflict) {
			t.Fatalf("error %v, want an idempotency conflict at index %d", err, n-1)
		}
		tx, err := db.BeginTx(b.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = b.ob.EnqueueMany(b.ctx, tx, evs)
		if !errors.As(err, &be) || be.Index != n-1 {
			t.Fatalf("error %v, want the conflict at index %d", err, n-1)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if got := b.count("SELECT count(*) FROM txhook_events"); got != 1 {
			t.Fatalf("%d events after the refused batch was committed, want 1", got)
		}
		res, err := b.many(evs[:n-1])
		if err != nil {
			t.Fatal(err)
		}
		if got := b.count("SELECT count(*) FROM txhook_events"); got != n {
			t.Fatalf("%d events, want %d", got, n)
		}
		for i, r := range res {
			if r.Duplicate || r.ID == "" {
				t.Fatalf("result %d: %+v", i, r)
			}
		}
	})
}

// chunks is how EnqueueMany splits evs into statements.
func chunks(evs []outbox.Event) [][]store.NewEvent {
	rows := make([]store.NewEvent, len(evs))
	for i, e := range evs {
		rows[i] = store.NewEvent{Payload: string(e.Payload)}
	}
	return store.BatchChunks(rows)
}

func TestEnqueueManyEmpty(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		res, err := b.many(nil)
		if err != nil || len(res) != 0 {
			t.Fatalf("EnqueueMany(nil) = %v, %v", res, err)
		}
	})
}
