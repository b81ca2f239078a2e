package broker

import (
	"context"
	"strconv"

	"github.com/txhook/txhook/internal/link"
	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/outbox"
)

// NewWorker returns a delivery worker: an *outbox.Relay that takes its
// deliveries from the stream's consumer instead of the database. It
// delivers as a relay of table mode does (Config.Relay: signatures,
// target rules, proxy, client certificates, endpoint headers, limits and
// breakers, pinned versions and converters, tracing, the retry policy),
// records every attempt in the history database (Config.History, or ob)
// in batches, and leaves each retry to JetStream as a message scheduled
// for its time. Run any number, in any number of processes: they share
// the consumer. Start checks the stream (see Setup) and fails with an
// error matching ErrUnavailable or ErrStreamConfig; Stop gives back what
// the worker holds. Stats counts received deliveries as Claimed.
func NewWorker(ob *outbox.Outbox, cfg Config) (*outbox.Relay, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	hist := ob
	if cfg.History != nil {
		hist = cfg.History
	}
	in := link.Outbox(hist)
	if !in.Broker {
		return nil, ErrNotBrokerMode
	}
	log := cfg.Logger
	if log == nil {
		log = in.Logger
	}
	src := &source{cfg: cfg, in: in, log: log.With("component", "txhook.broker.worker"), prefix: cfg.Subjects,
		keys: &keyring{in: in, name: cfg.Stream}}
	r, err := link.NewQueueRelay(hist, cfg.Relay, src, store.BrokerOwner(cfg.Stream))
	if err != nil {
		return nil, err
	}
	return r.(*outbox.Relay), nil
}

// keyring reads the stream's message key from a database (see
// store.BrokerKey), encrypted at rest with the Outbox's SecretCipher.
type keyring struct {
	in   link.Internals
	name string
}

const keyColumn = "broker_key"

func (k *keyring) key(ctx context.Context) ([]byte, error) {
	seal := func(plain string) (string, error) {
		b, err := k.in.Seal(ctx, keyColumn, k.name, []byte(plain))
		return string(b), err
	}
	open := func(stored string) (string, error) {
		b, err := k.in.Open(ctx, keyColumn, k.name, []byte(stored))
		return string(b), err
	}
	return k.in.Store.BrokerKey(ctx, k.name, k.in.Clock.Now(), seal, open)
}

func formatUint(v uint64) string { return strconv.FormatUint(v, 10) }
