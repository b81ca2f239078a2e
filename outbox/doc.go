// Package outbox is the sending side of txhook: it writes webhook events
// inside the caller's own database transaction (the transactional outbox
// pattern), manages the endpoints that receive them, and runs the relay that
// delivers them.
//
// # The model
//
// Enqueue writes the event through the caller's *sql.Tx or *sqlx.Tx, so the
// webhook commits or rolls back with the business change that caused it:
// there is no window in which a payment exists without its event, or an
// event without its payment. It writes that one row and nothing else, so it
// costs the transaction about what a plain INSERT would.
//
// A Relay dispatches committed events: in one statement it claims a batch
// of them under a lease and finds, for each, the enabled endpoints of its
// tenant that subscribe to its type, one delivery each. On PostgreSQL the
// lease is on the event and each delivery row is written once, with its
// first attempt's outcome (on SQLite the rows are created at dispatch,
// claimed for the first attempt). It also claims due retries, in batches
// under a lease. It signs each request
// (Standard Webhooks by default, see package signer), POSTs it through an
// HTTP client that refuses private and metadata addresses at connect time,
// and records every attempt. A failed attempt is retried on the schedule of
// package retry; after the last one the delivery moves to the dead-letter
// table (package dlq) in the same transaction that records that attempt;
// so does one whose endpoint URL the target rules refused, unsent, for
// RelayConfig.RefusedLimit while no relay sent to the endpoint.
// A relay that dies leaves its deliveries to others when their leases
// expire: every event ends up delivered or dead-lettered, never silently
// dropped. Delivery is at least once; receivers deduplicate on the event ID,
// which stays the same across attempts and replays (package verify does it
// for Go receivers).
//
// # Isolation between tenants
//
// Each relay hands the deliveries it claims to a scheduler (in
// internal/sched, a pure unit tested with a fake clock) that starts them
// round-robin over tenants and, within a tenant, over its endpoints, and
// enforces every endpoint's rate limit, in-flight cap and circuit breaker.
// Endpoints that are slow or not yet known share at most half the relay's
// slots, and a tenant takes more than half only when no other tenant could
// start anything, so a merchant whose receivers hang, throttle or fail
// costs the others at most one request slot. A delivery that cannot start
// within a second goes back to the database, spending no attempt, due when
// it can next run: waiting never takes the relay's claim capacity.
//
// Nothing a receiver sends back can stop the pipeline either: response
// text is stored cleaned and bounded, and an outcome the database refuses
// is written without the receiver's text, never holding back the others.
// Leases are timed by the database's clock, so a relay host whose clock is
// wrong cannot send a delivery another relay still has in flight.
//
// # Databases
//
// SQLite is the embedded default, for single-process applications, through
// mattn/go-sqlite3 (cgo) or modernc.org/sqlite (pure Go): open it with
// SQLiteDSN. PostgreSQL, through lib/pq or pgx, is the production path: any
// number of relays on any number of hosts share one outbox, claiming with
// FOR UPDATE SKIP LOCKED. Enqueue wakes them with a NOTIFY sent at commit,
// which a relay hears through Config.Listener: pgxoutbox.Listener for pgx,
// pqlisten.New for lib/pq. Polling every RelayConfig.PollInterval remains
// as the fallback. Teams on pgxpool enqueue in a pgx.Tx with
// pgxoutbox.Enqueue and run relays on the pool with pgxoutbox.New. This
// package imports no database driver.
//
// Migrate creates the tables; teams with goose or golang-migrate apply the
// same files from package outbox/migrations and call CheckSchema instead.
// Before that, Enqueue, CreateEndpoint and Relay.Start fail with
// ErrNotMigrated. On PostgreSQL, Config.Schema puts the tables in a schema
// of their own, named in every statement rather than set in a search_path.
//
// Behind PgBouncer in transaction mode, set Config.TransactionPooling (no
// prepared statements; New checks that the driver sends each statement in
// one piece: binary_parameters=yes for lib/pq,
// default_query_exec_mode=cache_describe for pgx) and give relays a
// Listener on a direct connection (pqlisten.New or
// pgxoutbox.DirectListener with a DSN that bypasses PgBouncer). txhook keeps
// no other session state: its advisory locks are transaction locks.
//
// # Secrets at rest
//
// With Config.SecretCipher set (AESGCM, or a host's KMS behind Cipher),
// endpoint signing secrets, client certificate keys and custom headers
// are stored encrypted, each ciphertext bound to its endpoint and column,
// and decrypted only in memory; relays decrypt each endpoint's once.
// Relay.Start fails with ErrSecretKey when a stored row needs a key the
// Cipher lacks. Rows stored in plaintext before keep working; RotateSecret
// (secrets), UpdateEndpoint (new headers or client certificate) and
// ReencryptSecrets (all three) encrypt them, and ReencryptSecrets also moves rows to a new key
// after a key rotation.
//
// # Use
//
//	ob, err := outbox.New(ctx, db, outbox.Config{})
//	err = ob.Migrate(ctx)
//	ep, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{
//		Tenant: "merchant_42", URL: "https://merchant.example/webhooks",
//		EventTypes: []string{"payment.*"},
//	})
//	// show ep.Secrets[0].Value to the merchant once
//
//	relay, err := ob.NewRelay(outbox.RelayConfig{})
//	err = relay.Start(ctx)
//	defer relay.Stop(shutdownCtx)
//
//	// in the business transaction:
//	tx, err := db.BeginTx(ctx, nil)
//	_, err = tx.ExecContext(ctx, "UPDATE payments SET status = 'succeeded' WHERE id = $1", id)
//	eventID, err := ob.Enqueue(ctx, tx, outbox.Event{
//		Tenant: "merchant_42", Type: "payment.succeeded",
//		IdempotencyKey: id + ":succeeded",
//		Payload:        payloadJSON,
//	})
//	err = tx.Commit()
//
// # Tracing
//
// With Config.TracerProvider set (OpenTelemetry), Enqueue runs in a span
// named txhook.enqueue (kind producer), a child of the span in its
// context, and stores that span's W3C trace context (traceparent and
// tracestate) with the event. EnqueueMany runs in one span,
// txhook.enqueue_many (attribute txhook.batch.size), whose context every
// event of the batch stores. Every attempt a relay makes at a receiver is
// a span named txhook.attempt (kind client), a child of the Enqueue span
// whichever process makes it and however much later, so the payment's
// trace shows each attempt, retries and replays included; the request
// carries the attempt span's traceparent and tracestate headers, so the
// merchant's receiver continues the same trace. A child rather than a
// link: a link would start a new trace per attempt, and the receiver would
// not see the payment's trace ID. Attributes: txhook.tenant,
// txhook.event.id and txhook.event.type on both; txhook.event.duplicate on
// the Enqueue span; txhook.endpoint.id, txhook.delivery.id,
// txhook.attempt (1 for the first), http.response.status_code (when there
// was a response) and txhook.attempt.outcome (succeeded, retry,
// dead_lettered) on the attempt span, whose status is Error unless the
// attempt succeeded. The endpoint URL is not recorded (it may hold a
// token). A relay traces with its own Outbox's TracerProvider: one whose
// Outbox has none sends no trace headers, whatever the event stored; an
// event enqueued without tracing gets root attempt spans. Without a
// TracerProvider nothing is stored or sent, Enqueue
// runs the statement it ran before tracing existed, and the relay's
// attempt path allocates nothing more.
//
// For metrics, Outbox.Backlog, Outbox.DeadLetterCounts and Relay.Stats
// are the public reads that packages outbox/metrics (Prometheus) and
// outbox/otelmetrics (OpenTelemetry) report; any host can call them.
//
// # What receivers get
//
// A POST with Content-Type application/json, a User-Agent naming txhook,
// the headers Webhook-Id (the event ID) and Webhook-Event-Type, the
// signer's headers (and traceparent, tracestate with tracing on), and the
// body
//
//	{"id":"01J…","type":"payment.succeeded","timestamp":"2026-11-30T12:00:00.000000Z","data":{…}}
//
// where data is the enqueued payload byte for byte and timestamp is when it
// was enqueued. The body is identical on every attempt and replay; the
// signature timestamp is that of the attempt.
package outbox
