package dlq_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/txhook/txhook/dlq"
	"github.com/txhook/txhook/internal/testdb"
)

func TestQueueListFiltersAndPages(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		e := newUIEnv(t, db, "/", false)
		q := dlq.New(e.ob)
		a := e.endpoint("acme", "https://93.184.216.34/a")
		g := e.endpoint("globex", "https://93.184.216.34/g")
		base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
		// Seven dead letters for acme an hour apart (two of another type),
		// three for globex.
		for i := range 7 {
			typ := "payment.failed"
			if i%3 == 0 {
				typ = "refund.failed"
			}
			e.deadLetter(a, fmt.Sprintf("a%d", i), typ, base.Add(time.Duration(i)*time.Hour))
		}
		for i := range 3 {
			e.deadLetter(g, fmt.Sprintf("g%d", i), "payment.failed", base.Add(time.Duration(i)*time.Hour))
		}

		// Pages of three, newest first, over acme only.
		var ids []string
		cursor := ""
		for pages := 0; ; pages++ {
			p, err := q.List(e.ctx, dlq.Filter{Tenant: "acme"}, cursor, 3)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range p.Entries {
				ids = append(ids, x.EventID)
				if x.Tenant != "acme" || x.EndpointID != a.ID || x.Attempts != 2 || x.LastStatus != 500 {
					t.Fatalf("entry %+v", x)
				}
			}
			if p.Next == "" {
				if pages != 2 {
					t.Fatalf("%d pages, want 3", pages+1)
				}
				break
			}
			cursor = p.Next
		}
		if fmt.Sprint(ids) != "[a6 a5 a4 a3 a2 a1 a0]" {
			t.Fatalf("pages gave %v", ids)
		}

		count := func(f dlq.Filter) int {
			n, err := q.Count(e.ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		for _, c := range []struct {
			f    dlq.Filter
			want int
		}{
			{dlq.Filter{}, 10},
			{dlq.Filter{EndpointID: g.ID}, 3},
			{dlq.Filter{Tenant: "acme", EventType: "refund.failed"}, 3},
			{dlq.Filter{Since: base.Add(2 * time.Hour)}, 6},                             // a2..a6 g2
			{dlq.Filter{Since: base.Add(time.Hour), Until: base.Add(3 * time.Hour)}, 4}, // a1 a2 g1 g2
			{dlq.Filter{Tenant: "nobody"}, 0},
		} {
			if got := count(c.f); got != c.want {
				t.Errorf("count %+v = %d, want %d", c.f, got, c.want)
			}
			p, err := q.List(e.ctx, c.f, "", 100)
			if err != nil || len(p.Entries) != c.want {
				t.Errorf("list %+v: %d entries, %v", c.f, len(p.Entries), err)
			}
		}
		if _, err := q.List(e.ctx, dlq.Filter{}, "not-a-cursor!", 10); !errors.Is(err, dlq.ErrInvalidCursor) {
			t.Fatalf("bad cursor: %v", err)
		}
	})
}

func TestQueueReplayPurgeAndErrors(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		e := newUIEnv(t, db, "/", false)
		q := dlq.New(e.ob)
		a := e.endpoint("acme", "https://93.184.216.34/a")
		gone := e.endpoint("acme", "https://93.184.216.34/gone")
		now := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
		one := e.deadLetter(a, "e1", "payment.failed", now)
		e.deadLetter(a, "e2", "payment.failed", now)
		e.deadLetter(a, "e3", "refund.failed", now)
		orphan := e.deadLetter(gone, "e4", "payment.failed", now)
		if err := e.ob.DeleteEndpoint(e.ctx, gone.ID); err != nil {
			t.Fatal(err)
		}

		d, err := q.Get(e.ctx, one)
		if err != nil || d.EventID != "e1" || len(d.Attempts) != 2 || string(d.Payload) != `{"payment_id":"pay_e1","amount":1200}` {
			t.Fatalf("get: %+v %v", d, err)
		}
		if _, err := q.Get(e.ctx, 999999); !errors.Is(err, dlq.ErrNotFound) {
			t.Fatalf("get missing: %v", err)
		}

		fresh, err := q.Replay(e.ctx, one)
		if err != nil || fresh == one {
			t.Fatalf("replay: %d %v", fresh, err)
		}
		if n := e.count("SELECT count(*) FROM txhook_deliveries WHERE id = ? AND event_id = 'e1' AND state = 'pending' AND attempts = 0", fresh); n != 1 {
			t.Fatalf("replayed delivery not queued")
		}
		if _, err := q.Replay(e.ctx, one); !errors.Is(err, dlq.ErrNotFound) {
			t.Fatalf("second replay: %v", err)
		}
		if _, err := q.Replay(e.ctx, orphan); !errors.Is(err, dlq.ErrEndpointGone) {
			t.Fatalf("replay with endpoint gone: %v", err)
		}

		// Replay all matching a filter: only refunds.
		n, err := q.ReplayAll(e.ctx, dlq.Filter{EventType: "refund.failed"})
		if err != nil || n != 1 {
			t.Fatalf("replay all refunds: %d %v", n, err)
		}
		// Replaying everything skips the orphan, which stays listed.
		n, err = q.ReplayAll(e.ctx, dlq.Filter{})
		if err != nil || n != 1 {
			t.Fatalf("replay all: %d %v", n, err)
		}
		if left, _ := q.Count(e.ctx, dlq.Filter{}); left != 1 {
			t.Fatalf("left %d, want the orphan", left)
		}
		if err := q.Purge(e.ctx, orphan); err != nil {
			t.Fatal(err)
		}
		if err := q.Purge(e.ctx, orphan); !errors.Is(err, dlq.ErrNotFound) {
			t.Fatalf("second purge: %v", err)
		}
		for i := range 5 {
			e.deadLetter(a, fmt.Sprintf("p%d", i), "payment.failed", now)
		}
		if n, err := q.PurgeAll(e.ctx, dlq.Filter{Tenant: "acme"}); err != nil || n != 5 {
			t.Fatalf("purge all: %d %v", n, err)
		}
		// Purging keeps the event and the attempt log.
		if n := e.count("SELECT count(*) FROM txhook_events WHERE id = 'p0'"); n != 1 {
			t.Fatalf("purge removed the event")
		}
	})
}
