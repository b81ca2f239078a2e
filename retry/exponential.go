package retry

import (
	"fmt"
	"math"
	"time"
)

// Exponential is a policy whose delays grow geometrically:
// Base×Factor^(n−1) after failed attempt n, capped at Cap, then jittered.
//
// Delays saturate instead of overflowing, so any attempt number and any
// Factor give a delay in [0, Cap] (or [0, the largest Duration] with no Cap).
// An Exponential is safe for concurrent use as long as Rand is.
type Exponential struct {
	Base     time.Duration // delay after the first failure
	Factor   float64       // growth, default 2 (used when Factor is 0)
	Cap      time.Duration // largest delay, jitter included; 0 = no cap
	Attempts int           // total attempts including the first
	Jitter   float64       // fraction, e.g. 0.25 for ±25%; 0 means none
	// Rand returns draws uniform in [0,1); nil means math/rand/v2.Float64.
	// It must be safe for concurrent use.
	Rand func() float64
}

// MaxAttempts returns e.Attempts (0 if it is negative).
func (e Exponential) MaxAttempts() int { return max(e.Attempts, 0) }

// Next returns Base×Factor^(attempt−1), capped at Cap and jittered. ok is
// false when attempt < 1 or attempt ≥ Attempts.
//
// Jitter is applied to the capped delay. Where it would push the delay past
// Cap, the excess is reflected back below Cap rather than clipped: clipping
// would put half of all capped retries on exactly the same instant, which is
// the synchronisation jitter exists to break.
func (e Exponential) Next(attempt int) (time.Duration, bool) {
	if attempt < 1 || attempt >= e.Attempts {
		return 0, false
	}
	factor := e.Factor
	if factor == 0 {
		factor = 2
	}
	// Float math cannot overflow into a negative: a huge power gives +Inf,
	// which durationOf saturates. Pow of an invalid (negative, NaN) factor may
	// give a negative or NaN, which durationOf turns into 0.
	d := durationOf(float64(e.Base) * math.Pow(factor, float64(attempt-1)))
	if e.Cap > 0 && d > e.Cap {
		d = e.Cap
	}
	d = jitter(d, e.Jitter, e.Rand)
	if e.Cap > 0 && d > e.Cap {
		d = e.Cap - (d - e.Cap)
	}
	return max(d, 0), true
}

// Validate reports the first problem with e as a *PolicyError, which matches
// ErrInvalidPolicy: Attempts < 1, Base ≤ 0, Factor < 1 (other than 0, which
// means 2) or not finite, Cap < 0, or Jitter outside [0, 1).
func (e Exponential) Validate() error {
	if e.Attempts < 1 {
		return invalid("Attempts", fmt.Sprintf("is %d, must be at least 1", e.Attempts))
	}
	if e.Base <= 0 {
		return invalid("Base", fmt.Sprintf("is %v, must be positive", e.Base))
	}
	if e.Factor != 0 && !(e.Factor >= 1 && !math.IsInf(e.Factor, 1)) {
		return invalid("Factor", fmt.Sprintf("is %v, must be a finite number ≥ 1 (or 0 for the default 2)", e.Factor))
	}
	if e.Cap < 0 {
		return invalid("Cap", fmt.Sprintf("is %v, must be ≥ 0 (0 means no cap)", e.Cap))
	}
	return validateJitter(e.Jitter)
}
