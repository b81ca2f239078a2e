package sched

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// harness drives a Scheduler with a hand-moved clock.
type harness struct {
	t   *testing.T
	s   *Scheduler
	now time.Time
	n   int
}

func newHarness(t *testing.T, cfg Config) *harness {
	if cfg.Rand == nil {
		cfg.Rand = func() float64 { return 0 }
	}
	return &harness{t: t, s: New(cfg), now: t0}
}

func (h *harness) job(tenant, ep string, l Limits) *Job {
	h.n++
	return &Job{Tenant: tenant, Endpoint: ep, Limits: l, Value: h.n}
}

// add offers a job and returns it with the decision.
func (h *harness) add(tenant, ep string, l Limits) (*Job, bool, time.Time) {
	j := h.job(tenant, ep, l)
	hold, at := h.s.Add(h.now, j)
	return j, hold, at
}

// warm makes ep known to answer fast, with its ramp at full width.
func (h *harness) warm(tenant, ep string, l Limits) {
	h.t.Helper()
	for range 8 {
		_, hold, _ := h.add(tenant, ep, l)
		if !hold {
			h.t.Fatalf("warm-up job for %s not held", ep)
		}
		j := h.s.Next(h.now)
		if j == nil {
			h.t.Fatalf("warm-up job for %s not started", ep)
		}
		h.s.Done(h.now, j, Answered, 2*time.Millisecond)
	}
}

func (h *harness) advance(d time.Duration) { h.now = h.now.Add(d) }

// startAll starts every job that can start now.
func (h *harness) startAll() []*Job {
	var out []*Job
	for {
		j := h.s.Next(h.now)
		if j == nil {
			return out
		}
		out = append(out, j)
	}
}

func TestHealthyTenantGetsTheNextSlot(t *testing.T) {
	h := newHarness(t, Config{Concurrency: 4, EndpointConcurrency: 4})
	h.warm("busy", "ep_busy", Limits{})
	h.warm("calm", "ep_calm", Limits{})
	held := 0
	for range 40 {
		if _, hold, _ := h.add("busy", "ep_busy", Limits{}); hold {
			held++
		}
	}
	if held == 0 {
		t.Fatal("no job of a fast endpoint held")
	}
	running := h.startAll()
	if len(running) != 4 {
		t.Fatalf("started %d, want 4 (Concurrency)", len(running))
	}
	calm, hold, _ := h.add("calm", "ep_calm", Limits{})
	if !hold {
		t.Fatal("calm tenant's job given back")
	}
	// One slot frees: it goes to the calm tenant, ahead of the busy
	// tenant's queue.
	h.s.Done(h.now, running[0], Answered, time.Millisecond)
	if j := h.s.Next(h.now); j != calm {
		t.Fatalf("next = %v, want the calm tenant's job", j.Value)
	}
}

func TestRoundRobinOverEndpointsOfATenant(t *testing.T) {
	h := newHarness(t, Config{Concurrency: 1})
	for _, ep := range []string{"a", "b", "c"} {
		h.warm("m", ep, Limits{})
	}
	for range 3 {
		for _, ep := range []string{"a", "a", "a", "b", "c"} {
			h.add("m", ep, Limits{})
		}
	}
	var order string
	for range 6 {
		j := h.s.Next(h.now)
		if j == nil {
			t.Fatal("nothing to start")
		}
		order += j.Endpoint
		h.s.Done(h.now, j, Answered, time.Millisecond)
	}
	if order != "abcabc" {
		t.Fatalf("order %q, want abcabc", order)
	}
}

func TestSlowEndpointsShareAtMostSlowShare(t *testing.T) {
	h := newHarness(t, Config{Concurrency: 8, SlowShare: 4, TenantShare: 8})
	h.warm("calm", "ep_calm", Limits{})
	// A hostile tenant with 6 endpoints never seen before, each with a
	// queue: what they hold and start together stays within SlowShare.
	for i := range 6 {
		for range 100 {
			h.add("evil", fmt.Sprintf("hang_%d", i), Limits{})
		}
	}
	if w := h.s.Waiting(); w > 4 {
		t.Fatalf("%d jobs of unknown endpoints held, want at most SlowShare 4", w)
	}
	hanging := h.startAll()
	if len(hanging) == 0 || len(hanging) > 4 {
		t.Fatalf("%d requests to unknown endpoints started, want 1..SlowShare 4", len(hanging))
	}
	// They hang; time passes; the calm tenant's work still starts at once.
	h.advance(3 * time.Second)
	for range 10 {
		j, hold, _ := h.add("calm", "ep_calm", Limits{})
		if !hold {
			t.Fatal("calm job given back")
		}
		if got := h.s.Next(h.now); got != j {
			t.Fatalf("calm job did not start at once")
		}
		h.s.Done(h.now, j, Answered, time.Millisecond)
	}
	// The hanging requests time out: the endpoints are slow now, and their
	// new jobs go straight back to the database.
	for _, j := range hanging {
		h.s.Done(h.now, j, Fault, 5*time.Second)
	}
	h.s.Expire(h.now.Add(2 * time.Second))
	for i := range 6 {
		_, hold, at := h.add("evil", fmt.Sprintf("hang_%d", i), Limits{})
		if hold && i < 4 {
			continue // a slow endpoint may still get one slot at once
		}
		if !hold && !at.After(h.now) {
			t.Fatalf("slow endpoint's job given back due now")
		}
	}
}

func TestRateLimitedBacklogGoesBackSpaced(t *testing.T) {
	h := newHarness(t, Config{Concurrency: 32, MaxPostpone: 10 * time.Minute})
	lim := Limits{Rate: 0.01}
	var ats []time.Time
	for range 80 {
		_, hold, at := h.add("slowpay", "ep_rl", lim)
		if hold {
			t.Fatal("a job that cannot start for 100 s was held")
		}
		ats = append(ats, at)
	}
	if h.s.Waiting() != 0 {
		t.Fatalf("%d held", h.s.Waiting())
	}
	for i := range 6 {
		want := h.now.Add(time.Duration(i+1) * 100 * time.Second)
		if !ats[i].Equal(want) {
			t.Fatalf("job %d back at +%v, want +%v", i, ats[i].Sub(h.now), want.Sub(h.now))
		}
	}
	for i, at := range ats[6:] {
		if d := at.Sub(h.now); d < 5*time.Minute || d > 10*time.Minute {
			t.Fatalf("job %d back at +%v, want within MaxPostpone's second half", i+6, d)
		}
	}
	// Another tenant is not held up at all.
	j, hold, _ := h.add("other", "ep_other", Limits{})
	if !hold || h.s.Next(h.now) != j {
		t.Fatal("other tenant's job did not start at once")
	}
	// When the first comes back due, a token is there.
	h.now = ats[0]
	j, hold, _ = h.add("slowpay", "ep_rl", lim)
	if !hold || h.s.Next(h.now) != j {
		t.Fatal("rate-limited job due at its slot did not start")
	}
}

func TestRateLimitPacesStarts(t *testing.T) {
	h := newHarness(t, Config{Concurrency: 32, EndpointConcurrency: 32})
	lim := Limits{Rate: 10, Burst: 2}
	h.warm("m", "ep", Limits{})
	var held []*Job
	for range 20 {
		if j, hold, _ := h.add("m", "ep", lim); hold {
			held = append(held, j)
		}
	}
	// Within the 1 s horizon, about 10 can start; the bucket starts empty.
	if len(held) < 8 || len(held) > 11 {
		t.Fatalf("%d held, want about 10", len(held))
	}
	started := 0
	end := h.now.Add(time.Second)
	for h.now.Before(end) {
		w := h.s.Wake(h.now)
		if w.IsZero() {
			break
		}
		h.now = w
		for {
			j := h.s.Next(h.now)
			if j == nil {
				break
			}
			started++
			h.s.Done(h.now, j, Answered, time.Millisecond)
		}
	}
	if started < 9 || started > 11 {
		t.Fatalf("%d started in the first second at 10/s, want 10±1", started)
	}
}

func TestBreakerOpensProbesAndRampsUp(t *testing.T) {
	h := newHarness(t, Config{Concurrency: 16, EndpointConcurrency: 8, BreakerThreshold: 3,
		BreakerCooldown: 10 * time.Second, BreakerMaxCooldown: 40 * time.Second})
	h.warm("m", "ep", Limits{})
	for range 10 {
		h.add("m", "ep", Limits{})
	}
	running := h.startAll()
	if len(running) != 8 {
		t.Fatalf("%d started, want the endpoint's cap 8", len(running))
	}
	var back []Back
	for _, j := range running[:3] {
		back = append(back, h.s.Done(h.now, j, Fault, time.Millisecond)...)
	}
	if len(back) != 2 {
		t.Fatalf("opening gave back %d waiting jobs, want 2", len(back))
	}
	openUntil := h.now.Add(10 * time.Second)
	for _, b := range back {
		if b.At.Before(openUntil) {
			t.Fatalf("given back due %v before the circuit half-opens", b.At.Sub(h.now))
		}
	}
	for _, j := range running[3:] {
		h.s.Done(h.now, j, Fault, time.Millisecond)
	}
	if _, hold, at := h.add("m", "ep", Limits{}); hold || at.Before(openUntil) {
		t.Fatalf("job held=%v at +%v while the circuit is open", hold, at.Sub(h.now))
	}
	// Half-open: one probe at a time.
	h.now = openUntil
	for range 3 {
		h.add("m", "ep", Limits{})
	}
	probes := h.startAll()
	if len(probes) != 1 {
		t.Fatalf("%d probes, want 1", len(probes))
	}
	// The probe fails: open again for twice as long.
	h.s.Done(h.now, probes[0], Fault, time.Millisecond)
	if _, hold, at := h.add("m", "ep", Limits{}); hold || at.Before(h.now.Add(20*time.Second)) {
		t.Fatalf("after a failed probe: held=%v at +%v, want ≥ +20s", hold, at.Sub(h.now))
	}
	h.advance(20 * time.Second)
	h.s.Expire(h.now)
	for range 10 {
		h.add("m", "ep", Limits{})
	}
	probes = h.startAll()
	if len(probes) != 1 {
		t.Fatalf("%d probes, want 1", len(probes))
	}
	h.s.Done(h.now, probes[0], Answered, time.Millisecond)
	// Recovered: 2 in flight, then 4, then the cap.
	for _, want := range []int{2, 4, 8} {
		for range 8 {
			h.add("m", "ep", Limits{})
		}
		got := h.startAll()
		if len(got) != want {
			t.Fatalf("ramp: %d in flight, want %d", len(got), want)
		}
		for _, j := range got {
			h.s.Done(h.now, j, Answered, time.Millisecond)
		}
		h.s.Expire(h.now.Add(2 * time.Second)) // drop what is left waiting
	}
}

func TestTenantShareIsWorkConserving(t *testing.T) {
	h := newHarness(t, Config{Concurrency: 8, EndpointConcurrency: 8, TenantShare: 4})
	h.warm("a", "ea", Limits{})
	h.warm("b", "eb", Limits{})
	for range 20 {
		h.add("a", "ea", Limits{})
	}
	// Alone, a tenant takes every slot.
	if got := len(h.startAll()); got != 8 {
		t.Fatalf("lone tenant started %d, want all 8", got)
	}
	h2 := newHarness(t, Config{Concurrency: 8, EndpointConcurrency: 8, TenantShare: 4})
	h2.warm("a", "ea", Limits{})
	h2.warm("b", "eb", Limits{})
	for range 8 {
		h2.add("a", "ea", Limits{})
		h2.add("b", "eb", Limits{})
	}
	count := map[string]int{}
	for _, j := range h2.startAll() {
		count[j.Tenant]++
	}
	if count["a"] != 4 || count["b"] != 4 {
		t.Fatalf("two busy tenants got %v, want 4 each", count)
	}
}

func TestHeldJobsExpireAfterHorizon(t *testing.T) {
	h := newHarness(t, Config{Concurrency: 1, Horizon: time.Second})
	h.warm("m", "ep", Limits{})
	h.add("m", "ep", Limits{})
	j := h.s.Next(h.now)
	_, hold, _ := h.add("m", "ep", Limits{})
	if !hold {
		t.Fatal("second job not held")
	}
	if w := h.s.Wake(h.now); !w.Equal(h.now.Add(time.Second)) {
		t.Fatalf("wake at +%v, want the held job's expiry +1s", w.Sub(h.now))
	}
	if back := h.s.Expire(h.now.Add(999 * time.Millisecond)); len(back) != 0 {
		t.Fatal("expired early")
	}
	// The request hangs: the waiting job goes back after the horizon.
	h.advance(time.Second)
	back := h.s.Expire(h.now)
	if len(back) != 1 || !back[0].At.After(h.now) {
		t.Fatalf("expired %v", back)
	}
	if h.s.Waiting() != 0 {
		t.Fatal("expired job still held")
	}
	h.s.Done(h.now, j, Fault, 5*time.Second)
}

func TestDrainReturnsEveryHeldJob(t *testing.T) {
	h := newHarness(t, Config{Concurrency: 2})
	h.warm("a", "ea", Limits{})
	h.warm("b", "eb", Limits{})
	held := 0
	for range 10 {
		if _, hold, _ := h.add("a", "ea", Limits{}); hold {
			held++
		}
		if _, hold, _ := h.add("b", "eb", Limits{}); hold {
			held++
		}
	}
	started := len(h.startAll())
	if got := len(h.s.Drain()); got != held-started {
		t.Fatalf("drained %d, want %d", got, held-started)
	}
	if h.s.Waiting() != 0 || h.s.Next(h.now) != nil {
		t.Fatal("something left after Drain")
	}
}

// TestRandomOperationsKeepInvariants runs random adds, starts, completions
// and time steps and checks that no job is lost or duplicated and no cap
// is exceeded.
func TestRandomOperationsKeepInvariants(t *testing.T) {
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 1))
		cfg := Config{Concurrency: 1 + r.IntN(16), BreakerThreshold: r.IntN(4), BreakerCooldown: time.Second,
			Rand: r.Float64}
		h := newHarness(t, cfg)
		limits := map[string]Limits{}
		for i := range 6 {
			limits[fmt.Sprint("e", i)] = Limits{Rate: []float64{0, 0, 5, 0.5}[r.IntN(4)], MaxInFlight: r.IntN(4)}
		}
		state := map[*Job]string{} // held, running, back
		running := []*Job{}
		for step := range 3000 {
			switch op := r.IntN(10); {
			case op < 4:
				ep := fmt.Sprint("e", r.IntN(6))
				j := h.job(fmt.Sprint("t", r.IntN(3)), ep, limits[ep])
				hold, at := h.s.Add(h.now, j)
				if hold {
					state[j] = "held"
				} else {
					if at.Before(h.now) {
						t.Fatalf("seed %d step %d: given back into the past", seed, step)
					}
					state[j] = "back"
				}
			case op < 7:
				if j := h.s.Next(h.now); j != nil {
					if state[j] != "held" {
						t.Fatalf("seed %d step %d: started a job in state %q", seed, step, state[j])
					}
					state[j] = "running"
					running = append(running, j)
				}
			case op < 9 && len(running) > 0:
				i := r.IntN(len(running))
				j := running[i]
				running = append(running[:i], running[i+1:]...)
				state[j] = "done"
				o := Outcome(r.IntN(3))
				for _, b := range h.s.Done(h.now, j, o, time.Duration(r.IntN(3000))*time.Millisecond) {
					if state[b.Job] != "held" {
						t.Fatalf("seed %d step %d: gave back a job in state %q", seed, step, state[b.Job])
					}
					state[b.Job] = "back"
				}
			default:
				h.advance(time.Duration(r.IntN(500)) * time.Millisecond)
				for _, b := range h.s.Expire(h.now) {
					if state[b.Job] != "held" {
						t.Fatalf("seed %d step %d: expired a job in state %q", seed, step, state[b.Job])
					}
					state[b.Job] = "back"
				}
			}
			if h.s.InFlight() != len(running) || h.s.InFlight() > h.s.cfg.Concurrency {
				t.Fatalf("seed %d step %d: in flight %d, running %d, cap %d", seed, step, h.s.InFlight(), len(running), h.s.cfg.Concurrency)
			}
			held := 0
			for _, st := range state {
				if st == "held" {
					held++
				}
			}
			if held != h.s.Waiting() {
				t.Fatalf("seed %d step %d: %d held, scheduler says %d", seed, step, held, h.s.Waiting())
			}
			for _, e := range h.s.eps {
				if e.inflight != len(e.running) || (e.inflight > e.maxInFlight && e.maxInFlight > 0) {
					t.Fatalf("seed %d step %d: endpoint %s in flight %d, running %d, cap %d", seed, step, e.id, e.inflight, len(e.running), e.maxInFlight)
				}
			}
		}
		for _, j := range h.s.Drain() {
			if state[j] != "held" {
				t.Fatalf("seed %d: drained a job in state %q", seed, state[j])
			}
			state[j] = "back"
		}
		for j, st := range state {
			if st == "held" {
				t.Fatalf("seed %d: job %v lost", seed, j.Value)
			}
		}
	}
}

func TestSlowEndpointBacklogGoesBackAtItsPace(t *testing.T) {
	h := newHarness(t, Config{Concurrency: 32})
	lim := Limits{MaxInFlight: 1}
	// Known: each request takes the whole 5 s timeout.
	for range 20 {
		_, hold, _ := h.add("m", "slow", lim)
		j := h.s.Next(h.now)
		if !hold || j == nil {
			h.s.Expire(h.now.Add(time.Hour))
			continue
		}
		h.s.Done(h.now, j, Fault, 5*time.Second)
	}
	h.add("m", "slow", lim)
	if h.s.Next(h.now) == nil {
		t.Fatal("nothing in flight")
	}
	var ats []time.Time
	for range 30 {
		_, hold, at := h.add("m", "slow", lim)
		if hold {
			t.Fatal("held a job that cannot start for 5 s")
		}
		ats = append(ats, at)
	}
	// One per request time (≈5 s) apart, for as long as four requests take;
	// the rest spread over the second half of that window, since a pace
	// measured on a slow endpoint is only a guess.
	for i := 1; i < 4; i++ {
		if gap := ats[i].Sub(ats[i-1]); gap < 4*time.Second {
			t.Fatalf("jobs %d and %d back %v apart; the endpoint takes one per ~5 s", i-1, i, gap)
		}
	}
	for i, at := range ats {
		if at.After(h.now.Add(25 * time.Second)) {
			t.Fatalf("job %d back at +%v, beyond four requests' time", i, at.Sub(h.now))
		}
	}
	if ats[0].Before(h.now.Add(4 * time.Second)) {
		t.Fatalf("first job back at +%v, before the request in flight can end", ats[0].Sub(h.now))
	}
}
