// Package metrics exports a txhook outbox's delivery metrics to Prometheus.
//
// It is a separate package so that only programs that use Prometheus link
// its client library. One Collector serves one outbox: register it, and
// hand its Observe method to every relay as RelayConfig.OnAttempt:
//
//	c := metrics.New(ob, metrics.Options{})
//	prometheus.MustRegister(c)
//	relay, err := ob.NewRelay(outbox.RelayConfig{OnAttempt: c.Observe})
//
// # Metrics
//
//	txhook_attempts_total{endpoint, outcome}      counter: attempts by outcome
//	txhook_attempt_duration_seconds{endpoint}     histogram: request latency
//	txhook_backlog_deliveries{endpoint, state}    gauge: deliveries pending, running, paused or blocked
//	txhook_undispatched_events                    gauge: committed events no relay has fanned out yet
//	txhook_dead_letters{endpoint}                 gauge: dead letters not replayed or purged
//	txhook_dead_letters_refused{endpoint}         gauge: those of them no relay would send
//
// The outcome of an attempt is "succeeded" (2xx), "retry" (failed, another
// attempt is scheduled), "dead_lettered" (failed, none left) or
// "dead_lettered_refused" (dead-lettered without a request: the target
// rules refused the endpoint's URL for longer than RelayConfig.RefusedLimit;
// the refusals before it are not counted), so the succeeded and the two
// dead_lettered series count deliveries by their final outcome. The
// refused dead letters are a configuration problem, not a receiver's:
// alert on txhook_dead_letters_refused > 0 and fix the target rules or the
// endpoint's URL, then replay them (dlq.Filter.Reason). Counters and the histogram count what this process's relays did
// since it started; attempts that made no request (a lease that lapsed, a
// secret that could not sign) count as attempts but not as latencies. The
// gauges are read from the database at each scrape, for the whole outbox,
// through Outbox.Backlog, Outbox.DeadLetterCounts and
// Outbox.RefusedDeadLetterCounts (counts on indexes),
// bounded by ScrapeTimeout.
//
// # Label cardinality
//
// At most Options.MaxEndpoints endpoints get their own "endpoint" label
// value, first come first served (by an observed attempt, or by a backlog
// or dead letters at a scrape, the largest first); every other endpoint is
// summed under endpoint="other". So each metric has at most MaxEndpoints+1
// endpoint values (times three outcomes or states), however many endpoints
// the outbox has. The assignment lasts for the life of the Collector: a
// restart starts afresh, which Prometheus sees as new series.
package metrics

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/txhook/txhook/outbox"
)

// Defaults.
const (
	DefaultMaxEndpoints  = 100
	DefaultScrapeTimeout = 5 * time.Second
)

// Other is the endpoint label value of the endpoints beyond MaxEndpoints.
const Other = "other"

// Options configure a Collector. Zero fields take the defaults.
type Options struct {
	// Namespace prefixes the metric names. Default "txhook".
	Namespace string
	// MaxEndpoints is how many endpoints get their own label value; the
	// others are summed under "other". Default 100.
	MaxEndpoints int
	// Buckets of the latency histogram, in seconds. Default
	// prometheus.DefBuckets (5 ms to 10 s), which spans the relay's
	// default 5 s timeout.
	Buckets []float64
	// ScrapeTimeout bounds the database queries of one scrape. Default 5 s.
	ScrapeTimeout time.Duration
	// ConstLabels are added to every metric, such as the service name.
	ConstLabels prometheus.Labels
}

// Collector is a prometheus.Collector for one outbox. It is safe for
// concurrent use.
type Collector struct {
	ob           *outbox.Outbox
	opts         Options
	attempt      *prometheus.CounterVec
	latency      *prometheus.HistogramVec
	backlog      *prometheus.Desc
	undispatched *prometheus.Desc
	dead         *prometheus.Desc
	refused      *prometheus.Desc

	mu    sync.Mutex
	own   map[string]*slot // endpoints with a label value of their own
	other *slot            // the rest; nil until needed
}

// slot is one endpoint label value's series, resolved once so that
// Observe costs a map lookup.
type slot struct {
	label    string
	outcomes map[string]prometheus.Counter
	latency  prometheus.Observer
}

var outcomes = []string{outbox.OutcomeSucceeded, outbox.OutcomeRetry, outbox.OutcomeDeadLettered, outbox.OutcomeDeadLetteredRefused}

// New returns a Collector for ob. Register it with a prometheus.Registerer
// and pass its Observe method as RelayConfig.OnAttempt.
func New(ob *outbox.Outbox, opts Options) *Collector {
	if opts.Namespace == "" {
		opts.Namespace = "txhook"
	}
	if opts.MaxEndpoints <= 0 {
		opts.MaxEndpoints = DefaultMaxEndpoints
	}
	if opts.Buckets == nil {
		opts.Buckets = prometheus.DefBuckets
	}
	if opts.ScrapeTimeout <= 0 {
		opts.ScrapeTimeout = DefaultScrapeTimeout
	}
	ns, cl := opts.Namespace, opts.ConstLabels
	return &Collector{
		ob:   ob,
		opts: opts,
		attempt: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "attempts_total", ConstLabels: cl,
			Help: "Delivery attempts by outcome: succeeded (2xx), retry (failed, retry scheduled), dead_lettered (failed, none left), dead_lettered_refused (not sent: the target rules refused the endpoint's URL too long).",
		}, []string{"endpoint", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "attempt_duration_seconds", ConstLabels: cl, Buckets: opts.Buckets,
			Help: "Duration of delivery requests, redirects and response included.",
		}, []string{"endpoint"}),
		backlog: prometheus.NewDesc(prometheus.BuildFQName(ns, "", "backlog_deliveries"),
			"Deliveries not finished: pending, running, paused while their endpoint is disabled, or blocked behind an earlier event of their ordering key.",
			[]string{"endpoint", "state"}, cl),
		undispatched: prometheus.NewDesc(prometheus.BuildFQName(ns, "", "undispatched_events"),
			"Committed events no relay has fanned out into deliveries yet; grows when no relay runs.", nil, cl),
		dead: prometheus.NewDesc(prometheus.BuildFQName(ns, "", "dead_letters"),
			"Dead letters not yet replayed or purged.", []string{"endpoint"}, cl),
		refused: prometheus.NewDesc(prometheus.BuildFQName(ns, "", "dead_letters_refused"),
			"Dead letters no relay would send: the target rules refused their endpoint's URL for longer than RefusedLimit.", []string{"endpoint"}, cl),
		own: map[string]*slot{},
	}
}

// Observe records one attempt. Pass it as RelayConfig.OnAttempt (or call
// it from yours); it returns quickly.
func (c *Collector) Observe(n outbox.AttemptNotice) {
	c.mu.Lock()
	s := c.slotLocked(n.EndpointID)
	c.mu.Unlock()
	if ctr, ok := s.outcomes[n.Outcome]; ok {
		ctr.Inc()
	}
	if n.Duration > 0 {
		s.latency.Observe(n.Duration.Seconds())
	}
}

// slotLocked returns the series of an endpoint, giving it a label value of
// its own while fewer than MaxEndpoints have one.
func (c *Collector) slotLocked(endpointID string) *slot {
	if s, ok := c.own[endpointID]; ok {
		return s
	}
	if len(c.own) >= c.opts.MaxEndpoints || endpointID == "" || endpointID == Other {
		if c.other == nil {
			c.other = c.newSlot(Other)
		}
		return c.other
	}
	s := c.newSlot(endpointID)
	c.own[endpointID] = s
	return s
}

func (c *Collector) newSlot(label string) *slot {
	s := &slot{label: label, outcomes: make(map[string]prometheus.Counter, len(outcomes)),
		latency: c.latency.WithLabelValues(label)}
	for _, o := range outcomes {
		s.outcomes[o] = c.attempt.WithLabelValues(label, o)
	}
	return s
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	c.attempt.Describe(ch)
	c.latency.Describe(ch)
	ch <- c.backlog
	ch <- c.undispatched
	ch <- c.dead
	ch <- c.refused
}

// Collect implements prometheus.Collector: the counters and histogram
// from memory, the gauges from the database. A failed query is reported
// to the registry as an invalid metric, so the scrape shows the error
// rather than a silent zero.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.attempt.Collect(ch)
	c.latency.Collect(ch)

	ctx, cancel := context.WithTimeout(context.Background(), c.opts.ScrapeTimeout)
	defer cancel()
	bl, err := c.ob.Backlog(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.backlog, err)
		ch <- prometheus.NewInvalidMetric(c.undispatched, err)
	} else {
		ch <- prometheus.MustNewConstMetric(c.undispatched, prometheus.GaugeValue, float64(bl.Undispatched))
	}
	backlog := bl.Deliveries
	dead, derr := c.ob.DeadLetterCounts(ctx)
	if derr != nil {
		ch <- prometheus.NewInvalidMetric(c.dead, derr)
	}
	refused, rerr := c.ob.RefusedDeadLetterCounts(ctx)
	if rerr != nil {
		ch <- prometheus.NewInvalidMetric(c.refused, rerr)
	}

	// Larger backlogs claim free label values first.
	perEndpoint := map[string]int{}
	for _, b := range backlog {
		perEndpoint[b.EndpointID] += b.N
	}
	for id, n := range dead {
		perEndpoint[id] += n
	}
	ids := make([]string, 0, len(perEndpoint))
	for id := range perEndpoint {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool {
		if perEndpoint[ids[i]] != perEndpoint[ids[j]] {
			return perEndpoint[ids[i]] > perEndpoint[ids[j]]
		}
		return ids[i] < ids[j]
	})

	type key struct{ label, state string }
	backlogs := map[key]int{}
	deads, refuseds := map[string]int{}, map[string]int{}
	c.mu.Lock()
	labels := make(map[string]string, len(ids))
	for _, id := range ids {
		labels[id] = c.slotLocked(id).label
	}
	// Every label value in use gets a sample, zero included, so a drained
	// backlog reads 0 rather than vanishing.
	all := make([]*slot, 0, len(c.own)+1)
	for _, s := range c.own {
		all = append(all, s)
	}
	if c.other != nil {
		all = append(all, c.other)
	}
	for _, s := range all {
		deads[s.label], refuseds[s.label] = 0, 0
		for _, st := range []string{outbox.StatePending, outbox.StateRunning, outbox.StatePaused} {
			backlogs[key{s.label, st}] = 0
		}
	}
	c.mu.Unlock()
	for _, b := range backlog {
		backlogs[key{labels[b.EndpointID], b.State}] += b.N
	}
	for id, n := range dead {
		deads[labels[id]] += n
	}
	for id, n := range refused {
		if l, ok := labels[id]; ok { // a refused dead letter is a dead letter: labelled above
			refuseds[l] += n
		}
	}
	if err == nil {
		for k, n := range backlogs {
			ch <- prometheus.MustNewConstMetric(c.backlog, prometheus.GaugeValue, float64(n), k.label, k.state)
		}
	}
	if derr == nil {
		for l, n := range deads {
			ch <- prometheus.MustNewConstMetric(c.dead, prometheus.GaugeValue, float64(n), l)
		}
	}
	if rerr == nil && derr == nil {
		for l, n := range refuseds {
			ch <- prometheus.MustNewConstMetric(c.refused, prometheus.GaugeValue, float64(n), l)
		}
	}
}
