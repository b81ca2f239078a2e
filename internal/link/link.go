// Package link lets packages of this module reach an Outbox's internals
// without widening outbox's public API. outbox sets Outbox at init.
package link

import (
	"context"
	"log/slog"

	"github.com/txhook/txhook/internal/clock"
	"github.com/txhook/txhook/internal/queue"
	"github.com/txhook/txhook/internal/store"
)

// Internals are the parts of an Outbox other txhook packages share.
type Internals struct {
	Store  *store.Store
	Clock  clock.Clock
	Logger *slog.Logger
	// Wake tells relays that deliveries became due outside Enqueue.
	Wake func()
	// Listen calls wake whenever an enqueuing transaction commits (and once
	// listening), until ctx ends or the connection fails: the Outbox's
	// Config.Listener on PostgreSQL (nil without one, or with NOTIFY off),
	// its in-process wake-ups on SQLite.
	Listen func(ctx context.Context, wake func()) error
	// Broker is Config.Broker.
	Broker bool
	// Seal returns the stored form of plain, a secret of txhook's own
	// named by col and id: encrypted with Config.SecretCipher when there
	// is one. Open returns the plaintext of a stored form.
	Seal func(ctx context.Context, col, id string, plain []byte) ([]byte, error)
	Open func(ctx context.Context, col, id string, stored []byte) ([]byte, error)
}

// NewQueueRelay makes a relay of the *outbox.Outbox o that takes its
// deliveries from src and records them as owner (store.BrokerOwner): cfg
// is an outbox.RelayConfig, the result an *outbox.Relay. Set by package
// outbox.
var NewQueueRelay func(o any, cfg any, src queue.Source, owner string) (any, error)

// Outbox returns the internals of an *outbox.Outbox; set by package outbox.
var Outbox func(o any) Internals

// Enqueue runs (*outbox.Outbox).EnqueueDetail's logic on c, for drivers
// whose transactions are not database/sql's (outbox/pgxoutbox): o is an
// *outbox.Outbox, ev an outbox.Event, the result an outbox.Enqueued. Set by
// package outbox.
var Enqueue func(ctx context.Context, o any, c store.Conn, ev any) (any, error)

// EnqueueMany is Enqueue for (*outbox.Outbox).EnqueueMany: evs is an
// []outbox.Event, the result an []outbox.Enqueued. Set by package outbox.
var EnqueueMany func(ctx context.Context, o any, c store.Conn, evs any) (any, error)
