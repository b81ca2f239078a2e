package broker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txhook/txhook/internal/link"
	"github.com/txhook/txhook/internal/queue"
)

// source hands a worker (a relay of package outbox) the deliveries of the
// stream's consumer, and settles them: see internal/queue.
type source struct {
	cfg    Config
	in     link.Internals
	log    *slog.Logger
	prefix string
	keys   *keyring

	seal     sealer
	cons     jetstream.Consumer
	rejected atomic.Uint64

	// batch is the pull request under way, which Receive takes messages
	// from as they arrive; a new one is made, sized to what the relay can
	// take then, once it ends. asked is when it was sent: JetStream's
	// lease on each message it brings (AckWait) starts later.
	mu    sync.Mutex
	batch jetstream.MessageBatch
	asked time.Time
}

// fetchWait bounds one pull request: its messages are taken as they
// arrive, so it delays nothing, and it ends at the latest after this.
const fetchWait = time.Second

// settleTimeout bounds one settlement round (publishes and acks).
const settleTimeout = 10 * time.Second

func (s *source) Lease() time.Duration { return s.cfg.Relay.Lease }

func (s *source) Open(ctx context.Context) error {
	key, err := s.keys.key(ctx)
	if err != nil {
		return err
	}
	s.seal = sealer{key: key}
	cons, err := setup(ctx, s.cfg)
	if err != nil {
		return err
	}
	s.cons = cons
	return nil
}

func (s *source) Receive(ctx context.Context, max int) ([]*queue.Delivery, error) {
	s.mu.Lock()
	batch, asked := s.batch, s.asked
	s.mu.Unlock()
	if batch == nil {
		asked = time.Now()
		b, err := s.cons.Fetch(max, jetstream.FetchMaxWait(fetchWait))
		if err != nil {
			return nil, classify(err)
		}
		s.mu.Lock()
		s.batch, s.asked, batch = b, asked, b
		s.mu.Unlock()
	}
	var out []*queue.Delivery
	msgs := batch.Messages()
	// The first message: wait for it (or for the request to end).
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case m, ok := <-msgs:
		if !ok {
			s.endBatch(batch)
			return nil, classify(batch.Error())
		}
		out = s.take(ctx, out, m, asked)
	}
	// Then whatever has arrived too.
	for len(out) < max {
		select {
		case m, ok := <-msgs:
			if !ok {
				s.endBatch(batch)
				return out, nil
			}
			out = s.take(ctx, out, m, asked)
		default:
			return out, nil
		}
	}
	return out, nil
}

// endBatch forgets the pull request b once it has ended.
func (s *source) endBatch(b jetstream.MessageBatch) {
	s.mu.Lock()
	if s.batch == b {
		s.batch = nil
	}
	s.mu.Unlock()
}

// take checks and decodes m and appends it to out; a message that is not
// a forwarder's is set aside on the rejected subject, never delivered.
func (s *source) take(ctx context.Context, out []*queue.Delivery, m jetstream.Msg, asked time.Time) []*queue.Delivery {
	d, err := s.seal.decode(s.prefix, m.Subject(), m.Data(), m.Headers().Get(headerMAC))
	if err != nil {
		s.reject(ctx, m, err)
		return out
	}
	d.Received = asked
	d.Handle = m
	s.log.Debug("txhook: received", "subject", m.Subject())
	d.Deliveries = 1
	if md, err := m.Metadata(); err == nil && md.NumDelivered > 1 {
		d.Deliveries = int(min(md.NumDelivered, 1000))
	}
	return append(out, d)
}

// reject moves m to the rejected subject with the reason, and ends it.
func (s *source) reject(ctx context.Context, m jetstream.Msg, cause error) {
	s.rejected.Add(1)
	s.log.Warn("txhook: a message on the broker's delivery subjects was not published by a forwarder; set aside, not delivered",
		"subject", m.Subject(), "reason", cause)
	pctx, cancel := boundedContext(ctx, settleTimeout)
	defer cancel()
	r := nats.NewMsg(rejectSubject(s.prefix))
	for k, v := range m.Headers() {
		if k != headerMsgID {
			r.Header[k] = v
		}
	}
	r.Header.Set(headerReason, cause.Error())
	r.Header.Set("Txhook-Subject", m.Subject())
	r.Data = m.Data()
	if _, err := s.cfg.JetStream.PublishMsg(pctx, r); err != nil {
		s.log.Warn("txhook: keeping a rejected message failed; it is dropped", "subject", m.Subject(), "error", err)
	}
	if err := m.Term(); err != nil {
		s.log.Warn("txhook: ending a rejected message failed; it will be seen again", "subject", m.Subject(), "error", err)
	}
}

// Settle publishes what must come again (a retry, a delivery that waits,
// one given back), then acknowledges every message whose successor is
// stored (or that has none). A message not acknowledged is handed out
// again after its lease; its next holder finds its outcome recorded.
func (s *source) Settle(ctx context.Context, ss []queue.Settlement) {
	if len(ss) == 0 {
		return
	}
	sctx, cancel := boundedContext(ctx, settleTimeout)
	defer cancel()
	type pending struct {
		m   jetstream.Msg
		ack jetstream.PubAckFuture
	}
	var waits []pending
	var acks []jetstream.Msg
	now := time.Now()
	for _, st := range ss {
		m, _ := st.D.Handle.(jetstream.Msg)
		if st.Action == queue.Ack {
			if m != nil {
				acks = append(acks, m)
			}
			continue
		}
		next := *st.D
		next.Base, next.Attempt, next.Row, next.RefusedSince = st.Base, st.Attempt, st.Row, st.RefusedSince
		next.Lapsed = next.Lapsed && st.Action != queue.Retry && next.Base == st.D.Base
		id := msgID(next.Key, next.Attempt)
		if st.Action != queue.Retry {
			// The same attempt again: a new message, named after the one it
			// replaces, so that a crash before the acknowledgement does not
			// queue it twice.
			id += "/" + replacedSeq(m)
		}
		at := st.At
		if st.Action == queue.Release {
			at = time.Time{}
		}
		msg, err := s.message(&next, id, at, now)
		if err != nil {
			s.log.Error("txhook: encoding a delivery for the broker failed", "event", next.Event.ID, "error", err)
			continue
		}
		f, err := s.cfg.JetStream.PublishMsgAsync(msg)
		if err != nil {
			s.log.Warn("txhook: queueing a delivery's next attempt failed; the broker will hand it out again", "event", next.Event.ID, "error", err)
			continue
		}
		s.log.Debug("txhook: queued", "subject", msg.Subject, "id", id, "at", at)
		waits = append(waits, pending{m: m, ack: f})
	}
	for _, w := range waits {
		select {
		case <-w.ack.Ok():
			if w.m != nil {
				acks = append(acks, w.m)
			}
		case err := <-w.ack.Err():
			s.log.Warn("txhook: queueing a delivery's next attempt failed; the broker will hand it out again", "error", classify(err))
		case <-sctx.Done():
			s.log.Warn("txhook: queueing a delivery's next attempt timed out; the broker will hand it out again", "error", sctx.Err())
		}
	}
	for _, m := range acks {
		if err := m.Ack(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			s.log.Warn("txhook: acknowledging a delivery failed; the broker will hand it out again, and its outcome is recorded", "error", err)
		}
	}
}

// message builds the message of d's attempt: onto its queue subject now,
// or scheduled onto it at `at`.
func (s *source) message(d *queue.Delivery, id string, at, now time.Time) (*nats.Msg, error) {
	data, mac, err := s.seal.encode(d)
	if err != nil {
		return nil, err
	}
	return newMessage(s.prefix, d.Key, id, data, mac, at, now), nil
}

// newMessage is a delivery's message: onto its queue subject, or, when at
// is more than a moment away, a schedule that JetStream fires onto it then.
func newMessage(prefix, key, id string, data []byte, mac string, at, now time.Time) *nats.Msg {
	m := nats.NewMsg(queueSubject(prefix, key))
	if at.Sub(now) > scheduleFloor {
		m.Subject = scheduleSubject(prefix, key)
		m.Header.Set(headerSchedule, "@at "+at.UTC().Format(time.RFC3339Nano))
		m.Header.Set(headerScheduleTarget, queueSubject(prefix, key))
	}
	m.Header.Set(headerMsgID, id)
	m.Header.Set(headerMAC, mac)
	m.Data = data
	return m
}

// scheduleFloor: a delivery due sooner than this is queued at once
// (JetStream fires schedules no sooner than a quarter second anyway).
const scheduleFloor = 250 * time.Millisecond

// replacedSeq names the stream message m is, for the ID of the message
// that replaces it.
func replacedSeq(m jetstream.Msg) string {
	if m != nil {
		if md, err := m.Metadata(); err == nil {
			return "s" + formatUint(md.Sequence.Stream)
		}
	}
	return "n" + formatUint(uint64(time.Now().UnixNano()))
}

// Close gives back what the last pull request brought and the relay never
// took: republished for any worker, not left to time out.
func (s *source) Close() {
	s.mu.Lock()
	batch := s.batch
	s.batch = nil
	s.mu.Unlock()
	if batch == nil {
		return
	}
	var ss []queue.Settlement
	ctx := context.Background()
	for m := range batch.Messages() {
		d, err := s.seal.decode(s.prefix, m.Subject(), m.Data(), m.Headers().Get(headerMAC))
		if err != nil {
			s.reject(ctx, m, err)
			continue
		}
		d.Handle = m
		n := 1
		if md, err := m.Metadata(); err == nil {
			n = int(min(md.NumDelivered, 1000))
		}
		ss = append(ss, queue.Settlement{D: d, Action: queue.Release, Base: d.Base, Attempt: d.Attempt + n - 1, Row: d.Row, RefusedSince: d.RefusedSince})
	}
	s.Settle(ctx, ss)
}
