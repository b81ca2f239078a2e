// Package broker is txhook's broker mode: events enqueued in the host's
// transaction are delivered through NATS JetStream instead of delivery
// rows claimed from the database, so that delivery work leaves the payment
// database and scales out across machines.
//
// # The model
//
// The host keeps calling Enqueue (or EnqueueMany) in its own transaction,
// on an Outbox in broker mode (outbox.Config{Broker: true}): the same one
// row, atomic with the payment.
//
// A Forwarder publishes committed events to a JetStream stream: one
// message per delivery, for each enabled endpoint of the event's tenant
// that subscribes to the event's type at that moment (fan-out happens
// here, so that every delivery is retried, delayed and handed out on its
// own), with the delivery's ID as the message ID, so JetStream drops a
// message published twice within its duplicate window. It waits for every
// acknowledgement before it moves on. On PostgreSQL it finds new events by
// a cursor over the writing transactions' IDs and writes nothing per
// event; on SQLite it claims them under a lease and marks them forwarded.
// Any number of forwarders may run: one holds the cursor, the others stand
// by (and share the leftovers and due rows under leases of their own).
//
// Workers (NewWorker, an *outbox.Relay) consume the stream's durable pull
// consumer in any number of processes and deliver exactly as table-mode
// relays do: signatures, target rules (SSRF), egress proxy, client
// certificates, endpoint headers, rate and in-flight limits, circuit
// breakers, pinned versions and converters, tracing, the retry policy with
// its jitter and Retry-After. A retry is a message scheduled for its time
// (JetStream message schedules), not a sleeping worker; a delivery that
// must wait for its endpoint's limits or open circuit goes back to the
// stream the same way, so a worker holds only what it can start within a
// second and the consumer's unacknowledged messages stay bounded: a slow,
// throttled, failing or hostile endpoint delays only itself.
//
// Every attempt is recorded, in batches, in the delivery tables the
// operations UI, the merchant portal, health, Recover and the
// reconciliation export read: a delivery's row is written with its first
// outcome and updated with each later one, fenced by the number of
// attempts it had when its message was sent, so a message handed out
// twice never records twice. Exhausted deliveries go to the same
// dead-letter table; a replay, a resend, a recovery or a test event makes
// a delivery row due, and a forwarder hands it to the stream.
//
// The history can live in a database of its own (Config.History): the
// payment database then keeps only the events, and forwarding costs it a
// read per round (see docs/BENCHMARKS.md).
//
// # Guarantees and limits
//
// At least once, as in table mode. A message is acknowledged only once its
// outcome is recorded (and its retry queued); a worker that dies holds its
// messages until the consumer's AckWait (Config.Relay.Lease) passes, after
// which another worker records the unfinished attempt as lapsed and makes
// the next one. A request never starts with less than the lease's safety
// margin and Timeout left. JetStream's duplicate window forgets messages
// already delivered when a server restarts (it is rebuilt from what the
// stream holds), so a forwarder taking over may store a copy of a
// delivery again; a worker checks every delivery against its row and
// sends nothing for one recorded, but a copy received while the first is
// still in flight is sent. Receivers deduplicate by webhook-id.
//
// Broker mode does not order deliveries per key: Enqueue refuses an
// OrderingKey with outbox.ErrOrderingBroker, and a forwarder does not start
// while ordered events wait to be dispatched.
//
// Messages are authenticated with a key the forwarders and workers share
// through the history database (encrypted at rest with the Outbox's
// SecretCipher): a message on the stream's subjects that no forwarder
// published is never delivered; it is set aside on the subject
// <Subjects>.rejected with the reason.
//
// # Failures
//
// JetStream unreachable at Start: ErrUnavailable, and Enqueue keeps
// working (events wait in the outbox table). JetStream down mid-run:
// forwarding pauses and resumes (Forwarder.Err says why meanwhile);
// workers wait. The stream set up otherwise than Setup requires:
// ErrStreamConfig, naming the setting and the fix. The stream deleted by
// hand: ErrStreamMissing; events wait in the outbox until Setup creates it
// again, and what the stream held is sent again by Outbox.Recover.
package broker
