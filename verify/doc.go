// Package verify is the receiving side of txhook: it checks that a webhook
// request was signed by the sender, recently, and makes sure each event is
// processed once although the sender delivers it at least once.
//
// It works with any sender that signs in the Standard Webhooks scheme or the
// Stripe-style scheme (see package signer), and needs nothing of txhook's
// sending side. The middleware is a plain func(http.Handler) http.Handler,
// so it fits any router.
//
// # The receiver flow
//
//  1. Verify the raw bytes. The signature covers the body exactly as sent;
//     decoding and re-encoding JSON changes bytes. The signed timestamp must
//     be within the tolerance (5 minutes either way), which turns a captured
//     request into garbage after a few minutes.
//  2. Deduplicate on the event ID, before processing. Delivery is
//     at-least-once: a timeout on the sender's side after the receiver did
//     the work means the same event comes again.
//  3. Process.
//  4. Acknowledge with 2xx, which stops the sender's retries. Anything else
//     (or no answer) means "try again later".
//
// Step 2 needs three states, not two. A store that knows only "seen" must
// either mark an event seen before processing (and then a crash mid-way
// loses it: every retry is skipped) or after (and then a retry that arrives
// while a slow handler still runs is processed twice). So a Store records a
// claim with a lease: the first delivery acquires it and processes; a
// delivery that finds a live claim gets 409 and the sender retries later;
// once processing succeeds the claim becomes "done" and later deliveries get
// 200 without processing; if processing fails the claim is released, and if
// the receiver dies the lease runs out, so a retry processes the event.
//
// # Exactly-once effects
//
// A claim in one store and a business write in another can still disagree
// after a crash between the two. With SQLStore, call MarkDoneTx in the
// business transaction instead: the done mark and the business write commit
// together, and a duplicate fails with ErrDuplicate, so the write happens
// once whatever the timing.
//
// # Use
//
//	v, err := verify.New(verify.Config{
//		Secrets: []string{os.Getenv("WEBHOOK_SECRET")}, // whsec_... or whpk_...
//		Store:   verify.NewMemoryStore(verify.MemoryConfig{}),
//	})
//	if err != nil {
//		log.Fatal(err)
//	}
//	http.Handle("POST /webhooks", v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
//		ev, _ := verify.EventFrom(r.Context())
//		if err := handle(r.Context(), ev.Type, ev.Data); err != nil {
//			w.WriteHeader(http.StatusInternalServerError) // released: the retry runs this again
//		}
//	})))
//
// Without the middleware, Verifier.Verify checks headers and a body read by
// other means (a serverless event, a queue). For slow work, a handler can
// answer 202 at once and finish in the background: see Async.
//
// # Event IDs
//
// The event ID is the deduplication key, so it must be one the sender
// signed. In the Standard scheme that is the webhook-id header. The
// Stripe-style scheme does not sign webhook-id, so there the ID is the "id"
// member of the signed body, and a body without one is refused (400):
// otherwise anyone replaying a captured request within the tolerance could
// change the header and have it processed again. txhook's sender puts the
// ID in both places.
//
// # Secrets
//
// Config.Secrets takes every secret a signature may match: during a
// rotation, the old and the new one; afterwards only the new. With the
// Standard scheme a receiver can hold a whpk_ public key instead of a shared
// secret: it verifies the sender's v1a (ed25519) signatures and cannot forge
// them. Rejections carry a short reason ("timestamp too old") and never a
// secret or an expected signature.
package verify
