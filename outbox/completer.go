package outbox

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/txhook/txhook/internal/store"
)

// completer writes outcomes back in batches. It takes whatever has queued
// up while the previous write ran, so batches grow with load, and waits up
// to completionWindow after an outcome arrives for others to join it
// (unless a batch is full, or an outcome of an ordered delivery is
// waiting: the next delivery of its key waits for its write). An outcome
// is written after its request, so the wait delays no request; it saves
// the database a statement and a commit per outcome written alone, which
// at a steady rate is most of what the completion costs.
//
// A write that fails is retried with a growing pause, and meanwhile new
// outcomes keep being accepted (up to maxPending), so the workers never
// wait on a database that is down. An outcome is retried only until its
// lease ends: after that another relay takes the delivery over and records
// the attempt as lapsed. What the database refuses is the store's to
// isolate (store.Complete splits the batch and falls back to an outcome
// without the receiver's text); here it is only logged.
type completer struct {
	r       *Relay
	in      chan outcome
	done    chan struct{}
	closeMu sync.Mutex
	closed  bool
	// abort, once closed, makes the completer give up instead of retrying:
	// each batch is still written once, and what fails is dropped. The
	// leases of whatever is dropped expire and other relays redo it.
	abort     chan struct{}
	abortOnce sync.Once
	// notices serialises the endpoint notices of the completion and the
	// maintenance goroutines.
	notices sync.Mutex
	// window is how long an outcome may wait for others to join its batch
	// (completionWindow; 0: none), and full the batch size that ends the
	// wait.
	window time.Duration
	full   int
}

const (
	maxCompletionBatch = 500
	// maxPending bounds the outcomes held while writes fail; beyond it the
	// workers wait, and with them the claiming.
	maxPending = 4 * maxCompletionBatch
	// Pauses between failed writes.
	minWriteBackoff = 50 * time.Millisecond
	maxWriteBackoff = 5 * time.Second
	// completionWindow bounds how long an outcome waits for others to be
	// written with it. River flushes its completions every 50-250 ms; a
	// few milliseconds already turn single-row writes at a steady rate
	// into batches, and keep what a request did visible at once to
	// whoever reads the attempt log.
	completionWindow = 5 * time.Millisecond
)

func newCompleter(r *Relay, size int) *completer {
	return &completer{
		r:      r,
		in:     make(chan outcome, size),
		done:   make(chan struct{}),
		abort:  make(chan struct{}),
		window: completionWindow,
		full:   min(r.cfg.BatchSize, maxCompletionBatch),
	}
}

// outcome is a completion with what the logs and callbacks need.
type outcome struct {
	store.Completion
	eventID, eventType, tenant, endpointID, orderingKey string
	// fault: the receiver failed (no answer, 5xx, 408, 429), which counts
	// toward its circuit breaker. local: the attempt failed on our side
	// (signing, conversion) and says nothing about the receiver.
	fault, local bool
	// refused: this relay's target rules refused the endpoint; the
	// delivery went back unspent.
	refused bool
	// deadline is when the delivery's lease ends, on the local monotonic
	// clock (time.Now, never the relay's Clock). Past it the outcome is
	// not retried: another relay may own the delivery. Zero: never
	// retried.
	deadline time.Time
	// unwritten is why the last write of this outcome failed, if one did.
	unwritten error
	// event is shared by the first attempts of one event claimed with it
	// (ID 0 until written); see eventClaim. written: the outcome is in
	// the database (ID is then its delivery's).
	event   *eventClaim
	written bool
	// q is set for a delivery taken from a queue (broker mode).
	q *queued
}

// push appends x to pending. For a first attempt claimed with its event it
// decides whether x is the event's last outcome: the completer writes
// outcomes in the order they arrive, so its siblings are all ahead of it.
func push(pending *[]outcome, x outcome) {
	if ec := x.event; ec != nil {
		ec.seen++
		x.Last = ec.seen >= ec.jobs
	}
	*pending = append(*pending, x)
}

// lost records that x will not be written: its event, if it was claimed
// with it, must not be marked dispatched by a sibling.
func lost(x *outcome) {
	if x.event != nil {
		x.event.broken = true
	}
}

func (c *completer) add(x outcome) { c.in <- x }

// close flushes what is queued and stops, giving up on the database when
// ctx ends.
func (c *completer) close(ctx context.Context) {
	c.closeMu.Lock()
	if !c.closed {
		c.closed = true
		close(c.in)
	}
	c.closeMu.Unlock()
	select {
	case <-c.done:
	case <-ctx.Done():
		c.giveUp()
		<-c.done
	}
}

func (c *completer) giveUp() { c.abortOnce.Do(func() { close(c.abort) }) }

func (c *completer) aborted(ctx context.Context) bool {
	select {
	case <-c.abort:
		return true
	case <-ctx.Done():
		return true
	default:
		return false
	}
}

func (c *completer) run(ctx context.Context) {
	defer close(c.done)
	r := c.r
	var pending []outcome
	open := true
	backoff := time.Duration(0)
	// oldest is when the oldest outcome in pending arrived, or a time
	// before it: the gathering window runs from there.
	var oldest time.Time
	for {
		if len(pending) == 0 {
			x, ok := <-c.in
			if !ok {
				return
			}
			oldest = time.Now()
			push(&pending, x)
		}
		open = c.accept(&pending, open)
		if backoff == 0 {
			open = c.gather(ctx, &pending, open, oldest.Add(c.window))
		}
		pending = c.expire(pending)
		if len(pending) == 0 {
			if !open {
				return
			}
			continue
		}
		n := min(len(pending), maxCompletionBatch)
		oldest = time.Now() // what arrives from now on arrived after it
		fctx, cancel := r.statementContext(ctx)
		left, err := c.flush(fctx, pending[:n])
		cancel()
		pending = append(left, pending[n:]...)
		if err == nil {
			backoff = 0
			continue
		}
		if c.aborted(ctx) {
			r.stats.lost.Add(uint64(len(left)))
			r.log.Warn("txhook: relay stopping with outcomes unwritten; their leases will expire and the deliveries be retried",
				"deliveries", len(left), "error", err)
			for i := range left {
				lost(&left[i])
			}
			pending = append(pending[:0], pending[len(left):]...)
			continue
		}
		backoff = min(max(2*backoff, minWriteBackoff), maxWriteBackoff)
		r.log.Warn("txhook: writing delivery outcomes failed; retrying", "deliveries", len(left),
			"retry_in", backoff, "error", err)
		open = c.wait(ctx, backoff, &pending, open)
	}
}

// accept takes the outcomes queued on c.in, without waiting, up to
// maxPending, and reports whether c.in is still open.
func (c *completer) accept(pending *[]outcome, open bool) bool {
	for open && len(*pending) < maxPending {
		select {
		case x, ok := <-c.in:
			if !ok {
				return false
			}
			push(pending, x)
		default:
			return true
		}
	}
	return open
}

// gather accepts outcomes until the batch is full, until (on the local
// clock; the relay's Config.Clock decides what is due, not how long to
// batch) or until an outcome of an ordered delivery is in it, and reports
// whether c.in is still open. It stops at once when the relay stops.
func (c *completer) gather(ctx context.Context, pending *[]outcome, open bool, until time.Time) bool {
	if c.window <= 0 || !open {
		return open
	}
	for _, x := range *pending {
		if x.orderingKey != "" {
			return open
		}
	}
	var t *time.Timer
	for len(*pending) < c.full {
		d := time.Until(until)
		if d <= 0 {
			break
		}
		if t == nil {
			t = time.NewTimer(d)
			defer t.Stop()
		}
		select {
		case x, ok := <-c.in:
			if !ok {
				return false
			}
			push(pending, x)
			if x.orderingKey != "" {
				return open
			}
		case <-t.C:
			return open
		case <-c.abort:
			return open
		case <-ctx.Done():
			return open
		}
	}
	return open
}

// wait pauses for d after a failed write, or until the relay gives up,
// accepting outcomes meanwhile; it reports whether c.in is still open.
func (c *completer) wait(ctx context.Context, d time.Duration, pending *[]outcome, open bool) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		in := c.in
		if !open || len(*pending) >= maxPending {
			in = nil
		}
		select {
		case <-t.C:
			return open
		case <-c.abort:
			return open
		case <-ctx.Done():
			return open
		case x, ok := <-in:
			if !ok {
				open = false
				continue
			}
			push(pending, x)
		}
	}
}

// expire drops the outcomes that failed to be written and whose lease has
// ended since, logging each once with why its write failed.
func (c *completer) expire(pending []outcome) []outcome {
	r := c.r
	now := time.Now()
	kept := pending[:0]
	for _, x := range pending {
		if x.unwritten == nil || (!x.deadline.IsZero() && now.Before(x.deadline)) {
			kept = append(kept, x)
			continue
		}
		r.stats.lost.Add(1)
		lost(&x)
		r.log.Warn("txhook: outcome not written before the lease ended; another relay will take the delivery over",
			"delivery", x.ID, "event", x.eventID, "attempt", x.Attempt, "endpoint", x.endpointID, "tenant", x.tenant, "error", x.unwritten)
	}
	clear(pending[len(kept):])
	return kept
}

// flush writes batch once, reports what was written and returns what was
// not, for a retry, with the error that stopped the write.
func (c *completer) flush(ctx context.Context, batch []outcome) ([]outcome, error) {
	r := c.r
	if r.src != nil {
		return c.flushQueue(ctx, batch)
	}
	rows := make([]store.Completion, len(batch))
	for i := range batch {
		if x := &batch[i]; x.event != nil && x.event.broken {
			x.Last = false
		}
		rows[i] = batch[i].Completion
	}
	res, err := r.st.Complete(ctx, r.cfg.ID, r.clock.Now(), rows)
	var left []outcome
	done := make([]outcome, 0, len(batch))
	unwritten := make(map[int]bool, len(res.Unwritten))
	for _, i := range res.Unwritten {
		unwritten[i] = true
	}
	for i := range batch {
		x := batch[i]
		if id, ok := res.Written[i]; ok {
			x.ID, x.written = id, true
		}
		if cause, ok := res.Refused[i]; ok {
			lost(&x)
			r.stats.lost.Add(1)
			r.log.Warn("txhook: the database refused a delivery outcome, even without the receiver's text; its lease will expire and the delivery be retried",
				"delivery", x.ID, "event", x.eventID, "attempt", x.Attempt, "endpoint", x.endpointID, "tenant", x.tenant, "error", cause)
			continue
		}
		if unwritten[i] {
			x.unwritten = err
			left = append(left, x)
			continue
		}
		if res.RefusedDead[i] {
			// Refused for longer than RefusedLimit: the database wrote a
			// dead letter instead of handing it back.
			x.State = store.StateDead
		}
		if cause, ok := res.Substituted[i]; ok {
			r.log.Warn("txhook: the database refused a delivery outcome; stored it without the receiver's text",
				"delivery", x.ID, "event", x.eventID, "attempt", x.Attempt, "endpoint", x.endpointID, "tenant", x.tenant, "error", cause)
			x.Completion = store.Fallback(x.Completion, cause)
		}
		done = append(done, x)
	}
	if len(done) > 0 {
		c.report(ctx, done)
	}
	return left, err
}

// report logs what the batch did, tells the host about dead letters and
// attempts, and keeps endpoints' failure runs.
func (c *completer) report(ctx context.Context, batch []outcome) {
	r := c.r
	defer c.trackEndpoints(ctx, batch)
	defer c.unblock(ctx, batch)
	for i := range batch {
		x := &batch[i]
		if !x.written {
			r.stats.lost.Add(1)
			r.log.Warn("txhook: lease lost before the outcome was written; another relay owns the delivery now",
				"delivery", x.ID, "event", x.eventID, "endpoint", x.endpointID, "attempt", x.Attempt)
			continue
		}
		outcome := ""
		switch {
		case x.State == store.StateSucceeded:
			r.stats.succeeded.Add(1)
			outcome = OutcomeSucceeded
		case x.State == store.StateDead && x.refused:
			r.stats.dead.Add(1)
			r.stats.refusedDead.Add(1)
			r.deadLettered(x)
			outcome = OutcomeDeadLetteredRefused
		case x.State == store.StateDead:
			r.stats.dead.Add(1)
			r.deadLettered(x)
			outcome = OutcomeDeadLettered
		case x.refused:
			r.stats.refused.Add(1)
		case x.Attempts < x.Attempt:
			r.stats.released.Add(1)
		default:
			r.stats.failed.Add(1)
			outcome = OutcomeRetry
		}
		if r.cfg.OnAttempt != nil && outcome != "" {
			// The record of this attempt is the last one (an earlier one
			// may be a lapsed lease's).
			var rec store.AttemptRecord
			if n := len(x.Records); n > 0 {
				rec = x.Records[n-1]
			}
			if x.refused {
				// No request: the notice carries the refusal.
				rec = store.AttemptRecord{Attempt: x.Attempts, Error: x.Error}
			}
			r.cfg.OnAttempt(AttemptNotice{
				DeliveryID: x.ID, EventID: x.eventID, EventType: x.eventType, Tenant: x.tenant,
				EndpointID: x.endpointID, Attempt: rec.Attempt, Outcome: outcome, Status: rec.Status,
				Duration: rec.Duration, Error: rec.Error,
			})
		}
	}
}

// trackEndpoints records on the endpoints of a written batch the start of
// their latest successful and failed attempts, which keeps their runs of
// failures as the attempt log shows them, whatever other relays record
// meanwhile; it tells the host about endpoints that recovered and disables
// those failing for longer than DisableAfter (or answering 410 Gone, with
// DisableOnGone). Every attempt record counts, including those of lapsed
// leases: they are in the attempt log too.
func (c *completer) trackEndpoints(ctx context.Context, batch []outcome) {
	r := c.r
	times := map[string]*store.AttemptTimes{}
	gone := map[string]time.Time{} // the latest attempt answered 410, per endpoint
	for i := range batch {
		x := &batch[i]
		if !x.written {
			continue // lost lease: its records were not written
		}
		for _, rec := range x.Records {
			t := times[x.endpointID]
			if t == nil {
				t = &store.AttemptTimes{EndpointID: x.endpointID}
				times[x.endpointID] = t
			}
			if rec.Error == "" {
				if rec.StartedAt.After(t.Success) {
					t.Success = rec.StartedAt
				}
				continue
			}
			if rec.StartedAt.After(t.Failure) {
				t.Failure = rec.StartedAt
			}
			if r.cfg.DisableOnGone && rec.Status == http.StatusGone && rec.StartedAt.After(gone[x.endpointID]) {
				gone[x.endpointID] = rec.StartedAt
			}
		}
	}
	if len(times) == 0 {
		return
	}
	list := make([]store.AttemptTimes, 0, len(times))
	for _, t := range times {
		list = append(list, *t)
	}
	states, err := r.st.RecordAttemptTimes(ctx, list)
	if err != nil {
		r.log.Warn("txhook: recording endpoint health failed; the health sweep will repair it", "endpoints", len(list), "error", err)
		return
	}
	c.healthChanged(ctx, states, gone)
}

// healthChanged acts on endpoints' health as a statement left it: it
// reports the runs of failures that statement ended, and disables the
// endpoints due for it, and those in gone (the start of their latest
// attempt answered 410 Gone). The statement that ends a run, and the
// conditional update that disables an endpoint, happen once across all
// relays, so each notice is sent once.
func (c *completer) healthChanged(ctx context.Context, states []store.HealthState, gone map[string]time.Time) {
	r := c.r
	for _, h := range states {
		c.recovered(h)
	}
	if r.cfg.DisableAfter > 0 {
		for _, h := range states {
			if !h.Enabled || h.FailingSince.IsZero() || h.LastFailureAt.Sub(h.FailingSince) < r.cfg.DisableAfter {
				continue
			}
			now := r.clock.Now()
			var reason string
			got, disabled, err := r.st.DisableFailing(ctx, h.ID, r.cfg.DisableAfter, now, func(since time.Time) string {
				reason = fmt.Sprintf("every attempt failed since %s", since.UTC().Format(time.RFC3339))
				return reason
			})
			if err != nil {
				r.log.Warn("txhook: disabling endpoint failed", "endpoint", h.ID, "error", err)
				continue
			}
			c.recovered(got)
			if disabled {
				delete(gone, h.ID)
				c.disabled(got.ID, got.Tenant, got.FailingSince, reason, now)
			}
		}
	}
	for id, at := range gone {
		now := r.clock.Now()
		const reason = "the endpoint answered 410 Gone"
		tenant, disabled, err := r.st.DisableGone(ctx, id, at, now, reason)
		if err != nil {
			r.log.Warn("txhook: disabling endpoint failed", "endpoint", id, "error", err)
			continue
		}
		if disabled {
			c.disabled(id, tenant, time.Time{}, reason, now)
		}
	}
}

// recovered reports h's recovery if the statement that read it ended a run
// of failures.
func (c *completer) recovered(h store.HealthState) {
	r := c.r
	if !h.Recovered() {
		return
	}
	r.log.Info("txhook: endpoint recovered", "endpoint", h.ID, "tenant", h.Tenant, "failing_since", h.WasFailingSince)
	if r.cfg.OnEndpointRecovered != nil {
		c.notices.Lock()
		defer c.notices.Unlock()
		r.cfg.OnEndpointRecovered(EndpointNotice{EndpointID: h.ID, Tenant: h.Tenant, FailingSince: h.WasFailingSince, At: r.clock.Now()})
	}
}

func (c *completer) disabled(id, tenant string, since time.Time, reason string, now time.Time) {
	r := c.r
	r.log.Warn("txhook: endpoint disabled", "endpoint", id, "tenant", tenant, "reason", reason)
	if r.cfg.OnEndpointDisabled != nil {
		c.notices.Lock()
		defer c.notices.Unlock()
		r.cfg.OnEndpointDisabled(EndpointNotice{EndpointID: id, Tenant: tenant, Reason: reason, FailingSince: since, At: now})
	}
}

// unblock lets the next delivery of each ordering key go once the one
// before it has succeeded or been dead-lettered.
func (c *completer) unblock(ctx context.Context, batch []outcome) {
	var pairs []store.OrderedPair
	var refused []store.RefusedLine
	for i := range batch {
		x := &batch[i]
		if x.orderingKey != "" && x.written && x.refused && x.State == store.StateDead {
			refused = append(refused, store.RefusedLine{ID: x.ID, EndpointID: x.endpointID, Key: x.orderingKey})
		}
	}
	if len(refused) > 0 {
		// Before the unblocking, so that the next delivery of the line is
		// refused since when this one was.
		if _, err := c.r.st.CarryRefusal(ctx, refused); err != nil {
			c.r.log.Warn("txhook: carrying a refusal along an ordered line failed; its next delivery waits RefusedLimit of its own", "error", err)
		}
	}
	for i := range batch {
		x := &batch[i]
		if x.orderingKey != "" && x.written && (x.State == store.StateSucceeded || x.State == store.StateDead) {
			pairs = append(pairs, store.OrderedPair{Tenant: x.tenant, EndpointID: x.endpointID, Key: x.orderingKey})
		}
	}
	if len(pairs) == 0 {
		return
	}
	n, err := c.r.st.Unblock(ctx, c.r.clock.Now(), pairs)
	if err != nil {
		// The sweep in the relay's maintenance catches up.
		c.r.log.Warn("txhook: releasing ordered deliveries failed; the sweep will retry", "error", err)
		return
	}
	if n > 0 {
		c.r.Wake()
	}
}
