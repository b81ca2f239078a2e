package retry

import (
	"fmt"
	"math"
	"time"
)

// Schedule is a list of attempt times as offsets from the first attempt: Offsets[0] must be 0 (the first attempt); Offsets are strictly increasing. The delay after attempt n is Offsets[n]-Offsets[n-1], with jitter applied to that gap.
//
// The delay counts from the end of attempt n (see [Policy]), so the offsets
// are exact for a receiver that answers at once; each slow or timed-out
// attempt moves the later ones by its duration.
//
// Each gap is jittered on its own, so with Jitter 0.25 the last attempt of
// Default lands anywhere between 18h and 30h after the first, not exactly at
// 24h. A Schedule is safe for concurrent use as long as Offsets is not
// modified and Rand is itself safe for concurrent use.
type Schedule struct {
	Offsets []time.Duration
	Jitter  float64 // fraction, e.g. 0.25 for ±25%; 0 means none
	// Rand returns draws uniform in [0,1); nil means math/rand/v2.Float64.
	// It is called from every goroutine that calls Next, so it must be safe
	// for concurrent use (math/rand/v2.Float64 is; a *rand.Rand is not).
	Rand func() float64
}

// Default returns the source article's schedule: T+0, 10s, 30s, 1m, 5m, 15m,
// 1h, 6h, 24h with ±25% jitter on every gap: 9 attempts, then dead-letter.
func Default() Schedule {
	return Schedule{
		Offsets: []time.Duration{
			0,
			10 * time.Second,
			30 * time.Second,
			1 * time.Minute,
			5 * time.Minute,
			15 * time.Minute,
			1 * time.Hour,
			6 * time.Hour,
			24 * time.Hour,
		},
		Jitter: 0.25,
	}
}

// Intervals returns a Schedule from the waits between attempts: the first
// attempt is immediate and attempt n+1 comes delays[n-1] after attempt n.
// It has no jitter; set Jitter (and Rand) on the result if wanted.
// Zero or negative waits make a schedule that Validate rejects; offsets that
// would pass the largest Duration (about 292 years) saturate at it.
func Intervals(delays ...time.Duration) Schedule {
	offsets := make([]time.Duration, 1, len(delays)+1)
	var at time.Duration
	for _, d := range delays {
		if d > 0 && at > math.MaxInt64-d {
			at = math.MaxInt64
		} else {
			at += d
		}
		offsets = append(offsets, at)
	}
	return Schedule{Offsets: offsets}
}

// MaxAttempts returns len(s.Offsets): one attempt per offset.
func (s Schedule) MaxAttempts() int { return len(s.Offsets) }

// Next returns the jittered gap Offsets[attempt]-Offsets[attempt-1].
// ok is false when attempt < 1 or attempt ≥ MaxAttempts.
func (s Schedule) Next(attempt int) (time.Duration, bool) {
	if attempt < 1 || attempt >= len(s.Offsets) {
		return 0, false
	}
	prev, next := s.Offsets[attempt-1], s.Offsets[attempt]
	var gap time.Duration
	if next > prev {
		gap = next - prev
		if gap < 0 { // overflow: only possible with a negative prev, which Validate rejects
			gap = math.MaxInt64
		}
	}
	return jitter(gap, s.Jitter, s.Rand), true
}

// Validate reports the first problem with s as a *PolicyError, which matches
// ErrInvalidPolicy: no offsets, Offsets[0] not 0, offsets not strictly
// increasing, or Jitter outside [0, 1).
func (s Schedule) Validate() error {
	if len(s.Offsets) == 0 {
		return invalid("Offsets", "is empty: a schedule needs at least the first attempt")
	}
	if s.Offsets[0] != 0 {
		return invalid("Offsets[0]", fmt.Sprintf("is %v, must be 0 (the first attempt)", s.Offsets[0]))
	}
	for i := 1; i < len(s.Offsets); i++ {
		if s.Offsets[i] <= s.Offsets[i-1] {
			return invalid(fmt.Sprintf("Offsets[%d]", i),
				fmt.Sprintf("(%v) must be after Offsets[%d] (%v)", s.Offsets[i], i-1, s.Offsets[i-1]))
		}
	}
	return validateJitter(s.Jitter)
}
