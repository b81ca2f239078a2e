package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/txhook/txhook/internal/gate"
	"github.com/txhook/txhook/internal/queue"
	"github.com/txhook/txhook/internal/safehttp"
	"github.com/txhook/txhook/internal/sched"
	"github.com/txhook/txhook/internal/store"
)

// Relay claims due deliveries, sends them and records the outcome. Any
// number of relays, in one process or many, can share a PostgreSQL outbox.
//
// The pipeline: one goroutine claims batches under a lease and offers each
// delivery to the scheduler (internal/sched), which holds what can start
// soon and sends the rest back to the database for later; Concurrency
// workers take from it, fairly across tenants and endpoints, and send; a
// completion goroutine writes outcomes back in batches, each batch one
// statement on PostgreSQL.
type Relay struct {
	o      *Outbox
	st     *store.Store
	cfg    RelayConfig
	clock  Clock
	log    *slog.Logger
	client *safehttp.Client

	mu       sync.Mutex // guards started, sch, timerAt, quitting
	cond     *sync.Cond // workers wait on it for the scheduler
	started  bool
	sch      *sched.Scheduler
	timerAt  time.Time          // when timerLoop wakes the workers next; zero: not armed
	rearm    chan time.Duration // tells timerLoop that timerAt moved earlier
	quitting bool

	held     atomic.Int64 // jobs claimed and not yet handed to the completer
	freed    chan struct{}
	wakeCh   chan struct{}
	stopping atomic.Bool
	pollMin  time.Duration // minPoll; tests raise it so that only wake-ups claim
	side     sideShare     // the fetch loop's share for other than new events

	fetchCancel context.CancelFunc
	httpCancel  context.CancelFunc
	httpCtx     context.Context
	bgCancel    context.CancelFunc
	fetchDone   chan struct{}
	maintDone   chan struct{}
	timersQuit  chan struct{}
	workers     sync.WaitGroup
	comp        *completer
	stopOnce    sync.Once
	stopped     chan struct{}
	stopErr     error

	secrets    secretCache
	pins       pinCache
	transport  transportCache
	refusals   logLimiter
	late       logLimiter // deliveries given back because preparing them outlasted startBy
	gateErrors logLimiter // failed exchanges with the shared gates
	stats      relayCounters

	clockCheck clockCheck // this relay's clock against the database's; see clockcheck.go

	// src, in broker mode, hands out the deliveries instead of claims,
	// and owner is the lease owner of the rows the broker holds (see
	// queue.go); nil and "" for a relay of table mode.
	src   queue.Source
	owner string

	// gate asks the fleet's shared endpoint gates (internal/gate); nil in
	// broker mode, whose workers keep their limits per process.
	gate *gate.Client
}

type relayCounters struct {
	claimed, succeeded, failed, dead, released, refused, lost atomic.Uint64
	refusedDead                                               atomic.Uint64
	polls, emptyPolls                                         atomic.Uint64
	deferred                                                  atomic.Uint64
}

// RelayStats counts what a relay has done since it started.
type RelayStats struct {
	Claimed      uint64 // deliveries claimed
	Succeeded    uint64 // attempts answered 2xx and recorded
	Failed       uint64 // failed attempts recorded with a retry scheduled
	DeadLettered uint64 // deliveries moved to the dead-letter table
	Released     uint64 // claims given back unspent (stopping, limits, open circuit, busy or disabled endpoint)
	// Refused counts claims given back unspent because this relay's
	// target rules (Config.AllowHTTP, AllowPrivateTargets, AllowedTargets)
	// refuse the endpoint: see Config.
	Refused uint64
	// DeadLetteredRefused counts the deliveries among DeadLettered that
	// were dead-lettered because the target rules refused their endpoint
	// for longer than RefusedLimit (reason DeadReasonRefused).
	DeadLetteredRefused uint64
	// LeaseLost counts outcomes not written: another relay took the
	// delivery over, or the write kept failing until the lease ended (or
	// the relay stopped), so the next holder records the attempt as lapsed.
	LeaseLost uint64
	// Polls counts claim rounds (each up to three statements: new events,
	// new events with an ordering key, due deliveries) and EmptyPolls those
	// that found nothing to claim: the database work relays spend looking
	// for work when there is less than they can take, which grows with the
	// number of relays sharing an outbox.
	Polls, EmptyPolls uint64

	// Deferred counts the claims among Released given back because the
	// endpoint's shared gate (its limits and circuit, held in the
	// database for every relay: see docs/delivery.md, Protecting
	// receivers) said to wait longer than the relay holds a claim.
	Deferred uint64
	// SharedLimitWaits counts the times the shared gate told this relay
	// to wait before a request (the endpoint's rate or in-flight cap used
	// by the relays together, or its circuit open or being probed by
	// another relay); SharedLimitErrors the exchanges with it that failed
	// (a database error): the request then waits a second, since the
	// limits cannot be checked.
	SharedLimitWaits, SharedLimitErrors uint64

	// InFlight is how many requests the relay has under way now, and
	// Waiting how many claimed deliveries wait in its memory to start (each
	// at most a second before it goes back to the database).
	InFlight, Waiting int
}

// Stats returns the relay's counters and what it holds now. It is cheap
// enough to call at every metrics collection.
func (r *Relay) Stats() RelayStats {
	r.mu.Lock()
	inFlight, waiting := r.sch.InFlight(), r.sch.Waiting()
	r.mu.Unlock()
	st := RelayStats{
		Claimed: r.stats.claimed.Load(), Succeeded: r.stats.succeeded.Load(), Failed: r.stats.failed.Load(),
		DeadLettered: r.stats.dead.Load(), Released: r.stats.released.Load(), Refused: r.stats.refused.Load(),
		DeadLetteredRefused: r.stats.refusedDead.Load(),
		LeaseLost:           r.stats.lost.Load(), Polls: r.stats.polls.Load(), EmptyPolls: r.stats.emptyPolls.Load(),
		InFlight: inFlight, Waiting: waiting, Deferred: r.stats.deferred.Load(),
	}
	if r.gate != nil {
		st.SharedLimitWaits, st.SharedLimitErrors = r.gate.Waits(), r.gate.Errors()
	}
	return st
}

// job is one claimed delivery in memory.
type job struct {
	c  store.Claimed
	sj sched.Job
	// lease is the claim's lease on the local monotonic clock: when the
	// request may start by, when it is cut, when the lease ends.
	lease leaseTimes
	span  trace.Span // the attempt's, while it runs with tracing on
	// claimedAt is when the claim ran (the relay's clock); event is set for
	// a first attempt claimed with its event (c.ID 0): what the jobs of
	// that event share.
	claimedAt time.Time
	event     *eventClaim
	// q is set for a delivery taken from a queue (broker mode).
	q *queued
}

// eventClaim is what the first attempts of one event, claimed together
// with it (no delivery rows yet), share: how many there are, and what the
// completer has seen of them. The completer, and only it, reads and
// writes seen and broken: the outcome that brings seen to jobs is the
// event's last, whose write marks the event dispatched, unless broken says
// that an earlier one will never be written (the database refused it, or
// its lease ended first): the event then stays leased, and the relay that
// takes it over when the lease lapses writes what is missing.
type eventClaim struct {
	jobs   int
	seen   int
	broken bool
}

// ErrRelayStarted is returned by Start on a relay that is running.
var ErrRelayStarted = errors.New("txhook: relay already started")

// ErrRelayStopped is returned by Start on a relay that was stopped (by Stop
// or by the end of Start's context): a relay runs once. Make a new one with
// Outbox.NewRelay; the deliveries the old one released are waiting for it.
var ErrRelayStopped = errors.New("txhook: relay was stopped; a relay runs once, make a new one with Outbox.NewRelay")

// NewRelay returns a relay for the outbox. Start it with Start. On an
// Outbox in broker mode (Config.Broker) it fails with ErrBrokerMode.
func (o *Outbox) NewRelay(cfg RelayConfig) (*Relay, error) {
	if o.cfg.Broker {
		return nil, ErrBrokerMode
	}
	return o.newRelay(cfg)
}

func (o *Outbox) newRelay(cfg RelayConfig) (*Relay, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Relay{
		o:     o,
		st:    o.st,
		cfg:   cfg,
		clock: o.clock,
		log:   o.relayLogger().With("relay", cfg.ID),
		client: safehttp.New(safehttp.Config{
			AllowHTTP:           o.cfg.AllowHTTP,
			AllowPrivate:        o.cfg.AllowPrivateTargets,
			AllowPrefixes:       o.cfg.AllowedTargets,
			Timeout:             cfg.Timeout,
			ConnectTimeout:      cfg.ConnectTimeout,
			MaxRedirects:        cfg.MaxRedirects,
			MaxBodyBytes:        cfg.MaxResponseBytes,
			MaxIdleConnsPerHost: cfg.EndpointConcurrency,
			LookupIPAddr:        o.target.LookupIPAddr,
			Proxy:               cfg.Proxy,
			DialContext:         cfg.DialContext,
			WrapTransport:       cfg.WrapTransport,
			RootCAs:             cfg.RootCAs,
		}),
		sch:        sched.New(cfg.schedConfig()),
		rearm:      make(chan time.Duration, 1),
		freed:      make(chan struct{}, 1),
		wakeCh:     make(chan struct{}, 1),
		pollMin:    minPoll,
		timersQuit: make(chan struct{}),
		stopped:    make(chan struct{}),
	}
	r.cond = sync.NewCond(&r.mu)
	r.gate = gate.New(o.st, gate.Config{Relay: cfg.ID, Lease: cfg.Lease, Threshold: max(0, cfg.BreakerThreshold),
		Cooldown: cfg.BreakerCooldown, MaxCooldown: cfg.BreakerMaxCooldown})
	return r, nil
}

// ID returns the relay's lease owner name.
func (r *Relay) ID() string { return r.cfg.ID }

// Start begins claiming and delivering in the background and returns. If
// ctx is cancelled the relay stops at once, as Stop with an expired
// context would. A relay starts once: Start returns ErrRelayStarted while
// it runs and ErrRelayStopped once it is stopping or stopped.
//
// Start fails, with an error matching ErrSecretKey, when endpoint secrets,
// client certificate keys or custom headers are stored encrypted under a
// key Config.SecretCipher cannot use (or with no Cipher set): one endpoint
// per key ID in use in each column is decrypted to check.
//
// It first checks the schema (see Outbox.CheckSchema) and fails with an
// error wrapping ErrNotMigrated when a migration is missing.
func (r *Relay) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		if r.stopping.Load() {
			return ErrRelayStopped
		}
		return ErrRelayStarted
	}
	if err := r.st.CheckSchema(ctx); err != nil {
		return fmt.Errorf("txhook: relay start: %w", err)
	}
	queries := append(r.st.ClaimQueries(r.cfg.BatchSize), r.st.CompleteQueries()...)
	if r.src != nil {
		queries = r.st.BrokerCompleteQueries()
	}
	if err := r.st.Prepare(ctx, queries...); err != nil {
		return fmt.Errorf("txhook: relay start: %w (has Migrate run?)", err)
	}
	if err := r.o.checkSecretKeys(ctx); err != nil {
		return fmt.Errorf("txhook: relay start: %w", err)
	}
	if r.src != nil {
		if err := r.src.Open(ctx); err != nil {
			return fmt.Errorf("txhook: relay start: %w", err)
		}
	}
	r.started = true

	bg, bgCancel := context.WithCancel(context.WithoutCancel(ctx))
	r.bgCancel = bgCancel
	fetchCtx, fetchCancel := context.WithCancel(bg)
	r.fetchCancel = fetchCancel
	r.httpCtx, r.httpCancel = context.WithCancel(bg)

	r.comp = newCompleter(r, r.cfg.Concurrency+r.cfg.BatchSize)
	go r.comp.run(bg)

	go r.timerLoop()
	r.workers.Add(r.cfg.Concurrency)
	for range r.cfg.Concurrency {
		go r.worker()
	}

	r.fetchDone = make(chan struct{})
	if r.src != nil {
		go r.receiveLoop(fetchCtx)
	} else {
		r.listen(fetchCtx)
		go r.fetchLoop(fetchCtx)
	}
	r.maintDone = make(chan struct{})
	go func() {
		defer close(r.maintDone)
		r.maintain(fetchCtx)
	}()

	go func() {
		select {
		case <-ctx.Done():
			expired, cancel := context.WithCancel(context.Background())
			cancel()
			_ = r.Stop(expired)
		case <-r.stopped:
		}
	}()
	return nil
}

// Stop stops claiming (a claim statement under way finishes first, within
// Timeout, so that what it took is released rather than left leased),
// releases the deliveries that have not started (without spending an
// attempt), lets requests in flight finish until ctx is done, then cancels
// them (they count as failed attempts and are retried) and writes every
// outcome back. Whatever cannot be written back,
// for instance because the database is unreachable, is picked up by another
// relay when its lease expires. Stop returns ctx.Err() if ctx ended first.
func (r *Relay) Stop(ctx context.Context) error {
	r.mu.Lock()
	started := r.started
	r.mu.Unlock()
	if !started {
		return nil
	}
	r.stopOnce.Do(func() {
		r.stopErr = r.stop(ctx)
		close(r.stopped)
	})
	<-r.stopped
	return r.stopErr
}

func (r *Relay) stop(ctx context.Context) error {
	r.stopping.Store(true)
	r.fetchCancel()
	<-r.fetchDone
	<-r.maintDone

	// Release what is held, waiting to start.
	r.mu.Lock()
	waiting := r.sch.Drain()
	r.mu.Unlock()
	now := r.clock.Now()
	for _, sj := range waiting {
		r.putBack(sj.Value.(*job), now)
	}

	// Wait for in-flight requests; workers release the jobs still in the
	// ready queue because stopping is set.
	var err error
	for r.held.Load() > 0 {
		select {
		case <-r.freed:
		case <-ctx.Done():
			if err == nil {
				err = ctx.Err()
				r.httpCancel()
				r.comp.giveUp()
			}
			// Cancelled requests return promptly; keep waiting for them.
			<-r.freed
		}
	}
	r.mu.Lock()
	r.quitting = true
	r.cond.Broadcast()
	r.mu.Unlock()
	r.workers.Wait()
	close(r.timersQuit)
	r.httpCancel()
	// Every request is over: close the kept-alive connections, or each
	// would hold two goroutines here (and one in the receiver) until the
	// receiver times it out, for every relay ever stopped in the process.
	r.client.CloseIdleConnections()

	// Write everything back. If ctx is already over, allow a short grace:
	// without it every outcome of this relay's last seconds would be
	// redone after the lease expires.
	flushCtx := ctx
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		flushCtx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
	}
	r.comp.close(flushCtx)
	if r.src != nil {
		r.src.Close()
	}
	r.bgCancel()
	return err
}

func (r *Relay) dropHeld() {
	r.held.Add(-1)
	select {
	case r.freed <- struct{}{}:
	default:
	}
}

// Wake makes the relay look for due deliveries now.
func (r *Relay) Wake() {
	select {
	case r.wakeCh <- struct{}{}:
	default:
	}
}

// listen connects the relay to the outbox's wake-ups.
func (r *Relay) listen(ctx context.Context) {
	if r.st.Dialect == store.SQLite {
		ch, unsubscribe := r.st.SubscribeLocal()
		go func() {
			defer unsubscribe()
			for {
				select {
				case <-ctx.Done():
					return
				case <-ch:
					r.Wake()
				}
			}
		}()
		return
	}
	if r.o.cfg.NotifyInterval < 0 {
		return
	}
	if r.o.cfg.Listener == nil {
		hint := "set it (pgxoutbox.Listener or pqlisten.New) to be woken at commit"
		if r.o.cfg.TransactionPooling {
			hint = "set it to pgxoutbox.DirectListener or pqlisten.New with a DSN that bypasses the pooler, to be woken at commit"
		}
		r.log.Warn("txhook: no Config.Listener, so the relay finds new events by polling; "+hint, "interval", r.cfg.PollInterval)
		return
	}
	go func() {
		backoff := 100 * time.Millisecond
		for {
			err := r.o.cfg.Listener.Listen(ctx, r.o.db, WakeChannel, r.Wake)
			if ctx.Err() != nil {
				return
			}
			r.log.Warn("txhook: LISTEN connection failed; polling until it is back", "error", err)
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

// statementContext bounds a completion batch by a lease (a claim round is
// bounded by Timeout, see claim). A primary that stops answering without
// closing its connections (a paused VM, a stalled disk, a failover that
// left it running) would otherwise hold the relay on those connections
// forever; past the deadline pgx closes the connection and the relay goes
// on with a fresh one, which a multi-host DSN points at the new primary.
// A round that took a lease achieves nothing anyway: its claims could not
// start, its outcomes could no longer be written.
func (r *Relay) statementContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.cfg.Lease)
}

// minPoll is the first re-poll delay after a claim came back short: just
// long enough for transactions that committed alongside the one that woke
// us (their NOTIFY was skipped) to become visible.
const minPoll = time.Millisecond

func (r *Relay) fetchLoop(ctx context.Context) {
	defer close(r.fetchDone)
	// An event fans out to several deliveries, so one claim can overshoot n.
	capacity := int64(r.cfg.Concurrency + r.cfg.BatchSize)
	delay := time.Duration(0)
	// Polling runs on real time even under a fake Config.Clock: it paces
	// queries, it does not decide what is due (the claim's now does).
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	errBackoff := 50 * time.Millisecond
	for {
		held := r.held.Load()
		free := capacity - held
		// Claim in whole batches: with every worker's next job in hand,
		// wait for room for half a batch, then take a whole one (the relay
		// holds at most Concurrency + 1.5 × BatchSize deliveries), rather
		// than claim a few at a time: a claim statement and its outcomes'
		// statement cost the database about half a millisecond each
		// besides their rows.
		if free <= 0 || free < int64(r.cfg.BatchSize/2) && held >= int64(r.cfg.Concurrency) {
			select {
			case <-ctx.Done():
				return
			case <-r.freed:
				continue
			}
		}
		n := r.cfg.BatchSize
		if held < int64(r.cfg.Concurrency) {
			n = r.claimSize(int(min(free, int64(r.cfg.BatchSize))))
		}
		claimed, err := r.claim(ctx, n)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			r.log.Warn("txhook: claim failed", "error", err)
			delay = errBackoff
			errBackoff = min(errBackoff*2, 5*time.Second)
		} else {
			errBackoff = 50 * time.Millisecond
			switch {
			case claimed >= n:
				continue // more may be due right now
			case claimed > 0:
				delay = r.pollMin
			case delay == 0:
				delay = r.pollMin
			default:
				delay = max(min(delay*2, r.cfg.PollInterval), r.pollMin)
			}
		}
		timer.Reset(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-r.wakeCh:
			timer.Stop()
			delay = 0
		case <-timer.C:
		}
	}
}

// claimSize rounds n down to BatchSize, BatchSize/2, BatchSize/4 … or 1:
// each claim statement is prepared once per size, so a relay uses a few.
func (r *Relay) claimSize(n int) int {
	size := r.cfg.BatchSize
	for size > n && size > 1 {
		size /= 2
	}
	return max(size, 1)
}

// claim dispatches new events and claims due deliveries, up to n jobs in
// all, hands them to the workers and returns how many it took.
//
// Stop cancels ctx, but a claim statement under way is let finish (for at
// most Timeout): it may have taken rows already, and cancelling it would
// lose them to this relay while they stay leased to it until the lease
// lapses. Finished, its rows reach the scheduler, which Stop empties back
// into the database. No further statement starts once ctx is done.
func (r *Relay) claim(ctx context.Context, n int) (int, error) {
	// Bounded by Timeout (less than a lease), which also gets the relay
	// off a primary that hangs without closing its connections.
	stmtCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.Timeout)
	defer cancel()
	r.checkClock(ctx)
	start := r.clock.Now()
	// The database times the lease by its own clock from when the statement
	// runs, after this instant: measured locally from here, on the
	// monotonic clock, it is a conservative bound whatever either clock
	// reads (see lease.go).
	lease := leaseWindow(time.Now(), r.cfg.Lease, r.cfg.Timeout)
	got := 0
	take := func(batch []store.Claimed) {
		r.stats.claimed.Add(uint64(len(batch)))
		// The first attempts of an event claimed with it come together,
		// in one batch.
		var events map[string]*eventClaim
		for i := range batch {
			if c := &batch[i]; c.ID == 0 {
				if events == nil {
					events = map[string]*eventClaim{}
				}
				ec := events[c.EventID]
				if ec == nil {
					ec = &eventClaim{}
					events[c.EventID] = ec
				}
				ec.jobs++
			}
		}
		for i := range batch {
			r.held.Add(1)
			j := &job{c: batch[i], lease: lease, claimedAt: start}
			if j.c.ID == 0 {
				j.event = events[j.c.EventID]
			}
			r.dispatch(j)
		}
		got += len(batch)
	}
	// Counted when done, so that Polls and EmptyPolls read at any moment
	// agree on which rounds have finished.
	defer func() {
		if got == 0 {
			r.stats.emptyPolls.Add(1)
		}
		r.stats.polls.Add(1)
	}()
	// New events come first, and what is left of n goes to events with an
	// ordering key (a slower path that keeps their order), then to retries,
	// resends and rescued leases. A backlog of new events would leave
	// nothing for the others, so a share is kept for them: half of every
	// round while they fill it, half of one round per sidePace otherwise.
	now := time.Now()
	share := n >= 2 && (r.side.busy || !now.Before(r.side.next))
	freshN := n
	if share {
		freshN = r.claimSize(n / 2)
	}
	fresh, err := r.st.Dispatch(stmtCtx, r.cfg.ID, start, r.cfg.Lease, freshN)
	if err != nil {
		return 0, err
	}
	take(fresh)
	rest := n - got
	if rest <= 0 || ctx.Err() != nil {
		return got, nil
	}
	keyed := func(limit int) ([]store.Claimed, error) {
		return r.st.DispatchKeyed(stmtCtx, r.cfg.ID, start, r.cfg.Lease, limit)
	}
	due := func(limit int) ([]store.Claimed, error) {
		return r.st.Claim(stmtCtx, r.cfg.ID, start, r.cfg.Lease, r.claimSize(limit))
	}
	first, second := keyed, due
	if r.side.turn {
		first, second = due, keyed
	}
	r.side.turn = !r.side.turn
	for _, claim := range [2]func(int) ([]store.Claimed, error){first, second} {
		if rest := n - got; rest > 0 && ctx.Err() == nil {
			batch, err := claim(rest)
			if err != nil {
				return got, err
			}
			take(batch)
		}
	}
	// Busy: what the others were offered, they took.
	r.side.busy = got-len(fresh) >= rest
	r.side.next = now.Add(sidePace)
	return got, nil
}

// sidePace is how often, at most, a relay whose new events fill every
// claim still offers half a claim to ordered events, retries, resends and
// rescued leases (every round while they take all of it).
const sidePace = 100 * time.Millisecond

// sideShare is the state of that offer; only the fetch loop uses it.
type sideShare struct {
	next time.Time // real time: it paces queries
	busy bool      // the last offer was taken whole
	turn bool      // retries before ordered events this time
}
