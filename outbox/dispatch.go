package outbox

import (
	"context"
	"slices"
	"time"

	"github.com/txhook/txhook/internal/gate"
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
		UnansweredFast:      gate.Disabled.Load(),
	}
}

// dispatch hands a claimed job to the scheduler, or back to the database
// when it cannot start soon.
func (r *Relay) dispatch(j *job) {
	c := &j.c
	j.sj = sched.Job{Tenant: c.Tenant, Endpoint: c.EndpointID, Value: j,
		Limits: sched.Limits{Rate: c.RateLimit, Burst: c.RateBurst, MaxInFlight: c.MaxInFlight}}
	r.mu.Lock()
	now := r.clock.Now()
	hold, at := r.sch.Add(now, &j.sj)
	stuck := !hold && r.gate != nil && r.sch.Stuck(now, c.EndpointID)
	if hold {
		r.cond.Signal()
	}
	r.mu.Unlock()
	if !hold {
		if stuck {
			r.block(c.EndpointID, now)
		}
		r.putBack(j, at)
	}
}

// block marks endpoint blocked in its shared gate while this relay's
// request to it is out: its deliveries wait for a request that hangs or
// is slow (or the endpoint's first answer), and until it ends, claims
// skip them rather than hand them back over and over, a write each that
// every tenant pays for. The relay's next finished request to the
// endpoint clears the mark; Timeout bounds it.
func (r *Relay) block(endpoint string, now time.Time) {
	ctx, cancel := context.WithTimeout(r.httpCtx, r.cfg.Timeout)
	defer cancel()
	if err := r.gate.Block(ctx, endpoint, now.Add(r.cfg.Timeout)); err != nil && r.gateErrors.due(endpoint, time.Now()) {
		r.log.Warn("txhook: marking an endpoint blocked failed", "endpoint", endpoint, "error", err)
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
	if len(back) > 0 && r.gate != nil {
		var stuck []string
		r.mu.Lock()
		now := r.clock.Now()
		for _, b := range back {
			if ep := b.Job.Endpoint; b.Reason == "expired" && r.sch.Stuck(now, ep) && !slices.Contains(stuck, ep) {
				stuck = append(stuck, ep)
			}
		}
		r.mu.Unlock()
		for _, ep := range stuck {
			r.block(ep, now)
		}
	}
	for _, b := range back {
		if b.Reason == "shared" {
			r.stats.deferred.Add(1)
		}
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
			pass, ok := r.passGate(j)
			if !ok {
				r.mu.Lock()
				continue
			}
			out, took := r.process(j)
			r.endAttempt(j, &out)
			kind := r.outcomeKind(&out, took)
			openUntil := r.finishGate(j, pass, kind)
			// The endpoint's state first: once the outcome is written, what
			// it caused (a replay of a dead letter, say) must meet the
			// circuit this attempt left behind.
			r.mu.Lock()
			now := r.clock.Now()
			back = r.sch.Done(now, &j.sj, kind, took)
			if openUntil.After(now) {
				back = append(back, r.sch.Hold(now, j.c.EndpointID, openUntil)...)
			}
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

// passGate asks the endpoint's shared gate (internal/gate) for j's
// request. When it says to wait, j goes back to the scheduler, which holds
// the endpoint until then (or gives j back to the database when that is
// beyond its horizon), and passGate returns false.
func (r *Relay) passGate(j *job) (gate.Pass, bool) {
	if r.gate == nil || r.stopping.Load() {
		return gate.Pass{}, true
	}
	c := &j.c
	ctx, cancel := context.WithTimeout(r.httpCtx, r.cfg.Timeout)
	pass, err := r.gate.Acquire(ctx, r.clock.Now(), gate.Request{Endpoint: c.EndpointID, Rate: c.RateLimit, Burst: c.RateBurst, MaxInFlight: c.MaxInFlight})
	cancel()
	now := r.clock.Now()
	var until time.Time
	switch {
	case err != nil:
		if r.gateErrors.due(c.EndpointID, time.Now()) {
			r.log.Warn("txhook: asking the endpoint's shared limits failed; its deliveries wait", "endpoint", c.EndpointID, "error", err)
		}
		until = now.Add(time.Second)
	case !pass.OK():
		until, _ = pass.Wait()
	default:
		return pass, true
	}
	r.mu.Lock()
	back := r.sch.Defer(now, &j.sj, maxTime(until, now.Add(time.Millisecond)))
	r.cond.Signal()
	r.mu.Unlock()
	r.giveBack(back)
	return pass, false
}

// finishGate tells the gate how j's request went, and returns until when
// the endpoint's shared circuit is open (zero: it is not).
func (r *Relay) finishGate(j *job, pass gate.Pass, kind sched.Outcome) time.Time {
	if r.gate == nil {
		return time.Time{}
	}
	o := gate.NotSent
	switch kind {
	case sched.Answered:
		o = gate.Answered
	case sched.Fault:
		o = gate.Fault
	}
	// Also after Stop cancelled the requests: the slot must come back.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.httpCtx), r.cfg.Timeout)
	defer cancel()
	until, err := r.gate.Finish(ctx, r.clock.Now(), pass, o)
	if err != nil && r.gateErrors.due(j.c.EndpointID, time.Now()) {
		r.log.Warn("txhook: reporting to the endpoint's shared limits failed; its slot comes back when its lease ends", "endpoint", j.c.EndpointID, "error", err)
	}
	return until
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
