// Package sched decides when a relay sends each delivery it has claimed:
// per-endpoint limits (rate and in-flight caps), the circuit breaker, and
// fairness between tenants and between endpoints. It does no I/O and reads
// no clock; every call is given the time, so it is tested with plain values.
//
// The relay hands every claimed job to Add, which either holds it (it can
// start soon) or says when to give it back to the database, without
// spending an attempt. A job that cannot start within Config.Horizon is
// never held: waiting on a limiter, an open circuit or a busy endpoint must
// not take claim capacity from everyone else. Next picks the job to start
// now, round-robin over tenants with startable work and, within a tenant,
// over its endpoints. Done reports how the request went.
//
// Slots are shared by rules that keep a healthy tenant's delivery starting
// within one request slot of being claimed, however many slow endpoints
// others have:
//
//   - Endpoints not known to answer fast (new to this relay, or answering
//     slower than Config.SlowAfter, or with a request in flight for longer)
//     hold at most Config.SlowShare slots between them; the rest are kept
//     for endpoints that answer fast.
//   - A tenant beyond Config.TenantShare slots gets another only when no
//     other tenant can start anything.
//   - An endpoint starts with one request in flight and adds one per fast
//     answer (doubling each round) up to its cap; a slow answer halves it.
package sched

import (
	"math"
	"math/rand/v2"
	"time"
)

// Limits are one endpoint's limits as stored with it.
type Limits struct {
	Rate        float64 // requests per second; 0: no limit
	Burst       int     // requests above the rate at once; 0: Rate rounded up, at least 1
	MaxInFlight int     // 0: Config.EndpointConcurrency
}

// Config configures a Scheduler. Zero fields take the documented defaults.
type Config struct {
	Concurrency         int // requests in flight at once; required
	EndpointConcurrency int // default in-flight cap per endpoint; default Concurrency/2
	// TenantShare is how many slots a tenant takes while other tenants
	// have work that could start. Default Concurrency/2, at least 1.
	TenantShare int
	// SlowShare is how many slots requests to endpoints that are slow or
	// not yet known to this relay hold together. Default Concurrency/2,
	// at least 1.
	SlowShare int
	// SlowAfter is the request duration from which an endpoint counts as
	// slow. Default 1 s.
	SlowAfter time.Duration
	// Horizon is the longest a job is held in memory waiting to start;
	// jobs that cannot start within it go back to the database. Default 1 s.
	Horizon time.Duration
	// MaxPostpone caps how far ahead a job given back is due again, so a
	// raised limit or a recovered endpoint takes effect within it.
	// Default 10 min.
	MaxPostpone time.Duration

	BreakerThreshold   int           // receiver faults in a row that open a circuit; ≤ 0: no breaker
	BreakerCooldown    time.Duration // first open period; default 30 s
	BreakerMaxCooldown time.Duration // cap as failed probes double it; default 10 min

	// Rand returns a number in [0, 1) to spread jobs given back to the same
	// moment; default math/rand/v2.
	Rand func() float64

	// UnansweredFast gives back the jobs of an endpoint not yet known,
	// with no request of it in flight, due again in 50 ms, as before issue
	// 25 §5; only the fairness benchmark sets it, to measure both ways.
	UnansweredFast bool
}

// Defaults.
const (
	DefaultSlowAfter   = time.Second
	DefaultHorizon     = time.Second
	DefaultMaxPostpone = 10 * time.Minute
	idleTTL            = 10 * time.Minute // an idle endpoint's state is kept this long
	maxIdleEndpoints   = 10000
	minEstimate        = 10 * time.Millisecond
)

func (c Config) withDefaults() Config {
	c.Concurrency = max(1, c.Concurrency)
	if c.EndpointConcurrency <= 0 {
		c.EndpointConcurrency = max(1, c.Concurrency/2)
	}
	if c.TenantShare <= 0 {
		c.TenantShare = max(1, c.Concurrency/2)
	}
	if c.SlowShare <= 0 {
		c.SlowShare = max(1, c.Concurrency/2)
	}
	if c.SlowAfter <= 0 {
		c.SlowAfter = DefaultSlowAfter
	}
	if c.Horizon <= 0 {
		c.Horizon = DefaultHorizon
	}
	if c.MaxPostpone <= 0 {
		c.MaxPostpone = DefaultMaxPostpone
	}
	if c.BreakerCooldown <= 0 {
		c.BreakerCooldown = 30 * time.Second
	}
	if c.BreakerMaxCooldown < c.BreakerCooldown {
		c.BreakerMaxCooldown = max(10*time.Minute, c.BreakerCooldown)
	}
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
	return c
}

// Job is one claimed delivery. The caller fills the exported fields; the
// Scheduler keeps the rest.
type Job struct {
	Tenant   string
	Endpoint string
	Limits   Limits
	Value    any // the caller's

	ep      *endpoint
	queued  time.Time // when it was held
	started time.Time // when Next returned it
}

// Back is a job to give back to the database, due again at At, without
// spending an attempt.
type Back struct {
	Job    *Job
	At     time.Time
	Reason string // "rate", "circuit", "busy" or "expired"
}

// Outcome is how a request went, for Done.
type Outcome int

const (
	// NotSent: no request was made (the job was released, or failed on
	// the sender's side); only the slot is freed.
	NotSent Outcome = iota
	// Answered: the receiver answered with a status that says it is up
	// (2xx, or a 4xx other than 408 and 429).
	Answered
	// Fault: no answer, a timeout, 5xx, 408 or 429. Counts toward the
	// circuit breaker.
	Fault
)

type circuitState int

const (
	closed   circuitState = iota // normal
	open                         // nothing starts until openUntil
	halfOpen                     // one probe at a time
)

type tenant struct {
	name     string
	eps      int // endpoints known
	inflight int
	waiting  int
	ring     []*endpoint // endpoints with waiting jobs, round-robin
	cursor   int
	inRing   bool
}

type endpoint struct {
	id       string
	t        *tenant
	waiting  []*Job
	running  []*Job // started, not Done
	inflight int    // len(running)
	inRing   bool
	lastUsed time.Time

	maxInFlight int
	allowance   int // in-flight ramp; 0: up to maxInFlight
	proven      bool
	ewma        time.Duration

	rate       float64
	burst      int
	tokens     float64
	tokensAt   time.Time
	backCursor time.Time // latest time a job was given back for

	circuit   circuitState
	failures  int
	openUntil time.Time
	cooldown  time.Duration

	idleBacks int // give-backs with nothing of it out, since its last start

	// gateUntil is when the fleet's shared gate of the endpoint (its
	// limits and circuit, as every relay sees them) may let a request
	// through again: see Hold.
	gateUntil time.Time
}

// Scheduler holds the jobs a relay has claimed and not yet started, and the
// state of the endpoints it sends to. It is not safe for concurrent use.
type Scheduler struct {
	cfg       Config
	tenants   map[string]*tenant
	eps       map[string]*endpoint
	ring      []*tenant // tenants with waiting jobs
	cursor    int
	busy      map[*endpoint]struct{} // endpoints with requests in flight
	inflight  int
	waiting   int
	lastPrune time.Time
	expireAt  time.Time // no held job expires before this
	dirty     bool      // an endpoint in the rings may have nothing waiting
}

// New returns a Scheduler.
func New(cfg Config) *Scheduler {
	return &Scheduler{
		cfg:     cfg.withDefaults(),
		tenants: map[string]*tenant{},
		eps:     map[string]*endpoint{},
		busy:    map[*endpoint]struct{}{},
	}
}

// InFlight returns how many started jobs are not Done yet.
func (s *Scheduler) InFlight() int { return s.inflight }

// Waiting returns how many jobs are held, not started.
func (s *Scheduler) Waiting() int { return s.waiting }

func (s *Scheduler) endpoint(j *Job) *endpoint {
	e := s.eps[j.Endpoint]
	if e == nil {
		t := s.tenants[j.Tenant]
		if t == nil {
			t = &tenant{name: j.Tenant}
			s.tenants[j.Tenant] = t
		}
		e = &endpoint{id: j.Endpoint, t: t, allowance: 1}
		t.eps++
		s.eps[j.Endpoint] = e
	}
	return e
}

// configure applies the limits of the latest claim of e.
func (s *Scheduler) configure(e *endpoint, l Limits, now time.Time) {
	e.maxInFlight = s.cfg.EndpointConcurrency
	if l.MaxInFlight > 0 {
		e.maxInFlight = min(l.MaxInFlight, s.cfg.Concurrency)
	}
	if e.allowance >= e.maxInFlight {
		e.allowance = 0
	}
	burst := l.Burst
	if burst <= 0 {
		burst = max(1, int(math.Ceil(l.Rate)))
	}
	if l.Rate != e.rate || burst != e.burst {
		// The bucket starts empty: a relay that restarts, or sees the
		// endpoint for the first time, must not add a full burst to what
		// another relay just sent.
		e.rate, e.burst, e.tokens, e.tokensAt = l.Rate, burst, 0, now
		e.backCursor = time.Time{}
	}
}

// capacity is how many requests e may have in flight now.
func (e *endpoint) capacity() int {
	if e.circuit == halfOpen {
		return 1
	}
	if e.allowance > 0 {
		return min(e.allowance, e.maxInFlight)
	}
	return e.maxInFlight
}

// tokensAt returns the rate bucket's tokens at now.
func (e *endpoint) tokensNow(now time.Time) float64 {
	if e.rate <= 0 {
		return math.Inf(1)
	}
	if now.After(e.tokensAt) {
		e.tokens = min(float64(e.burst), e.tokens+now.Sub(e.tokensAt).Seconds()*e.rate)
		e.tokensAt = now
	}
	return e.tokens
}

// oldest is how long e's longest request in flight has run.
func (e *endpoint) oldest(now time.Time) time.Duration {
	var d time.Duration
	for _, j := range e.running {
		d = max(d, now.Sub(j.started))
	}
	return d
}

// fast reports whether e is known to answer within SlowAfter.
func (s *Scheduler) fast(e *endpoint, now time.Time) bool {
	return e.proven && e.ewma < s.cfg.SlowAfter && e.oldest(now) < s.cfg.SlowAfter
}

// estimate is how long one round of e's requests is expected to take.
func (s *Scheduler) estimate(e *endpoint, now time.Time) time.Duration {
	return max(e.ewma, e.oldest(now), minEstimate)
}

// spread returns a time in [at, at+span) so that jobs given back together
// do not all come due at once.
func (s *Scheduler) spread(at time.Time, span time.Duration) time.Time {
	return at.Add(time.Duration(s.cfg.Rand() * float64(span)))
}

// capAt bounds a give-back time to limit from now, spreading what it cuts
// over the second half of that window.
func (s *Scheduler) capAt(at, now time.Time, limit time.Duration) time.Time {
	if at.After(now.Add(limit)) {
		return s.spread(now.Add(limit/2), limit/2)
	}
	return at
}

// Add offers a claimed job. It returns hold true when the Scheduler keeps
// it (Next will return it); otherwise the job is not kept and should go
// back to the database, due at `at`.
//
// A job is held only when it is expected to start within Horizon: its
// endpoint, its tenant, the slow endpoints' share and the relay as a whole
// each have a slot for it within that time, judged by how long the
// endpoint's requests take.
func (s *Scheduler) Add(now time.Time, j *Job) (hold bool, at time.Time) {
	e := s.endpoint(j)
	s.configure(e, j.Limits, now)
	e.lastUsed = now
	if e.circuit == open && !now.Before(e.openUntil) {
		e.circuit = halfOpen
	}
	if e.circuit == open {
		return false, s.capAt(s.spread(e.openUntil, min(e.cooldown, s.cfg.MaxPostpone)), now, s.cfg.MaxPostpone)
	}
	est := s.estimate(e, now)
	start := now
	wait := func(ahead, slots int, est time.Duration) {
		if ahead >= slots {
			start = maxTime(start, now.Add(time.Duration((ahead-slots)/slots+1)*est))
		}
	}
	t := e.t
	wait(e.inflight+len(e.waiting), e.capacity(), est)
	if s.inflight+s.waiting > t.inflight+t.waiting { // other tenants have work
		wait(t.inflight+t.waiting, s.cfg.TenantShare, est)
	}
	wait(s.inflight+s.waiting, s.cfg.Concurrency, est)
	if !s.fast(e, now) {
		// What slow and unknown endpoints hold together, in flight and
		// waiting, stays within their share: however many of them a tenant
		// has, they cannot fill the relay's memory or its slots.
		slow := max(est, s.cfg.SlowAfter)
		wait(s.slowLoad(now), s.cfg.SlowShare, slow)
		wait(e.inflight+len(e.waiting), max(1, s.cfg.SlowShare/2), slow)
	}
	if e.gateUntil.After(start) {
		start = e.gateUntil
	}
	rateStart := now
	if need := float64(len(e.waiting)+1) - e.tokensNow(now); need > 0 {
		rateStart = now.Add(time.Duration(need / e.rate * float64(time.Second)))
		start = maxTime(start, rateStart)
	}
	if start.Before(now.Add(s.cfg.Horizon)) {
		j.ep, j.queued = e, now
		e.waiting = append(e.waiting, j)
		t.waiting++
		s.waiting++
		s.enring(e)
		if exp := now.Add(s.cfg.Horizon); s.expireAt.IsZero() || exp.Before(s.expireAt) {
			s.expireAt = exp
		}
		return true, time.Time{}
	}
	if !e.gateUntil.Before(now.Add(s.cfg.Horizon)) {
		// The fleet's gate holds the endpoint (see Hold): due when it opens.
		return false, s.capAt(s.spread(e.gateUntil, max(50*time.Millisecond, e.gateUntil.Sub(now))), now, s.cfg.MaxPostpone)
	}
	if !e.proven && e.oldest(now) < s.cfg.SlowAfter && rateStart.Before(now.Add(s.cfg.Horizon)) {
		// Its first answer is still out, and not late yet: by the time this
		// is due again the endpoint is likely known.
		if e.inflight > 0 || s.cfg.UnansweredFast {
			return false, now.Add(max(50*time.Millisecond, 2*e.oldest(now)))
		}
		// None is out: what holds the job is elsewhere (the slow
		// endpoints' share is full, say). Due again in 50 ms, then twice
		// as long each time until one of its requests starts: it is not
		// held back behind a backlog, nor claimed and handed back every
		// 50 ms while the share stays full.
		d := 50 * time.Millisecond << min(e.idleBacks, 5)
		e.idleBacks++
		return false, now.Add(d)
	}
	// Give jobs back one slot of the endpoint's pace apart (its rate, or
	// its request time over its in-flight cap), so that a backlog comes
	// due as fast as the endpoint takes it instead of all at once, again
	// and again. A rate is a stated fact and paces up to MaxPostpone; a
	// pace measured on a slow endpoint is only a guess (it may recover and
	// ramp up), so it spreads the backlog over at most four requests' time.
	pace := est / time.Duration(e.capacity())
	limit := min(s.cfg.MaxPostpone, max(s.cfg.Horizon, 4*est))
	if e.rate > 0 && time.Duration(float64(time.Second)/e.rate) >= pace {
		pace = time.Duration(float64(time.Second) / e.rate)
		limit = s.cfg.MaxPostpone
	}
	at = maxTime(start, e.backCursor.Add(pace))
	if at.After(now.Add(limit)) {
		return false, s.capAt(at, now, limit)
	}
	e.backCursor = at
	return false, at
}

// slowLoad counts the requests in flight to, and the jobs held for,
// endpoints that are not known to be fast.
func (s *Scheduler) slowLoad(now time.Time) int {
	n := 0
	for b := range s.busy {
		if !s.fast(b, now) {
			n += b.inflight
		}
	}
	for _, t := range s.ring {
		for _, e := range t.ring {
			if e.inflight == 0 && !s.fast(e, now) {
				n += len(e.waiting)
			}
		}
	}
	for b := range s.busy {
		if !s.fast(b, now) {
			n += len(b.waiting)
		}
	}
	return n
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// enring puts e, and its tenant, in the round-robin rings.
func (s *Scheduler) enring(e *endpoint) {
	if !e.inRing {
		e.inRing = true
		e.t.ring = append(e.t.ring, e)
	}
	if !e.t.inRing {
		e.t.inRing = true
		s.ring = append(s.ring, e.t)
	}
}

// Next returns the job to start now, or nil when none can start. The job
// counts as in flight until Done.
func (s *Scheduler) Next(now time.Time) *Job {
	if s.waiting == 0 || s.inflight >= s.cfg.Concurrency {
		return nil
	}
	slow := -1 // slots held by slow endpoints, counted when first needed
	// First pass: tenants within their share. Second: anyone, since no
	// tenant within its share can start anything.
	for pass := 0; pass < 2; pass++ {
		for i := 0; i < len(s.ring); i++ {
			idx := (s.cursor + i) % len(s.ring)
			t := s.ring[idx]
			if pass == 0 && t.inflight >= s.cfg.TenantShare {
				continue
			}
			if j := s.pick(t, now, &slow); j != nil {
				s.cursor = idx + 1
				s.tidy()
				return j
			}
		}
	}
	s.tidy()
	return nil
}

// pick starts the next startable job of t, round-robin over its endpoints.
func (s *Scheduler) pick(t *tenant, now time.Time, slow *int) *Job {
	for i := 0; i < len(t.ring); i++ {
		idx := (t.cursor + i) % len(t.ring)
		e := t.ring[idx]
		if !s.startable(e, now, slow) {
			continue
		}
		t.cursor = idx + 1
		j := e.waiting[0]
		e.waiting[0] = nil
		e.waiting = e.waiting[1:]
		t.waiting--
		s.waiting--
		if len(e.waiting) == 0 {
			s.dirty = true
		}
		if e.rate > 0 {
			e.tokens--
		}
		j.started = now
		e.idleBacks = 0
		e.running = append(e.running, j)
		e.inflight++
		t.inflight++
		s.inflight++
		s.busy[e] = struct{}{}
		return j
	}
	return nil
}

func (s *Scheduler) startable(e *endpoint, now time.Time, slow *int) bool {
	if len(e.waiting) == 0 {
		return false
	}
	if e.circuit == open {
		if now.Before(e.openUntil) {
			return false
		}
		e.circuit = halfOpen
	}
	if e.inflight >= e.capacity() || e.tokensNow(now) < 1 || now.Before(e.gateUntil) {
		return false
	}
	if !s.fast(e, now) {
		if *slow < 0 {
			*slow = 0
			for b := range s.busy {
				if !s.fast(b, now) {
					*slow += b.inflight
				}
			}
		}
		if *slow >= s.cfg.SlowShare {
			return false
		}
	}
	return true
}

// tidy drops endpoints without waiting jobs from the rings, and tenants
// without such endpoints.
func (s *Scheduler) tidy() {
	if !s.dirty {
		return
	}
	s.dirty = false
	keep := s.ring[:0]
	for _, t := range s.ring {
		eps := t.ring[:0]
		for _, e := range t.ring {
			if len(e.waiting) > 0 {
				eps = append(eps, e)
			} else {
				e.inRing = false
			}
		}
		clear(t.ring[len(eps):])
		t.ring = eps
		if t.cursor >= len(eps) {
			t.cursor = 0
		}
		if len(eps) > 0 {
			keep = append(keep, t)
		} else {
			t.inRing = false
		}
	}
	clear(s.ring[len(keep):])
	s.ring = keep
	if s.cursor >= len(keep) {
		s.cursor = 0
	}
}

// Done reports the end of a job Next returned: whether and how the
// receiver answered, and how long the request took. It returns the jobs an
// opening circuit sends back.
func (s *Scheduler) Done(now time.Time, j *Job, o Outcome, took time.Duration) []Back {
	e := j.ep
	s.unrun(e, j)
	e.lastUsed = now
	if o == NotSent {
		return nil
	}
	if !e.proven {
		e.proven, e.ewma = true, took
	} else {
		e.ewma = (e.ewma*7 + took) / 8
	}
	if took >= s.cfg.SlowAfter {
		e.allowance = max(1, e.capacity()/2)
	} else if e.allowance > 0 {
		// One more per fast answer: the cap doubles with each round.
		if e.allowance++; e.allowance >= e.maxInFlight {
			e.allowance = 0
		}
	}
	if o == Fault {
		e.failures++
		threshold := s.cfg.BreakerThreshold
		if e.circuit == halfOpen || (threshold > 0 && e.failures >= threshold && e.circuit == closed) {
			return s.open(e, now)
		}
		return nil
	}
	e.failures = 0
	if e.circuit == halfOpen {
		// Recovered: ramp up again from two requests in flight.
		e.circuit, e.cooldown, e.allowance = closed, 0, min(2, e.maxInFlight)
		if e.allowance >= e.maxInFlight {
			e.allowance = 0
		}
	}
	return nil
}

// unrun takes j off e's requests in flight.
func (s *Scheduler) unrun(e *endpoint, j *Job) {
	for i, r := range e.running {
		if r == j {
			last := len(e.running) - 1
			e.running[i] = e.running[last]
			e.running[last] = nil
			e.running = e.running[:last]
			break
		}
	}
	e.inflight--
	e.t.inflight--
	s.inflight--
	if e.inflight == 0 {
		delete(s.busy, e)
	}
}

// Stuck reports whether the endpoint has a request in flight or held,
// and is not known to answer fast (new to this relay, slow, or with a
// request out for longer than SlowAfter): what Add gives back of it then
// can start only once one of those requests ends.
func (s *Scheduler) Stuck(now time.Time, endpoint string) bool {
	e := s.eps[endpoint]
	return e != nil && e.inflight+len(e.waiting) > 0 && !s.fast(e, now)
}

// Defer takes back a job Next returned that did not start after all: the
// fleet's shared gate of its endpoint said no until `until`. The job
// waits again, first in its endpoint's line, and the endpoint starts
// nothing before until (see Hold); what cannot start within Horizon of
// being held is returned, to go back to the database.
func (s *Scheduler) Defer(now time.Time, j *Job, until time.Time) []Back {
	e := j.ep
	s.unrun(e, j)
	if e.rate > 0 {
		e.tokens = min(float64(e.burst), e.tokens+1)
	}
	return s.hold(e, now, until, j)
}

// Hold keeps the endpoint from starting anything before until: the
// fleet's shared gate (another relay's open circuit, the endpoint's
// shared rate or in-flight cap) says it must wait. Jobs held for it that
// cannot start within Horizon are returned, to go back to the database,
// due at until.
func (s *Scheduler) Hold(now time.Time, endpoint string, until time.Time) []Back {
	e := s.eps[endpoint]
	if e == nil {
		return nil
	}
	return s.hold(e, now, until, nil)
}

func (s *Scheduler) hold(e *endpoint, now, until time.Time, j *Job) []Back {
	if until.After(e.gateUntil) {
		e.gateUntil = until
	}
	fits := func(w *Job) bool { return w.queued.Add(s.cfg.Horizon).After(e.gateUntil) }
	due := func() time.Time {
		return s.capAt(s.spread(e.gateUntil, max(50*time.Millisecond, e.gateUntil.Sub(now))), now, s.cfg.MaxPostpone)
	}
	var back []Back
	lined := make([]*Job, 0, len(e.waiting)+1)
	if j != nil {
		// j counts as waiting again, first in its endpoint's line.
		lined = append(lined, j)
		e.t.waiting++
		s.waiting++
	}
	lined = append(lined, e.waiting...)
	clear(e.waiting)
	e.waiting = e.waiting[:0]
	for _, w := range lined {
		if fits(w) {
			e.waiting = append(e.waiting, w)
			if exp := w.queued.Add(s.cfg.Horizon); s.expireAt.IsZero() || exp.Before(s.expireAt) {
				s.expireAt = exp
			}
			continue
		}
		back = append(back, Back{Job: w, At: due(), Reason: "shared"})
		e.t.waiting--
		s.waiting--
	}
	if len(e.waiting) > 0 {
		s.enring(e)
	} else {
		s.dirty = true
	}
	return back
}

// open opens e's circuit and gives its waiting jobs back until it
// half-opens.
func (s *Scheduler) open(e *endpoint, now time.Time) []Back {
	if e.cooldown == 0 {
		e.cooldown = s.cfg.BreakerCooldown
	} else {
		e.cooldown = min(e.cooldown*2, s.cfg.BreakerMaxCooldown)
	}
	e.circuit, e.allowance = open, 1
	e.openUntil = now.Add(e.cooldown)
	back := make([]Back, 0, len(e.waiting))
	for _, j := range e.waiting {
		back = append(back, Back{Job: j, At: s.capAt(s.spread(e.openUntil, min(e.cooldown, s.cfg.MaxPostpone)), now, s.cfg.MaxPostpone), Reason: "circuit"})
	}
	s.waiting -= len(e.waiting)
	e.t.waiting -= len(e.waiting)
	clear(e.waiting)
	e.waiting = e.waiting[:0]
	s.dirty = true
	return back
}

// Expire gives back the jobs held longer than Horizon (their endpoint
// turned slow, or every slot is taken), due after another Horizon so that
// other work runs meanwhile, and forgets endpoints idle for long.
func (s *Scheduler) Expire(now time.Time) []Back {
	var back []Back
	if !s.expireAt.IsZero() && !now.Before(s.expireAt) {
		s.expireAt = time.Time{}
		cut := now.Add(-s.cfg.Horizon)
		for _, t := range s.ring {
			for _, e := range t.ring {
				n := 0
				for n < len(e.waiting) && !e.waiting[n].queued.After(cut) {
					back = append(back, Back{Job: e.waiting[n], At: maxTime(e.gateUntil, now.Add(max(s.cfg.Horizon, s.estimate(e, now)))), Reason: "expired"})
					e.waiting[n] = nil
					n++
				}
				if n > 0 {
					e.waiting = e.waiting[n:]
					t.waiting -= n
					s.waiting -= n
					s.dirty = true
				}
				if len(e.waiting) > 0 {
					if exp := e.waiting[0].queued.Add(s.cfg.Horizon); s.expireAt.IsZero() || exp.Before(s.expireAt) {
						s.expireAt = exp
					}
				}
			}
		}
		s.tidy()
	}
	// Once a minute, or once a second while over the cap: Expire runs on
	// every worker's turn, and a prune walks every endpoint.
	if since := now.Sub(s.lastPrune); since >= time.Minute || (since >= time.Second && len(s.eps) > maxIdleEndpoints) {
		s.prune(now)
	}
	return back
}

// prune forgets endpoints with nothing waiting or in flight, unused for
// idleTTL (or any such endpoint beyond maxIdleEndpoints), whose circuit is
// closed: what they lose is their speed estimate and ramp.
func (s *Scheduler) prune(now time.Time) {
	s.lastPrune = now
	for id, e := range s.eps {
		if e.inflight > 0 || len(e.waiting) > 0 || e.circuit != closed || e.failures > 0 || e.backCursor.After(now) || e.gateUntil.After(now) {
			continue
		}
		if now.Sub(e.lastUsed) >= idleTTL || len(s.eps) > maxIdleEndpoints {
			delete(s.eps, id)
			if e.t.eps--; e.t.eps == 0 {
				delete(s.tenants, e.t.name)
			}
		}
	}
}

// Wake returns the earliest time at which Next or Expire may have
// something new to do without an Add or Done in between: a rate token, a
// circuit half-opening, a held job expiring. Zero means none.
func (s *Scheduler) Wake(now time.Time) time.Time {
	var w time.Time
	at := func(t time.Time) {
		if w.IsZero() || t.Before(w) {
			w = t
		}
	}
	for _, t := range s.ring {
		for _, e := range t.ring {
			if len(e.waiting) == 0 {
				continue
			}
			at(e.waiting[0].queued.Add(s.cfg.Horizon))
			if e.circuit == open {
				at(e.openUntil)
			}
			if e.gateUntil.After(now) {
				at(e.gateUntil)
			}
			if tk := e.tokensNow(now); tk < 1 {
				at(now.Add(time.Duration((1 - tk) / e.rate * float64(time.Second))))
			}
		}
	}
	return w
}

// Drain removes and returns every held job, for a relay that stops.
func (s *Scheduler) Drain() []*Job {
	var out []*Job
	for _, t := range s.ring {
		for _, e := range t.ring {
			out = append(out, e.waiting...)
			clear(e.waiting)
			e.waiting = e.waiting[:0]
		}
		t.waiting = 0
	}
	s.waiting = 0
	s.dirty = true
	s.tidy()
	return out
}
