// Package portal is the merchant portal: an http.Handler a platform mounts
// in its own service so that each merchant (tenant) manages and debugs its
// own webhooks without a support ticket. Every request is scoped to exactly
// one tenant, and every read and write goes through outbox.TenantView, which
// filters by tenant in SQL: another tenant's endpoint, event, delivery or
// attempt ID is answered 404, exactly like a missing one.
//
// # What a merchant sees and does
//
// Endpoints with their health (success rate and latency over 24 hours and 7
// days, with charts; last failure and its reason; enabled, disabled and why;
// how long a failing endpoint has before the relays disable it); create,
// edit (URL checked with the outbox's SSRF rules, event types from the
// catalog with wildcards, description, custom headers), enable, disable,
// delete. The signing secret in full exactly once, on the answer to the POST
// that created or rotated it, masked everywhere else; rotation with the
// overlap of the old secret as a countdown. The delivery log per endpoint and
// per event, filtered by status, type, event ID and time; each attempt with
// the request headers it was sent with (signature included), status,
// latency, response excerpt and error, all escaped. Resend a delivery,
// recover everything since a time, send a test event of a catalog type and
// watch the result (the page refreshes itself with a meta refresh until the
// result is in: no JavaScript). The catalog with versions, examples and the
// versions the merchant's endpoints pin. Exports for reconciliation, CSV
// (cells that a spreadsheet would read as a formula get a leading ') and
// JSON, streamed row by row. The tenant's own audit log.
//
// # Who the tenant is
//
// Config.Tenant, when the host has its own merchant login; or an access
// link from (*Portal).Link, for hosts without one: a URL with a token
// HMAC-signed with Config.LinkKeys naming one tenant and an expiry. Opening
// it sets a session cookie (HttpOnly, SameSite=Lax; "__Host-" and Secure over
// TLS, including behind Config.TrustedProxies) and redirects to a URL without
// the token. An expired, altered or foreign link gets a 403 page that says
// nothing more. Dropping a key from LinkKeys revokes its links and sessions.
//
// # Security
//
// Server-rendered with html/template, nothing loaded from elsewhere, every
// action a plain form POST followed by a redirect. Every POST needs the CSRF
// token of its form (tied to a cookie and to the tenant) and must not be
// cross-origin by the browser's account. Every response carries
//
//	Content-Security-Policy: default-src 'none'; style-src 'self'; img-src 'self' data:;
//	  form-action 'self'; frame-ancestors <Config.FrameAncestors or 'none'>; base-uri 'none'
//	X-Frame-Options: DENY (when no FrameAncestors), X-Content-Type-Options: nosniff,
//	Referrer-Policy: no-referrer (links carry tokens), Cache-Control: no-store
//
// # JSON API
//
// The same operations under Prefix + "api/", same tenant scope: GET/POST
// api/endpoints, GET/PATCH/DELETE api/endpoints/{id}, POST
// api/endpoints/{id}/{enable,disable,rotate,recover,test}, GET
// api/endpoints/{id}/health, GET api/deliveries, GET api/deliveries/{id},
// POST api/deliveries/{id}/resend, GET api/events/{id}, GET api/catalog, GET
// api/export, GET api/audit. Every API request must carry the header
// APIHeader ("X-Txhook-Portal: 1"): browsers send a custom header
// cross-origin only after a CORS preflight the portal never grants, so
// another site cannot call the API with the merchant's cookies. Errors are
// {"error": {"code": "...", "message": "..."}} with a 4xx or 5xx status.
//
// # Audit
//
// Every mutating call records who (Config.Actor, or "link:<tenant>" /
// "host:<tenant>"), from where (the client address, through
// TrustedProxies), what and when in the outbox's audit log (see
// outbox.WithActor), which the merchant reads on the audit page and
// operators with outbox.Outbox.AuditLog.
//
// # Languages
//
// English and Simplified Chinese, from Config.Locale or the Accept-Language
// header (q-values honoured; Traditional Chinese tags fall back to English).
package portal
