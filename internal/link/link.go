// Package link lets packages of this module reach an Outbox's internals
// without widening outbox's public API. outbox sets Outbox at init.
package link

import (
	"context"
	"log/slog"

	"github.com/txhook/txhook/internal/clock"
	"github.com/txhook/txhook/internal/store"
)

// Internals are the parts of an Outbox other txhook packages share.
type Internals struct {
	Store  *store.Store
	Clock  clock.Clock
	Logger *slog.Logger
	// Wake tells relays that deliveries became due outside Enqueue.
	Wake func()
}

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
