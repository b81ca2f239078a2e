package retry_test

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/txhook/txhook/retry"
)

func TestExponentialGrowth(t *testing.T) {
	t.Parallel()
	s := time.Second
	tests := []struct {
		name string
		e    retry.Exponential
		want []time.Duration
	}{
		{"factor 0 means 2", retry.Exponential{Base: s, Attempts: 6}, []time.Duration{s, 2 * s, 4 * s, 8 * s, 16 * s}},
		{"factor 2", retry.Exponential{Base: s, Factor: 2, Attempts: 4}, []time.Duration{s, 2 * s, 4 * s}},
		{"factor 3", retry.Exponential{Base: 10 * s, Factor: 3, Attempts: 5}, []time.Duration{10 * s, 30 * s, 90 * s, 270 * s}},
		{"factor 1 is constant", retry.Exponential{Base: 5 * s, Factor: 1, Attempts: 4}, []time.Duration{5 * s, 5 * s, 5 * s}},
		{"factor 1.5", retry.Exponential{Base: 4 * s, Factor: 1.5, Attempts: 4}, []time.Duration{4 * s, 6 * s, 9 * s}},
		{"cap", retry.Exponential{Base: s, Cap: 10 * s, Attempts: 8}, []time.Duration{s, 2 * s, 4 * s, 8 * s, 10 * s, 10 * s, 10 * s}},
		{"cap below base", retry.Exponential{Base: time.Minute, Cap: s, Attempts: 3}, []time.Duration{s, s}},
		{"one attempt: no retries", retry.Exponential{Base: s, Attempts: 1}, nil},
		{"zero attempts", retry.Exponential{Base: s}, nil},
		{"negative attempts", retry.Exponential{Base: s, Attempts: -3}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := nextAll(t, tt.e); !slices.Equal(got, tt.want) {
				t.Fatalf("delays = %v, want %v", got, tt.want)
			}
			for _, n := range []int{math.MinInt, -1, 0, tt.e.Attempts, tt.e.Attempts + 1, math.MaxInt} {
				if d, ok := tt.e.Next(n); ok || d != 0 {
					t.Errorf("Next(%d) = %v, %v; want 0, false", n, d, ok)
				}
			}
		})
	}
}

func TestExponentialOverflow(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		e    retry.Exponential
		// want is the delay at the last attempts, once growth has saturated.
		want time.Duration
	}{
		{"factor 2, no cap", retry.Exponential{Base: time.Second, Attempts: 10_001}, math.MaxInt64},
		{"factor 2, cap", retry.Exponential{Base: time.Second, Cap: time.Hour, Attempts: 10_001}, time.Hour},
		{"factor 1e9, no cap", retry.Exponential{Base: time.Second, Factor: 1e9, Attempts: 10_001}, math.MaxInt64},
		{"factor 1e9, cap", retry.Exponential{Base: time.Second, Factor: 1e9, Cap: 24 * time.Hour, Attempts: 10_001}, 24 * time.Hour},
		{"max float factor", retry.Exponential{Base: time.Nanosecond, Factor: math.MaxFloat64, Attempts: 10_001}, math.MaxInt64},
		{"infinite factor", retry.Exponential{Base: time.Nanosecond, Factor: math.Inf(1), Attempts: 10_001}, math.MaxInt64},
		{"largest base", retry.Exponential{Base: math.MaxInt64, Attempts: 10_001}, math.MaxInt64},
		{"no cap, upward jitter", retry.Exponential{Base: time.Second, Factor: 1e9, Attempts: 10_001, Jitter: 0.5, Rand: fixed(almostOne)}, math.MaxInt64},
		{"cap, upward jitter reflects", retry.Exponential{Base: time.Second, Factor: 1e9, Cap: time.Hour, Attempts: 10_001, Jitter: 0.5, Rand: fixed(almostOne)}, 30 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var prev time.Duration
			for n := 1; n < tt.e.Attempts; n++ {
				d, ok := tt.e.Next(n)
				if !ok {
					t.Fatalf("Next(%d) not ok", n)
				}
				if d < 0 {
					t.Fatalf("Next(%d) = %v, negative", n, d)
				}
				if tt.e.Cap > 0 && d > tt.e.Cap {
					t.Fatalf("Next(%d) = %v, above Cap %v", n, d, tt.e.Cap)
				}
				if tt.e.Jitter == 0 && d < prev {
					t.Fatalf("Next(%d) = %v, shorter than Next(%d) = %v", n, d, n-1, prev)
				}
				prev = d
			}
			for _, n := range []int{tt.e.Attempts - 2, tt.e.Attempts - 1} {
				// Reflection lands within a few ns of the exact value.
				if d, _ := tt.e.Next(n); d < tt.want-10 || d > tt.want {
					t.Fatalf("Next(%d) = %v, want %v", n, d, tt.want)
				}
			}
		})
	}
}

func TestExponentialJitter(t *testing.T) {
	t.Parallel()
	const draws = 2000
	e := retry.Exponential{Base: time.Second, Cap: time.Minute, Attempts: 12, Jitter: 0.25, Rand: seeded(3)}
	nominal := func(n int) time.Duration { return min(time.Second<<(n-1), time.Minute) }
	atCap := 0
	for n := 1; n < e.Attempts; n++ {
		lo, hi := time.Duration(math.MaxInt64), time.Duration(0)
		for range draws {
			d, _ := e.Next(n)
			if !within(d, nominal(n), 0.25) || d > e.Cap {
				t.Fatalf("Next(%d) = %v, want %v ±25%% and ≤ Cap %v", n, d, nominal(n), e.Cap)
			}
			if d == e.Cap {
				atCap++
			}
			lo, hi = min(lo, d), max(hi, d)
		}
		// The draws must reach both sides of the nominal delay (or, at the
		// cap, well below it): jitter that is not applied would pass the
		// bounds above.
		if lo > nominal(n)*4/5 {
			t.Errorf("attempt %d: lowest of %d draws is %v, nominal %v", n, draws, lo, nominal(n))
		}
		if nominal(n)*6/5 <= e.Cap && hi < nominal(n)*6/5 {
			t.Errorf("attempt %d: highest of %d draws is %v, nominal %v", n, draws, hi, nominal(n))
		}
	}
	// Capped attempts must not pile up on exactly Cap (that would retry them
	// in lockstep); reflection spreads them below it.
	if atCap > 5 {
		t.Errorf("%d draws landed exactly on Cap", atCap)
	}

	t.Run("extremes", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name string
			e    retry.Exponential
			want []time.Duration
		}{
			{"lowest draw", retry.Exponential{Base: 4 * time.Second, Attempts: 3, Jitter: 0.25, Rand: fixed(0)}, []time.Duration{3 * time.Second, 6 * time.Second}},
			{"midpoint", retry.Exponential{Base: 4 * time.Second, Attempts: 3, Jitter: 0.25, Rand: fixed(0.5)}, []time.Duration{4 * time.Second, 8 * time.Second}},
			{"lowest draw at cap", retry.Exponential{Base: 4 * time.Second, Cap: 4 * time.Second, Attempts: 3, Jitter: 0.25, Rand: fixed(0)}, []time.Duration{3 * time.Second, 3 * time.Second}},
			{"highest draw at cap reflects", retry.Exponential{Base: 4 * time.Second, Cap: 4 * time.Second, Attempts: 2, Jitter: 0.25, Rand: fixed(0.75)}, []time.Duration{3500 * time.Millisecond}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				if got := nextAll(t, tt.e); !slices.Equal(got, tt.want) {
					t.Fatalf("delays = %v, want %v", got, tt.want)
				}
			})
		}
	})
}

// Next does not require a validated policy, but it must never return a
// negative delay.
func TestExponentialInvalidNeverNegative(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		e    retry.Exponential
	}{
		{"negative base", retry.Exponential{Base: -time.Second, Attempts: 5}},
		{"negative factor", retry.Exponential{Base: time.Second, Factor: -2, Attempts: 5}},
		{"NaN factor", retry.Exponential{Base: time.Second, Factor: math.NaN(), Attempts: 5}},
		{"fractional factor", retry.Exponential{Base: time.Second, Factor: 1e-300, Attempts: 5}},
		{"negative cap", retry.Exponential{Base: time.Second, Cap: -time.Second, Attempts: 5}},
		{"jitter ≥ 1", retry.Exponential{Base: time.Second, Attempts: 5, Jitter: 9, Rand: fixed(0)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for n, d := range nextAll(t, tt.e) {
				if d < 0 {
					t.Fatalf("Next(%d) = %v", n+1, d)
				}
			}
		})
	}
}

func TestExponentialValidate(t *testing.T) {
	t.Parallel()
	valid := retry.Exponential{Base: time.Second, Attempts: 5}
	with := func(f func(*retry.Exponential)) retry.Exponential { e := valid; f(&e); return e }
	tests := []struct {
		name  string
		e     retry.Exponential
		field string // "" means valid
	}{
		{"minimal", valid, ""},
		{"single attempt", with(func(e *retry.Exponential) { e.Attempts = 1 }), ""},
		{"factor 1", with(func(e *retry.Exponential) { e.Factor = 1 }), ""},
		{"factor 1e9", with(func(e *retry.Exponential) { e.Factor = 1e9 }), ""},
		{"cap and jitter", with(func(e *retry.Exponential) { e.Cap = time.Hour; e.Jitter = 0.25 }), ""},
		{"zero attempts", with(func(e *retry.Exponential) { e.Attempts = 0 }), "Attempts"},
		{"negative attempts", with(func(e *retry.Exponential) { e.Attempts = -1 }), "Attempts"},
		{"zero base", with(func(e *retry.Exponential) { e.Base = 0 }), "Base"},
		{"negative base", with(func(e *retry.Exponential) { e.Base = -time.Second }), "Base"},
		{"factor below 1", with(func(e *retry.Exponential) { e.Factor = 0.5 }), "Factor"},
		{"negative factor", with(func(e *retry.Exponential) { e.Factor = -2 }), "Factor"},
		{"NaN factor", with(func(e *retry.Exponential) { e.Factor = math.NaN() }), "Factor"},
		{"infinite factor", with(func(e *retry.Exponential) { e.Factor = math.Inf(1) }), "Factor"},
		{"negative cap", with(func(e *retry.Exponential) { e.Cap = -time.Second }), "Cap"},
		{"negative jitter", with(func(e *retry.Exponential) { e.Jitter = -0.25 }), "Jitter"},
		{"jitter 1", with(func(e *retry.Exponential) { e.Jitter = 1 }), "Jitter"},
		{"first problem wins", retry.Exponential{}, "Attempts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			checkValidate(t, tt.e.Validate(), tt.field)
		})
	}
}
