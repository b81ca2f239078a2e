package outbox_test

import (
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txhook/txhook/dlq"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// The target rules of a relay that refuses loopback: plain http is
// allowed (the receivers are httptest servers), private networks are not
// but one that no test uses.
var strictRules = outbox.Config{AllowHTTP: true, AllowedTargets: []netip.Prefix{netip.MustParsePrefix("10.99.0.0/16")}}

// refusalRow is what the tests read of a refused delivery.
type refusalRow struct {
	id        int64
	state     string
	attempts  int
	lastError string
	refused   store_time // refused_since; zero when NULL
}

func (b *bundle) refusal(eventID string) refusalRow {
	b.t.Helper()
	var r refusalRow
	if err := b.db.QueryRowContext(b.ctx, b.rebind(`SELECT id, state, attempts, last_error, refused_since FROM txhook_deliveries
WHERE event_id = ? ORDER BY id DESC LIMIT 1`), eventID).Scan(&r.id, &r.state, &r.attempts, &r.lastError, &r.refused); err != nil {
		b.t.Fatalf("delivery of %s: %v", eventID, err)
	}
	return r
}

// backdateRefusal moves the start of the refusal of every delivery of
// endpointID back by d, by the database's clock: what waiting d would
// have done.
func (b *bundle) backdateRefusal(endpointID string, d time.Duration) {
	b.t.Helper()
	q := `UPDATE txhook_deliveries SET refused_since = refused_since - ? * interval '1 microsecond' WHERE endpoint_id = ? AND refused_since IS NOT NULL`
	if !b.db.Backend.Postgres() {
		q = `UPDATE txhook_deliveries SET refused_since = refused_since - ? WHERE endpoint_id = ? AND refused_since IS NOT NULL`
	}
	if _, err := b.db.ExecContext(b.ctx, b.rebind(q), d.Microseconds(), endpointID); err != nil {
		b.t.Fatal(err)
	}
}

// dueNow makes endpointID's pending deliveries due at once, instead of
// RefusedRetryDelay after their refusal, and wakes r.
func (b *bundle) dueNow(endpointID string, r *outbox.Relay) {
	b.t.Helper()
	if _, err := b.db.ExecContext(b.ctx, b.rebind(`UPDATE txhook_deliveries SET next_attempt_at = ? WHERE endpoint_id = ? AND state = 'pending'`),
		b.ts(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)), endpointID); err != nil {
		b.t.Fatal(err)
	}
	r.Wake()
}

// notices collects a relay's dead-letter and attempt notices.
type notices struct {
	mu       sync.Mutex
	dead     []outbox.DeadLetterNotice
	attempts []outbox.AttemptNotice
}

func (n *notices) cfg(cfg outbox.RelayConfig) outbox.RelayConfig {
	cfg.OnDeadLetter = func(x outbox.DeadLetterNotice) { n.mu.Lock(); n.dead = append(n.dead, x); n.mu.Unlock() }
	cfg.OnAttempt = func(x outbox.AttemptNotice) { n.mu.Lock(); n.attempts = append(n.attempts, x); n.mu.Unlock() }
	return cfg
}

func (n *notices) deadLetters() []outbox.DeadLetterNotice {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]outbox.DeadLetterNotice(nil), n.dead...)
}

func (n *notices) outcomes() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for _, a := range n.attempts {
		out = append(out, a.Outcome)
	}
	return out
}

// A delivery whose endpoint URL every relay refuses waits, unspent, while
// another relay might allow it, but not forever: once refused for the
// relay's RefusedLimit (by default the retry schedule's span, 24 hours)
// by the database's clock, with no attempt to the endpoint meanwhile, it
// is dead-lettered with reason "refused", told as such to OnDeadLetter,
// OnAttempt and the stats, listed so by dlq, and replayable: once the
// rules allow the URL, the replay delivers it. When the refusals began is
// the delivery's, in the database: a second relay, started after the
// first stopped, dead-letters on the first one's start. Before this, the
// delivery stayed pending forever.
func TestRefusedTooLongIsDeadLettered(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		rc := newReceiver(t, nil)
		ep := b.endpoint("m", rc.URL)
		strict := b.outboxOn(strictRules)
		var first notices
		r1 := b.startRelay(strict, first.cfg(outbox.RelayConfig{ID: "strict-1"}))
		ev := b.enqueue(outbox.Event{Tenant: "m", Type: "t", Payload: []byte(`{}`)})

		b.eventually("the first refusal", func() bool { return r1.Stats().Refused == 1 })
		d := b.refusal(ev)
		if d.state != outbox.StatePending || d.attempts != 0 || d.refused.IsZero() || !strings.Contains(d.lastError, "relay strict-1") {
			t.Fatalf("after the first refusal: %+v, want pending, no attempt, refused_since set", d)
		}
		since := d.refused.Time
		ctx := b.ctx
		if err := r1.Stop(ctx); err != nil {
			t.Fatal(err)
		}

		// Another relay, the default limit (24 h, the span of
		// retry.Default): refused for 23 hours, it still waits, and the
		// start of its refusals stays where it was.
		var second notices
		r2 := b.startRelay(strict, second.cfg(outbox.RelayConfig{ID: "strict-2"}))
		b.backdateRefusal(ep.ID, 23*time.Hour)
		b.dueNow(ep.ID, r2)
		b.eventually("the second relay's refusal", func() bool { return r2.Stats().Refused == 1 })
		d = b.refusal(ev)
		if d.state != outbox.StatePending || !d.refused.Equal(since.Add(-23*time.Hour)) || !strings.Contains(d.lastError, "relay strict-2") {
			t.Fatalf("refused for 23h: %+v, want pending, refused since %v", d, since.Add(-23*time.Hour))
		}

		// Past 24 hours: dead-lettered, reason refused.
		b.backdateRefusal(ep.ID, 2*time.Hour)
		b.dueNow(ep.ID, r2)
		// The counter goes up before the relay calls OnDeadLetter and
		// OnAttempt: wait for the callbacks too.
		b.eventually("the refusal dead-lettered", func() bool {
			return r2.Stats().DeadLetteredRefused == 1 && len(second.deadLetters()) == 1 && len(second.outcomes()) == 1
		})
		d = b.refusal(ev)
		if d.state != outbox.StateDead || d.attempts != 0 || d.refused.IsZero() {
			t.Fatalf("refused for 25h: %+v, want dead with refused_since kept", d)
		}
		if s := r2.Stats(); s.DeadLettered != 1 || s.Refused != 1 || s.Failed != 0 {
			t.Fatalf("stats of the second relay: %+v", s)
		}
		dead := second.deadLetters()
		if len(dead) != 1 || dead[0].Reason != outbox.DeadReasonRefused || dead[0].EventID != ev || dead[0].Attempts != 0 ||
			!strings.Contains(dead[0].LastError, "target rules") {
			t.Fatalf("OnDeadLetter got %+v", dead)
		}
		if got := second.outcomes(); len(got) != 1 || got[0] != outbox.OutcomeDeadLetteredRefused {
			t.Fatalf("OnAttempt outcomes %v, want one %s", got, outbox.OutcomeDeadLetteredRefused)
		}
		q := dlq.New(b.ob)
		page, err := q.List(ctx, dlq.Filter{Reason: outbox.DeadReasonRefused}, "", 10)
		if err != nil || len(page.Entries) != 1 || page.Entries[0].Reason != outbox.DeadReasonRefused || page.Entries[0].EventID != ev {
			t.Fatalf("refused dead letters: %+v, %v", page.Entries, err)
		}
		if n, err := q.Count(ctx, dlq.Filter{Reason: outbox.DeadReasonFailed}); err != nil || n != 0 {
			t.Fatalf("%d dead letters failed (%v), want 0", n, err)
		}
		counts, err := b.ob.RefusedDeadLetterCounts(ctx)
		if err != nil || counts[ep.ID] != 1 || len(counts) != 1 {
			t.Fatalf("RefusedDeadLetterCounts = %v, %v", counts, err)
		}
		if len(rc.requests()) != 0 {
			t.Fatalf("the receiver got %d requests", len(rc.requests()))
		}
		if err := r2.Stop(ctx); err != nil {
			t.Fatal(err)
		}

		// The rules fixed (a relay that allows the URL), the replay of
		// the refused dead letters delivers it.
		if n, err := q.ReplayAll(ctx, dlq.Filter{Reason: outbox.DeadReasonRefused}); err != nil || n != 1 {
			t.Fatalf("ReplayAll = %d, %v", n, err)
		}
		b.relay(outbox.RelayConfig{ID: "fixed"})
		got := recv(t, rc.got, "the replayed delivery")
		if id := got.Header.Get(outbox.HeaderEventID); id != ev {
			t.Fatalf("delivered %s, want %s", id, ev)
		}
		b.eventually("the replay succeeded", func() bool { return b.refusal(ev).state == outbox.StateSucceeded })
		if d := b.refusal(ev); !d.refused.IsZero() {
			t.Fatalf("the replayed delivery is marked refused: %+v", d)
		}
	})
}

// A relay whose rules refuse the URL must not dead-letter a delivery that
// another relay, whose rules allow it, would send: while any relay has
// attempted the endpoint within RefusedLimit, refusals only hand the
// delivery back, however long it has been refused itself; the relay that
// allows it then sends it, which ends the refusal. A negative
// RefusedLimit never dead-letters.
func TestRefusalByOneRelayDoesNotDeadLetterWhatAnotherSends(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		rc := newReceiver(t, nil)
		ep := b.endpoint("m", rc.URL)
		ctx := b.ctx

		// The relay that allows the URL delivers one event now.
		lax, err := b.ob.NewRelay(outbox.RelayConfig{ID: "lax"})
		if err != nil {
			t.Fatal(err)
		}
		if err := lax.Start(ctx); err != nil {
			t.Fatal(err)
		}
		b.enqueue(outbox.Event{Tenant: "m", Type: "t", Payload: []byte(`{"n":1}`)})
		recv(t, rc.got, "the lax relay's delivery")
		b.eventually("the endpoint's attempt recorded", func() bool {
			return b.count(`SELECT count(*) FROM txhook_endpoints WHERE id = ? AND last_success_at IS NOT NULL`, ep.ID) == 1
		})
		if err := lax.Stop(ctx); err != nil {
			t.Fatal(err)
		}

		// The strict relay refuses the next one, for two days by its
		// clock: the lax relay sent to the endpoint within the hour, so
		// the refusal hands it back.
		strict := b.startRelay(b.outboxOn(strictRules), outbox.RelayConfig{ID: "strict", RefusedLimit: time.Hour})
		ev := b.enqueue(outbox.Event{Tenant: "m", Type: "t", Payload: []byte(`{"n":2}`)})
		b.eventually("the first refusal", func() bool { return strict.Stats().Refused == 1 })
		b.backdateRefusal(ep.ID, 48*time.Hour)
		b.dueNow(ep.ID, strict)
		b.eventually("the second refusal", func() bool { return strict.Stats().Refused == 2 })
		if d := b.refusal(ev); d.state != outbox.StatePending || d.refused.IsZero() {
			t.Fatalf("refused while another relay sends to the endpoint: %+v, want pending", d)
		}
		if s := strict.Stats(); s.DeadLettered != 0 {
			t.Fatalf("strict relay dead-lettered: %+v", s)
		}

		// The lax relay back: it sends the delivery, which ends its
		// refusal.
		if err := strict.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		laxAgain := b.relay(outbox.RelayConfig{ID: "lax-again"})
		b.dueNow(ep.ID, laxAgain)
		b.eventually("the delivery by the lax relay", func() bool { return b.refusal(ev).state == outbox.StateSucceeded })
		if d := b.refusal(ev); d.attempts != 1 || !d.refused.IsZero() {
			t.Fatalf("after the lax relay's attempt: %+v, want 1 attempt and no refusal", d)
		}

		// RefusedLimit < 0: refused for years and nobody sending, still
		// handed back.
		if err := laxAgain.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		never := b.startRelay(b.outboxOn(strictRules), outbox.RelayConfig{ID: "never", RefusedLimit: -1})
		ev3 := b.enqueue(outbox.Event{Tenant: "m", Type: "t", Payload: []byte(`{"n":3}`)})
		b.eventually("the refusal", func() bool { return never.Stats().Refused == 1 })
		b.backdateRefusal(ep.ID, 5*365*24*time.Hour)
		if _, err := b.db.ExecContext(ctx, b.rebind(`UPDATE txhook_endpoints SET last_success_at = NULL, last_failure_at = NULL WHERE id = ?`), ep.ID); err != nil {
			t.Fatal(err)
		}
		b.dueNow(ep.ID, never)
		b.eventually("the second refusal", func() bool { return never.Stats().Refused == 2 })
		if d := b.refusal(ev3); d.state != outbox.StatePending || never.Stats().DeadLettered != 0 {
			t.Fatalf("with RefusedLimit < 0: %+v, stats %+v", d, never.Stats())
		}
	})
}

// The deliveries of an ordering key wait, blocked, behind the first: when
// the first is dead-lettered for refusal, the next ones inherit its
// refusal instead of each waiting RefusedLimit of its own in turn, so the
// whole line reaches the dead-letter table in order.
func TestRefusedOrderedLineDrains(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		rc := newReceiver(t, nil)
		ep := b.endpoint("m", rc.URL)
		var evs []string
		for i := range 3 {
			evs = append(evs, b.enqueue(outbox.Event{Tenant: "m", Type: "t", Payload: []byte(`{}`), OrderingKey: "k", ID: "evt_line_" + itoa(i)}))
		}
		r := b.startRelay(b.outboxOn(strictRules), outbox.RelayConfig{ID: "strict", RefusedLimit: time.Hour})
		b.eventually("the first refusal, the others blocked behind it", func() bool {
			return r.Stats().Refused == 1 &&
				b.count(`SELECT count(*) FROM txhook_deliveries WHERE endpoint_id = ? AND state = 'blocked'`, ep.ID) == 2
		})
		b.backdateRefusal(ep.ID, 2*time.Hour)
		b.dueNow(ep.ID, r)
		b.eventually("the whole line dead-lettered", func() bool { return r.Stats().DeadLetteredRefused == 3 })
		page, err := dlq.New(b.ob).List(b.ctx, dlq.Filter{Reason: outbox.DeadReasonRefused}, "", 10)
		if err != nil || len(page.Entries) != 3 {
			t.Fatalf("refused dead letters: %+v, %v", page.Entries, err)
		}
		// Newest first: the line's order, reversed.
		for i, e := range page.Entries {
			if e.EventID != evs[2-i] {
				t.Fatalf("dead letter %d is %s, want %s (order %v)", i, e.EventID, evs[2-i], page.Entries)
			}
		}
	})
}
