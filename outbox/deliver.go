package outbox

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/retry"
)

// Header names set on every request besides the signer's.
const (
	// HeaderEventType carries the event type, so receivers can route or
	// ignore a request before parsing the body.
	HeaderEventType = "Webhook-Event-Type"
	// HeaderEventID carries the event ID; the Standard scheme also signs it.
	HeaderEventID = "Webhook-Id"
	// HeaderEventVersion carries the schema version of the body's data.
	HeaderEventVersion = "Webhook-Event-Version"
)

var (
	jsonContentType = []string{"application/json"}
	testTrue        = []string{"true"}
)

// process makes one attempt at j and returns its outcome and how long the
// request took (0 when none was made).
func (r *Relay) process(j *job) (outcome, time.Duration) {
	c := &j.c
	now := r.clock.Now()
	out := newOutcome(j, now, j.lease.end)
	switch {
	case r.stopping.Load(), time.Now().After(j.lease.startBy):
		// Stopping, or waited so long the lease might not cover a request.
		return releaseOutcome(out, now), 0
	case !c.EndpointFound:
		return r.fail(out, now, now, 0, "endpoint no longer exists", "", true), 0
	case !c.Enabled:
		out.State, out.Attempts = store.StatePaused, c.Attempt-1
		return out, 0
	case c.LeaseLapsed && c.Attempt > r.cfg.Retry.MaxAttempts():
		out.State, out.Attempts, out.Record = store.StateDead, c.Attempt-1, true
		out.Error = out.Records[0].Error
		return out, 0
	}

	r.startAttempt(j)
	body, version, err := r.body(c)
	if err != nil {
		r.log.Error("txhook: cannot build the delivery in the endpoint's pinned version; register the converter", "endpoint", c.EndpointID, "error", err)
		out.local = true
		return r.fail(out, now, now, 0, err.Error(), "", false), 0
	}
	custom, cert, err := r.endpointTransport(c)
	if err != nil && !errors.Is(err, ErrSecretKey) {
		r.log.Error("txhook: cannot read the endpoint's stored headers or client certificate; set them again", "endpoint", c.EndpointID, "error", err)
		out.local = true
		return r.fail(out, now, now, 0, err.Error(), "", false), 0
	}
	var secrets []string
	if err == nil {
		secrets, err = r.secrets.active(r.httpCtx, r.o, c.EndpointID, c.Secrets, now)
	}
	if errors.Is(err, ErrSecretKey) {
		// The keys changed under a running relay: no attempt is spent,
		// nothing reaches the receiver; the delivery waits for a relay
		// with the right keys.
		r.secrets.keyFailed(r.log, now, err)
		return releaseOutcome(out, now.Add(secretKeyRetry)), 0
	}
	if err == nil && len(secrets) == 0 {
		err = errors.New("endpoint has no active signing secret")
	}
	h := make(http.Header, 8+len(custom))
	for k, v := range custom { // first: ours below replace any of the same name
		h[k] = []string{v}
	}
	h["Content-Type"] = jsonContentType
	h[HeaderEventID] = []string{c.EventID}
	h[HeaderEventType] = []string{c.Type}
	h[HeaderEventVersion] = []string{strconv.Itoa(version)}
	if strings.HasPrefix(c.EventID, TestEventPrefix) {
		h[HeaderTest] = testTrue
	}
	r.traceHeaders(j, h)
	if err == nil {
		err = r.cfg.Signer.Sign(h, c.EventID, now, body, secrets)
	}
	if err != nil {
		r.log.Error("txhook: cannot sign delivery; fix the endpoint's secrets", "endpoint", c.EndpointID, "error", err)
		out.local = true
		return r.fail(out, now, now, 0, "signing failed: "+err.Error(), "", false), 0
	}

	if time.Now().After(j.lease.startBy) {
		// What ran since the check above (a Catalog converter, the Cipher
		// asking a key service) took so long that the request might
		// outlast the lease, and another relay might send the delivery
		// while it is open: nothing is sent, no attempt spent.
		if r.late.due(c.EndpointID, time.Now()) {
			r.log.Warn("txhook: preparing a delivery (version conversion, secret decryption) took so long that its lease could not cover the request; given back unsent",
				"endpoint", c.EndpointID, "event", c.EventID)
		}
		return releaseOutcome(out, now), 0
	}
	// Cut after Timeout, and at the lease's safety margin whatever
	// delayed the start.
	ctx, cancel := context.WithDeadline(r.httpCtx, earliest(time.Now().Add(r.cfg.Timeout), j.lease.cutOff))
	res := r.client.PostCert(ctx, c.URL, h, body, cert)
	cancel()
	if res.Err != nil && refusedByRules(res, c.URL) && r.httpCtx.Err() == nil {
		return r.refuse(out, now, c.EndpointID, res.Err), 0
	}
	rec := store.AttemptRecord{
		Attempt: c.Attempt, StartedAt: now, Duration: res.Duration,
		Status: res.Status, Excerpt: string(res.Excerpt),
	}
	if res.OK() {
		out.Records = append(out.Records, rec)
		out.State, out.Attempts, out.Record, out.Status = store.StateSucceeded, c.Attempt, true, res.Status
		r.log.Debug("txhook: delivered", "event", c.EventID, "endpoint", c.EndpointID, "attempt", c.Attempt, "status", res.Status)
		return out, res.Duration
	}
	msg := res.Err.Error()
	if r.httpCtx.Err() != nil {
		msg = "relay stopped during the request: " + msg
	} else {
		out.fault = res.Status == 0 || res.Status >= 500 || res.Status == http.StatusTooManyRequests || res.Status == http.StatusRequestTimeout
	}
	rec.Error = msg
	out.Records = append(out.Records, rec)
	out.Status = res.Status
	hint := ""
	if res.Status == http.StatusTooManyRequests || res.Status == http.StatusServiceUnavailable {
		hint = res.RetryAfter
	}
	return r.fail(out, now, r.clock.Now(), res.Status, msg, hint, false), res.Duration
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// endpointTransport returns the endpoint's custom headers and client
// certificate, decoded (and decrypted) once per distinct stored value.
// Headers or a key that do not decrypt are a *SecretsError.
func (r *Relay) endpointTransport(c *store.Claimed) (map[string]string, *tls.Certificate, error) {
	h, err := r.transport.header(r.httpCtx, r.o, c.EndpointID, c.Headers)
	if err != nil {
		return nil, nil, err
	}
	cert, err := r.transport.cert(r.httpCtx, r.o, c.EndpointID, c.ClientCert, c.ClientKey)
	return h, cert, err
}

// fail schedules the next attempt after a failed one, started at started
// and ended at now, or dead-letters the delivery when the policy has no
// attempt left (or final is set). msg and
// the attempt's record may hold what a receiver chose (a certificate's
// names, a redirect target): they are cleaned here, so that the log line
// and the callbacks carry what the database will.
func (r *Relay) fail(out outcome, started, now time.Time, status int, msg, retryAfter string, final bool) outcome {
	msg = store.CleanError(msg)
	out.Attempts, out.Record, out.Status, out.Error = out.Attempt, true, status, msg
	if len(out.Records) == 0 || out.Records[len(out.Records)-1].Attempt != out.Attempt {
		out.Records = append(out.Records, store.AttemptRecord{Attempt: out.Attempt, StartedAt: started, Status: status, Error: msg})
	}
	out.Completion = out.Completion.Clean()
	delay, ok := r.cfg.Retry.Next(out.Attempt)
	if final || !ok {
		out.State = store.StateDead
		return out
	}
	if retryAfter != "" {
		if hint, ok := retry.ParseRetryAfter(retryAfter, now); ok {
			delay = retry.WithRetryAfter(delay, hint, r.cfg.MaxRetryAfter)
		}
	}
	// The delay, and a Retry-After hint, count from the attempt's end (now):
	// a receiver that was slow to answer, or still working when the
	// request was cut, gets the whole pause before the next request.
	next := now.Add(delay)
	out.State, out.NextAt = store.StatePending, next
	r.log.Info("txhook: delivery failed; will retry", "event", out.eventID, "type", out.eventType,
		"endpoint", out.endpointID, "attempt", out.Attempt, "status", status, "error", msg, "next_attempt_at", next)
	return out
}

// newOutcome starts the outcome of j, to be written before deadline (the
// end of j's lease, on the local monotonic clock) or not at all. If the
// previous holder of the delivery died or stalled without recording its
// attempt, that attempt is recorded now as failed.
func newOutcome(j *job, now, deadline time.Time) outcome {
	c := &j.c
	out := outcome{
		// Last is the completer's to decide (see push).
		Completion: c.Completion(j.claimedAt, false),
		eventID:    c.EventID, eventType: c.Type, tenant: c.Tenant, endpointID: c.EndpointID, orderingKey: c.OrderingKey,
		deadline: deadline, event: j.event, q: j.q,
	}
	if c.LeaseLapsed {
		lapsed := 1
		if j.q != nil {
			lapsed = j.q.lapsed
		}
		for a := c.Attempt - lapsed; a < c.Attempt; a++ {
			out.Records = append(out.Records, store.AttemptRecord{
				Attempt: a, StartedAt: now,
				Error: "lease expired: the relay holding this delivery stopped before recording the outcome",
			})
		}
	}
	return out
}

// releaseOutcome gives a claimed delivery back, due at `at`, without
// spending its attempt.
func releaseOutcome(out outcome, at time.Time) outcome {
	out.State, out.Attempts, out.NextAt = store.StatePending, out.Attempt-1, at
	return out
}

// postpone gives j back, due at `at`, without spending its attempt.
func (r *Relay) postpone(j *job, at time.Time) outcome {
	return releaseOutcome(newOutcome(j, r.clock.Now(), j.lease.end), at)
}

func (r *Relay) deadLettered(x *outcome) {
	reason := DeadReasonFailed
	if x.refused {
		reason = DeadReasonRefused
		r.log.Warn("txhook: delivery dead-lettered: the target rules refused its endpoint for longer than RefusedLimit and no relay sent to it meanwhile; replay it once the rules or the URL are fixed",
			"event", x.eventID, "type", x.eventType, "tenant", x.tenant, "endpoint", x.endpointID,
			"refused_limit", r.cfg.RefusedLimit, "error", x.Error)
	} else {
		r.log.Warn("txhook: delivery dead-lettered after its last attempt", "event", x.eventID, "type", x.eventType,
			"tenant", x.tenant, "endpoint", x.endpointID, "attempts", x.Attempts, "status", x.Status, "error", x.Error)
	}
	if r.cfg.OnDeadLetter != nil {
		r.cfg.OnDeadLetter(DeadLetterNotice{
			DeliveryID: x.ID, EventID: x.eventID, EventType: x.eventType, Tenant: x.tenant,
			EndpointID: x.endpointID, Attempts: x.Attempts, LastStatus: x.Status, LastError: x.Error, Reason: reason,
		})
	}
}

// body builds the request body in the schema version the endpoint pinned
// for the event's type, if any, and returns that version.
func (r *Relay) body(c *store.Claimed) ([]byte, int, error) {
	version, data := c.Version, json.RawMessage(c.Payload)
	if want, pinned, err := r.pins.version(c.Versions, c.Type); err != nil {
		return nil, 0, err
	} else if pinned && want != version {
		if r.o.cfg.Catalog == nil {
			return nil, 0, fmt.Errorf("endpoint pins %s to version %d but the event is version %d and no catalog is configured", c.Type, want, version)
		}
		if data, err = r.o.cfg.Catalog.Convert(c.Type, version, want, data); err != nil {
			return nil, 0, err
		}
		version = want
	}
	return envelope(c, version, data), version, nil
}

// envelope builds the request body: the Standard Webhooks payload shape
// around the payload, which is copied, never re-encoded. Event IDs and types
// are restricted to characters that need no JSON escaping.
func envelope(c *store.Claimed, version int, data []byte) []byte {
	b := make([]byte, 0, len(data)+len(c.EventID)+len(c.Type)+96)
	b = append(b, `{"id":"`...)
	b = append(b, c.EventID...)
	b = append(b, `","type":"`...)
	b = append(b, c.Type...)
	b = append(b, `","version":`...)
	b = strconv.AppendInt(b, int64(version), 10)
	b = append(b, `,"timestamp":"`...)
	b = c.EventTime.UTC().AppendFormat(b, "2006-01-02T15:04:05.000000Z")
	b = append(b, `","data":`...)
	b = append(b, data...)
	b = append(b, '}')
	return b
}

// pinCache decodes endpoints' pinned versions once per distinct value.
type pinCache struct {
	mu sync.Mutex
	m  map[string]map[string]int
}

func (pc *pinCache) version(raw []byte, typ string) (int, bool, error) {
	if len(raw) == 0 || string(raw) == "{}" {
		return 0, false, nil
	}
	pc.mu.Lock()
	pins, ok := pc.m[string(raw)]
	pc.mu.Unlock()
	if !ok {
		if err := json.Unmarshal(raw, &pins); err != nil {
			return 0, false, fmt.Errorf("stored versions: %w", err)
		}
		pc.mu.Lock()
		if pc.m == nil || len(pc.m) > 10000 {
			pc.m = map[string]map[string]int{}
		}
		pc.m[string(raw)] = pins
		pc.mu.Unlock()
	}
	v, ok := pins[typ]
	return v, ok, nil
}

// secretKeyRetry is how long a delivery whose endpoint's secrets cannot
// be decrypted waits, unspent, before a relay tries it again.
const secretKeyRetry = time.Minute

// secretCache holds endpoints' decrypted secrets, in memory only, once per
// stored value: a rotation or re-encryption stores a new value, which is
// decrypted on first use. An entry serves only the endpoint it was
// decrypted for, as the ciphertext is bound to it.
type secretCache struct {
	mu sync.Mutex
	m  map[string]cachedSecrets
	// keyErrAt is when a key failure was last logged (Unix ns).
	keyErrAt atomic.Int64
}

type cachedSecrets struct {
	endpointID string
	secrets    []Secret
}

func (sc *secretCache) active(ctx context.Context, o *Outbox, endpointID string, raw []byte, now time.Time) ([]string, error) {
	sc.mu.Lock()
	e, ok := sc.m[string(raw)]
	sc.mu.Unlock()
	if !ok || e.endpointID != endpointID {
		ss, err := o.openSecrets(ctx, endpointID, raw)
		if err != nil {
			return nil, err
		}
		e = cachedSecrets{endpointID: endpointID, secrets: ss}
		sc.mu.Lock()
		if sc.m == nil || len(sc.m) > 10000 {
			sc.m = map[string]cachedSecrets{}
		}
		sc.m[string(raw)] = e
		sc.mu.Unlock()
	}
	out := make([]string, 0, len(e.secrets))
	for _, s := range e.secrets {
		if s.Active(now) {
			out = append(out, s.Value)
		}
	}
	return out, nil
}

// keyFailed logs a failure to decrypt secrets or a client key at most once
// a minute.
func (sc *secretCache) keyFailed(log *slog.Logger, now time.Time, err error) {
	last := sc.keyErrAt.Load()
	if last != 0 && now.UnixNano()-last < int64(secretKeyRetry) || !sc.keyErrAt.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	log.Error("txhook: cannot decrypt an endpoint's signing secrets, client certificate key or custom headers; its deliveries wait, spending no attempt, until a relay has the right Config.SecretCipher keys (logged at most once a minute)",
		"error", err)
}
