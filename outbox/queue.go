package outbox

import (
	"context"
	"errors"
	"time"

	"github.com/txhook/txhook/internal/queue"
	"github.com/txhook/txhook/internal/store"
)

// Broker mode: a relay whose deliveries come from a message queue
// (internal/queue, implemented on NATS JetStream by package outbox/broker)
// instead of claim statements. Everything between is the relay's own: the
// scheduler with its limits, breakers and fairness, the request with its
// signatures, target rules, proxy, client certificates, headers, pinned
// versions and tracing, the retry policy. What differs is at the ends:
//
//   - A received delivery's endpoint and row are read with the batch (a
//     statement each per batch, as a claim joins them), and the delivery
//     is checked against its row first: if its attempt was recorded, it
//     is settled as the row says, and nothing is sent. That covers a
//     message handed out again after its lease (its holder died after
//     writing the outcome), and a copy the queue stored as a new message:
//     a forwarder that takes over forwards again what the last one sent
//     after its saved cursor, and JetStream drops those copies by their
//     IDs only while its duplicate window remembers them; the window is
//     rebuilt from the messages a stream holds when a server restarts (or
//     a node that restarted comes to lead the stream), which in a
//     work-queue stream are not those delivered and acknowledged.
//   - Outcomes are written by BrokerComplete, in batches, fenced by the
//     attempts the row had when the message was sent; then each message
//     is settled: removed, or queued again for its next attempt at the
//     retry time (a delayed message, not a sleeping worker).
//   - What must wait (limits, open circuits, a relay stopping) goes back to
//     the queue, unspent, due when it can run, writing nothing.

// queued is what a job taken from a queue carries besides its claim.
type queued struct {
	d *queue.Delivery
	// lapsed counts the attempts before c.Attempt that holders made and
	// never recorded (the queue handed the message out that many times
	// before).
	lapsed int
}

// newQueueRelay returns a relay that takes its deliveries from src and
// records them as owner (store.BrokerOwner).
func (o *Outbox) newQueueRelay(cfg RelayConfig, src queue.Source, owner string) (*Relay, error) {
	if src == nil || owner == "" {
		return nil, errors.New("txhook: queue relay needs a source and an owner")
	}
	cfg.Lease = src.Lease()
	r, err := o.newRelay(cfg)
	if err != nil {
		return nil, err
	}
	r.src, r.owner = src, owner
	r.gate = nil // a broker worker's database is the history; limits stay per worker
	return r, nil
}

// receiveLoop is fetchLoop for a queue: it keeps the relay's hands as full
// as fetchLoop does, receiving instead of claiming.
func (r *Relay) receiveLoop(ctx context.Context) {
	defer close(r.fetchDone)
	capacity := int64(r.cfg.Concurrency + r.cfg.BatchSize)
	errBackoff := 50 * time.Millisecond
	for {
		held := r.held.Load()
		free := capacity - held
		if free <= 0 || free < int64(r.cfg.BatchSize/2) && held >= int64(r.cfg.Concurrency) {
			select {
			case <-ctx.Done():
				return
			case <-r.freed:
				continue
			}
		}
		n := int(min(free, int64(r.cfg.BatchSize)))
		ds, err := r.src.Receive(ctx, n)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			r.log.Warn("txhook: receiving deliveries from the broker failed", "error", err, "retry_in", errBackoff)
			t := time.NewTimer(errBackoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			errBackoff = min(errBackoff*2, 5*time.Second)
			continue
		}
		errBackoff = 50 * time.Millisecond
		r.stats.polls.Add(1)
		if len(ds) == 0 {
			r.stats.emptyPolls.Add(1)
			continue
		}
		r.take(ctx, ds)
	}
}

// take looks up the endpoints and the rows of ds, settles those whose
// attempt is recorded as their rows say, and hands the others to the
// scheduler.
func (r *Relay) take(ctx context.Context, ds []*queue.Delivery) {
	stmtCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.Timeout)
	defer cancel()
	now := r.clock.Now()
	seen := map[string]bool{}
	var ids []string
	var rowIDs []int64
	var pairs [][2]string
	for _, d := range ds {
		if !seen[d.EndpointID] {
			seen[d.EndpointID] = true
			ids = append(ids, d.EndpointID)
		}
		if d.Row != 0 {
			rowIDs = append(rowIDs, d.Row)
		} else {
			pairs = append(pairs, [2]string{d.Event.ID, d.EndpointID})
		}
	}
	eps, err := r.st.EndpointsByID(stmtCtx, ids)
	var byID map[int64]store.BrokerRow
	var byPair map[[2]string]store.BrokerRow
	if err == nil {
		byID, byPair, err = r.st.BrokerRows(stmtCtx, rowIDs, pairs)
	}
	if err != nil {
		// Nothing can start without the endpoint: back to the queue, for
		// this relay or another, once the database may answer again.
		r.log.Warn("txhook: reading endpoints for received deliveries failed; giving them back", "deliveries", len(ds), "error", err)
		ss := make([]queue.Settlement, len(ds))
		for i, d := range ds {
			ss[i] = queue.Settlement{D: d, Action: queue.Defer, At: now.Add(time.Second), Base: d.Base,
				Attempt: d.Attempt + d.Deliveries - 1, Row: d.Row, RefusedSince: d.RefusedSince}
		}
		r.src.Settle(ctx, ss)
		return
	}
	r.stats.claimed.Add(uint64(len(ds)))
	var settle []queue.Settlement
	for _, d := range ds {
		// Each time the queue handed the message out before, its holder
		// may have made the attempt: each counts, as a lapsed lease does
		// in table mode, so a delivery that kills its holders ends.
		attempt := d.Attempt + d.Deliveries - 1
		lapsedFrom := d.Base + 1
		if d.Lapsed {
			lapsedFrom = d.Base
		}
		lapsed := attempt - lapsedFrom
		row, ok := byID[d.Row]
		if d.Row == 0 {
			row, ok = byPair[[2]string{d.Event.ID, d.EndpointID}]
		}
		if ok && (row.Attempts != d.Base || row.Owner != r.owner || row.State != store.StatePending && row.State != store.StateRunning) {
			// The message's attempt is recorded (a holder died after
			// writing it, before settling; or this is a copy of a message
			// that was delivered, see the top of the file), or the row
			// moved on: do what the row says, send nothing.
			settle = append(settle, r.reconcile(d, row))
			continue
		}
		ep, found := eps[d.EndpointID]
		if found && ep.Tenant != d.Event.Tenant {
			// Forged or corrupted: an event never goes to another
			// tenant's endpoint.
			r.log.Error("txhook: broker delivery names an endpoint of another tenant; dropped", "event", d.Event.ID, "endpoint", d.EndpointID)
			settle = append(settle, queue.Settlement{D: d, Action: queue.Ack})
			continue
		}
		c := ep
		c.ID, c.Attempt, c.LeaseLapsed = d.Row, attempt, lapsed > 0
		c.EventID, c.Tenant, c.Type, c.Version, c.Payload, c.EventTime = d.Event.ID, d.Event.Tenant, d.Event.Type, d.Event.Version, d.Event.Payload, d.Event.CreatedAt
		c.TraceParent, c.TraceState, c.EndpointID, c.EndpointFound = d.Event.TraceParent, d.Event.TraceState, d.EndpointID, found
		r.held.Add(1)
		j := &job{c: c, lease: leaseWindow(d.Received, r.cfg.Lease, r.cfg.Timeout), claimedAt: now,
			q: &queued{d: d, lapsed: lapsed}}
		r.dispatch(j)
	}
	if len(settle) > 0 {
		r.src.Settle(ctx, settle)
	}
}

// reconcile settles a delivery whose row no longer waits for the message's
// attempt: when the row waits for a later attempt the broker holds,
// queueing that attempt again is harmless (the queue keeps one message per
// delivery and drops a repeated one), and covers a holder that died
// between writing the outcome and queueing the retry.
func (r *Relay) reconcile(d *queue.Delivery, row store.BrokerRow) queue.Settlement {
	if row.State == store.StatePending && row.Owner == r.owner {
		return queue.Settlement{D: d, Action: queue.Retry, At: row.NextAt, Base: row.Attempts, Attempt: row.Attempts + 1, Row: row.ID}
	}
	return queue.Settlement{D: d, Action: queue.Ack}
}

// queueBack gives a job taken from the queue back to it, unspent, due at
// `at` (released at once when the relay stops).
func (r *Relay) queueBack(j *job, at time.Time) {
	d := j.q.d
	s := queue.Settlement{D: d, Action: queue.Defer, At: at, Base: d.Base, Attempt: j.c.Attempt, Row: d.Row, RefusedSince: d.RefusedSince}
	if r.stopping.Load() {
		s.Action = queue.Release
	}
	r.stats.released.Add(1)
	r.src.Settle(r.httpCtx, []queue.Settlement{s})
}

// flushQueue is flush for outcomes of deliveries taken from the queue:
// it writes what was attempted (or parked), settles every message once its
// outcome is written, and returns what was not written, for a retry, with
// the error that stopped the write.
func (c *completer) flushQueue(ctx context.Context, batch []outcome) ([]outcome, error) {
	r := c.r
	var settle []queue.Settlement
	var write []outcome
	now := r.clock.Now()
	for _, x := range batch {
		d := x.q.d
		if x.refused && !d.RefusedSince.IsZero() && r.cfg.RefusedLimit > 0 && now.Sub(d.RefusedSince) >= r.cfg.RefusedLimit {
			// Refused by the target rules of every worker that had it
			// (each refusal queues it again, for any worker) for longer
			// than RefusedLimit: a dead letter of its own reason, which a
			// replay sends once the rules or the URL are fixed.
			x.State, x.NextAt, x.Refused = store.StateDead, time.Time{}, true
		}
		if x.State == store.StatePending && x.Attempts < x.Attempt {
			// Not attempted (stopping, no key to sign with, refused by
			// this relay's target rules): back to the queue, unspent.
			s := queue.Settlement{D: d, Action: queue.Defer, At: x.NextAt, Base: d.Base, Attempt: x.Attempt, Row: d.Row, RefusedSince: d.RefusedSince}
			if x.refused && s.RefusedSince.IsZero() {
				s.RefusedSince = now
			}
			if r.stopping.Load() && !x.refused {
				s.Action = queue.Release
			}
			if x.refused {
				r.stats.refused.Add(1)
			} else {
				r.stats.released.Add(1)
			}
			settle = append(settle, s)
			continue
		}
		x.Base = d.Base
		write = append(write, x)
	}
	var left []outcome
	var err error
	if len(write) > 0 {
		rows := make([]store.Completion, len(write))
		for i := range write {
			rows[i] = write[i].Completion
		}
		var res store.Completed
		res, err = r.st.BrokerComplete(ctx, r.owner, r.clock.Now(), rows)
		unwritten := make(map[int]bool, len(res.Unwritten))
		for _, i := range res.Unwritten {
			unwritten[i] = true
		}
		var done []outcome
		var fenced []*queue.Delivery
		for i := range write {
			x := write[i]
			d := x.q.d
			if cause, ok := res.Refused[i]; ok {
				// Left to the queue, which hands the message out again
				// after its lease: the next holder tries again.
				r.stats.lost.Add(1)
				r.log.Warn("txhook: the database refused a delivery outcome, even without the receiver's text; the broker will hand the delivery out again",
					"event", x.eventID, "attempt", x.Attempt, "endpoint", x.endpointID, "tenant", x.tenant, "error", cause)
				continue
			}
			if unwritten[i] {
				x.unwritten = err
				left = append(left, x)
				continue
			}
			if cause, ok := res.Substituted[i]; ok {
				r.log.Warn("txhook: the database refused a delivery outcome; stored it without the receiver's text",
					"event", x.eventID, "attempt", x.Attempt, "endpoint", x.endpointID, "tenant", x.tenant, "error", cause)
				x.Completion = store.Fallback(x.Completion, cause)
			}
			id, ok := res.Written[i]
			if !ok {
				fenced = append(fenced, d)
				done = append(done, x)
				continue
			}
			x.ID, x.written = id, true
			done = append(done, x)
			if x.State == store.StatePending {
				settle = append(settle, queue.Settlement{D: d, Action: queue.Retry, At: x.NextAt, Base: x.Attempt, Attempt: x.Attempt + 1, Row: id})
			} else {
				settle = append(settle, queue.Settlement{D: d, Action: queue.Ack})
			}
		}
		if len(fenced) > 0 {
			settle = append(settle, c.reconcileFenced(ctx, fenced)...)
		}
		if len(done) > 0 {
			c.report(ctx, done)
		}
	}
	if len(settle) > 0 {
		r.src.Settle(ctx, settle)
	}
	return left, err
}

// reconcileFenced settles the deliveries whose outcome the database
// fenced out, as their rows say (see Relay.reconcile). A row that cannot
// be read leaves its message to be handed out again.
func (c *completer) reconcileFenced(ctx context.Context, ds []*queue.Delivery) []queue.Settlement {
	r := c.r
	var ids []int64
	var pairs [][2]string
	for _, d := range ds {
		if d.Row != 0 {
			ids = append(ids, d.Row)
		} else {
			pairs = append(pairs, [2]string{d.Event.ID, d.EndpointID})
		}
	}
	byID, byPair, err := r.st.BrokerRows(ctx, ids, pairs)
	if err != nil {
		r.log.Warn("txhook: reading the rows of fenced broker deliveries failed; the broker will hand them out again", "deliveries", len(ds), "error", err)
		return nil
	}
	out := make([]queue.Settlement, 0, len(ds))
	for _, d := range ds {
		row, ok := byID[d.Row]
		if d.Row == 0 {
			row, ok = byPair[[2]string{d.Event.ID, d.EndpointID}]
		}
		if !ok {
			out = append(out, queue.Settlement{D: d, Action: queue.Ack})
			continue
		}
		out = append(out, r.reconcile(d, row))
	}
	return out
}

// listenFunc returns what wakes a forwarder when events commit (see
// link.Internals.Listen): nil when nothing does and it must poll.
func (o *Outbox) listenFunc() func(ctx context.Context, wake func()) error {
	if o.st.Dialect == store.SQLite {
		return func(ctx context.Context, wake func()) error {
			ch, unsubscribe := o.st.SubscribeLocal()
			defer unsubscribe()
			wake()
			for {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-ch:
					wake()
				}
			}
		}
	}
	if o.cfg.Listener == nil || o.cfg.NotifyInterval < 0 {
		return nil
	}
	return func(ctx context.Context, wake func()) error {
		return o.cfg.Listener.Listen(ctx, o.db, WakeChannel, wake)
	}
}
