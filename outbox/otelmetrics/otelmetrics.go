// Package otelmetrics reports a txhook outbox's metrics through an
// OpenTelemetry MeterProvider, as package outbox/metrics does for
// Prometheus; a program may use either or both.
//
// It depends on the OpenTelemetry metric API only: the program chooses the
// SDK and exporter. One Metrics serves one outbox: hand its Observe method
// to every relay as RelayConfig.OnAttempt, and add the relays whose
// in-flight requests it should report:
//
//	m, err := otelmetrics.New(ob, otelmetrics.Options{MeterProvider: mp})
//	relay, err := ob.NewRelay(outbox.RelayConfig{OnAttempt: m.Observe})
//	m.AddRelay(relay)
//	defer m.Close()
//
// # Instruments
//
//	txhook.attempts{txhook.endpoint.id, txhook.attempt.outcome}  counter: attempts by outcome
//	txhook.attempt.duration{txhook.endpoint.id}                  histogram, s: request latency
//	txhook.backlog{txhook.endpoint.id, txhook.delivery.state}    gauge: unfinished deliveries
//	txhook.undispatched                                          gauge: events not fanned out yet
//	txhook.dead_letters{txhook.endpoint.id}                      gauge: dead letters not replayed or purged
//	txhook.dead_letters.refused{txhook.endpoint.id}              gauge: those of them no relay would send
//	txhook.relay.in_flight{txhook.relay.id}                      gauge: requests under way
//	txhook.relay.waiting{txhook.relay.id}                        gauge: claimed deliveries waiting to start
//
// Outcomes are those of outbox.AttemptNotice: "succeeded", "retry",
// "dead_lettered", "dead_lettered_refused" (not sent: the target rules
// refused the endpoint's URL for longer than RelayConfig.RefusedLimit).
// The counter and histogram count what this process's
// relays did; the backlog, undispatched and dead-letter gauges are read
// at each collection from the database, for the whole outbox, through
// Outbox.Backlog, Outbox.DeadLetterCounts and
// Outbox.RefusedDeadLetterCounts, bounded by CollectTimeout;
// the relay gauges come from Relay.Stats.
//
// Every endpoint has its own attribute value. The SDK bounds how many
// attribute sets an instrument keeps (2000 by default; see the SDK's
// WithCardinalityLimit), folding the rest into one overflow series.
package otelmetrics

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/txhook/txhook/outbox"
)

// DefaultCollectTimeout bounds the database reads of one collection.
const DefaultCollectTimeout = 5 * time.Second

// Attribute keys of the instruments.
const (
	AttrEndpointID = attribute.Key("txhook.endpoint.id")
	AttrOutcome    = attribute.Key("txhook.attempt.outcome")
	AttrState      = attribute.Key("txhook.delivery.state")
	AttrRelayID    = attribute.Key("txhook.relay.id")
)

// Options configure Metrics. Zero fields take the defaults.
type Options struct {
	// MeterProvider makes the instruments. Default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// CollectTimeout bounds the database reads of one collection.
	// Default 5 s.
	CollectTimeout time.Duration
	// DurationBoundaries are the latency histogram's bucket boundaries,
	// in seconds. Default 5 ms to 10 s, spanning the relay's default 5 s
	// timeout.
	DurationBoundaries []float64
}

// Metrics reports one outbox's metrics. It is safe for concurrent use.
type Metrics struct {
	ob       *outbox.Outbox
	timeout  time.Duration
	attempts metric.Int64Counter
	duration metric.Float64Histogram
	reg      metric.Registration

	mu     sync.Mutex
	relays []*outbox.Relay
	// The series the last collection reported: one that is gone now is
	// reported once more, as 0, so that a drained backlog reads 0 rather
	// than its last value.
	lastBacklog map[backlogKey]bool
	lastDead    map[string]bool
	lastRefused map[string]bool
}

type backlogKey struct{ endpoint, state string }

var defaultBoundaries = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// New makes the instruments for ob on the MeterProvider and registers the
// callback that reads the gauges at each collection. Close unregisters it.
func New(ob *outbox.Outbox, opts Options) (*Metrics, error) {
	if ob == nil {
		return nil, errors.New("txhook: otelmetrics.New: nil outbox")
	}
	mp := opts.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if opts.CollectTimeout <= 0 {
		opts.CollectTimeout = DefaultCollectTimeout
	}
	if opts.DurationBoundaries == nil {
		opts.DurationBoundaries = defaultBoundaries
	}
	meter := mp.Meter("github.com/txhook/txhook/outbox/otelmetrics")
	m := &Metrics{ob: ob, timeout: opts.CollectTimeout}
	var errs [8]error
	var backlog, undispatched, dead, refused, inFlight, waiting metric.Int64ObservableGauge
	m.attempts, errs[0] = meter.Int64Counter("txhook.attempts", metric.WithUnit("{attempt}"),
		metric.WithDescription("Delivery attempts by outcome: succeeded (2xx), retry (failed, retry scheduled), dead_lettered (failed, none left), dead_lettered_refused (not sent: the target rules refused the endpoint's URL too long)."))
	m.duration, errs[1] = meter.Float64Histogram("txhook.attempt.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of delivery requests, redirects and response included."),
		metric.WithExplicitBucketBoundaries(opts.DurationBoundaries...))
	backlog, errs[2] = meter.Int64ObservableGauge("txhook.backlog", metric.WithUnit("{delivery}"),
		metric.WithDescription("Deliveries not finished: pending, running, paused (endpoint disabled) or blocked (ordering)."))
	undispatched, errs[3] = meter.Int64ObservableGauge("txhook.undispatched", metric.WithUnit("{event}"),
		metric.WithDescription("Committed events no relay has fanned out into deliveries yet; grows when no relay runs."))
	dead, errs[4] = meter.Int64ObservableGauge("txhook.dead_letters", metric.WithUnit("{dead_letter}"),
		metric.WithDescription("Dead letters not yet replayed or purged."))
	refused, errs[7] = meter.Int64ObservableGauge("txhook.dead_letters.refused", metric.WithUnit("{dead_letter}"),
		metric.WithDescription("Dead letters no relay would send: the target rules refused their endpoint's URL for longer than RefusedLimit."))
	inFlight, errs[5] = meter.Int64ObservableGauge("txhook.relay.in_flight", metric.WithUnit("{request}"),
		metric.WithDescription("Requests a relay of this process has under way."))
	waiting, errs[6] = meter.Int64ObservableGauge("txhook.relay.waiting", metric.WithUnit("{delivery}"),
		metric.WithDescription("Deliveries a relay of this process claimed and holds, waiting to start."))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	reg, err := meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		return m.collect(ctx, o, backlog, undispatched, dead, refused, inFlight, waiting)
	}, backlog, undispatched, dead, refused, inFlight, waiting)
	if err != nil {
		return nil, err
	}
	m.reg = reg
	return m, nil
}

// Observe records one attempt. Pass it as RelayConfig.OnAttempt (or call
// it from yours, beside the Prometheus collector's Observe).
func (m *Metrics) Observe(n outbox.AttemptNotice) {
	ctx := context.Background()
	ep := AttrEndpointID.String(n.EndpointID)
	m.attempts.Add(ctx, 1, metric.WithAttributes(ep, AttrOutcome.String(n.Outcome)))
	if n.Duration > 0 {
		m.duration.Record(ctx, n.Duration.Seconds(), metric.WithAttributes(ep))
	}
}

// AddRelay reports r's in-flight and waiting deliveries until Close.
func (m *Metrics) AddRelay(r *outbox.Relay) {
	m.mu.Lock()
	m.relays = append(m.relays, r)
	m.mu.Unlock()
}

// Close unregisters the gauges' callback. The counter and histogram stay
// with the MeterProvider.
func (m *Metrics) Close() error { return m.reg.Unregister() }

// collect observes the gauges. A failed read is returned to the SDK, which
// reports it through OpenTelemetry's error handler, and leaves its gauges
// out of this collection rather than reporting zero.
func (m *Metrics) collect(ctx context.Context, o metric.Observer, backlog, undispatched, dead, refused, inFlight, waiting metric.Int64Observable) error {
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	bl, berr := m.ob.Backlog(ctx)
	dl, derr := m.ob.DeadLetterCounts(ctx)
	rl, rerr := m.ob.RefusedDeadLetterCounts(ctx)
	m.mu.Lock()
	relays := append([]*outbox.Relay(nil), m.relays...)
	if berr == nil {
		o.ObserveInt64(undispatched, int64(bl.Undispatched))
		now := make(map[backlogKey]bool, len(bl.Deliveries))
		for _, c := range bl.Deliveries {
			now[backlogKey{c.EndpointID, c.State}] = true
			o.ObserveInt64(backlog, int64(c.N), metric.WithAttributes(AttrEndpointID.String(c.EndpointID), AttrState.String(c.State)))
		}
		for k := range m.lastBacklog {
			if !now[k] {
				o.ObserveInt64(backlog, 0, metric.WithAttributes(AttrEndpointID.String(k.endpoint), AttrState.String(k.state)))
			}
		}
		m.lastBacklog = now
	}
	if derr == nil {
		now := make(map[string]bool, len(dl))
		for id, n := range dl {
			now[id] = true
			o.ObserveInt64(dead, int64(n), metric.WithAttributes(AttrEndpointID.String(id)))
		}
		for id := range m.lastDead {
			if !now[id] {
				o.ObserveInt64(dead, 0, metric.WithAttributes(AttrEndpointID.String(id)))
			}
		}
		m.lastDead = now
	}
	if rerr == nil {
		now := make(map[string]bool, len(rl))
		for id, n := range rl {
			now[id] = true
			o.ObserveInt64(refused, int64(n), metric.WithAttributes(AttrEndpointID.String(id)))
		}
		for id := range m.lastRefused {
			if !now[id] {
				o.ObserveInt64(refused, 0, metric.WithAttributes(AttrEndpointID.String(id)))
			}
		}
		m.lastRefused = now
	}
	m.mu.Unlock()
	for _, r := range relays {
		s := r.Stats()
		id := metric.WithAttributes(AttrRelayID.String(r.ID()))
		o.ObserveInt64(inFlight, int64(s.InFlight), id)
		o.ObserveInt64(waiting, int64(s.Waiting), id)
	}
	return errors.Join(berr, derr, rerr)
}
