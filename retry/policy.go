package retry

import (
	"errors"
	"math"
	"math/rand/v2"
	"time"
)

// Policy decides when a failed delivery is tried again.
//
// Implementations must be safe for concurrent use: one Policy serves every
// delivery of an endpoint.
type Policy interface {
	// Next returns the delay between the end of failed attempt n
	// (1-based: its response, or the moment it was cut or failed) and the
	// start of the next attempt; ok is false when attempt n was the last
	// one.
	Next(attempt int) (delay time.Duration, ok bool)
	// MaxAttempts returns the total number of attempts, including the first.
	MaxAttempts() int
}

var (
	_ Policy = Schedule{}
	_ Policy = Exponential{}
)

// ErrInvalidPolicy is matched (with errors.Is) by every error that Validate
// returns.
var ErrInvalidPolicy = errors.New("retry: invalid policy")

// PolicyError says which field of a policy is wrong and why.
// errors.Is(err, ErrInvalidPolicy) is true for every *PolicyError.
type PolicyError struct {
	Field  string // e.g. "Offsets[3]", "Jitter"
	Reason string
}

func (e *PolicyError) Error() string {
	return "retry: invalid policy: " + e.Field + " " + e.Reason
}

// Unwrap returns ErrInvalidPolicy.
func (e *PolicyError) Unwrap() error { return ErrInvalidPolicy }

func invalid(field, reason string) error { return &PolicyError{Field: field, Reason: reason} }

func validateJitter(j float64) error {
	// Written so that NaN fails too. Jitter 1 would allow a zero delay, which
	// is exactly the retry storm jitter exists to prevent.
	if !(j >= 0 && j < 1) {
		return invalid("Jitter", "must be in [0, 1)")
	}
	return nil
}

// jitter spreads d uniformly over d×(1±j) using r, a draw in [0,1).
// It tolerates invalid input (a Rand outside [0,1), NaN, j ≥ 1) without
// panicking or going negative, because Next is not required to be called on a
// validated policy.
func jitter(d time.Duration, j float64, r func() float64) time.Duration {
	if d <= 0 {
		return 0
	}
	if !(j > 0) { // zero, negative or NaN: no jitter
		return d
	}
	j = min(j, 1)
	if r == nil {
		r = rand.Float64 // safe for concurrent use
	}
	x := r()
	switch {
	case x != x: // NaN
		x = 0.5
	case x < 0:
		x = 0
	case x > 1:
		x = 1
	}
	return durationOf(float64(d) * (1 + j*(2*x-1)))
}

// durationOf converts f nanoseconds to a Duration, saturating instead of
// overflowing: NaN and negatives give 0, anything from 2^63 up gives the
// largest Duration. A plain conversion of an out-of-range float is
// implementation-defined in Go and yields a negative value on amd64.
func durationOf(f float64) time.Duration {
	if !(f > 0) {
		return 0
	}
	if f >= 0x1p63 {
		return math.MaxInt64
	}
	return time.Duration(f)
}

// Span returns how long p takes from its first attempt to its last when
// every attempt fails: the sum of the delays between them, without jitter
// for a Schedule or an Exponential (a Schedule's last offset), as Next
// returns them for any other Policy (which may implement Span()
// time.Duration itself). It saturates at the largest Duration, and adds
// at most the first 10,000 delays. Delays count from the end of each
// attempt, so attempts that take time (timeouts) lengthen the real span
// by their durations.
func Span(p Policy) time.Duration {
	switch x := p.(type) {
	case interface{ Span() time.Duration }:
		return x.Span()
	case Schedule:
		x.Jitter = 0
		p = x
	case *Schedule:
		c := *x
		c.Jitter = 0
		p = c
	case Exponential:
		x.Jitter = 0
		p = x
	case *Exponential:
		c := *x
		c.Jitter = 0
		p = c
	}
	var total time.Duration
	for n := 1; n < min(p.MaxAttempts(), 10001); n++ {
		d, ok := p.Next(n)
		if !ok {
			break
		}
		if d > 0 && total > math.MaxInt64-d {
			return math.MaxInt64
		}
		total += max(d, 0)
	}
	return total
}
