// Package gate is a relay's side of the fleet's endpoint gates: an
// endpoint's rate limit, in-flight cap and circuit breaker held in the
// database (migration 012, internal/store/gate.go), so that they hold for
// the endpoint across every relay process sharing it, however many run
// and however they start and stop.
//
// A relay asks the gate before each request to an endpoint with limits,
// or to one whose shared circuit counts faults, and tells it how the
// request went. An endpoint without limits and without faults costs the
// database nothing here: its first fault is reported (one statement), and
// from then on until an answer clears the count, its requests go through
// the gate too, so that a circuit opened by one relay stops the others
// and only one of them probes it.
//
//	c := gate.New(st, gate.Config{Relay: "relay-1", Lease: 30 * time.Second})
//	p, err := c.Acquire(ctx, now, gate.Request{Endpoint: "ep_1", Rate: 50, MaxInFlight: 4})
//	if err == nil && p.OK() {
//		// send, then
//		openUntil, _ := c.Finish(ctx, now, p, gate.Answered)
//	}
package gate

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txhook/txhook/internal/store"
)

// Config configures a Client.
type Config struct {
	Relay string        // the relay's lease owner name
	Lease time.Duration // longer than any request may run: a slot counts this long after its request starts
	// The breaker, as the relay's: faults in a row that open the circuit
	// (≤ 0: none), the first open period, and its cap as failed probes
	// double it.
	Threshold             int
	Cooldown, MaxCooldown time.Duration
}

// Request is one request to ask the gate for.
type Request struct {
	Endpoint    string
	Rate        float64 // requests per second; 0: none
	Burst       int
	MaxInFlight int // 0: no shared cap
}

// Outcome is how a request went, as the breaker counts it.
type Outcome int

// Outcomes.
const (
	NotSent  Outcome = iota // no request was made
	Answered                // the receiver answered and is up
	Fault                   // no answer, a timeout, 5xx, 408 or 429
)

// Pass is the gate's answer to Acquire.
type Pass struct {
	endpoint string
	asked    bool
	grant    store.GateGrant
}

// OK reports whether the request may go now.
func (p Pass) OK() bool { return !p.asked || p.grant.OK }

// Wait returns when to ask again, and why ("circuit", "rate", "busy"),
// for a Pass that is not OK.
func (p Pass) Wait() (time.Time, string) { return p.grant.RetryAt, p.grant.Reason }

// Client asks the gates for one relay. It is safe for concurrent use.
type Client struct {
	st  *store.Store
	cfg Config

	mu      sync.Mutex
	failing map[string]bool      // endpoints whose shared circuit counted faults when last seen
	opened  map[string]bool      // endpoints whose shared circuit was open or half-open when last seen
	checked map[string]time.Time // when the circuit of an endpoint without limits was last read (real time)
	blocked map[string]bool      // endpoints this relay marked blocked (Block), until a Finish clears them

	waits, errors atomic.Uint64
}

// New returns a Client.
func New(st *store.Store, cfg Config) *Client {
	return &Client{st: st, cfg: cfg, failing: map[string]bool{}, opened: map[string]bool{}, checked: map[string]time.Time{}, blocked: map[string]bool{}}
}

// Waits counts the requests the gate told to wait; Errors the exchanges
// that failed.
func (c *Client) Waits() uint64  { return c.waits.Load() }
func (c *Client) Errors() uint64 { return c.errors.Load() }

func (c *Client) isOpened(endpoint string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.opened[endpoint]
}

func (c *Client) isFailing(endpoint string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failing[endpoint]
}

func (c *Client) seen(endpoint string, failures int, opened bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if opened {
		c.opened[endpoint] = true
	} else {
		delete(c.opened, endpoint)
	}
	if failures > 0 {
		c.failing[endpoint] = true
	} else {
		delete(c.failing, endpoint)
	}
}

// PeekEvery is how often, at most, a relay reads the shared circuit of an
// endpoint without limits that it has seen no fault of: another relay
// may have opened it. It is the longest such a relay may go on sending
// to an endpoint whose circuit another relay opened (besides what
// claims skip), and a quarter of the cooldown when that is shorter.
const PeekEvery = 5 * time.Second

// fresh reports whether the circuit of endpoint, which has no limits,
// was read within the last peek period; if not, it counts it as read now.
func (c *Client) fresh(endpoint string) bool {
	every := min(PeekEvery, max(100*time.Millisecond, c.cfg.Cooldown/4))
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if at, ok := c.checked[endpoint]; ok && now.Sub(at) < every {
		return true
	}
	if len(c.checked) > 100000 {
		clear(c.checked)
	}
	c.checked[endpoint] = now
	return false
}

// Acquire asks the gate for one request to r.Endpoint. For an endpoint
// without limits whose circuit counted no fault it asks nothing: it
// reads the circuit once per PeekEvery and returns an OK Pass. On an
// error the request must wait: the limits cannot be checked.
func (c *Client) Acquire(ctx context.Context, now time.Time, r Request) (Pass, error) {
	p := Pass{endpoint: r.Endpoint}
	if Disabled.Load() {
		return p, nil
	}
	if r.Rate <= 0 && r.MaxInFlight <= 0 && c.cfg.Threshold > 0 && !c.isOpened(r.Endpoint) {
		if c.fresh(r.Endpoint) {
			return p, nil
		}
		n, opened, err := c.st.GatePeek(ctx, r.Endpoint)
		if err != nil {
			c.errors.Add(1)
			c.mu.Lock()
			delete(c.checked, r.Endpoint)
			c.mu.Unlock()
			return p, err
		}
		if !opened {
			// A closed circuit, with or without faults, needs no
			// permission: only its answers must be reported (Finish),
			// which write after the request, not before it.
			c.seen(r.Endpoint, n, false)
			return p, nil
		}
		c.seen(r.Endpoint, n, true)
	} else if r.Rate <= 0 && r.MaxInFlight <= 0 && c.cfg.Threshold <= 0 {
		return p, nil // no limits, no breaker
	}
	p.asked = true
	g, err := c.st.GateAcquire(ctx, store.GateAsk{Endpoint: r.Endpoint, Relay: c.cfg.Relay, Now: now, Rate: r.Rate, Burst: r.Burst,
		MaxInFlight: r.MaxInFlight, SlotLease: c.cfg.Lease, Threshold: c.cfg.Threshold})
	if err != nil {
		c.errors.Add(1)
		return p, err
	}
	p.grant = g
	c.seen(r.Endpoint, g.Failures, g.Opened)
	if !g.OK {
		c.waits.Add(1)
	}
	return p, nil
}

// Finish reports how the request p let through went: it gives its slot
// back and counts a fault, or an answer after faults, toward the shared
// circuit. It returns when the circuit is open until, zero when it is not
// (or nothing needed telling).
func (c *Client) Finish(ctx context.Context, now time.Time, p Pass, o Outcome) (time.Time, error) {
	c.mu.Lock()
	unblock := c.blocked[p.endpoint]
	delete(c.blocked, p.endpoint)
	c.mu.Unlock()
	if Disabled.Load() {
		return time.Time{}, nil
	}
	report := o == Fault || o == Answered && c.isFailing(p.endpoint) || unblock
	if !p.grant.Slot && !p.grant.Probe && !report {
		return time.Time{}, nil
	}
	st, err := c.st.GateFinish(ctx, store.GateFinish{Endpoint: p.endpoint, Relay: c.cfg.Relay, Now: now,
		Slot: p.grant.Slot, Probe: p.grant.Probe, Fault: o == Fault, Answered: o == Answered,
		Threshold: c.cfg.Threshold, Cooldown: c.cfg.Cooldown, MaxCooldown: c.cfg.MaxCooldown})
	if err != nil {
		c.errors.Add(1)
		return time.Time{}, err
	}
	c.seen(p.endpoint, st.Failures, st.Opened)
	return st.OpenUntil, nil
}

// Disabled turns every Client into a no-op, as relays were before the
// gates: limits and circuits per relay, claims that skip nothing (and
// relays made meanwhile retry unanswered endpoints every 50 ms, see
// sched.Config.UnansweredFast). Only the fairness benchmark sets it, to
// measure both ways in one run.
var Disabled atomic.Bool

// Block marks the endpoint blocked in the database until `until`, unless
// this relay marked it already and no request of it has ended since:
// claims skip its deliveries meanwhile. A relay calls it when it gives
// back deliveries of an endpoint that has a request of it in flight and
// is not known to answer fast (hanging, slow, or new): they could start
// only once that request ends, and each claim of them before would hand
// them back again. The relay's next Finish for the endpoint clears the
// mark; until bounds it if the relay dies first.
func (c *Client) Block(ctx context.Context, endpoint string, until time.Time) error {
	if Disabled.Load() {
		return nil
	}
	c.mu.Lock()
	if c.blocked[endpoint] {
		c.mu.Unlock()
		return nil
	}
	if len(c.blocked) > 100000 {
		c.mu.Unlock()
		return nil
	}
	c.blocked[endpoint] = true
	c.mu.Unlock()
	if err := c.st.GateBlock(ctx, endpoint, until); err != nil {
		c.errors.Add(1)
		c.mu.Lock()
		delete(c.blocked, endpoint)
		c.mu.Unlock()
		return err
	}
	return nil
}
