package broker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// consumerName is the durable pull consumer every worker of a stream
// shares.
const consumerName = "txhook-workers"

// Setup creates the stream and its consumer as cfg describes them when
// they are missing, and checks them when they exist: it returns an error
// matching ErrStreamConfig, which names the setting and the fix, for one
// that would lose, hold back or misroute deliveries (a retention other
// than work queue, limits that drop messages, message schedules off,
// another subject space), and one matching ErrUnavailable when JetStream
// does not answer. Forwarders and workers call it at Start; call it
// yourself to create the stream ahead, or to recreate it after it was
// deleted (ErrStreamMissing).
func Setup(ctx context.Context, cfg Config) error {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	_, err := setup(ctx, cfg)
	return err
}

func streamConfig(cfg Config) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        cfg.Stream,
		Description: "txhook webhook deliveries (package outbox/broker)",
		Subjects:    []string{cfg.Subjects + ".>"},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Discard:     jetstream.DiscardOld,
		MaxMsgs:     -1,
		MaxBytes:    -1,
		Duplicates:  cfg.Duplicates,
		// Retries and waits are scheduled messages; the forwarder's rescue
		// looks a delivery's subject up directly.
		AllowMsgSchedules: true,
		AllowRollup:       true,
		AllowDirect:       true,
	}
}

func consumerConfig(cfg Config) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       consumerName,
		Description:   "txhook broker workers",
		FilterSubject: cfg.Subjects + ".q.>",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.Relay.Lease,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		// Every redelivery counts: a worker that dies mid-attempt spends
		// the attempt, and the retry policy ends it, as in table mode.
		MaxDeliver: -1,
		// Workers fetch no more than they can start soon; this only bounds
		// a fleet that asks for more.
		MaxAckPending: 100000,
	}
}

// setup creates or checks the stream and the consumer.
func setup(ctx context.Context, cfg Config) (jetstream.Consumer, error) {
	js := cfg.JetStream
	want := streamConfig(cfg)
	st, err := js.Stream(ctx, cfg.Stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		if st, err = js.CreateStream(ctx, want); err != nil {
			return nil, classify(fmt.Errorf("creating stream %s: %w", cfg.Stream, err))
		}
	case err != nil:
		return nil, classify(fmt.Errorf("looking up stream %s: %w", cfg.Stream, err))
	default:
		if err := checkStream(st.CachedInfo().Config, want); err != nil {
			return nil, err
		}
	}
	cons, err := st.Consumer(ctx, consumerName)
	wantC := consumerConfig(cfg)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		cons, err = st.CreateOrUpdateConsumer(ctx, wantC)
		if err != nil {
			return nil, classify(fmt.Errorf("creating consumer %s: %w", consumerName, err))
		}
	case err != nil:
		return nil, classify(fmt.Errorf("looking up consumer %s: %w", consumerName, err))
	default:
		got := cons.CachedInfo().Config
		if err := checkConsumer(got, wantC); err != nil {
			return nil, err
		}
		if got.AckWait != wantC.AckWait {
			// Workers of a new configuration: the lease follows them.
			got.AckWait = wantC.AckWait
			if cons, err = st.UpdateConsumer(ctx, got); err != nil {
				return nil, classify(fmt.Errorf("updating consumer %s: %w", consumerName, err))
			}
		}
	}
	return cons, nil
}

// checkStream returns an ErrStreamConfig error for the first setting of
// got that would lose or misroute deliveries.
func checkStream(got, want jetstream.StreamConfig) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: stream %s: %s", ErrStreamConfig, got.Name, fmt.Sprintf(format, args...))
	}
	hasSubjects := false
	for _, s := range got.Subjects {
		if s == want.Subjects[0] {
			hasSubjects = true
		}
	}
	switch {
	case !hasSubjects:
		return bad("subjects %v do not include %s; add it (nats stream edit %s --subjects ...) or set Config.Subjects to the stream's", got.Subjects, want.Subjects[0], got.Name)
	case got.Retention != jetstream.WorkQueuePolicy:
		return bad("retention %s, not workqueue: acknowledged deliveries would stay and be counted again; create the stream anew with work-queue retention (delete it and call Setup)", got.Retention)
	case got.MaxAge > 0:
		return bad("max age %s would drop deliveries waiting for a retry; set it to 0 (nats stream edit %s --max-age 0)", got.MaxAge, got.Name)
	case got.MaxMsgs > 0 || got.MaxBytes > 0 || got.MaxMsgsPerSubject > 0:
		return bad("message limits (max msgs %d, max bytes %d, per subject %d) would drop deliveries; set them to -1", got.MaxMsgs, got.MaxBytes, got.MaxMsgsPerSubject)
	case got.Discard == jetstream.DiscardNew:
		return bad("discard policy new: message schedules need discard old")
	case !got.AllowMsgSchedules:
		return bad("message schedules are off: retries are scheduled messages; turn them on (allow_msg_schedules, nats-server 2.12 or later)")
	case !got.AllowDirect:
		return bad("direct get is off: forwarders look deliveries up by subject; turn it on (allow_direct)")
	case got.Duplicates < want.Duplicates/2:
		return bad("duplicate window %s shorter than half of Config.Duplicates %s: a forwarder taking over would send events twice", got.Duplicates, want.Duplicates)
	case got.Replicas < want.Replicas:
		return bad("%d replicas, Config.Replicas asks for %d", got.Replicas, want.Replicas)
	}
	return nil
}

func checkConsumer(got, want jetstream.ConsumerConfig) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: consumer %s: %s; delete it and call Setup", ErrStreamConfig, got.Durable, fmt.Sprintf(format, args...))
	}
	switch {
	case got.FilterSubject != want.FilterSubject:
		return bad("filter %q, want %q", got.FilterSubject, want.FilterSubject)
	case got.AckPolicy != jetstream.AckExplicitPolicy:
		return bad("ack policy %s, want explicit", got.AckPolicy)
	case got.MaxDeliver > 0:
		return bad("max deliver %d would leave a delivery unacknowledged forever", got.MaxDeliver)
	case got.DeliverSubject != "":
		return bad("a push consumer; workers pull")
	}
	return nil
}

// classify wraps err with ErrUnavailable when it says JetStream could not
// be reached, ErrStreamMissing when the stream or consumer is gone.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var ne net.Error
	var api *jetstream.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode {
		case jsClusterNoPeers, jsClusterNotAvailable, jsClusterNotLeader, jsInsufficientResources, jsStreamOffline:
			// A cluster that lost a node, is electing a leader or is
			// full: it may answer later.
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	}
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrConsumerNotFound),
		errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerDoesNotExist):
		return fmt.Errorf("%w: %w", ErrStreamMissing, err)
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrConnectionDraining), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrNoServers), errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount), errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.As(err, &ne):
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// JetStream API error codes of a cluster that cannot serve a request now
// (nats-server's JSClusterNoPeersErrF, JSClusterNotAvailErr,
// JSClusterNotLeaderErr, JSInsufficientResourcesErr, JSStreamOfflineErr).
const (
	jsClusterNoPeers        jetstream.ErrorCode = 10005
	jsClusterNotAvailable   jetstream.ErrorCode = 10008
	jsClusterNotLeader      jetstream.ErrorCode = 10009
	jsInsufficientResources jetstream.ErrorCode = 10023
	jsStreamOffline         jetstream.ErrorCode = 10118
)

// boundedContext is ctx without its cancellation, bounded by d: for a
// settlement that must go out even while the relay stops.
func boundedContext(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}
