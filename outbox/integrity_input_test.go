package outbox_test

import (
	"database/sql"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// businessTx begins the caller's transaction and writes the caller's own
// row in it, as a payment service would before enqueuing its event.
func (b *bundle) businessTx(note string) *sql.Tx {
	b.t.Helper()
	if _, err := b.db.ExecContext(b.ctx, `CREATE TABLE IF NOT EXISTS payments (note TEXT NOT NULL)`); err != nil {
		b.t.Fatal(err)
	}
	tx, err := b.db.BeginTx(b.ctx, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	if _, err := tx.ExecContext(b.ctx, b.rebind(`INSERT INTO payments (note) VALUES (?)`), note); err != nil {
		tx.Rollback()
		b.t.Fatal(err)
	}
	return tx
}

// mustStillCommit checks that tx is still usable after a refused call (on
// PostgreSQL a failed statement aborts the transaction) and that the
// caller's own row survives its commit.
func (b *bundle) mustStillCommit(what string, tx *sql.Tx, note string) {
	b.t.Helper()
	var one int
	if err := tx.QueryRowContext(b.ctx, "SELECT 1").Scan(&one); err != nil {
		tx.Rollback()
		b.t.Fatalf("%s: caller's transaction unusable afterwards: %v", what, err)
	}
	if err := tx.Commit(); err != nil {
		b.t.Fatalf("%s: commit: %v", what, err)
	}
	if n := b.count("SELECT count(*) FROM payments WHERE note = ?", note); n != 1 {
		b.t.Fatalf("%s: the caller's own row was lost (%d rows)", what, n)
	}
}

func TestEnqueueRefusesWhatTheDatabaseWouldRefuseKeepingTheCallersTx(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		ok := outbox.Event{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"a":1}`)}
		with := func(f func(*outbox.Event)) outbox.Event { ev := ok; f(&ev); return ev }
		deep := strings.Repeat("[", 65) + strings.Repeat("]", 65)
		cases := []struct {
			name string
			ev   outbox.Event
			want error
		}{
			{"invalid UTF-8 payload", with(func(e *outbox.Event) { e.Payload = []byte("{\"a\":\"\xff\xfe\"}") }), outbox.ErrInvalidPayload},
			{"surrogate bytes in payload", with(func(e *outbox.Event) { e.Payload = []byte("\"\xed\xa0\x80\"") }), outbox.ErrInvalidPayload},
			{"escaped NUL in payload", with(func(e *outbox.Event) { e.Payload = []byte(`{"a":"x\u0000y"}`) }), outbox.ErrInvalidPayload},
			{"lone high surrogate", with(func(e *outbox.Event) { e.Payload = []byte(`"\ud800"`) }), outbox.ErrInvalidPayload},
			{"lone low surrogate", with(func(e *outbox.Event) { e.Payload = []byte(`"\uDC00"`) }), outbox.ErrInvalidPayload},
			{"high surrogate then letter", with(func(e *outbox.Event) { e.Payload = []byte(`"\ud800\u0041"`) }), outbox.ErrInvalidPayload},
			{"nested 65 deep", with(func(e *outbox.Event) { e.Payload = []byte(deep) }), outbox.ErrInvalidPayload},
			{"byte order mark", with(func(e *outbox.Event) { e.Payload = []byte("\ufeff{}") }), outbox.ErrInvalidPayload},
			{"version beyond integer", with(func(e *outbox.Event) { e.Version = 1 << 40 }), outbox.ErrInvalidEvent},
			{"version 2^31", with(func(e *outbox.Event) { e.Version = math.MaxInt32 + 1 }), outbox.ErrInvalidEvent},
			{"invalid UTF-8 tenant", with(func(e *outbox.Event) { e.Tenant = "m\xff" }), outbox.ErrInvalidEvent},
			{"invalid UTF-8 idempotency key", with(func(e *outbox.Event) { e.IdempotencyKey = "k\xc3" }), outbox.ErrInvalidEvent},
			{"NUL in idempotency key", with(func(e *outbox.Event) { e.IdempotencyKey = "k\x00" }), outbox.ErrInvalidEvent},
			{"invalid UTF-8 ordering key", with(func(e *outbox.Event) { e.OrderingKey = "\x80" }), outbox.ErrInvalidEvent},
			{"invalid UTF-8 ID", with(func(e *outbox.Event) { e.ID = "evt_\xff" }), outbox.ErrInvalidEvent},
			{"invalid UTF-8 type", with(func(e *outbox.Event) { e.Type = "a.\xff" }), outbox.ErrInvalidEvent},
		}
		// What the error says: what is refused, and why. A payload that is
		// valid JSON is never called invalid JSON.
		says := map[string][]string{
			"invalid UTF-8 payload":      {"not valid UTF-8"},
			"surrogate bytes in payload": {"not valid UTF-8"},
			"escaped NUL in payload":     {`\u0000 escape at byte 7 is valid JSON`, "NUL character", "cannot store"},
			"lone high surrogate":        {"unpaired surrogate escape at byte 1 is valid JSON", "no Unicode character"},
			"lone low surrogate":         {"unpaired surrogate escape at byte 1 is valid JSON"},
			"high surrogate then letter": {"unpaired surrogate escape at byte 1 is valid JSON"},
			"nested 65 deep":             {"valid JSON nested more than 64 levels deep", "receivers"},
			"byte order mark":            {"not valid JSON"},
		}
		for _, c := range cases {
			tx := b.businessTx(c.name)
			_, err := b.ob.Enqueue(b.ctx, tx, c.ev)
			if !errors.Is(err, c.want) {
				tx.Rollback()
				t.Fatalf("%s: err = %v, want %v", c.name, err, c.want)
			}
			if want, ok := says[c.name]; ok {
				msg := err.Error()
				for _, w := range want {
					if !strings.Contains(msg, w) {
						t.Errorf("%s: error %q does not say %q", c.name, msg, w)
					}
				}
				if validJSON := json.Valid(c.ev.Payload); validJSON && strings.Contains(msg, "not valid JSON") {
					t.Errorf("%s: error %q calls valid JSON invalid", c.name, msg)
				}
			}
			b.mustStillCommit(c.name, tx, c.name)
		}
		if n := b.count("SELECT count(*) FROM txhook_events"); n != 0 {
			t.Fatalf("%d events stored from refused input", n)
		}

		// What the database does accept is stored byte for byte.
		accepted := []string{
			`"\ud83d\ude00 \u00e9 \/ \"x\""`,
			`1e999999999`,
			"{\"a\":\"\u2028 é 😀\"}\n",
			strings.Repeat("[", 64) + strings.Repeat("]", 64),
		}
		for i, p := range accepted {
			id := b.enqueue(outbox.Event{Tenant: "m", Type: "a", Payload: []byte(p), Version: math.MaxInt32})
			var got []byte
			if err := db.QueryRowContext(b.ctx, b.rebind(`SELECT payload FROM txhook_events WHERE id = ?`), id).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if string(got) != p {
				t.Fatalf("accepted payload %d read back as %q, want %q", i, got, p)
			}
		}
	})
}

func TestEndpointFieldsTheDatabaseWouldRefuseAreRefused(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		const url = "https://93.184.216.34/hook"
		nan, inf := math.NaN(), math.Inf(1)
		creates := []struct {
			name string
			ne   outbox.NewEndpoint
			want error
		}{
			{"URL with invalid UTF-8", outbox.NewEndpoint{URL: "https://93.184.216.34/h\xffook"}, outbox.ErrInvalidURL},
			{"URL with invalid UTF-8 host", outbox.NewEndpoint{URL: "https://exa\xc3mple.com/"}, outbox.ErrInvalidURL},
			{"URL with NUL", outbox.NewEndpoint{URL: "https://93.184.216.34/\x00"}, outbox.ErrInvalidURL},
			{"rate NaN", outbox.NewEndpoint{URL: url, Limits: outbox.Limits{RatePerSecond: nan}}, outbox.ErrInvalidEndpoint},
			{"rate +Inf", outbox.NewEndpoint{URL: url, Limits: outbox.Limits{RatePerSecond: inf}}, outbox.ErrInvalidEndpoint},
			{"rate -Inf", outbox.NewEndpoint{URL: url, Limits: outbox.Limits{RatePerSecond: -inf}}, outbox.ErrInvalidEndpoint},
			{"description with NUL", outbox.NewEndpoint{URL: url, Description: "a\x00b"}, outbox.ErrInvalidEndpoint},
			{"description with invalid UTF-8", outbox.NewEndpoint{URL: url, Description: "\xff"}, outbox.ErrInvalidEndpoint},
			{"tenant with invalid UTF-8", outbox.NewEndpoint{Tenant: "m\xff", URL: url}, outbox.ErrInvalidEndpoint},
			{"event type with invalid UTF-8", outbox.NewEndpoint{URL: url, EventTypes: []string{"a.\xff"}}, outbox.ErrInvalidEndpoint},
			{"pinned version key with invalid UTF-8", outbox.NewEndpoint{URL: url, Versions: map[string]int{"a\xff": 1}}, outbox.ErrInvalidEndpoint},
			{"pinned version beyond integer", outbox.NewEndpoint{URL: url, Versions: map[string]int{"a": 1 << 40}}, outbox.ErrInvalidEndpoint},
			{"secret with invalid UTF-8", outbox.NewEndpoint{URL: url, Secret: "0123456789abcdef\xff"}, outbox.ErrInvalidSecret},
			{"secret with NUL", outbox.NewEndpoint{URL: url, Secret: "0123456789abcdef\x00"}, outbox.ErrInvalidSecret},
			{"whsec secret with NUL", outbox.NewEndpoint{URL: url, Secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\x00"}, outbox.ErrInvalidSecret},
		}
		for _, c := range creates {
			if c.ne.Tenant == "" {
				c.ne.Tenant = "m"
			}
			if _, err := b.ob.CreateEndpoint(b.ctx, c.ne); !errors.Is(err, c.want) {
				t.Errorf("create, %s: err = %v, want %v", c.name, err, c.want)
			}
		}
		if n := b.count("SELECT count(*) FROM txhook_endpoints"); n != 0 {
			t.Fatalf("%d endpoints stored from refused input", n)
		}

		ep, err := b.ob.CreateEndpoint(b.ctx, outbox.NewEndpoint{Tenant: "m", URL: url})
		if err != nil {
			t.Fatal(err)
		}
		bad := "https://93.184.216.34/\xff"
		if _, err := b.ob.UpdateEndpoint(b.ctx, ep.ID, outbox.EndpointUpdate{URL: &bad}); !errors.Is(err, outbox.ErrInvalidURL) {
			t.Errorf("update URL: err = %v, want ErrInvalidURL", err)
		}
		for _, r := range []float64{nan, inf, -inf} {
			if _, err := b.ob.UpdateEndpoint(b.ctx, ep.ID, outbox.EndpointUpdate{Limits: &outbox.Limits{RatePerSecond: r}}); !errors.Is(err, outbox.ErrInvalidEndpoint) {
				t.Errorf("update rate %v: err = %v, want ErrInvalidEndpoint", r, err)
			}
		}
		if _, err := b.ob.RotateSecret(b.ctx, ep.ID, outbox.Rotation{Secret: "0123456789abcdef\xff"}); !errors.Is(err, outbox.ErrInvalidSecret) {
			t.Errorf("rotate to invalid UTF-8 secret: err = %v, want ErrInvalidSecret", err)
		}
		got, err := b.ob.Endpoint(b.ctx, ep.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.URL != url || got.Limits != (outbox.Limits{}) || len(got.Secrets) != 1 {
			t.Fatalf("refused updates changed the endpoint: %+v", got)
		}

		// Disable reasons: NUL and invalid UTF-8 are refused; a long one is
		// cut at a character boundary, never inside one.
		for _, reason := range []string{"a\x00b", "\xff"} {
			if err := b.ob.DisableEndpoint(b.ctx, ep.ID, reason); !errors.Is(err, outbox.ErrInvalidEndpoint) {
				t.Errorf("disable reason %q: err = %v, want ErrInvalidEndpoint", reason, err)
			}
		}
		long := strings.Repeat("x", 1023) + "é and more"
		if err := b.ob.DisableEndpoint(b.ctx, ep.ID, long); err != nil {
			t.Fatalf("disable with a long reason: %v", err)
		}
		got, err = b.ob.Endpoint(b.ctx, ep.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Enabled || !utf8.ValidString(got.DisabledReason) || got.DisabledReason != long[:1023] {
			t.Fatalf("disabled %v with reason %q (%d bytes)", !got.Enabled, got.DisabledReason, len(got.DisabledReason))
		}

		// Lookups by an ID or tenant no endpoint can have say so, instead of
		// PostgreSQL's encoding error.
		if _, err := b.ob.Endpoint(b.ctx, "ep_\xff"); !errors.Is(err, outbox.ErrEndpointNotFound) {
			t.Errorf("endpoint with invalid UTF-8 ID: err = %v, want ErrEndpointNotFound", err)
		}
		if err := b.ob.DisableEndpoint(b.ctx, "ep_\x00", "r"); !errors.Is(err, outbox.ErrEndpointNotFound) {
			t.Errorf("disable with NUL ID: err = %v, want ErrEndpointNotFound", err)
		}
		if eps, err := b.ob.Endpoints(b.ctx, "m\xff"); err != nil || len(eps) != 0 {
			t.Errorf("endpoints of an invalid tenant: %v, %v", eps, err)
		}
	})
}

func TestEnqueueReusedIDOfAnotherTenantIsAConflictRevealingNothing(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		a := outbox.Event{ID: "evt_shared", Tenant: "tenant_alpha", Type: "alpha.secret_type", Payload: []byte(`{"card":"4242-alpha-private"}`)}
		if id := b.enqueue(a); id != "evt_shared" {
			t.Fatalf("A's id %q", id)
		}

		for _, ev := range []outbox.Event{
			{ID: "evt_shared", Tenant: "tenant_beta", Type: "payment.succeeded", Payload: []byte(`{"amount":5}`)},
			{ID: "evt_shared", Tenant: "tenant_beta", Type: a.Type, Payload: a.Payload}, // even A's content
			{ID: "evt_shared", Tenant: "tenant_beta", Type: "payment.succeeded", Payload: []byte(`{}`), IdempotencyKey: "k"},
		} {
			tx := b.businessTx("beta " + string(ev.Payload) + ev.IdempotencyKey)
			r, err := b.ob.EnqueueDetail(b.ctx, tx, ev)
			if !errors.Is(err, outbox.ErrEventConflict) {
				tx.Rollback()
				t.Fatalf("B reusing A's ID: result %+v, err = %v, want ErrEventConflict", r, err)
			}
			for _, leak := range []string{"alpha", "4242", "secret_type"} {
				if strings.Contains(err.Error(), leak) {
					t.Fatalf("B's error reveals A's event (%q): %v", leak, err)
				}
			}
			b.mustStillCommit("B after conflict", tx, "beta "+string(ev.Payload)+ev.IdempotencyKey)
		}
		if n := b.count("SELECT count(*) FROM txhook_events"); n != 1 {
			t.Fatalf("events = %d, want A's only", n)
		}
		if n := b.count("SELECT count(*) FROM txhook_events WHERE id = 'evt_shared' AND tenant = 'tenant_alpha' AND type = 'alpha.secret_type'"); n != 1 {
			t.Fatal("A's event was changed")
		}

		// Same tenant, same ID, other content: a conflict too.
		if _, err := b.ob.Enqueue(b.ctx, db.DB, outbox.Event{ID: "evt_shared", Tenant: a.Tenant, Type: a.Type, Payload: []byte(`{"card":"other"}`)}); !errors.Is(err, outbox.ErrEventConflict) {
			t.Fatalf("same ID, other payload: err = %v, want ErrEventConflict", err)
		}
	})
}

func TestEnqueueIdempotencyKeyReusedForOtherContentIsAConflict(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		first := outbox.Event{Tenant: "m", IdempotencyKey: "pay_1:succeeded", Type: "payment.succeeded",
			Payload: []byte(`{"amount":100}`), OrderingKey: "pay_1"}
		id := b.enqueue(first)
		with := func(f func(*outbox.Event)) outbox.Event { ev := first; f(&ev); return ev }
		cases := []struct {
			name string
			ev   outbox.Event
		}{
			{"other payload", with(func(e *outbox.Event) { e.Payload = []byte(`{"amount":200}`) })},
			{"same JSON, other bytes", with(func(e *outbox.Event) { e.Payload = []byte(`{"amount": 100}`) })},
			{"other type", with(func(e *outbox.Event) { e.Type = "payment.failed" })},
			{"other version", with(func(e *outbox.Event) { e.Version = 2 })},
			{"other ordering key", with(func(e *outbox.Event) { e.OrderingKey = "pay_2" })},
			{"no ordering key", with(func(e *outbox.Event) { e.OrderingKey = "" })},
			{"other explicit ID", with(func(e *outbox.Event) { e.ID = "evt_other" })},
		}
		for _, c := range cases {
			tx := b.businessTx(c.name)
			r, err := b.ob.EnqueueDetail(b.ctx, tx, c.ev)
			if !errors.Is(err, outbox.ErrIdempotencyConflict) {
				tx.Rollback()
				t.Fatalf("%s: result %+v, err = %v, want ErrIdempotencyConflict", c.name, r, err)
			}
			if strings.Contains(err.Error(), "amount") {
				t.Fatalf("%s: error quotes the payload: %v", c.name, err)
			}
			b.mustStillCommit(c.name, tx, c.name)
		}
		if n := b.count("SELECT count(*) FROM txhook_events"); n != 1 {
			t.Fatalf("events = %d, want 1", n)
		}
		var stored []byte
		if err := db.QueryRowContext(b.ctx, b.rebind(`SELECT payload FROM txhook_events WHERE id = ?`), id).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if string(stored) != string(first.Payload) {
			t.Fatalf("the first event's payload became %s", stored)
		}
	})
}

func TestEnqueueDetailTellsADuplicateFromANewEvent(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		enq := func(ev outbox.Event) outbox.Enqueued {
			t.Helper()
			r, err := b.ob.EnqueueDetail(b.ctx, db.DB, ev)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		byKey := outbox.Event{Tenant: "m", IdempotencyKey: "pay_1:succeeded", Type: "payment.succeeded", Payload: []byte(`{"amount":100}`), OrderingKey: "pay_1"}
		r1 := enq(byKey)
		if r1.Duplicate || r1.ID == "" {
			t.Fatalf("first enqueue: %+v", r1)
		}
		r2 := enq(byKey)
		if !r2.Duplicate || r2.ID != r1.ID {
			t.Fatalf("identical replay by key: %+v, want duplicate of %s", r2, r1.ID)
		}
		withID := byKey
		withID.ID = r1.ID
		if r := enq(withID); !r.Duplicate || r.ID != r1.ID {
			t.Fatalf("identical replay by key and ID: %+v", r)
		}

		byID := outbox.Event{ID: "evt_1", Tenant: "m", Type: "a", Payload: []byte(`[1]`), Version: 1}
		if r := enq(byID); r.Duplicate || r.ID != "evt_1" {
			t.Fatalf("first enqueue by ID: %+v", r)
		}
		byID.Version = 0 // the same version, left to the default
		if r := enq(byID); !r.Duplicate || r.ID != "evt_1" {
			t.Fatalf("identical replay by ID: %+v", r)
		}
		// Enqueue, which cannot say, returns the stored ID without error.
		if id, err := b.ob.Enqueue(b.ctx, db.DB, byKey); err != nil || id != r1.ID {
			t.Fatalf("Enqueue of a duplicate: %q, %v", id, err)
		}
		if n := b.count("SELECT count(*) FROM txhook_events"); n != 2 {
			t.Fatalf("events = %d, want 2", n)
		}
	})
}

// TestEnqueueSameKeyRace enqueues one idempotency key from two transactions
// at once. On PostgreSQL the second insert is made to wait on the first
// transaction's uncommitted row before that one ends; on SQLite the second
// transaction waits for the write lock.
func TestEnqueueSameKeyRace(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		ev := outbox.Event{Tenant: "m", IdempotencyKey: "pay_9", Type: "payment.succeeded", Payload: []byte(`{"amount":9}`)}
		other := ev
		other.Payload = []byte(`{"amount":10}`)

		for _, c := range []struct {
			name   string
			second outbox.Event
			commit bool // the first transaction commits, or rolls back
		}{
			{"identical, first commits", ev, true},
			{"other payload, first commits", other, true},
			{"identical, first rolls back", ev, false},
		} {
			key := "race_" + strings.ReplaceAll(c.name, " ", "_")
			first, second := ev, c.second
			first.IdempotencyKey, second.IdempotencyKey = key, key

			tx1 := b.businessTx(c.name + " 1")
			r1, err := b.ob.EnqueueDetail(b.ctx, tx1, first)
			if err != nil || r1.Duplicate {
				t.Fatalf("%s: first: %+v, %v", c.name, r1, err)
			}

			type result struct {
				r   outbox.Enqueued
				err error
				tx  *sql.Tx
			}
			pid := make(chan int, 1)
			done := make(chan result, 1)
			go func() {
				tx2, err := db.BeginTx(b.ctx, nil) // on SQLite this waits for tx1
				if err != nil {
					pid <- 0
					done <- result{err: err}
					return
				}
				var p int
				if db.Backend.Postgres() {
					if err := tx2.QueryRowContext(b.ctx, "SELECT pg_backend_pid()").Scan(&p); err != nil {
						pid <- 0
						done <- result{err: err, tx: tx2}
						return
					}
				}
				pid <- p
				r, err := b.ob.EnqueueDetail(b.ctx, tx2, second)
				done <- result{r, err, tx2}
			}()
			if db.Backend.Postgres() {
				p := <-pid
				if p == 0 {
					res := <-done
					t.Fatalf("%s: second transaction: %v", c.name, res.err)
				}
				// Let the second insert block on tx1's row before tx1 ends.
				b.eventually("the second insert to wait on the first transaction", func() bool {
					var waiting sql.NullString
					_ = db.QueryRowContext(b.ctx, `SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1`, p).Scan(&waiting)
					return waiting.String == "Lock"
				})
				select {
				case res := <-done:
					t.Fatalf("%s: second enqueue returned before the first transaction ended: %+v, %v", c.name, res.r, res.err)
				default:
				}
			}
			if c.commit {
				err = tx1.Commit()
			} else {
				err = tx1.Rollback()
			}
			if err != nil {
				t.Fatal(err)
			}

			var res result
			select {
			case res = <-done:
			case <-time.After(waitFor):
				t.Fatalf("%s: second enqueue still blocked", c.name)
			}
			if res.tx == nil {
				t.Fatalf("%s: second transaction: %v", c.name, res.err)
			}
			switch {
			case !c.commit:
				if res.err != nil || res.r.Duplicate || res.r.ID == r1.ID {
					res.tx.Rollback()
					t.Fatalf("%s: second after rollback: %+v, %v; want a new event", c.name, res.r, res.err)
				}
			case string(second.Payload) == string(first.Payload):
				if res.err != nil || !res.r.Duplicate || res.r.ID != r1.ID {
					res.tx.Rollback()
					t.Fatalf("%s: second: %+v, %v; want duplicate of %s", c.name, res.r, res.err, r1.ID)
				}
			default:
				if !errors.Is(res.err, outbox.ErrIdempotencyConflict) {
					res.tx.Rollback()
					t.Fatalf("%s: second: %+v, %v; want ErrIdempotencyConflict", c.name, res.r, res.err)
				}
			}
			var one int
			if err := res.tx.QueryRowContext(b.ctx, "SELECT 1").Scan(&one); err != nil {
				res.tx.Rollback()
				t.Fatalf("%s: second transaction unusable: %v", c.name, err)
			}
			if err := res.tx.Commit(); err != nil {
				t.Fatalf("%s: second commit: %v", c.name, err)
			}
			if n := b.count("SELECT count(*) FROM txhook_events WHERE idempotency_key = ?", key); n != 1 {
				t.Fatalf("%s: %d events for the key, want 1", c.name, n)
			}
		}
	})
}
