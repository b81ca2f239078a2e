// Package signer signs webhook requests on the sending side and verifies them
// on the receiving side. It is pure: no I/O beyond crypto/rand, standard
// library only.
//
// A signature binds the body to a timestamp (so a captured request cannot be
// replayed later) and, in the Standard scheme, to the message id (so a
// receiver can deduplicate on it). Verify must see the raw body bytes, before
// any JSON decoding: re-encoding changes bytes and breaks the signature.
//
// # Schemes
//
// [Standard] follows the Standard Webhooks spec and is the default. Its
// headers are webhook-id, webhook-timestamp and webhook-signature; receivers
// can use any of the official Standard Webhooks libraries instead of txhook.
//
// [Stripe] writes one "t=<unix>,v1=<hex>" header in the style of Stripe, for
// receivers that already check that format. It does not sign the message id.
//
// Both implement [Signer] and [Verifier]. Verification accepts timestamps
// within [DefaultTolerance] (5 minutes) of the receiver's clock in either
// direction; the Tolerance and Now fields change that.
//
// # Secrets
//
// Standard takes the Standard Webhooks formats:
//
//   - "whsec_" + base64 of 24 to 64 random bytes: a shared HMAC-SHA256
//     secret, signing "v1" entries. [GenerateSecret] makes one.
//   - "whsk_" + base64 of an ed25519 private key: signs "v1a" entries, and
//     stays with the sender. Its "whpk_" public key, from [GenerateKeyPair]
//     or [PublicKey], is what receivers verify with; it cannot sign, so a
//     leak lets nobody forge.
//
// [ValidateSecret] checks a secret before it is stored. Stripe takes any
// secret string of at least 16 bytes and keys the HMAC with those bytes as
// they are.
//
// Errors name a bad secret by its position in the list, never by content;
// no error of this package contains a secret, key or signature.
//
// # Rotation
//
// To replace a secret without downtime, sign with both the old and the new
// one for a while: Sign puts one signature per secret into the header, and
// Verify accepts a request if any signature matches any of its secrets.
// Receivers switch to the new secret at their own pace; then the old one is
// dropped on the sending side.
//
// # Use
//
// Sender, per delivery attempt:
//
//	err := signer.Standard{}.Sign(req.Header, msgID, time.Now(), body, endpoint.Secrets)
//
// Receiver:
//
//	msg, err := signer.Standard{}.Verify(r.Header, rawBody, []string{secret})
//	if err != nil {
//		// 401; errors.Is(err, signer.ErrInvalidSecret) means our configuration is wrong
//	}
//	// msg.ID is the deduplication key
package signer
