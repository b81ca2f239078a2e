package outbox

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/retry"
	"github.com/txhook/txhook/signer"
)

// RelayConfig configures a Relay. Zero fields take the documented defaults.
type RelayConfig struct {
	// ID names this relay as the owner of its leases, in the database and
	// in logs. Default: host name, process ID and a random suffix, so a
	// restarted process never mistakes its predecessor's leases for its own.
	ID string

	// Signer signs each request. Default signer.Standard{} (Standard
	// Webhooks); signer.Stripe{Header: "X-Kxp-Signature"} gives the
	// Stripe-style t=,v1= header.
	Signer signer.Signer

	// Retry decides when a failed delivery is tried again and when it is
	// dead-lettered. Default retry.Default(): T+0, 10s, 30s, 1m, 5m, 15m,
	// 1h, 6h, 24h with ±25% jitter, 9 attempts. Each delay counts from the
	// end of the failed attempt (its response, or the moment it timed out
	// or failed), by the clock of the relay that made it: a relay whose
	// clock runs ahead of that one's takes the retry early by the
	// difference (see Lease for the warning about clocks).
	Retry retry.Policy

	// Concurrency is the most requests in flight at once. Default 32.
	Concurrency int

	// EndpointConcurrency is the most requests in flight to one endpoint,
	// so one slow receiver cannot take every slot. Default Concurrency/2
	// (at least 1).
	EndpointConcurrency int

	// BatchSize is the most deliveries one claim takes. Default 100.
	BatchSize int

	// Lease is how long a claim holds a delivery. A relay that dies leaves
	// its deliveries to others once their lease expires. The last fifth
	// of every lease is a safety margin in which its holder has no request
	// open: a request starts only while Timeout still fits before the
	// margin, and is cut when the margin begins, whatever delayed it. So
	// when another relay takes a delivery over, the previous request has
	// been over for at least a fifth of Lease, and two relays never have
	// it in flight at once, not even as the receiver sees it. The
	// database's clock times leases, so this holds however far the relays'
	// clocks are off. A relay whose clock (Config.Clock) is more than a
	// fifth of Lease from the database's logs a warning: the retry times
	// it schedules, and which pending deliveries it takes as due, follow
	// its own clock.
	// A lease also bounds each round of the relay's statements (a claim, a
	// batch of outcomes), so a database that stops answering without
	// closing its connections holds the relay for one lease at most (see
	// docs/SCALING.md, Failover). Default 30 s.
	Lease time.Duration

	// PollInterval is the longest a relay waits before looking for due
	// deliveries when nothing woke it: retries coming due, missed
	// notifications. Default 250 ms.
	PollInterval time.Duration

	// Timeout bounds one request, redirects and response included.
	// Default 5 s.
	Timeout time.Duration

	// ConnectTimeout bounds resolving and connecting. Default 3 s.
	ConnectTimeout time.Duration

	// MaxRedirects is how many redirects are followed (each re-checked
	// against the target rules) before the attempt fails. Default 2;
	// negative follows none.
	MaxRedirects int

	// MaxResponseBytes is how much of a response is read. Default 64 KiB;
	// the attempt log keeps the first 4 KiB.
	MaxResponseBytes int64

	// MaxRetryAfter caps how far a receiver's Retry-After (on 429 and 503)
	// can push the next attempt beyond the retry policy's own delay.
	// Default 1 h.
	MaxRetryAfter time.Duration

	// OnDeadLetter, if set, is called after a delivery has been moved to the
	// dead-letter table, from the relay's completion goroutine: it should
	// return quickly (hand off to your alerting).
	OnDeadLetter func(DeadLetterNotice)

	// OnAttempt, if set, is called for every attempt once its record is
	// written, from the relay's completion goroutine: for metrics. It must
	// return quickly.
	OnAttempt func(AttemptNotice)

	// DisableAfter disables an endpoint whose attempts have all failed for
	// this long, so a receiver that is gone stops costing attempts: when
	// its latest failed attempt started this long after the first failed
	// attempt since its last success, as the attempt log of every relay
	// shows. Its waiting deliveries are paused until it is enabled again,
	// and events enqueued meanwhile are not queued for it (Outbox.Recover
	// queues them). Enabled again while it still fails, it is disabled
	// again by its next failed attempt. Default 5 days; negative never
	// disables.
	DisableAfter time.Duration

	// RefusedLimit bounds how long a delivery waits while the target rules
	// refuse its endpoint's URL itself (see Config.AllowHTTP). Each relay
	// whose rules refuse the URL hands the delivery back without spending
	// an attempt, as any relay whose rules allow it may send it; the
	// delivery records, by the database's clock, when the refusals began,
	// and any attempt by any relay ends them. A refusal recorded once
	// they began RefusedLimit ago, when no relay has started an attempt
	// to the endpoint in that time either, dead-letters the delivery
	// instead, with reason DeadReasonRefused: shown as refused by the
	// dlq package and its UI, the portal and the metrics, counted in
	// RelayStats.DeadLetteredRefused, told to OnDeadLetter, and replayable
	// (dlq) once the rules or the URL are fixed.
	//
	// With relays whose rules differ, a delivery is dead-lettered only
	// when neither it nor any other delivery to its endpoint was sent for
	// RefusedLimit: a relay that allows the URL claims its deliveries like
	// any other relay (every refusal makes the delivery due again, for
	// every relay, in RefusedRetryDelay), and each of its attempts to the
	// endpoint keeps the refusing relays from dead-lettering. Each relay
	// applies its own RefusedLimit to the refusals it records. Default:
	// the span of Retry, from the first attempt to the last without jitter
	// (24 hours for retry.Default), so a delivery nobody will send is
	// dead-lettered about when one that keeps failing would be; negative
	// never dead-letters a refused delivery.
	RefusedLimit time.Duration

	// DisableOnGone disables an endpoint at once when it answers 410 Gone,
	// the Standard Webhooks signal that the receiver wants no more events,
	// unless a later attempt succeeded.
	DisableOnGone bool

	// OnEndpointDisabled, if set, is called when the relay disables an
	// endpoint (DisableAfter or DisableOnGone); OnEndpointRecovered when an
	// endpoint succeeds after a run of failures. Each is called once per
	// change, by the relay that records it, however many relays run; one
	// call at a time, from the completion or the maintenance goroutine:
	// hand off to your alerting and return.
	OnEndpointDisabled  func(EndpointNotice)
	OnEndpointRecovered func(EndpointNotice)

	// Retention prunes old finished deliveries; see Retention.
	Retention Retention

	// BreakerThreshold is how many receiver faults in a row (connection
	// errors, timeouts, 5xx, 408, 429) open an endpoint's circuit: its
	// deliveries then wait, spending no attempts, for BreakerCooldown; then
	// one probe request at a time is sent, and after a success the
	// endpoint's in-flight cap ramps up again from 2, doubling per success.
	// A failed probe reopens the circuit for twice as long, up to
	// BreakerMaxCooldown. Default 5; negative turns the breaker off. Each
	// relay keeps its own circuits.
	BreakerThreshold   int
	BreakerCooldown    time.Duration // default 30 s
	BreakerMaxCooldown time.Duration // default 10 min

	// Proxy, if set, is an HTTP CONNECT egress proxy, such as smokescreen,
	// that every request goes through: for http and https endpoints alike
	// the relay asks it for a tunnel to the endpoint's host:port (and to
	// each redirect's), sending Proxy-Authorization: Basic when the URL
	// has user:password, and speaks TLS to the endpoint inside the tunnel.
	// Receivers then see the proxy's addresses, which you can publish.
	// The URL is http://host:port; for a proxy that speaks TLS, return
	// the TLS connection from DialContext. Environment proxies
	// (HTTPS_PROXY) are never used.
	//
	// With a proxy, the proxy resolves endpoint names, not the relay. The
	// relay still refuses, by the target rules of Config, an IP-literal
	// endpoint it forbids, and a name that it can resolve itself (within
	// half of ConnectTimeout) to any address it forbids; a name it cannot
	// resolve is left to the proxy. The proxy must therefore enforce its
	// own rules on what it resolves and connects to (smokescreen refuses
	// private addresses by default): that is the only check against DNS
	// rebinding behind a proxy. A tunnel the proxy refuses is a failed
	// attempt ("egress proxy ... refused CONNECT ...: 403 Forbidden").
	Proxy *url.URL

	// DialContext, if set, makes the relay's TCP connections: to Proxy
	// when it is set, otherwise to endpoints, always as ip:port of an
	// address the target rules allow (the relay resolves the name and
	// checks each address first). Default: a net.Dialer with
	// ConnectTimeout.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)

	// WrapTransport, if set, wraps the http.RoundTripper that sends each
	// request (each redirect separately), for instrumentation or
	// a custom egress. It must send the request it is given.
	WrapTransport func(http.RoundTripper) http.RoundTripper

	// RootCAs verify endpoints' TLS certificates; nil means the system's.
	RootCAs *x509.CertPool
}

// EndpointNotice describes a change in an endpoint's health.
type EndpointNotice struct {
	EndpointID   string
	Tenant       string
	Reason       string    // why it was disabled; "" for a recovery
	FailingSince time.Time // start of the run of failures
	At           time.Time
}

// Attempt outcomes in AttemptNotice.
const (
	OutcomeSucceeded    = "succeeded"     // 2xx
	OutcomeRetry        = "retry"         // failed; another attempt is scheduled
	OutcomeDeadLettered = "dead_lettered" // failed; no attempt left
	// OutcomeDeadLetteredRefused: dead-lettered without a request, the
	// target rules having refused the endpoint's URL for longer than
	// RelayConfig.RefusedLimit. The refusals before it are not attempts
	// and are not reported.
	OutcomeDeadLetteredRefused = "dead_lettered_refused"
)

// Why a delivery was dead-lettered: DeadLetterNotice.Reason, and the
// Reason of the dlq package's entries.
const (
	// DeadReasonFailed: its attempts ran out, or it failed in a way no
	// retry mends (its endpoint was deleted, say).
	DeadReasonFailed = store.DeadReasonFailed
	// DeadReasonRefused: the target rules refused its endpoint's URL for
	// longer than RelayConfig.RefusedLimit, and no relay sent to the
	// endpoint meanwhile.
	DeadReasonRefused = store.DeadReasonRefused
)

// AttemptNotice describes one recorded attempt.
type AttemptNotice struct {
	DeliveryID int64
	EventID    string
	EventType  string
	Tenant     string
	EndpointID string
	Attempt    int
	Outcome    string // OutcomeSucceeded, OutcomeRetry, OutcomeDeadLettered or OutcomeDeadLetteredRefused
	Status     int    // 0: no HTTP response
	Duration   time.Duration
	Error      string // "" on success
}

// DeadLetterNotice describes a delivery that was dead-lettered.
type DeadLetterNotice struct {
	DeliveryID int64
	EventID    string
	EventType  string
	Tenant     string
	EndpointID string
	Attempts   int
	LastStatus int
	LastError  string
	// Reason is DeadReasonFailed (its attempts ran out) or
	// DeadReasonRefused (the target rules refused its endpoint for longer
	// than RefusedLimit; LastError names the rule).
	Reason string
}

// Defaults.
const (
	DefaultConcurrency   = 32
	DefaultBatchSize     = 100
	DefaultLease         = 30 * time.Second
	DefaultPollInterval  = 250 * time.Millisecond
	DefaultTimeout       = 5 * time.Second
	DefaultConnect       = 3 * time.Second
	DefaultMaxRedirects  = 2
	DefaultMaxResponse   = 64 << 10
	DefaultMaxRetryAfter = time.Hour
	DefaultDisableAfter  = 5 * 24 * time.Hour

	DefaultBreakerThreshold   = 5
	DefaultBreakerCooldown    = 30 * time.Second
	DefaultBreakerMaxCooldown = 10 * time.Minute
)

// ErrInvalidConfig is returned for a RelayConfig that cannot work.
var ErrInvalidConfig = errors.New("txhook: invalid relay config")

func (c RelayConfig) withDefaults() RelayConfig {
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = fmt.Sprintf("%s/%d/%s", host, os.Getpid(), ulid.Make().String()[20:])
	}
	if c.Signer == nil {
		c.Signer = signer.Standard{}
	}
	if c.Retry == nil {
		c.Retry = retry.Default()
	}
	setDefault(&c.Concurrency, DefaultConcurrency)
	if c.EndpointConcurrency == 0 {
		c.EndpointConcurrency = max(1, c.Concurrency/2)
	}
	setDefault(&c.BatchSize, DefaultBatchSize)
	setDefault(&c.Lease, DefaultLease)
	setDefault(&c.PollInterval, DefaultPollInterval)
	setDefault(&c.Timeout, DefaultTimeout)
	setDefault(&c.ConnectTimeout, DefaultConnect)
	setDefault(&c.MaxRedirects, DefaultMaxRedirects)
	setDefault(&c.MaxResponseBytes, DefaultMaxResponse)
	setDefault(&c.MaxRetryAfter, DefaultMaxRetryAfter)
	setDefault(&c.DisableAfter, DefaultDisableAfter)
	if c.RefusedLimit == 0 {
		c.RefusedLimit = retry.Span(c.Retry)
	}
	c.Retention = c.Retention.withDefaults()
	setDefault(&c.BreakerThreshold, DefaultBreakerThreshold)
	if c.BreakerCooldown <= 0 {
		c.BreakerCooldown = DefaultBreakerCooldown
	}
	if c.BreakerMaxCooldown < c.BreakerCooldown {
		c.BreakerMaxCooldown = max(DefaultBreakerMaxCooldown, c.BreakerCooldown)
	}
	return c
}

func (c RelayConfig) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case len(c.ID) > 200:
		return bad("ID longer than 200 bytes")
	case c.Concurrency < 1 || c.Concurrency > 10000:
		return bad("Concurrency %d not in 1..10000", c.Concurrency)
	case c.EndpointConcurrency < 1 || c.EndpointConcurrency > c.Concurrency:
		return bad("EndpointConcurrency %d not in 1..Concurrency", c.EndpointConcurrency)
	case c.BatchSize < 1 || c.BatchSize > 5000:
		return bad("BatchSize %d not in 1..5000", c.BatchSize)
	case c.Timeout <= 0 || c.ConnectTimeout <= 0 || c.PollInterval <= 0 || c.MaxRetryAfter < 0:
		return bad("timeouts and intervals must be positive")
	case c.Lease-leaseMargin(c.Lease)-c.Timeout < 100*time.Millisecond:
		return bad("Lease %s too short for Timeout %s: a request must fit in the lease less its safety margin (a fifth), with 100 ms to spare", c.Lease, c.Timeout)
	case c.MaxResponseBytes < 0:
		return bad("MaxResponseBytes is negative")
	case c.Retry.MaxAttempts() < 1:
		return bad("retry policy allows no attempt")
	case c.Proxy != nil && (c.Proxy.Scheme != "http" || c.Proxy.Hostname() == "" || c.Proxy.Path != "" && c.Proxy.Path != "/"):
		return bad("Proxy must be http://[user:password@]host:port (return a TLS connection from DialContext for a TLS proxy)")
	}
	if v, ok := c.Retry.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	return nil
}

func (o *Outbox) relayLogger() *slog.Logger { return o.log.With("component", "txhook.relay") }

// setDefault sets *v to d when it is the zero value.
func setDefault[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}
