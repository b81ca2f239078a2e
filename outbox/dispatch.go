package outbox

import (
	"time"

	"github.com/txhook/txhook/internal/sched"
)

// The relay's scheduling lives in internal/sched, a pure unit: per-endpoint
// limits and circuit breakers, and fairness between tenants and endpoints.
// This file is the thin layer around it: claimed jobs go in, workers take
// what may start, and what must wait longer than the scheduler's horizon
// goes back to the database with the time it can next run, without
// spending an attempt, so that waiting never takes claim capacity.

// schedConfig derives the scheduler's settings from the relay's.
func (c RelayConfig) schedConfig() sched.Config {
	return sched.Config{
		Concurrency:         c.Concurrency,
		EndpointConcurrency: c.EndpointConcurrency,
		SlowAfter:           min(sched.DefaultSlowAfter, c.Timeout/2),
		BreakerThreshold:    max(0, c.BreakerThreshold),
		BreakerCooldown:     c.BreakerCooldown,
		BreakerMaxCooldown:  c.BreakerMaxCooldown,
	}
}

// dispatch hands a claimed job to the scheduler, or back to the database
// when it cannot start soon.
func (r *Relay) dispatch(j *job) {
	c := &j.c
	j.sj = sched.Job{Tenant: c.Tenant, Endpoint: c.EndpointID, Value: j,
		Limits: sched.Limits{Rate: c.RateLimit, Burst: c.RateBurst, MaxInFlight: c.MaxInFlight}}
	r.mu.Lock()
	hold, at := r.sch.Add(r.clock.Now(), &j.sj)
	if hold {
		r.cond.Signal()
	}
	r.mu.Unlock()
	if !hold {
		r.putBack(j, at)
	}
}

// nextLocked returns the job a worker should start now, if any, and the
// jobs that waited too long and go back. With nothing to start it arms the
// timer for the scheduler's next change.
func (r *Relay) nextLocked() (*job, []sched.Back) {
	now := r.clock.Now()
	back := r.sch.Expire(now)
	if sj := r.sch.Next(now); sj != nil {
		// Another job may be startable too: pass the turn on.
		r.cond.Signal()
		return sj.Value.(*job), back
	}
	if w := r.sch.Wake(now); !w.IsZero() && (r.timerAt.IsZero() || w.Before(r.timerAt)) {
		r.timerAt = w
		select {
		case r.rearm <- w.Sub(now):
		default: // the timer goroutine has a pending re-arm; it re-reads timerAt
		}
	}
	return nil, back
}

// timerLoop wakes the workers when the scheduler's next change is due: a
// rate-limit token, a circuit half-opening, a held job expiring.
func (r *Relay) timerLoop() {
	t := r.clock.NewTimer(time.Hour)
	t.Stop()
	for {
		select {
		case d := <-r.rearm:
			r.mu.Lock()
			if at := r.timerAt; !at.IsZero() {
				d = at.Sub(r.clock.Now())
			}
			r.mu.Unlock()
			t.Reset(max(d, 0))
		case <-t.C():
			r.mu.Lock()
			r.timerAt = time.Time{}
			r.cond.Broadcast()
			r.mu.Unlock()
		case <-r.timersQuit:
			t.Stop()
			return
		}
	}
}

// putBack returns j to the database, due at `at`, without spending its
// attempt.
func (r *Relay) putBack(j *job, at time.Time) {
	if j.q != nil {
		r.queueBack(j, at)
	} else {
		r.comp.add(r.postpone(j, at))
	}
	r.dropHeld()
}

func (r *Relay) giveBack(back []sched.Back) {
	for _, b := range back {
		r.putBack(b.Job.Value.(*job), b.At)
	}
}

func (r *Relay) worker() {
	defer r.workers.Done()
	r.mu.Lock()
	for {
		j, back := r.nextLocked()
		if j == nil && len(back) == 0 {
			if r.quitting {
				r.mu.Unlock()
				return
			}
			r.cond.Wait()
			continue
		}
		r.mu.Unlock()
		r.giveBack(back)
		if j != nil {
			out, took := r.process(j)
			r.endAttempt(j, &out)
			// The endpoint's state first: once the outcome is written, what
			// it caused (a replay of a dead letter, say) must meet the
			// circuit this attempt left behind.
			r.mu.Lock()
			back = r.sch.Done(r.clock.Now(), &j.sj, r.outcomeKind(&out, took), took)
			r.cond.Signal()
			r.mu.Unlock()
			r.comp.add(out)
			r.dropHeld()
			r.giveBack(back)
		}
		r.mu.Lock()
	}
}

// outcomeKind tells the scheduler what an attempt says about the receiver.
func (r *Relay) outcomeKind(out *outcome, took time.Duration) sched.Outcome {
	switch {
	case took == 0 || out.local || r.httpCtx.Err() != nil:
		return sched.NotSent
	case out.fault:
		return sched.Fault
	}
	return sched.Answered
}
