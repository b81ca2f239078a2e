package retry_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/txhook/txhook/retry"
)

// almostOne is the largest float64 below 1, the top of Rand's range.
var almostOne = math.Nextafter(1, 0)

func fixed(r float64) func() float64 { return func() float64 { return r } }

// seeded returns a deterministic Rand for a single goroutine.
func seeded(seed uint64) func() float64 { return rand.New(rand.NewPCG(seed, seed)).Float64 }

// articleOffsets is the schedule from the source article.
var articleOffsets = []time.Duration{
	0, 10 * time.Second, 30 * time.Second, time.Minute, 5 * time.Minute,
	15 * time.Minute, time.Hour, 6 * time.Hour, 24 * time.Hour,
}

// nextAll calls Next from attempt 1 until ok is false and returns the delays.
func nextAll(t *testing.T, p retry.Policy) []time.Duration {
	t.Helper()
	var out []time.Duration
	for n := 1; ; n++ {
		d, ok := p.Next(n)
		if !ok {
			break
		}
		if n >= p.MaxAttempts() {
			t.Fatalf("Next(%d) ok with MaxAttempts %d", n, p.MaxAttempts())
		}
		out = append(out, d)
	}
	if want := max(p.MaxAttempts()-1, 0); len(out) != want {
		t.Fatalf("got %d retries, want MaxAttempts-1 = %d", len(out), want)
	}
	return out
}

func within(d, nominal time.Duration, jitter float64) bool {
	lo := time.Duration(float64(nominal) * (1 - jitter))
	hi := time.Duration(float64(nominal) * (1 + jitter))
	return d >= lo && d <= hi
}

func TestDefault(t *testing.T) {
	t.Parallel()
	s := retry.Default()
	if err := s.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if got := s.MaxAttempts(); got != 9 {
		t.Fatalf("MaxAttempts = %d, want 9", got)
	}
	if !slices.Equal(s.Offsets, articleOffsets) {
		t.Fatalf("Offsets = %v, want %v", s.Offsets, articleOffsets)
	}
	if s.Jitter != 0.25 {
		t.Fatalf("Jitter = %v, want 0.25", s.Jitter)
	}
	for _, n := range []int{math.MinInt, -1, 0, 9, 10, math.MaxInt} {
		if d, ok := s.Next(n); ok || d != 0 {
			t.Errorf("Next(%d) = %v, %v; want 0, false", n, d, ok)
		}
	}
	// Default hands out a fresh slice: one caller's edit cannot leak.
	s.Offsets[1] = time.Hour
	if got := retry.Default().Offsets[1]; got != 10*time.Second {
		t.Fatalf("Default shares its Offsets: got %v after a caller's edit", got)
	}
}

func TestDefaultMidpointIsTheArticle(t *testing.T) {
	t.Parallel()
	s := retry.Default()
	s.Rand = fixed(0.5)
	gaps := nextAll(t, s)
	want := []time.Duration{
		10 * time.Second, 20 * time.Second, 30 * time.Second, 4 * time.Minute,
		10 * time.Minute, 45 * time.Minute, 5 * time.Hour, 18 * time.Hour,
	}
	if !slices.Equal(gaps, want) {
		t.Fatalf("gaps = %v, want %v", gaps, want)
	}
	offsets := []time.Duration{0}
	for _, g := range gaps {
		offsets = append(offsets, offsets[len(offsets)-1]+g)
	}
	if !slices.Equal(offsets, articleOffsets) {
		t.Fatalf("cumulative offsets = %v, want %v", offsets, articleOffsets)
	}
}

func TestDefaultJitterExtremes(t *testing.T) {
	t.Parallel()
	nominal := []time.Duration{
		10 * time.Second, 20 * time.Second, 30 * time.Second, 4 * time.Minute,
		10 * time.Minute, 45 * time.Minute, 5 * time.Hour, 18 * time.Hour,
	}
	tests := []struct {
		name string
		r    float64
		// check is the exact-side assertion that proves jitter was applied.
		check func(got, nominal time.Duration) bool
	}{
		{"lowest draw is exactly -25%", 0, func(got, n time.Duration) bool { return got == n*3/4 }},
		{"highest draw is above nominal, at most +25%", almostOne, func(got, n time.Duration) bool { return got > n && got <= n*5/4 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := retry.Default()
			s.Rand = fixed(tt.r)
			gaps := nextAll(t, s)
			for i, g := range gaps {
				if !within(g, nominal[i], 0.25) || !tt.check(g, nominal[i]) {
					t.Errorf("gap after attempt %d = %v, nominal %v", i+1, g, nominal[i])
				}
			}
		})
	}
}

func TestDefaultTotalStaysWithinADayPlusMinus25Percent(t *testing.T) {
	t.Parallel()
	const draws = 10_000
	tests := []struct {
		name string
		rand func() float64
	}{
		{"seeded", seeded(1)},
		{"default source", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := retry.Default()
			s.Rand = tt.rand
			lo, hi := 18*time.Hour, 30*time.Hour
			minSum, maxSum := time.Duration(math.MaxInt64), time.Duration(0)
			var total float64
			for range draws {
				var sum time.Duration
				for n, g := range nextAll(t, s) {
					nominal := articleOffsets[n+1] - articleOffsets[n]
					if !within(g, nominal, 0.25) {
						t.Fatalf("gap after attempt %d = %v, nominal %v", n+1, g, nominal)
					}
					sum += g
				}
				if sum < lo || sum > hi {
					t.Fatalf("sum of gaps = %v, want within [%v, %v]", sum, lo, hi)
				}
				minSum, maxSum = min(minSum, sum), max(maxSum, sum)
				total += float64(sum)
			}
			// The draws must actually spread (a Rand that is ignored would
			// pass the bounds above) and centre on the article's 24h.
			if minSum > 22*time.Hour || maxSum < 26*time.Hour {
				t.Errorf("sums span only [%v, %v]; jitter is not spreading", minSum, maxSum)
			}
			if mean := time.Duration(total / draws); mean < 24*time.Hour-10*time.Minute || mean > 24*time.Hour+10*time.Minute {
				t.Errorf("mean sum = %v, want 24h ± 10m", mean)
			}
		})
	}
}

func TestIntervals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		delays  []time.Duration
		offsets []time.Duration
		valid   bool
	}{
		{"none: a single attempt", nil, []time.Duration{0}, true},
		{"one retry", []time.Duration{time.Minute}, []time.Duration{0, time.Minute}, true},
		{"the article's schedule as waits",
			[]time.Duration{10 * time.Second, 20 * time.Second, 30 * time.Second, 4 * time.Minute, 10 * time.Minute, 45 * time.Minute, 5 * time.Hour, 18 * time.Hour},
			articleOffsets, true},
		{"zero wait", []time.Duration{time.Second, 0}, []time.Duration{0, time.Second, time.Second}, false},
		{"negative wait", []time.Duration{-time.Second}, []time.Duration{0, -time.Second}, false},
		{"overflow saturates", []time.Duration{math.MaxInt64, time.Hour}, []time.Duration{0, math.MaxInt64, math.MaxInt64}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := retry.Intervals(tt.delays...)
			if !slices.Equal(s.Offsets, tt.offsets) {
				t.Fatalf("Offsets = %v, want %v", s.Offsets, tt.offsets)
			}
			if s.Jitter != 0 || s.Rand != nil {
				t.Fatalf("Intervals set Jitter %v / Rand %v; want none", s.Jitter, s.Rand != nil)
			}
			err := s.Validate()
			if tt.valid != (err == nil) {
				t.Fatalf("Validate = %v, want valid %v", err, tt.valid)
			}
			if !tt.valid {
				return
			}
			if got := nextAll(t, s); !slices.Equal(got, tt.delays) {
				t.Fatalf("delays = %v, want %v", got, tt.delays)
			}
		})
	}
}

func TestIntervalsWithJitter(t *testing.T) {
	t.Parallel()
	s := retry.Intervals(time.Second, 10*time.Second)
	s.Jitter, s.Rand = 0.5, fixed(0)
	if got, want := nextAll(t, s), []time.Duration{500 * time.Millisecond, 5 * time.Second}; !slices.Equal(got, want) {
		t.Fatalf("delays = %v, want %v", got, want)
	}
}

// Next does not require a validated schedule, but whatever it is given it
// must never return a negative delay: the relay would schedule into the past.
func TestScheduleNextNeverNegative(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		s    retry.Schedule
		want []time.Duration
	}{
		{"decreasing offsets", retry.Schedule{Offsets: []time.Duration{0, time.Hour, time.Minute}}, []time.Duration{time.Hour, 0}},
		{"gap overflows", retry.Schedule{Offsets: []time.Duration{math.MinInt64, math.MaxInt64}}, []time.Duration{math.MaxInt64}},
		{"huge gap with upward jitter", retry.Schedule{Offsets: []time.Duration{0, math.MaxInt64}, Jitter: 0.5, Rand: fixed(almostOne)}, []time.Duration{math.MaxInt64}},
		{"jitter ≥ 1", retry.Schedule{Offsets: []time.Duration{0, time.Hour}, Jitter: 7, Rand: fixed(0)}, []time.Duration{0}},
		{"NaN jitter means none", retry.Schedule{Offsets: []time.Duration{0, time.Hour}, Jitter: math.NaN(), Rand: fixed(0)}, []time.Duration{time.Hour}},
		{"negative jitter means none", retry.Schedule{Offsets: []time.Duration{0, time.Hour}, Jitter: -0.5, Rand: fixed(0)}, []time.Duration{time.Hour}},
		{"Rand below range clamps to 0", retry.Schedule{Offsets: []time.Duration{0, time.Hour}, Jitter: 0.5, Rand: fixed(-3)}, []time.Duration{30 * time.Minute}},
		{"Rand above range clamps to 1", retry.Schedule{Offsets: []time.Duration{0, time.Hour}, Jitter: 0.5, Rand: fixed(3)}, []time.Duration{90 * time.Minute}},
		{"NaN Rand means no jitter", retry.Schedule{Offsets: []time.Duration{0, time.Hour}, Jitter: 0.5, Rand: fixed(math.NaN())}, []time.Duration{time.Hour}},
		{"empty", retry.Schedule{}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := nextAll(t, tt.s); !slices.Equal(got, tt.want) {
				t.Fatalf("delays = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestScheduleValidate(t *testing.T) {
	t.Parallel()
	ok := []time.Duration{0, time.Second, time.Minute}
	tests := []struct {
		name  string
		s     retry.Schedule
		field string // "" means valid
	}{
		{"default", retry.Default(), ""},
		{"single attempt", retry.Schedule{Offsets: []time.Duration{0}}, ""},
		{"jitter just below 1", retry.Schedule{Offsets: ok, Jitter: almostOne}, ""},
		{"nil offsets", retry.Schedule{}, "Offsets"},
		{"empty offsets", retry.Schedule{Offsets: []time.Duration{}}, "Offsets"},
		{"first offset not zero", retry.Schedule{Offsets: []time.Duration{time.Second, time.Minute}}, "Offsets[0]"},
		{"negative first offset", retry.Schedule{Offsets: []time.Duration{-time.Second, time.Minute}}, "Offsets[0]"},
		{"repeated offset", retry.Schedule{Offsets: []time.Duration{0, time.Second, time.Second}}, "Offsets[2]"},
		{"decreasing offset", retry.Schedule{Offsets: []time.Duration{0, time.Minute, time.Second}}, "Offsets[2]"},
		{"repeated zero", retry.Schedule{Offsets: []time.Duration{0, 0}}, "Offsets[1]"},
		{"negative jitter", retry.Schedule{Offsets: ok, Jitter: -0.1}, "Jitter"},
		{"jitter 1", retry.Schedule{Offsets: ok, Jitter: 1}, "Jitter"},
		{"jitter above 1", retry.Schedule{Offsets: ok, Jitter: 1.5}, "Jitter"},
		{"NaN jitter", retry.Schedule{Offsets: ok, Jitter: math.NaN()}, "Jitter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			checkValidate(t, tt.s.Validate(), tt.field)
		})
	}
}

// checkValidate asserts err is nil when field is "", and otherwise a
// *retry.PolicyError for that field that matches ErrInvalidPolicy.
func checkValidate(t *testing.T, err error, field string) {
	t.Helper()
	if field == "" {
		if err != nil {
			t.Fatalf("Validate = %v, want nil", err)
		}
		return
	}
	if !errors.Is(err, retry.ErrInvalidPolicy) {
		t.Fatalf("Validate = %v, want an error matching ErrInvalidPolicy", err)
	}
	var pe *retry.PolicyError
	if !errors.As(err, &pe) {
		t.Fatalf("Validate = %T, want *retry.PolicyError", err)
	}
	if pe.Field != field || pe.Reason == "" {
		t.Fatalf("PolicyError = {%q, %q}, want field %q with a reason", pe.Field, pe.Reason, field)
	}
}

// Run with -race: policies are shared by every delivery goroutine.
func TestConcurrentNext(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(7, 7))
	lockedRand := func() float64 { mu.Lock(); defer mu.Unlock(); return r.Float64() }
	withLocked := retry.Default()
	withLocked.Rand = lockedRand

	policies := []struct {
		name    string
		p       retry.Policy
		nominal func(n int) time.Duration
	}{
		{"Default", retry.Default(), func(n int) time.Duration { return articleOffsets[n] - articleOffsets[n-1] }},
		{"Default with a locked Rand", withLocked, func(n int) time.Duration { return articleOffsets[n] - articleOffsets[n-1] }},
		{"Exponential", retry.Exponential{Base: time.Second, Attempts: 9, Jitter: 0.25}, func(n int) time.Duration { return time.Second << (n - 1) }},
	}
	for _, pp := range policies {
		t.Run(pp.name, func(t *testing.T) {
			t.Parallel()
			var wg sync.WaitGroup
			errs := make(chan string, 8)
			for range 8 {
				wg.Go(func() {
					for i := range 2000 {
						n := i%(pp.p.MaxAttempts()-1) + 1
						d, ok := pp.p.Next(n)
						if !ok || !within(d, pp.nominal(n), 0.25) {
							select {
							case errs <- "out of bounds":
							default:
							}
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for e := range errs {
				t.Fatal(e)
			}
		})
	}
}

// Span is the schedule without its jitter: the source's 24 hours for
// Default, the sum of the capped delays for an Exponential, the drawn
// delays for any other policy.
func TestSpan(t *testing.T) {
	if got := retry.Span(retry.Default()); got != 24*time.Hour {
		t.Errorf("retry.Span(retry.Default()) = %v, want 24h", got)
	}
	d := retry.Default()
	if got := retry.Span(&d); got != 24*time.Hour {
		t.Errorf("retry.Span(&retry.Default()) = %v, want 24h", got)
	}
	e := retry.Exponential{Base: time.Second, Factor: 2, Cap: 5 * time.Second, Attempts: 5, Jitter: 0.5}
	if got, want := retry.Span(e), (1+2+4+5)*time.Second; got != want {
		t.Errorf("retry.Span(%+v) = %v, want %v", e, got, want)
	}
	if got := retry.Span(retry.Schedule{Offsets: []time.Duration{0}}); got != 0 {
		t.Errorf("Span of one attempt = %v, want 0", got)
	}
	huge := retry.Exponential{Base: time.Hour, Factor: 10, Attempts: 100}
	if got := retry.Span(huge); got != math.MaxInt64 {
		t.Errorf("retry.Span(%+v) = %v, want the largest Duration", huge, got)
	}
	if got := retry.Span(everyD{3 * time.Minute, 4}); got != 9*time.Minute {
		t.Errorf("retry.Span(everyD) = %v, want 9m", got)
	}
}

// everyD is a Policy of n attempts d apart.
type everyD struct {
	d time.Duration
	n int
}

func (f everyD) Next(attempt int) (time.Duration, bool) { return f.d, attempt >= 1 && attempt < f.n }
func (f everyD) MaxAttempts() int                       { return f.n }
