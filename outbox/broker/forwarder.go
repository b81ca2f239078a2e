package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/txhook/txhook/internal/link"
	"github.com/txhook/txhook/internal/queue"
	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/outbox"
)

// Forwarder publishes the events committed in an Outbox to the stream:
// one message per delivery, for each enabled endpoint of the event's
// tenant that subscribes to its type at that moment (fan-out happens
// here, so that each delivery is a message of its own, which JetStream
// retries, delays and hands to any worker on its own). It also hands the
// stream the delivery rows that operations make due in the history
// database: dead letters replayed, resends, recoveries, test events,
// deliveries of an endpoint enabled again.
//
// Any number of forwarders may run, in any number of processes: on
// PostgreSQL one at a time holds the stream's cursor (a lease; the others
// take over when it stops or dies), and every one claims leftover events
// and due rows under leases of their own. A forwarder waits for
// JetStream's acknowledgement of every message before it moves its cursor
// or marks anything forwarded; a message published twice (a forwarder
// that died before saving its cursor) carries the same ID and JetStream
// drops the copy within its duplicate window, while it remembers the
// first: a server that restarted rebuilds the window from the messages
// the stream holds, without those already delivered. A copy it stores is
// a new message for a delivery already made; workers check each delivery
// against its row and send nothing for it.
type Forwarder struct {
	ob        *outbox.Outbox
	cfg       Config
	src, hist link.Internals
	separate  bool // the history database is not the source's
	log       *slog.Logger
	id        string
	owner     string // of the delivery rows the broker holds
	prefix    string
	keys      *keyring
	seal      sealer

	mu      sync.Mutex
	started bool
	cancel  context.CancelFunc
	done    chan struct{}
	wakeCh  chan struct{}

	// The cursor, while this forwarder holds it (PostgreSQL).
	held    bool
	cursor  store.Snapshot
	savedAt time.Time
	triedAt time.Time

	stats   forwarderCounters
	lastErr atomic.Pointer[error] // the last round's error, nil after a round that worked
}

type forwarderCounters struct {
	rounds, events, messages, rows, rescued, unrouted, duplicates, failures atomic.Uint64
}

// ForwarderStats counts what a forwarder has done since it started.
type ForwarderStats struct {
	Rounds     uint64 // forwarding rounds run
	Events     uint64 // events forwarded
	Messages   uint64 // deliveries published (an event makes one per endpoint)
	Rows       uint64 // delivery rows handed to the stream (replays, resends, recoveries…)
	Rescued    uint64 // rows the broker held whose message was gone, queued again
	Unrouted   uint64 // events no endpoint subscribed to
	Duplicates uint64 // messages JetStream already had (dropped as duplicates)
	Failures   uint64 // rounds that failed (JetStream or the database unreachable); retried
	// HoldsCursor says whether this forwarder holds its stream's cursor
	// (PostgreSQL): the one that forwards events enqueued in broker mode.
	HoldsCursor bool
}

// NewForwarder returns a forwarder of the events enqueued into ob, which
// must be in broker mode (outbox.Config.Broker). Start it with Start.
func NewForwarder(ob *outbox.Outbox, cfg Config) (*Forwarder, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	src := link.Outbox(ob)
	hist := src
	if cfg.History != nil && cfg.History != ob {
		hist = link.Outbox(cfg.History)
	}
	if !src.Broker || !hist.Broker {
		return nil, ErrNotBrokerMode
	}
	log := cfg.Logger
	if log == nil {
		log = src.Logger
	}
	host, _ := os.Hostname()
	id := fmt.Sprintf("forwarder:%s/%d/%s", host, os.Getpid(), ulid.Make().String()[20:])
	return &Forwarder{
		ob: ob, cfg: cfg, src: src, hist: hist, separate: hist.Store != src.Store,
		log: log.With("component", "txhook.broker.forwarder", "forwarder", id), id: id,
		owner: store.BrokerOwner(cfg.Stream), prefix: cfg.Subjects,
		keys:   &keyring{in: hist, name: cfg.Stream},
		wakeCh: make(chan struct{}, 1),
	}, nil
}

// ID returns the forwarder's lease owner name.
func (f *Forwarder) ID() string { return f.id }

// Stats returns the forwarder's counters.
func (f *Forwarder) Stats() ForwarderStats {
	f.mu.Lock()
	held := f.held
	f.mu.Unlock()
	c := &f.stats
	return ForwarderStats{Rounds: c.rounds.Load(), Events: c.events.Load(), Messages: c.messages.Load(), Rows: c.rows.Load(),
		Rescued: c.rescued.Load(), Unrouted: c.unrouted.Load(), Duplicates: c.duplicates.Load(), Failures: c.failures.Load(),
		HoldsCursor: held}
}

// ErrStarted is returned by Start on a forwarder that was started before.
var ErrStarted = errors.New("txhook/broker: forwarder already started; a forwarder runs once")

// Start checks the schema and the stream (creating it when missing, see
// Setup) and begins forwarding in the background. It fails with an error
// matching ErrUnavailable when JetStream does not answer (events wait in
// the outbox table meanwhile; start again later), ErrStreamConfig for a
// stream set up otherwise, ErrOrderingBroker when events with an ordering
// key wait to be dispatched (broker mode does not order them: deliver them
// with a table-mode relay first), or outbox.ErrNotMigrated.
func (f *Forwarder) Start(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.started {
		return ErrStarted
	}
	for _, in := range []link.Internals{f.src, f.hist} {
		if err := in.Store.CheckSchema(ctx); err != nil {
			return fmt.Errorf("txhook/broker: forwarder start: %w", err)
		}
	}
	if n, err := f.src.Store.PendingOrdered(ctx); err != nil {
		return fmt.Errorf("txhook/broker: forwarder start: %w", err)
	} else if n > 0 {
		return fmt.Errorf("txhook/broker: forwarder start: %w: %d events with an ordering key wait to be dispatched; deliver them with a table-mode relay (outbox.Config.Broker off) first", outbox.ErrOrderingBroker, n)
	}
	key, err := f.keys.key(ctx)
	if err != nil {
		return fmt.Errorf("txhook/broker: forwarder start: %w", err)
	}
	f.seal = sealer{key: key}
	if _, err := setup(ctx, f.cfg); err != nil {
		return fmt.Errorf("txhook/broker: forwarder start: %w", err)
	}
	_ = f.src.Store.Prepare(ctx, f.src.Store.ForwardQueries()...)
	f.started = true
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f.cancel, f.done = cancel, make(chan struct{})
	f.listen(runCtx, f.src)
	if f.separate {
		f.listen(runCtx, f.hist)
	}
	go f.run(runCtx)
	go func() {
		select {
		case <-ctx.Done():
			expired, cancel := context.WithCancel(context.Background())
			cancel()
			_ = f.Stop(expired)
		case <-f.done:
		}
	}()
	return nil
}

// Stop stops forwarding: a round under way finishes (within ctx), the
// cursor is saved and its lease given up, so another forwarder takes over
// at once. Stop returns ctx.Err() if ctx ended first.
func (f *Forwarder) Stop(ctx context.Context) error {
	f.mu.Lock()
	if !f.started || f.cancel == nil {
		f.mu.Unlock()
		return nil
	}
	cancel, done := f.cancel, f.done
	f.mu.Unlock()
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Err returns why the last forwarding round failed (errors matching
// ErrUnavailable, ErrStreamMissing, or the database's), or nil when it
// worked: for a readiness check. Failed rounds are retried; events wait
// in the outbox table meanwhile.
func (f *Forwarder) Err() error {
	if p := f.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// explain turns a publish failure into ErrStreamMissing when the stream is
// gone (a publish then finds no responder, as if JetStream were down).
func (f *Forwarder) explain(ctx context.Context, err error) error {
	if !errors.Is(err, ErrUnavailable) {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, serr := f.cfg.JetStream.Stream(cctx, f.cfg.Stream); errors.Is(serr, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("%w: stream %s not found; events wait in the outbox: %w", ErrStreamMissing, f.cfg.Stream, serr)
	}
	return err
}

// Wake makes the forwarder look for events and due rows now.
func (f *Forwarder) Wake() {
	select {
	case f.wakeCh <- struct{}{}:
	default:
	}
}

// listen wakes the forwarder at each commit of an enqueuing transaction
// (or operation) in in's database, re-listening after a failure.
func (f *Forwarder) listen(ctx context.Context, in link.Internals) {
	if in.Listen == nil {
		return
	}
	go func() {
		backoff := 100 * time.Millisecond
		for {
			err := in.Listen(ctx, f.Wake)
			if ctx.Err() != nil {
				return
			}
			f.log.Warn("txhook: the forwarder's LISTEN connection failed; polling until it is back", "error", err)
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(backoff*2, 10*time.Second)
		}
	}()
}

// minRepoll is the first wait after a round that forwarded events without
// filling a batch. Enqueue sends at most one NOTIFY per
// outbox.Config.NotifyInterval, so a steady stream wakes the forwarder for
// only some of its events: the others are found by polling again soon,
// after 2, 4, 8... ms, up to PollInterval, rather than at the next NOTIFY
// or PollInterval.
const minRepoll = 2 * time.Millisecond

func (f *Forwarder) run(ctx context.Context) {
	defer close(f.done)
	defer f.release()
	delay := time.Duration(0)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	backoff := 50 * time.Millisecond
	nextPrune := time.Now().Add(f.pruneInterval())
	// A whole round also claims events left to a lease and hands due rows
	// to the stream; a quick one (a re-poll, on PostgreSQL) only reads the
	// events past the cursor. Whole rounds run on a wake-up and at least
	// every PollInterval, as every round did before quick ones.
	whole, lastWhole := true, time.Time{}
	repoll := time.Duration(0)
	for {
		if f.separate && f.pruneInterval() > 0 && !time.Now().Before(nextPrune) {
			f.prune(ctx)
			nextPrune = time.Now().Add(f.pruneInterval())
		}
		if whole || f.src.Store.Dialect != store.Postgres || time.Since(lastWhole) >= f.cfg.PollInterval {
			whole, lastWhole = true, time.Now()
		}
		wasWhole := whole
		n, full, err := f.round(ctx, whole)
		whole = false
		f.stats.rounds.Add(1)
		if err != nil && ctx.Err() == nil {
			err = f.explain(ctx, err)
			f.lastErr.Store(&err)
		} else {
			f.lastErr.Store(nil)
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			f.stats.failures.Add(1)
			f.log.Warn("txhook: forwarding failed; events wait in the outbox and are forwarded when it works again", "error", err, "retry_in", backoff)
			delay = backoff
			backoff = min(2*backoff, 5*time.Second)
			whole, repoll = true, 0
		case full:
			backoff = 50 * time.Millisecond
			whole = wasWhole // a whole batch of due rows: more may be due
			continue
		default:
			backoff = 50 * time.Millisecond
			switch {
			case n > 0:
				repoll = minRepoll
			case repoll > 0:
				repoll *= 2
			}
			if repoll > 0 && repoll < f.cfg.PollInterval {
				delay = repoll
			} else {
				repoll = 0
				delay = max(f.cfg.PollInterval-time.Since(lastWhole), 0)
			}
		}
		timer.Reset(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-f.wakeCh:
			timer.Stop()
			whole = true
			// Transactions that committed with the one that woke us (whose
			// NOTIFY was skipped) become visible a moment later: the
			// re-polls after this round find them.
		case <-timer.C:
		}
	}
}

// round forwards what is due once: events past the cursor and, in a
// whole round, events left to a lease and due rows. n counts the events
// and rows it forwarded; full reports that some part found a whole batch,
// so more may be waiting.
func (f *Forwarder) round(ctx context.Context, whole bool) (n int, full bool, err error) {
	if f.src.Store.Dialect == store.Postgres {
		if n, full, err = f.cursorRound(ctx); err != nil {
			return n, false, err
		}
	}
	if !whole {
		return n, full, nil
	}
	evs, err := f.src.Store.ClaimUnforwarded(ctx, f.id, f.cfg.Lease, f.cfg.BatchSize)
	if err != nil {
		return n, false, err
	}
	if len(evs) > 0 {
		unrouted, err := f.forward(ctx, evs)
		if err != nil {
			return n, false, err
		}
		ids := make([]string, len(evs))
		var un []string
		for i, e := range evs {
			ids[i] = e.ID
			if unrouted[e.ID] || f.separate {
				// In a source whose history is elsewhere no delivery row
				// will refer to the event: retention takes it as unrouted.
				un = append(un, e.ID)
			}
		}
		if err := f.src.Store.MarkForwarded(ctx, f.id, f.src.Clock.Now(), ids, un); err != nil {
			return n, false, err
		}
		n += len(evs)
		full = full || len(evs) == f.cfg.BatchSize
	}
	rows, err := f.dueRows(ctx)
	if err != nil {
		return n, false, err
	}
	return n + rows, full || rows == f.cfg.BatchSize, nil
}

// cursorRound forwards the events committed since the cursor, if this
// forwarder holds it (or can take it).
func (f *Forwarder) cursorRound(ctx context.Context) (n int, full bool, err error) {
	st := f.src.Store
	f.mu.Lock()
	held := f.held
	f.mu.Unlock()
	if !held {
		if time.Since(f.triedAt) < min(time.Second, f.cfg.Lease/3) {
			return 0, false, nil
		}
		f.triedAt = time.Now()
		pos, ok, err := st.ForwardLease(ctx, f.cfg.Stream, f.id, f.cfg.Lease)
		if err != nil || !ok {
			return n, false, err
		}
		f.mu.Lock()
		f.held, f.cursor, f.savedAt = true, pos, time.Now()
		f.mu.Unlock()
		f.log.Info("txhook: forwarder took the stream's cursor", "stream", f.cfg.Stream, "position", pos.String())
	}
	// The first page comes with the round's target snapshot, in one
	// statement; a full one is paged on from its last event, in the
	// running range if that is where it ended, then in the new range.
	to, evs, err := st.ForwardFirst(ctx, f.cursor, f.cfg.BatchSize)
	if err != nil {
		return n, false, err
	}
	handle := func(evs []store.ForwardEvent) error {
		n += len(evs)
		if len(evs) == 0 {
			return nil
		}
		unrouted, err := f.forward(ctx, evs)
		if err != nil {
			return err
		}
		if !f.separate && len(unrouted) > 0 {
			return st.MarkUnrouted(ctx, keysOf(unrouted))
		}
		return nil
	}
	if err := handle(evs); err != nil {
		return n, false, err
	}
	if len(evs) == f.cfg.BatchSize {
		full = true
		last := evs[len(evs)-1]
		lastXID, err := strconv.ParseUint(last.XID, 10, 64)
		if err != nil {
			return n, false, fmt.Errorf("txhook/broker: event %s: transaction ID %q: %w", last.ID, last.XID, err)
		}
		inRunning := lastXID < f.cursor.Xmax
		for _, running := range []bool{true, false} {
			xid, id := "0", ""
			switch {
			case running && !inRunning:
				continue // the first page went past the running range
			case running == inRunning:
				xid, id = last.XID, last.ID
			}
			for {
				evs, err := st.ForwardPage(ctx, f.cursor, to, running, xid, id, f.cfg.BatchSize)
				if err != nil {
					return n, false, err
				}
				if err := handle(evs); err != nil {
					return n, false, err
				}
				if len(evs) < f.cfg.BatchSize {
					break
				}
				last := evs[len(evs)-1]
				xid, id = last.XID, last.ID
			}
		}
	}
	f.cursor = to
	if time.Since(f.savedAt) >= f.cfg.SaveInterval {
		if err := f.save(ctx); err != nil {
			return n, full, err
		}
	}
	return n, full, nil
}

// save saves the cursor and renews the lease; a lease lost (this forwarder
// stalled for longer than Lease, and another took over) ends its turn.
func (f *Forwarder) save(ctx context.Context) error {
	ok, err := f.src.Store.ForwardSave(ctx, f.cfg.Stream, f.id, f.cursor, f.cfg.Lease)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.savedAt = time.Now()
	if !ok {
		f.held = false
		f.log.Warn("txhook: forwarder lost the stream's cursor to another forwarder (it stalled for longer than Lease)", "stream", f.cfg.Stream)
	}
	return nil
}

// release saves the cursor and gives its lease up as the forwarder stops.
func (f *Forwarder) release() {
	f.mu.Lock()
	held := f.held
	f.mu.Unlock()
	if !held {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.save(ctx); err != nil {
		f.log.Warn("txhook: saving the forwarder's cursor at stop failed; the next forwarder sends the last events again (JetStream drops the copies)", "error", err)
		return
	}
	if err := f.src.Store.ForwardRelease(ctx, f.cfg.Stream, f.id); err != nil {
		f.log.Warn("txhook: giving up the forwarder's lease failed; another forwarder takes over when it expires", "error", err)
	}
	f.mu.Lock()
	f.held = false
	f.mu.Unlock()
}

// forward publishes the deliveries of evs, one per enabled endpoint of
// the event's tenant that subscribes to its type, first copying the events
// into the history database when it is another, and waits for every
// acknowledgement. It returns the events that no endpoint takes.
func (f *Forwarder) forward(ctx context.Context, evs []store.ForwardEvent) (map[string]bool, error) {
	tenants := make([]string, 0, 8)
	seen := map[string]bool{}
	for _, e := range evs {
		if !seen[e.Tenant] {
			seen[e.Tenant] = true
			tenants = append(tenants, e.Tenant)
		}
	}
	subs, err := f.hist.Store.Subscriptions(ctx, tenants)
	if err != nil {
		return nil, err
	}
	unrouted := map[string]bool{}
	var msgs []*nats.Msg
	now := time.Now()
	for i := range evs {
		e := &evs[i]
		n := 0
		for _, sub := range subs[e.Tenant] {
			if !sub.Subscribes(e.Type) {
				continue
			}
			if !validToken(e.ID) || !validToken(sub.EndpointID) {
				f.log.Error("txhook: event or endpoint ID unusable in a subject; not forwarded", "event", e.ID, "endpoint", sub.EndpointID)
				continue
			}
			n++
			d := &queue.Delivery{Key: eventKey(e.ID, sub.EndpointID), Attempt: 1, EndpointID: sub.EndpointID, Event: queueEvent(*e)}
			data, mac, err := f.seal.encode(d)
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, newMessage(f.prefix, d.Key, msgID(d.Key, 1), data, mac, e.DeliverAt, now))
		}
		if n == 0 {
			unrouted[e.ID] = true
		}
	}
	if f.separate {
		if err := f.hist.Store.CopyEvents(ctx, f.hist.Clock.Now(), evs, unrouted); err != nil {
			return nil, fmt.Errorf("copying events to the history database: %w", err)
		}
	}
	if err := f.publish(ctx, msgs); err != nil {
		return nil, err
	}
	f.stats.events.Add(uint64(len(evs)))
	f.stats.unrouted.Add(uint64(len(unrouted)))
	return unrouted, nil
}

// publishAckWait bounds the wait for a round's acknowledgements, which
// normally take milliseconds: past it (JetStream down, a cluster electing
// a leader) the round is retried, and what was stored meanwhile is
// dropped as a duplicate.
const publishAckWait = 5 * time.Second

// publish sends msgs and waits for JetStream to acknowledge every one.
func (f *Forwarder) publish(ctx context.Context, msgs []*nats.Msg) error {
	if len(msgs) == 0 {
		return nil
	}
	js := f.cfg.JetStream
	futures := make([]jetstream.PubAckFuture, 0, len(msgs))
	for _, m := range msgs {
		fu, err := js.PublishMsgAsync(m)
		if err != nil {
			return classify(fmt.Errorf("publishing to %s: %w", f.cfg.Stream, err))
		}
		futures = append(futures, fu)
	}
	wctx, cancel := context.WithTimeout(ctx, publishAckWait)
	defer cancel()
	var first error
	for _, fu := range futures {
		select {
		case ack := <-fu.Ok():
			f.stats.messages.Add(1)
			if ack.Duplicate {
				f.stats.duplicates.Add(1)
			}
		case err := <-fu.Err():
			if first == nil {
				first = classify(fmt.Errorf("publishing to %s: %w", f.cfg.Stream, err))
			}
		case <-wctx.Done():
			if first == nil {
				first = classify(fmt.Errorf("publishing to %s: no acknowledgement: %w", f.cfg.Stream, wctx.Err()))
			}
		}
	}
	return first
}

// dueRows hands the stream the delivery rows made due in the history
// database, and returns how many it claimed.
func (f *Forwarder) dueRows(ctx context.Context) (int, error) {
	rows, err := f.hist.Store.ClaimDueRows(ctx, f.owner, f.cfg.RescueAfter, f.hist.Clock.Now(), f.cfg.BatchSize)
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	var msgs []*nats.Msg
	now := time.Now()
	var stream jetstream.Stream
	for _, r := range rows {
		key := rowKey(r.ID)
		if r.Rescued {
			if stream == nil {
				if stream, err = f.cfg.JetStream.Stream(ctx, f.cfg.Stream); err != nil {
					return 0, classify(err)
				}
			}
			live, err := f.inStream(ctx, stream, key, eventKey(r.Event.ID, r.EndpointID))
			if err != nil {
				return 0, err
			}
			if live {
				continue // its message is there, waiting for a worker
			}
			f.stats.rescued.Add(1)
			f.log.Warn("txhook: a delivery the broker held had no message in the stream (purged or deleted?); queued again",
				"delivery", r.ID, "event", r.Event.ID, "endpoint", r.EndpointID)
		}
		d := &queue.Delivery{Key: key, Row: r.ID, Base: r.Attempts, Attempt: r.Attempts + 1, Lapsed: r.Lapsed,
			EndpointID: r.EndpointID, Event: queueEvent(r.Event)}
		data, mac, err := f.seal.encode(d)
		if err != nil {
			return 0, err
		}
		msgs = append(msgs, newMessage(f.prefix, key, msgID(key, d.Attempt), data, mac, time.Time{}, now))
	}
	if err := f.publish(ctx, msgs); err != nil {
		return 0, err
	}
	f.stats.rows.Add(uint64(len(msgs)))
	return len(rows), nil
}

// inStream reports whether the stream holds a message of any of the keys:
// waiting for a worker, or scheduled.
func (f *Forwarder) inStream(ctx context.Context, stream jetstream.Stream, keys ...string) (bool, error) {
	for _, k := range keys {
		for _, subj := range []string{queueSubject(f.prefix, k), scheduleSubject(f.prefix, k)} {
			_, err := stream.GetLastMsgForSubject(ctx, subj)
			switch {
			case err == nil:
				return true, nil
			case errors.Is(err, jetstream.ErrMsgNotFound):
			default:
				return false, classify(err)
			}
		}
	}
	return false, nil
}

// pruneInterval is how often a forwarder prunes a payment database whose
// history lives elsewhere: Config.Relay.Retention.Interval (10 minutes by
// default; negative: never).
func (f *Forwarder) pruneInterval() time.Duration {
	switch iv := f.cfg.Relay.Retention.Interval; {
	case iv < 0:
		return 0
	case iv == 0:
		return outbox.DefaultRetentionInterval
	default:
		return iv
	}
}

// prune keeps a payment database whose delivery history lives elsewhere
// (Config.History) from growing: the forwarder that holds the cursor
// deletes the events forwarded more than Config.Relay.Retention.Succeeded
// ago (7 days by default), which no delivery row there refers to; their
// copies stay in the history database as long as its retention keeps
// them. Events forwarded under a lease are marked unrouted there and go
// with Outbox.Prune.
func (f *Forwarder) prune(ctx context.Context) {
	keep := f.cfg.Relay.Retention.Succeeded
	if keep < 0 {
		return
	}
	if keep == 0 {
		keep = outbox.DefaultRetainSucceeded
	}
	before := f.src.Clock.Now().Add(-keep)
	total := 0
	if f.src.Store.Dialect == store.Postgres {
		f.mu.Lock()
		held, at := f.held, f.cursor
		f.mu.Unlock()
		if !held {
			return
		}
		for range 100 {
			n, done, err := f.src.Store.PruneForwarded(ctx, at, before, 1000)
			total += n
			if err != nil {
				f.log.Warn("txhook: pruning forwarded events failed", "error", err)
				return
			}
			if done {
				break
			}
		}
	}
	p, err := f.ob.Prune(ctx, f.cfg.Relay.Retention)
	if err != nil && ctx.Err() == nil {
		f.log.Warn("txhook: pruning the payment database failed", "error", err)
	}
	if total+p.Events > 0 {
		f.log.Info("txhook: pruned forwarded events", "events", total+p.Events)
	}
}

func queueEvent(e store.ForwardEvent) queue.Event {
	return queue.Event{ID: e.ID, Tenant: e.Tenant, Type: e.Type, Version: e.Version, Payload: e.Payload,
		CreatedAt: e.CreatedAt, TraceParent: e.TraceParent, TraceState: e.TraceState}
}

func keysOf(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
