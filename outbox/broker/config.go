package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txhook/txhook/outbox"
)

// Config configures broker mode's forwarders and workers. Zero fields take
// the documented defaults; JetStream is required. Forwarders and workers
// of one deployment share Stream, Subjects and History.
type Config struct {
	// JetStream is the NATS JetStream client to publish and consume with:
	// jetstream.New(nc) on a connection the host made (with its TLS,
	// credentials and reconnect settings). Required.
	JetStream jetstream.JetStream

	// Stream names the JetStream stream. Default "TXHOOK". Start creates
	// it when it is missing and checks it when it exists (see Setup).
	Stream string

	// Subjects is the prefix of the stream's subjects: Subjects+".>".
	// Default "txhook".
	Subjects string

	// Replicas is how many servers keep the stream when Start creates it:
	// 1 for a single server, 3 in a cluster. Default 1.
	Replicas int

	// Duplicates is the stream's duplicate window: a message published
	// again within it (a forwarder that died before saving its cursor
	// forwards again what it sent since) is dropped by JetStream, unless
	// the first was delivered and a server restarted meanwhile (the window
	// is rebuilt from the messages the stream holds; workers then find the
	// copy's delivery recorded and send nothing). Default 2 minutes; at
	// least 10 times SaveInterval.
	Duplicates time.Duration

	// History is the Outbox whose database keeps the endpoints and the
	// delivery history (attempt log, dead letters, endpoint health: what
	// the operations UI, the merchant portal, Recover and exports read),
	// when it is not the Outbox events are enqueued into: a database of
	// its own, so that neither delivery work nor its record costs the
	// payment database. Forwarders copy each event there as they forward
	// it. Nil: the same Outbox. It must be in broker mode too.
	History *outbox.Outbox

	// Relay sets how workers deliver: signer, retry policy, concurrency,
	// timeouts, target rules' proxy and dialer, callbacks (OnAttempt,
	// OnDeadLetter, OnEndpointDisabled…), breaker and retention, as for a
	// relay of table mode. Its Lease is the consumer's AckWait: how long a
	// worker may hold a delivery before JetStream hands it to another
	// (default 30 s; a request never starts with less than Timeout and a
	// fifth of it left). BatchSize bounds what a worker fetches at once.
	Relay outbox.RelayConfig

	// BatchSize is the most events a forwarder reads per round. Default
	// 500.
	BatchSize int

	// PollInterval is the longest a forwarder waits between rounds when
	// no commit woke it (Config.Listener of the Outbox). Default 250 ms.
	PollInterval time.Duration

	// Lease is how long a forwarder holds the cursor of its stream (only
	// one forwards at a time; the others stand by and take over when it
	// stops or dies) and the events it claims under a lease. Default 30 s.
	Lease time.Duration

	// SaveInterval is how often a forwarder saves its cursor: the most it
	// forwards again after it dies (the duplicate window drops the
	// copies). Default 1 s.
	SaveInterval time.Duration

	// RescueAfter is how long past its due time a delivery row the broker
	// holds may wait before a forwarder looks for its message in the
	// stream and, if it is gone (a stream purged or deleted by hand),
	// queues it again. Default 10 minutes.
	RescueAfter time.Duration

	// Logger receives the logs; nil means the Outbox's.
	Logger *slog.Logger
}

// Defaults.
const (
	DefaultStream       = "TXHOOK"
	DefaultSubjects     = "txhook"
	DefaultDuplicates   = 2 * time.Minute
	DefaultBatchSize    = 500
	DefaultPollInterval = 250 * time.Millisecond
	DefaultLease        = 30 * time.Second
	DefaultSaveInterval = time.Second
	DefaultRescueAfter  = 10 * time.Minute
)

// Errors. Each is returned wrapped with detail; test with errors.Is.
var (
	// ErrInvalidConfig: the Config cannot work (the message says why).
	ErrInvalidConfig = errors.New("txhook/broker: invalid config")
	// ErrUnavailable: JetStream did not answer (no server reachable, no
	// JetStream on it, a timeout). Enqueue keeps working: events wait in
	// the outbox table until a forwarder can publish them.
	ErrUnavailable = errors.New("txhook/broker: JetStream unavailable")
	// ErrStreamConfig: the stream or its consumer exists with settings
	// that would lose, delay or misroute deliveries (the message names the
	// setting and the fix).
	ErrStreamConfig = errors.New("txhook/broker: stream misconfigured")
	// ErrStreamMissing: the stream or its consumer was deleted while
	// forwarders or workers ran. The deliveries it held are gone: call
	// Setup (or restart), then Outbox.Recover each endpoint since the
	// deletion.
	ErrStreamMissing = errors.New("txhook/broker: stream or consumer deleted (call Setup or restart to create them, then Outbox.Recover the endpoints whose deliveries they held)")
	// ErrNotBrokerMode: an Outbox given to a forwarder or worker is not in
	// broker mode (outbox.Config.Broker).
	ErrNotBrokerMode = errors.New("txhook/broker: the outbox is not in broker mode (set outbox.Config.Broker)")
)

var namePattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func (c Config) withDefaults() Config {
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if c.Subjects == "" {
		c.Subjects = DefaultSubjects
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Duplicates == 0 {
		c.Duplicates = DefaultDuplicates
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.SaveInterval == 0 {
		c.SaveInterval = DefaultSaveInterval
	}
	if c.RescueAfter == 0 {
		c.RescueAfter = DefaultRescueAfter
	}
	if c.Relay.Lease == 0 {
		c.Relay.Lease = outbox.DefaultLease
	}
	if c.Relay.Timeout == 0 {
		c.Relay.Timeout = outbox.DefaultTimeout
	}
	return c
}

func (c Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.JetStream == nil:
		return bad("JetStream is required (jetstream.New(nc))")
	case !namePattern.MatchString(c.Stream):
		return bad("Stream %q: letters, digits, _ and - (at most 64)", c.Stream)
	case !subjectPattern.MatchString(c.Subjects):
		return bad("Subjects %q: dot-separated tokens of letters, digits, _ and -", c.Subjects)
	case c.Replicas < 1 || c.Replicas > 5:
		return bad("Replicas %d not in 1..5", c.Replicas)
	case c.Duplicates < 10*c.SaveInterval:
		return bad("Duplicates %s shorter than 10 × SaveInterval %s: a forwarder that dies would send events again", c.Duplicates, c.SaveInterval)
	case c.BatchSize < 1 || c.BatchSize > 5000:
		return bad("BatchSize %d not in 1..5000", c.BatchSize)
	case c.PollInterval <= 0 || c.Lease <= 0 || c.SaveInterval <= 0 || c.RescueAfter <= 0:
		return bad("intervals must be positive")
	case c.SaveInterval > c.Lease/3:
		return bad("SaveInterval %s longer than a third of Lease %s", c.SaveInterval, c.Lease)
	}
	return nil
}

var subjectPattern = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)
