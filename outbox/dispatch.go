package outbox

import (
	"math"
	"time"

	"golang.org/x/time/rate"
)

// Per-endpoint flow control, kept by each relay in memory: an in-flight
// cap, an optional rate limit, and a circuit breaker. Deliveries that must
// wait for any of them wait in the endpoint's queue, or, when that would
// hold them too long, go back to the database for later without spending an
// attempt.

type circuitState int

const (
	circuitClosed   circuitState = iota // normal
	circuitOpen                         // failing: nothing is sent until openUntil
	circuitHalfOpen                     // probing: one request at a time
)

type endpointQueue struct {
	inflight int
	waiting  []*job
	ewma     time.Duration // recent request duration

	maxInFlight int
	limiter     *rate.Limiter
	rate        float64
	burst       int
	timerSet    bool // a timer will pump the queue when the limiter allows

	circuit   circuitState
	failures  int // consecutive receiver faults
	openUntil time.Time
	cooldown  time.Duration
	allowance int // after a recovery, the in-flight cap ramping up; 0 = none
}

// configure applies the endpoint's limits as of the latest claim.
func (r *Relay) configure(q *endpointQueue, j *job) {
	c := &j.c
	q.maxInFlight = r.cfg.EndpointConcurrency
	if c.MaxInFlight > 0 {
		q.maxInFlight = min(c.MaxInFlight, r.cfg.Concurrency)
	}
	if c.RateLimit != q.rate || c.RateBurst != q.burst {
		q.rate, q.burst = c.RateLimit, c.RateBurst
		q.limiter = nil
		if c.RateLimit > 0 {
			burst := c.RateBurst
			if burst <= 0 {
				burst = max(1, int(math.Ceil(c.RateLimit)))
			}
			q.limiter = rate.NewLimiter(rate.Limit(c.RateLimit), burst)
			// Start empty: a relay that restarts, or sees the endpoint for
			// the first time, must not add a full burst to what another
			// process just sent.
			q.limiter.ReserveN(r.clock.Now(), burst)
		}
	}
}

// capacity is how many requests the endpoint may have in flight now.
func (q *endpointQueue) capacity() int {
	if q.circuit == circuitHalfOpen {
		return 1
	}
	if q.allowance > 0 {
		return min(q.allowance, q.maxInFlight)
	}
	return q.maxInFlight
}

// dispatch hands a claimed job to its endpoint's queue.
func (r *Relay) dispatch(j *job) {
	now := r.clock.Now()
	r.mu.Lock()
	q := r.eps[j.c.EndpointID]
	if q == nil {
		q = &endpointQueue{}
		r.eps[j.c.EndpointID] = q
	}
	r.configure(q, j)
	if q.circuit == circuitOpen && now.Before(q.openUntil) {
		at := q.openUntil
		r.mu.Unlock()
		r.putBack(j, at)
		return
	}
	if len(q.waiting) >= r.cfg.BatchSize {
		// A batch is already waiting for this endpoint: put this one back
		// for later, so the slots go to other endpoints meanwhile.
		wait := time.Duration(len(q.waiting)/max(1, q.capacity())+1) * max(q.ewma, 10*time.Millisecond)
		if q.limiter != nil {
			wait = max(wait, time.Duration(float64(len(q.waiting))/q.rate*float64(time.Second)))
		}
		r.mu.Unlock()
		r.putBack(j, now.Add(min(max(wait, 100*time.Millisecond), 5*time.Minute)))
		return
	}
	q.waiting = append(q.waiting, j)
	r.pumpLocked(q, now)
	r.mu.Unlock()
}

// pumpLocked moves waiting jobs of q to the workers as far as its limits
// allow; when only the rate limit holds them, a timer pumps again.
func (r *Relay) pumpLocked(q *endpointQueue, now time.Time) {
	if q.circuit == circuitOpen {
		if now.Before(q.openUntil) {
			return
		}
		q.circuit = circuitHalfOpen
	}
	for len(q.waiting) > 0 && q.inflight < q.capacity() {
		if q.limiter != nil {
			res := q.limiter.ReserveN(now, 1)
			if d := res.DelayFrom(now); d > 0 {
				res.CancelAt(now)
				r.armLocked(q, d)
				return
			}
		}
		j := q.waiting[0]
		q.waiting[0] = nil
		q.waiting = q.waiting[1:]
		q.inflight++
		r.readyQ = append(r.readyQ, j)
		r.cond.Signal()
	}
}

// armLocked makes sure q is pumped again after d.
func (r *Relay) armLocked(q *endpointQueue, d time.Duration) {
	if q.timerSet {
		return
	}
	q.timerSet = true
	t := r.clock.NewTimer(d)
	go func() {
		select {
		case <-t.C():
		case <-r.timersQuit:
			t.Stop()
			return
		}
		r.mu.Lock()
		q.timerSet = false
		r.pumpLocked(q, r.clock.Now())
		r.mu.Unlock()
	}()
}

// finish records the end of j's request on its endpoint: the in-flight
// slot, the request's duration and, for the circuit breaker, whether the
// receiver failed. It returns the jobs an opening circuit sends back.
func (r *Relay) finishLocked(j *job, out *outcome, took time.Duration, now time.Time) (back []*job, until time.Time) {
	q := r.eps[j.c.EndpointID]
	q.inflight--
	if took > 0 {
		if q.ewma == 0 {
			q.ewma = took
		} else {
			q.ewma = (q.ewma*7 + took) / 8
		}
	}
	switch {
	case out.fault:
		q.failures++
		threshold := r.cfg.BreakerThreshold
		if q.circuit == circuitHalfOpen || (threshold > 0 && q.failures >= threshold && q.circuit == circuitClosed) {
			back, until = r.openLocked(q, now)
		}
	case out.Record && !out.local:
		// The receiver answered: it is up, whatever it said.
		q.failures = 0
		switch {
		case q.circuit == circuitHalfOpen:
			q.circuit, q.cooldown, q.allowance = circuitClosed, 0, 2
		case q.allowance > 0:
			if q.allowance *= 2; q.allowance >= q.maxInFlight {
				q.allowance = 0
			}
		}
	}
	r.pumpLocked(q, now)
	if q.inflight == 0 && len(q.waiting) == 0 && q.circuit == circuitClosed && q.failures == 0 &&
		q.allowance == 0 && !q.timerSet && (q.limiter == nil || q.limiter.TokensAt(now) >= float64(q.limiter.Burst())) {
		delete(r.eps, j.c.EndpointID)
	}
	return back, until
}

// openLocked opens q's circuit and takes its waiting jobs out, to go back
// to the database until the circuit half-opens.
func (r *Relay) openLocked(q *endpointQueue, now time.Time) ([]*job, time.Time) {
	if q.cooldown == 0 {
		q.cooldown = r.cfg.BreakerCooldown
	} else {
		q.cooldown = min(q.cooldown*2, r.cfg.BreakerMaxCooldown)
	}
	q.circuit, q.allowance = circuitOpen, 0
	q.openUntil = now.Add(q.cooldown)
	back := q.waiting
	q.waiting = nil
	return back, q.openUntil
}

// putBack returns j to the database, due at `at`, without spending its
// attempt.
func (r *Relay) putBack(j *job, at time.Time) {
	r.comp.add(r.postpone(j, at))
	r.dropHeld()
}

func (r *Relay) worker() {
	defer r.workers.Done()
	r.mu.Lock()
	for {
		for len(r.readyQ) == 0 && !r.quitting {
			r.cond.Wait()
		}
		if len(r.readyQ) == 0 {
			r.mu.Unlock()
			return
		}
		j := r.readyQ[0]
		r.readyQ[0] = nil
		r.readyQ = r.readyQ[1:]
		r.mu.Unlock()

		out, took := r.process(j)
		// The endpoint's state first: once the outcome is written, what it
		// caused (a replay of a dead letter, say) must meet the circuit
		// this attempt left behind.
		r.mu.Lock()
		back, until := r.finishLocked(j, &out, took, r.clock.Now())
		r.mu.Unlock()
		r.comp.add(out)
		r.dropHeld()
		for _, b := range back {
			r.putBack(b, until)
		}
		r.mu.Lock()
	}
}
