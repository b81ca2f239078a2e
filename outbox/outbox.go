package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/txhook/txhook/internal/clock"
	"github.com/txhook/txhook/internal/link"
	"github.com/txhook/txhook/internal/safehttp"
	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/signer"
)

// Clock tells the time and makes timers. Tests substitute a fake one; nil
// means the wall clock.
type Clock = clock.Clock

// Timer is a one-shot timer made by a Clock.
type Timer = clock.Timer

// Default limits.
const (
	DefaultMaxPayloadBytes = 256 << 10
	DefaultNotifyInterval  = 5 * time.Millisecond
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
	AllowHTTP bool

	// AllowPrivateTargets allows endpoint URLs that resolve to loopback,
	// private, link-local and other non-public addresses, at registration
	// and when connecting. Only for local development and tests: it lets
	// whoever registers an endpoint make the relay call into your network.
	AllowPrivateTargets bool

	// AllowedTargets are networks reachable even though they are private,
	// such as a partner's VPN range: narrower than AllowPrivateTargets.
	AllowedTargets []netip.Prefix

	// NotifyInterval is, on PostgreSQL, the least time between two wake-up
	// notifications this Outbox adds to enqueuing transactions. NOTIFY
	// serialises the commits of the transactions that send one, so sending
	// one per Enqueue would halve the enqueue rate under load; a relay that
	// was just woken keeps polling briefly and picks up the events committed
	// in between. Default 5 ms; negative turns NOTIFY off (polling only).
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

	lastNotify atomic.Int64 // unix nanoseconds of the last queued NOTIFY
}

// New returns an Outbox on db. It prepares the Enqueue statement, so the
// schema must exist (see Migrate) unless the statement cannot be prepared
// yet, in which case Enqueue prepares nothing and costs one more round trip
// with lib/pq.
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
	if cfg.MaxPayloadBytes <= 0 {
		cfg.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if cfg.NotifyInterval == 0 {
		cfg.NotifyInterval = DefaultNotifyInterval
	}
	o := &Outbox{
		db:    db,
		st:    store.New(db, d),
		cfg:   cfg,
		clock: clock.OrReal(cfg.Clock),
		log:   cfg.Logger,
		target: safehttp.Config{
			AllowHTTP:     cfg.AllowHTTP,
			AllowPrivate:  cfg.AllowPrivateTargets,
			AllowPrefixes: cfg.AllowedTargets,
		},
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	o.prepare(ctx)
	return o, nil
}

// prepare readies the hot statements; before Migrate has run they cannot
// be prepared, and Migrate calls it again.
func (o *Outbox) prepare(ctx context.Context) {
	_ = o.st.Prepare(ctx, o.st.EnqueueQueries()...)
}

// DB returns the database the Outbox was made with.
func (o *Outbox) DB() *sql.DB { return o.db }

// Dialect returns "postgres" or "sqlite".
func (o *Outbox) Dialect() string { return o.st.Dialect.String() }

// Migrate creates or upgrades txhook's tables. It is idempotent and safe to
// run from several processes at once. The same schema is available as plain
// SQL files under internal/store/migrations for teams that apply migrations
// with their own tool.
func (o *Outbox) Migrate(ctx context.Context) error {
	if _, err := o.st.Migrate(ctx); err != nil {
		return err
	}
	o.prepare(ctx)
	return nil
}

// Close releases the Outbox's prepared statements. It does not close the
// database.
func (o *Outbox) Close() error { return o.st.Close() }

// Errors. Each is returned wrapped with detail; test with errors.Is.
var (
	// ErrInvalidEvent: the event is missing a tenant or type, or has a
	// malformed ID, type or idempotency key.
	ErrInvalidEvent = errors.New("txhook: invalid event")
	// ErrInvalidPayload: the payload is not valid JSON, or is JSON that a
	// database or receiver would refuse (see Event.Payload).
	ErrInvalidPayload = errors.New("txhook: payload is not valid JSON")
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
	// ErrInvalidSecret: a supplied signing secret is not usable.
	ErrInvalidSecret = signer.ErrInvalidSecret
)

func init() {
	link.Outbox = func(x any) link.Internals {
		o := x.(*Outbox)
		return link.Internals{Store: o.st, Clock: o.clock, Logger: o.log, Wake: func() { o.wake(context.Background()) }}
	}
	link.Enqueue = func(ctx context.Context, o any, c store.Conn, ev any) (any, error) {
		return o.(*Outbox).enqueue(ctx, c, ev.(Event))
	}
}

// SQLiteDSN returns the connection string txhook recommends for a SQLite
// database file: WAL journaling so readers never block the writer, a busy
// timeout so writers queue instead of failing, IMMEDIATE transactions so a
// transaction that reads before it writes never fails upgrading its lock,
// and foreign keys on. Both mattn/go-sqlite3 (driver "sqlite3", cgo) and
// modernc.org/sqlite (driver "sqlite", pure Go, v1.62 or newer) read it.
func SQLiteDSN(path string) string {
	return "file:" + path + "?_journal_mode=WAL&_busy_timeout=10000&_txlock=immediate&_foreign_keys=on"
}
