package retry

import (
	"math"
	"strings"
	"time"
)

// WithRetryAfter combines the policy delay with a receiver's Retry-After hint: never sooner than the policy's delay, never later than max (if the hint is larger, max is used). hint <= 0 means no hint.
//
// max bounds the hint, not the policy: when policyDelay is already above max,
// policyDelay is returned. max <= 0 therefore means hints are ignored. The
// bound matters because the hint comes from the receiver: "Retry-After:
// 99999999" must not park a payment event for three years. The result is
// never negative.
func WithRetryAfter(policyDelay, hint, max time.Duration) time.Duration {
	d := policyDelay
	if hint > 0 {
		d = maxDur(d, minDur(hint, max))
	}
	return maxDur(d, 0)
}

// ParseRetryAfter parses an HTTP Retry-After value (delta-seconds or HTTP-date relative to now); ok=false when absent/invalid/negative.
//
// Delta-seconds too large for a Duration saturate at the largest Duration;
// pass the result through WithRetryAfter to bound it. An HTTP-date in the
// past counts as negative. The three HTTP-date formats of RFC 9110 are
// accepted (IMF-fixdate, RFC 850, asctime).
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if isDigits(v) {
		return parseSeconds(v), true
	}
	for _, layout := range httpDateLayouts {
		t, err := time.Parse(layout, v)
		if err != nil {
			continue
		}
		d := t.Sub(now) // Sub saturates rather than overflowing
		if d < 0 {
			return 0, false
		}
		return d, true
	}
	return 0, false
}

// httpDateLayouts are net/http's, spelled out so that this leaf package does
// not import net/http. The literal "GMT" pins the zone to UTC; RFC 9110 allows
// no other.
var httpDateLayouts = []string{
	"Mon, 02 Jan 2006 15:04:05 GMT",  // IMF-fixdate
	"Monday, 02-Jan-06 15:04:05 GMT", // RFC 850
	"Mon Jan _2 15:04:05 2006",       // asctime
}

// isDigits reports whether s is RFC 9110's delay-seconds: 1*DIGIT, no sign.
func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// parseSeconds converts a string of digits (any length) to a Duration,
// saturating at the largest Duration.
func parseSeconds(s string) time.Duration {
	const limit = math.MaxInt64 / int64(time.Second)
	var n int64
	for i := 0; i < len(s); i++ {
		n = n*10 + int64(s[i]-'0')
		if n > limit {
			return math.MaxInt64
		}
	}
	return time.Duration(n) * time.Second
}

// minDur and maxDur exist because this file's parameter named max shadows
// the builtin.
func minDur(a, b time.Duration) time.Duration { return min(a, b) }
func maxDur(a, b time.Duration) time.Duration { return max(a, b) }
