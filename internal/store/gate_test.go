package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/procstat"
	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/internal/testdb"
)

// TestGateSharedAcrossRelays: the gate's tokens, slots and circuit are the
// endpoint's, whichever relay asks, on every backend.
func TestGateSharedAcrossRelays(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		st := openStore(t, db)
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		ask := func(relay string, at time.Time) store.GateGrant {
			t.Helper()
			g, err := st.GateAcquire(ctx, store.GateAsk{Endpoint: "ep_gate", Relay: relay, Now: at, Rate: 10, Burst: 3,
				MaxInFlight: 2, SlotLease: 30 * time.Second, Threshold: 2})
			if err != nil {
				t.Fatal(err)
			}
			return g
		}
		finish := func(relay string, at time.Time, g store.GateGrant, fault bool) store.GateState {
			t.Helper()
			s, err := st.GateFinish(ctx, store.GateFinish{Endpoint: "ep_gate", Relay: relay, Now: at, Slot: g.Slot, Probe: g.Probe,
				Fault: fault, Answered: !fault, Threshold: 2, Cooldown: 10 * time.Second, MaxCooldown: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		// The bucket starts empty and fills at 10/s up to its burst of 3.
		if g := ask("a", now); g.OK || g.Reason != "rate" {
			t.Fatalf("first ask: %+v, want rate (the bucket starts empty)", g)
		}
		now = now.Add(time.Second)
		// Two slots in all: relay b finds none once a has two.
		a1, a2 := ask("a", now), ask("a", now)
		if !a1.OK || !a2.OK || !a1.Slot {
			t.Fatalf("first two asks: %+v %+v", a1, a2)
		}
		if b := ask("b", now); b.OK || b.Reason != "busy" {
			t.Fatalf("third ask, of another relay: %+v, want busy", b)
		}
		finish("a", now, a1, false)
		// One token left of the burst of 3.
		b1 := ask("b", now)
		if !b1.OK {
			t.Fatalf("b after a slot came back: %+v", b1)
		}
		finish("a", now, a2, false)
		finish("b", now, b1, false)
		if b := ask("b", now); b.OK || b.Reason != "rate" {
			t.Fatalf("fourth request at once, burst 3: %+v, want rate", b)
		}
		// 100 ms later, one token at 10/s.
		later := now.Add(100 * time.Millisecond)
		g := ask("b", later)
		if !g.OK {
			t.Fatalf("a token later: %+v", g)
		}
		// Two faults in a row, from two relays, open the circuit for both.
		finish("b", later, g, true)
		if s := finish("a", later, store.GateGrant{}, true); s.OpenUntil.IsZero() {
			t.Fatalf("after 2 faults: %+v, want open", s)
		}
		if g := ask("a", later.Add(time.Second)); g.OK || g.Reason != "circuit" {
			t.Fatalf("ask while open: %+v", g)
		}
		// A slot held by a relay that died stops counting when its lease ends.
		after := later.Add(11 * time.Second)
		p := ask("a", after)
		if !p.OK || !p.Probe {
			t.Fatalf("after the cooldown: %+v, want the probe", p)
		}
		if g := ask("b", after); g.OK || g.Reason != "circuit" {
			t.Fatalf("second ask while a probe is out: %+v", g)
		}
		if s := finish("a", after, p, false); !s.OpenUntil.IsZero() || s.Failures != 0 {
			t.Fatalf("after a good probe: %+v", s)
		}
		d1, d2 := ask("dead", after.Add(time.Second)), ask("dead", after.Add(time.Second))
		if !d1.OK || !d2.OK {
			t.Fatalf("%+v %+v", d1, d2)
		}
		if g := ask("b", after.Add(2*time.Second)); g.OK {
			t.Fatalf("with a dead relay's slots leased: %+v", g)
		}
		if g := ask("b", after.Add(40*time.Second)); !g.OK {
			t.Fatalf("once the dead relay's lease ended: %+v", g)
		}
		// A mark keeps the later of two times, on both dialects.
		for _, at := range []time.Time{after.Add(time.Hour), after.Add(time.Minute)} {
			if err := st.GateBlock(ctx, "ep_block", at); err != nil {
				t.Fatal(err)
			}
		}
		var until store.Time
		if err := st.DB.QueryRowContext(ctx, st.Rebind(`SELECT blocked_until FROM txhook_endpoint_gates WHERE endpoint_id = ?`), "ep_block").Scan(&until); err != nil {
			t.Fatal(err)
		}
		if !until.Equal(after.Add(time.Hour)) {
			t.Fatalf("blocked until %v, want %v", until.Time, after.Add(time.Hour))
		}
	})
}

// TestGateConcurrentAsksNeverExceedCap: relays asking at once on their
// own connections never hold more slots than the cap.
func TestGateConcurrentAsksNeverExceedCap(t *testing.T) {
	testdb.EachPostgres(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		st := openStore(t, db)
		now := time.Now()
		var mu sync.Mutex
		held, peak := 0, 0
		var wg sync.WaitGroup
		for r := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				relay := string(rune('a' + r))
				for range 20 {
					g, err := st.GateAcquire(ctx, store.GateAsk{Endpoint: "ep_cap", Relay: relay, Now: now, MaxInFlight: 3, SlotLease: time.Minute})
					if err != nil {
						t.Error(err)
						return
					}
					if !g.OK {
						continue
					}
					mu.Lock()
					held++
					peak = max(peak, held)
					mu.Unlock()
					mu.Lock()
					held--
					mu.Unlock()
					if _, err := st.GateFinish(ctx, store.GateFinish{Endpoint: "ep_cap", Relay: relay, Now: now, Slot: true, Answered: true}); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		n, err := st.GateSlots(ctx, "ep_cap", now)
		if err != nil || n != 0 {
			t.Fatalf("slots left: %d, %v", n, err)
		}
		if peak > 3 {
			t.Fatalf("peak %d slots, cap 3", peak)
		}
	})
}

// BenchmarkPGGateExchange measures one request's gate exchanges (acquire
// a token and a slot, then finish), on one connection, with the
// PostgreSQL backend's CPU per request (read from /proc: a server on this
// machine only).
//
//	TXHOOK_TEST_POSTGRES_DSN=... go test -run '^$' -bench PGGateExchange -benchtime 5000x ./internal/store
func BenchmarkPGGateExchange(b *testing.B) {
	db := testdb.Postgres(b, testdb.PGX.Driver)
	db.DB.SetMaxOpenConns(1)
	ctx := context.Background()
	st := openStore(b, db)
	var pid int
	if err := st.DB.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	// The first ask makes the gate row, its bucket empty.
	if _, err := st.GateAcquire(ctx, store.GateAsk{Endpoint: "ep_bench", Relay: "r", Now: now, Rate: 1, Burst: 1, MaxInFlight: 4, SlotLease: 30 * time.Second}); err != nil {
		b.Fatal(err)
	}
	var acquireWall, finishWall time.Duration
	cpu0 := procstat.Ticks(pid)
	b.ResetTimer()
	for i := range b.N {
		at := now.Add(time.Duration(i+1) * time.Second) // always a token (the bucket starts empty)
		t0 := time.Now()
		g, err := st.GateAcquire(ctx, store.GateAsk{Endpoint: "ep_bench", Relay: "r", Now: at, Rate: 1, Burst: 1, MaxInFlight: 4, SlotLease: 30 * time.Second, Threshold: 5})
		if err != nil || !g.OK {
			b.Fatal(g, err)
		}
		t1 := time.Now()
		acquireWall += t1.Sub(t0)
		if _, err := st.GateFinish(ctx, store.GateFinish{Endpoint: "ep_bench", Relay: "r", Now: at, Slot: g.Slot, Answered: true, Threshold: 5}); err != nil {
			b.Fatal(err)
		}
		finishWall += time.Since(t1)
	}
	b.StopTimer()
	cpu := procstat.Ticks(pid) - cpu0
	b.ReportMetric(float64(acquireWall.Microseconds())/float64(b.N), "µs-acquire/op")
	b.ReportMetric(float64(finishWall.Microseconds())/float64(b.N), "µs-finish/op")
	if cpu0 >= 0 {
		b.ReportMetric(float64(cpu)*1e6/procstat.ClockTicks/float64(b.N), "µs-pg-cpu/op")
	}
}
