package outbox

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"sync"
	"time"

	"github.com/txhook/txhook/internal/safehttp"
	"github.com/txhook/txhook/internal/store"
)

// RefusedRetryDelay is how long a delivery that a relay refused by its own
// target rules waits before any relay claims it again (see Config).
const RefusedRetryDelay = time.Minute

// targetError is a refusal by the target rules, worded to name the knob
// that changes them; it unwraps to safehttp's error.
type targetError struct {
	msg string
	err error
}

func (e *targetError) Error() string { return e.msg }
func (e *targetError) Unwrap() error { return e.err }

// explainTarget rewords a refusal by the target rules to name the Config
// field that decides it; other errors are returned as they are.
func explainTarget(err error) error {
	var fe *safehttp.ForbiddenError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrInsecureURL):
		return &targetError{"txhook: https required (set Config.AllowHTTP for local development)", err}
	case errors.As(err, &fe):
		return &targetError{fmt.Sprintf("txhook: %s target refused: %s (see Config.AllowedTargets, or Config.AllowPrivateTargets for local development)",
			fe.Why, fe.Target()), err}
	}
	return err
}

// refusedByRules reports whether res failed because this relay's target
// rules refuse the endpoint's URL itself, whatever DNS says: plain http
// without AllowHTTP, or an IP-literal host the guard forbids. A name that
// resolves to a forbidden address is not one: DNS changes (and rebinding
// is an attack), so that is a failed attempt like any other. Nor is a
// redirect: that is the receiver's doing.
func refusedByRules(res safehttp.Result, rawURL string) bool {
	if res.Redirects != 0 {
		return false
	}
	if errors.Is(res.Err, ErrInsecureURL) {
		return true
	}
	if !errors.Is(res.Err, ErrForbiddenTarget) {
		return false
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return false
	}
	_, err = netip.ParseAddr(u.Hostname())
	return err == nil
}

// refuse hands a delivery back without spending its attempt, due in
// RefusedRetryDelay, with why this relay refused it as its last error: a
// relay whose rules allow the endpoint may deliver it. The database
// dead-letters it instead once it has been refused for RefusedLimit with
// no attempt to its endpoint meanwhile (see RelayConfig.RefusedLimit).
func (r *Relay) refuse(out outcome, now time.Time, endpointID string, err error) outcome {
	msg := store.CleanError("not sent, no attempt spent: relay " + r.cfg.ID + " refuses the endpoint by its target rules: " + explainTarget(err).Error())
	out = releaseOutcome(out, now.Add(RefusedRetryDelay))
	out.Record, out.Status, out.Error, out.refused = true, 0, msg, true
	out.Refused, out.RefusedLimit = true, max(r.cfg.RefusedLimit, 0)
	if r.refusals.due(endpointID, time.Now()) {
		r.log.Warn("txhook: endpoint refused by this relay's target rules; its deliveries wait for a relay that allows it",
			"endpoint", endpointID, "error", msg)
	}
	return out
}

// logLimiter lets a message about a key through once a minute.
type logLimiter struct {
	mu   sync.Mutex
	last map[string]time.Time
}

func (l *logLimiter) due(key string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t, ok := l.last[key]; ok && now.Sub(t) < time.Minute {
		return false
	}
	if l.last == nil || len(l.last) > 10000 {
		l.last = map[string]time.Time{}
	}
	l.last[key] = now
	return true
}
