package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/txhook/txhook/internal/clock"
	"github.com/txhook/txhook/internal/link"
	"github.com/txhook/txhook/internal/queue"
	"github.com/txhook/txhook/internal/safehttp"
	"github.com/txhook/txhook/internal/sqlitelock"
	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/signer"
)

// Clock tells the time and makes timers: Config.Clock. Tests substitute a
// fake one; nil means the wall clock. The relay reads it to schedule
// retries and to decide which pending deliveries are due; leases are timed
// by the database's clock whatever it says.
type Clock = interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer returns a Timer that fires once, d from now.
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer made by a Clock: the part of *time.Timer that
// txhook uses.
type Timer = interface {
	// C returns the channel on which the timer sends the time when it fires.
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it was active.
	Stop() bool
	// Reset changes the timer to fire d from now.
	Reset(d time.Duration)
}

// Default limits.
const (
	DefaultMaxPayloadBytes = 256 << 10
	DefaultNotifyInterval  = 25 * time.Millisecond
)

// Config configures an Outbox. The zero value is ready for production on
// PostgreSQL; local development against receivers on localhost needs
// AllowHTTP and AllowPrivateTargets.
type Config struct {
	// Dialect is "postgres" or "sqlite". Empty means detected from the
	// driver (lib/pq, pgx's stdlib, mattn/go-sqlite3, modernc.org/sqlite)
	// or by asking the database.
	Dialect string

	// MaxPayloadBytes is the largest event payload Enqueue accepts.
	// Default 256 KiB.
	MaxPayloadBytes int

	// AllowHTTP allows plain http:// endpoint URLs. Default: https only.
	//
	// AllowHTTP, AllowPrivateTargets and AllowedTargets are the target
	// rules. CreateEndpoint and UpdateEndpoint apply them to the URL, and
	// each relay to every connection it makes, with the rules of the
	// Outbox it was made from. Relays sharing a database should share the
	// rules; if they differ, a relay whose rules refuse an endpoint's URL
	// itself (plain http, or an IP-literal host it forbids) spends none of
	// the delivery's attempts: it hands the delivery back,
	// due again in RefusedRetryDelay (for any relay: one whose rules allow
	// the endpoint delivers it), with a last error that names the rule
	// and the field that sets it, logs a warning (once a minute per
	// endpoint) and counts it in RelayStats.Refused. Once a delivery has
	// been refused for RelayConfig.RefusedLimit (by default the span of
	// the retry schedule) with no attempt to its endpoint by any relay
	// meanwhile, it is dead-lettered with reason DeadReasonRefused; replay
	// it once the rules or the endpoint's URL are fixed. A host name that
	// resolves, when the relay connects, to an address its rules forbid is an
	// ordinary failed attempt, retried and in the end dead-lettered: DNS
	// changes, and a name that turns private after registration may be
	// DNS rebinding. So is a redirect to a refused target.
	AllowHTTP bool

	// AllowPrivateTargets allows endpoint URLs that resolve to loopback,
	// private, link-local and other non-public addresses, at registration
	// and when connecting. Only for local development and tests: it lets
	// whoever registers an endpoint make the relay call into your network.
	AllowPrivateTargets bool

	// AllowedTargets are networks reachable even though they are private,
	// such as a partner's VPN range: narrower than AllowPrivateTargets.
	AllowedTargets []netip.Prefix

	// Resolver resolves endpoint host names, at registration and when
	// relays connect; nil means net.DefaultResolver. With
	// RelayConfig.Proxy the proxy resolves names; a relay resolves them
	// only to refuse those that resolve to forbidden addresses.
	Resolver *net.Resolver

	// NotifyInterval is, on PostgreSQL, the least time between two wake-up
	// notifications this Outbox adds to enqueuing transactions. NOTIFY
	// serialises the commits of the transactions that send one, so sending
	// one per Enqueue would halve the enqueue rate under load; a relay that
	// was just woken keeps polling briefly and picks up the events committed
	// in between. Each NOTIFY also makes every commit that sends one wait
	// for a global lock, which lengthens the tail of commit→receipt: at 500
	// events/s from 24 goroutines on a loaded 2-core machine, p99 was 290 to
	// 540 ms with 5 ms, 105 to 115 ms with 25 ms, and 100 to 105 ms
	// without NOTIFY (docs/BENCHMARKS.md). Default 25 ms; negative turns
	// NOTIFY off (polling only).
	NotifyInterval time.Duration

	// Listener, on PostgreSQL, wakes relays as soon as an enqueuing
	// transaction commits: pgxoutbox.Listener() with pgx (pgxoutbox.New
	// sets it), pqlisten.New(dsn) with lib/pq. Nil means relays find new
	// events by polling every RelayConfig.PollInterval. Unused on SQLite,
	// where Enqueue wakes the relays of its own process directly.
	Listener Listener

	// Catalog, if set, lists the event types this platform sends: Enqueue
	// refuses types and versions it does not list, endpoints can pin only
	// versions it lists, and relays convert payloads with its converters.
	Catalog *Catalog

	// SecretCipher, if set, encrypts endpoint signing secrets, client
	// certificate keys and custom headers at rest: they are stored
	// encrypted with its current key, bound to their endpoint, and
	// decrypted in memory only (see AESGCM, and "Secrets at rest" in
	// docs/security.md). Values stored in plaintext before it was set keep working;
	// RotateSecret (secrets), UpdateEndpoint (new headers or client
	// certificate) and ReencryptSecrets (all three) encrypt them. Nil stores them in plaintext, with a warning logged by
	// New.
	SecretCipher Cipher

	// TracerProvider, if set, turns on OpenTelemetry tracing: a span for
	// each Enqueue, whose trace context is stored with the event, and a
	// span for each delivery attempt, a child of it, whose traceparent the
	// request carries to the receiver (see Tracing in the package
	// documentation). Relays made by this Outbox trace with it too. Nil:
	// off, at no cost.
	TracerProvider trace.TracerProvider

	// Schema is, on PostgreSQL, the schema that holds txhook's tables.
	// Empty means wherever the connection's search_path finds them
	// (normally public). Statements name the tables in it, so no
	// search_path is set on any connection: a pool behind PgBouncer in
	// transaction mode works. Migrate creates the schema if needed; with
	// goose or golang-migrate, set search_path to it in the tool's
	// connection string (see package outbox/migrations). Lowercase letters,
	// digits and underscores; anything else, or a Schema on SQLite, fails
	// New with ErrInvalidSchema. Relays of outboxes in different schemas of
	// one database share the NOTIFY channel: a wake-up in one makes the
	// others look for work once, and find none.
	Schema string

	// TransactionPooling says that the database is reached through a
	// connection pooler in transaction mode, such as PgBouncer with
	// pool_mode = transaction, which hands each transaction (and each
	// statement outside one) to any of its server connections. txhook then
	// prepares no statements, as prepared statements live on one server
	// connection (PgBouncer 1.21 and later can track them instead, with
	// max_prepared_statements). The driver must be set up for the pooler
	// too (New checks lib/pq's and pgx's, and fails with ErrPoolerUnsafe
	// when they would let the pooler split a statement across server
	// connections), and LISTEN needs a direct connection: see PgBouncer in
	// docs/drivers.md. Unused on SQLite.
	TransactionPooling bool

	// SyncRelayCommits makes relays commit their own writes (claims,
	// outcomes, the attempt log, endpoint health) as the server's
	// synchronous_commit says, as Enqueue's transaction always does. By
	// default, on PostgreSQL, each relay statement's transaction sets
	// synchronous_commit off for itself alone (set_config(..., true), so
	// PgBouncer in transaction mode is fine): its commit does not wait for
	// the WAL to reach the disk, or a synchronous standby. A database
	// crash or a failover can then forget the relays' last moments of
	// bookkeeping (on a crash at most about three times wal_writer_delay,
	// 600 ms by default, and only with everything committed after it).
	// No event is lost so: events commit with your own transactions,
	// durably, and a forgotten lease or outcome makes the relays deliver
	// the event again, which at-least-once delivery allows and receivers
	// deduplicate by webhook-id. What it saves is a WAL flush per relay
	// statement (docs/BENCHMARKS.md). Set SyncRelayCommits when the attempt
	// log must survive a crash to the last attempt. Unused on SQLite.
	SyncRelayCommits bool

	// Broker puts the Outbox in broker mode: its events are forwarded to
	// NATS JetStream and delivered by the workers of package outbox/broker,
	// which take delivery work off this database, instead of being
	// dispatched and delivered by relays (NewRelay then fails with
	// ErrBrokerMode). Enqueue writes the same one row in the caller's
	// transaction; on PostgreSQL it also stores the writing transaction's
	// ID, by which forwarders find new events without writing anything per
	// event. Broker mode does not order deliveries: Enqueue refuses an
	// OrderingKey with ErrOrderingBroker. Set it on every Outbox that
	// enqueues into the database (an event enqueued without it is still
	// forwarded, at the cost of a claim and an update of its row).
	Broker bool

	// Clock is the time source; nil means the wall clock.
	Clock Clock

	// Logger receives the library's logs; nil means slog.Default().
	// Secrets are never logged.
	Logger *slog.Logger
}

// Outbox is txhook's handle on one database: it enqueues events, manages
// endpoints and makes relays. It is safe for concurrent use.
type Outbox struct {
	db     *sql.DB
	st     *store.Store
	cfg    Config
	clock  Clock
	log    *slog.Logger
	target safehttp.Config
	tracer trace.Tracer // nil: tracing off

	lastNotify atomic.Int64 // unix nanoseconds of the last queued NOTIFY
	maxMoved   atomic.Int64 // tests: maxMovedPerPartition of this Outbox, 0 for the default
}

// New returns an Outbox on db. It prepares the Enqueue statement, so the
// schema must exist (see Migrate) unless the statement cannot be prepared
// yet, in which case Enqueue prepares nothing and costs one more round trip
// with lib/pq.
//
// On SQLite New opens one connection of the pool, waiting within ctx (one
// minute at most when ctx has no deadline) while another process holds a
// lock SQLite will not wait for: replicas opening a new database file at
// the same moment all switch it to WAL, and all but one are refused at
// once. Any other error opening the connection is returned.
func New(ctx context.Context, db *sql.DB, cfg Config) (*Outbox, error) {
	if db == nil {
		return nil, errors.New("txhook: outbox.New: nil *sql.DB")
	}
	var d store.Dialect
	switch cfg.Dialect {
	case "":
		var err error
		if d, err = store.Detect(ctx, db); err != nil {
			return nil, err
		}
	case "postgres", "postgresql", "pgx":
		d = store.Postgres
	case "sqlite", "sqlite3":
		d = store.SQLite
	default:
		return nil, fmt.Errorf("txhook: unknown dialect %q (want postgres or sqlite)", cfg.Dialect)
	}
	if d == store.SQLite {
		if err := sqlitelock.Connect(ctx, db); err != nil {
			return nil, fmt.Errorf("txhook: outbox.New: open SQLite: %w", err)
		}
	}
	if cfg.MaxPayloadBytes <= 0 {
		cfg.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if cfg.NotifyInterval == 0 {
		cfg.NotifyInterval = DefaultNotifyInterval
	}
	st := store.New(db, d)
	st.NoPrepare = cfg.TransactionPooling && d == store.Postgres
	st.SyncRelayCommits = cfg.SyncRelayCommits
	st.Forward = cfg.Broker
	if cfg.Schema != "" {
		if err := st.SetSchema(cfg.Schema); err != nil {
			return nil, err
		}
	}
	if cfg.TransactionPooling {
		if err := st.CheckPooler(ctx); err != nil {
			return nil, err
		}
	}
	o := &Outbox{
		db:    db,
		st:    st,
		cfg:   cfg,
		clock: clock.OrReal(cfg.Clock),
		log:   cfg.Logger,
		target: safehttp.Config{
			AllowHTTP:     cfg.AllowHTTP,
			AllowPrivate:  cfg.AllowPrivateTargets,
			AllowPrefixes: cfg.AllowedTargets,
		},
	}
	if cfg.Resolver != nil {
		o.target.LookupIPAddr = cfg.Resolver.LookupIPAddr
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	o.warnUnencrypted()
	o.tracer = newTracer(cfg.TracerProvider)
	o.prepare(ctx)
	return o, nil
}

// prepare readies the hot statements; before Migrate has run they cannot
// be prepared, and Migrate calls it again.
func (o *Outbox) prepare(ctx context.Context) {
	_ = o.st.Prepare(ctx, o.st.EnqueueQueries(o.tracer != nil)...)
}

// DB returns the database the Outbox was made with.
func (o *Outbox) DB() *sql.DB { return o.db }

// Dialect returns "postgres" or "sqlite".
func (o *Outbox) Dialect() string { return o.st.Dialect.String() }

// Migrate creates or upgrades txhook's tables (in Config.Schema, if set),
// applying in one transaction the files of package outbox/migrations that
// txhook_migrations does not record yet. It is idempotent and safe to run
// from several processes at once.
//
// Teams that apply migrations with goose or golang-migrate apply those
// files with their tool instead, and call CheckSchema rather than Migrate:
// use one or the other on a database. Migrate on a database a tool
// migrated applies only what txhook_migrations lacks, which the tool then
// does not know about (it fails, changing nothing, when it tries that
// migration again); a tool on a database Migrate created fails on its
// first migration, also changing nothing.
// On SQLite it waits for the database lock within ctx, as New does.
func (o *Outbox) Migrate(ctx context.Context) error {
	if _, err := o.st.Migrate(ctx); err != nil {
		return err
	}
	o.prepare(ctx)
	return nil
}

// CheckSchema returns nil when the database has every migration this
// version of txhook needs, however they were applied, and otherwise an
// error wrapping ErrNotMigrated that names what is missing. Relay.Start
// runs it; a service that migrates with its own tool can run it at start.
func (o *Outbox) CheckSchema(ctx context.Context) error {
	return o.st.CheckSchema(ctx)
}

// Close releases the Outbox's prepared statements. It does not close the
// database.
func (o *Outbox) Close() error { return o.st.Close() }

// Errors. Each is returned wrapped with detail; test with errors.Is.
var (
	// ErrInvalidEvent: the event is missing a tenant or type, or has a
	// malformed ID, type or idempotency key.
	ErrInvalidEvent = errors.New("txhook: invalid event")
	// ErrInvalidPayload: the payload is not valid JSON, or is valid JSON
	// that a database or receiver would refuse (see Event.Payload); the
	// error says which, and why.
	ErrInvalidPayload = errors.New("txhook: payload refused")
	// ErrPayloadTooLarge: the payload exceeds Config.MaxPayloadBytes.
	ErrPayloadTooLarge = errors.New("txhook: payload too large")
	// ErrEventConflict: the event's ID is taken by a different event
	// (another tenant's, or other content). IDs are global, as receivers
	// deduplicate on webhook-id; the error tells nothing about the other
	// event. Use a new ID, or none.
	ErrEventConflict = errors.New("txhook: event ID already used for a different event")
	// ErrIdempotencyConflict: the tenant's idempotency key was already used
	// for an event with another type, payload, version, ordering key or
	// ID. Replaying the same event is not an error (see EnqueueDetail);
	// this one means the key was reused for a different operation.
	ErrIdempotencyConflict = errors.New("txhook: idempotency key already used for a different event")

	// ErrOrderingBroker: an event with an OrderingKey was enqueued by an
	// Outbox in broker mode (Config.Broker). Broker mode delivers each
	// delivery on its own, from a shared queue: keeping one key's events
	// in order would let one failing key hold back whatever shares its
	// place in the queue, so it does not offer ordering. Enqueue without
	// an OrderingKey, or deliver ordered events in table mode.
	ErrOrderingBroker = errors.New("txhook: broker mode does not order deliveries: ordering keys need table mode")
	// ErrBrokerMode: NewRelay was called on an Outbox in broker mode
	// (Config.Broker), whose events table-mode relays never see; run the
	// forwarders and workers of package outbox/broker instead.
	ErrBrokerMode = errors.New("txhook: the outbox is in broker mode: deliver with package outbox/broker, not NewRelay")

	// ErrInvalidEndpoint: an endpoint field other than the URL is invalid.
	ErrInvalidEndpoint = errors.New("txhook: invalid endpoint")
	// ErrEndpointNotFound: no endpoint has that ID.
	ErrEndpointNotFound = errors.New("txhook: endpoint not found")
	// ErrInvalidURL: the endpoint URL is not an absolute http(s) URL
	// without credentials.
	ErrInvalidURL = safehttp.ErrInvalidURL
	// ErrInsecureURL: the URL is plain http and Config.AllowHTTP is off.
	ErrInsecureURL = safehttp.ErrInsecureScheme
	// ErrForbiddenTarget: the URL's host is, or resolves to, a loopback,
	// private, link-local, metadata or otherwise non-public address.
	ErrForbiddenTarget = safehttp.ErrForbiddenAddress
	// ErrHostNotFound: the URL's host name does not exist (NXDOMAIN) or
	// has no address. Check the name; asking again will not help.
	ErrHostNotFound = safehttp.ErrHostNotFound
	// ErrDNSUnavailable: the URL's host name could not be resolved for a
	// reason that may pass (a DNS timeout or SERVFAIL, no DNS server
	// reachable): try again later.
	ErrDNSUnavailable = safehttp.ErrDNSUnavailable
	// ErrInvalidSecret: a supplied signing secret is not usable.
	ErrInvalidSecret = signer.ErrInvalidSecret

	// ErrNotMigrated: txhook's tables do not exist, or lack a migration
	// this version of txhook needs (the error names it). Run Migrate, or
	// apply the files of package outbox/migrations with your tool. Enqueue
	// and CreateEndpoint return it when the database says a table or
	// column is missing; Relay.Start and CheckSchema check the recorded
	// migrations.
	ErrNotMigrated = store.ErrNotMigrated
	// ErrInvalidSchema: Config.Schema is not a name txhook accepts, or is
	// set on SQLite.
	ErrInvalidSchema = store.ErrInvalidSchema
	// ErrPoolerUnsafe: Config.TransactionPooling is set and the driver's
	// settings would let the pooler run parts of one statement on two
	// server connections (lib/pq without binary_parameters=yes, pgx in its
	// default cache_statement mode); the message names the setting.
	ErrPoolerUnsafe = store.ErrPoolerUnsafe
)

func init() {
	link.Outbox = func(x any) link.Internals {
		o := x.(*Outbox)
		return link.Internals{Store: o.st, Clock: o.clock, Logger: o.log, Wake: func() { o.wake(context.Background()) },
			Listen: o.listenFunc(), Broker: o.cfg.Broker, Seal: o.seal,
			Open: func(ctx context.Context, col, id string, stored []byte) ([]byte, error) {
				plain, _, err := o.open(ctx, col, id, stored)
				return plain, err
			}}
	}
	link.NewQueueRelay = func(o any, cfg any, src queue.Source, owner string) (any, error) {
		return o.(*Outbox).newQueueRelay(cfg.(RelayConfig), src, owner)
	}
	link.Enqueue = func(ctx context.Context, o any, c store.Conn, ev any) (any, error) {
		return o.(*Outbox).enqueue(ctx, c, ev.(Event))
	}
	link.EnqueueMany = func(ctx context.Context, o any, c store.Conn, evs any) (any, error) {
		return o.(*Outbox).enqueueManyOn(ctx, c, evs.([]Event))
	}
}

// SQLiteDSN returns the connection string txhook recommends for a SQLite
// database file: WAL journaling so readers never block the writer, a busy
// timeout so writers queue instead of failing, IMMEDIATE transactions so a
// transaction that reads before it writes never fails upgrading its lock,
// and foreign keys on. Both mattn/go-sqlite3 (driver "sqlite3", cgo) and
// modernc.org/sqlite (driver "sqlite", pure Go, v1.62 or newer) read it.
// Every connection sets WAL, and switching a new file to WAL is the one
// step the busy timeout does not cover: New waits for it (see New).
func SQLiteDSN(path string) string {
	return "file:" + path + "?_journal_mode=WAL&_busy_timeout=10000&_txlock=immediate&_foreign_keys=on"
}
