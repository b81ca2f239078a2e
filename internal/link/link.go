// Package link lets packages of this module reach an Outbox's internals
// without widening outbox's public API. outbox sets Outbox at init.
package link

import (
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
