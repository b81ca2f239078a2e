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
// A Relay dispatches committed events: in one statement it creates one
// delivery per enabled endpoint of the event's tenant that subscribes to its
// type, already claimed for the first attempt. It also claims due retries,
// in batches under a lease. It signs each request
// (Standard Webhooks by default, see package signer), POSTs it through an
// HTTP client that refuses private and metadata addresses at connect time,
// and records every attempt. A failed attempt is retried on the schedule of
// package retry; after the last one the delivery moves to the dead-letter
// table (package dlq) in the same transaction that records that attempt.
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
// # What receivers get
//
// A POST with Content-Type application/json, a User-Agent naming txhook,
// the headers Webhook-Id (the event ID) and Webhook-Event-Type, the
// signer's headers, and the body
//
//	{"id":"01J…","type":"payment.succeeded","timestamp":"2026-11-30T12:00:00.000000Z","data":{…}}
//
// where data is the enqueued payload byte for byte and timestamp is when it
// was enqueued. The body is identical on every attempt and replay; the
// signature timestamp is that of the attempt.
package outbox
