package retry_test

import (
	"math"
	"testing"
	"time"

	"github.com/txhook/txhook/retry"
)

func TestWithRetryAfter(t *testing.T) {
	t.Parallel()
	const m = time.Minute
	tests := []struct {
		name                    string
		policy, hint, max, want time.Duration
	}{
		{"no hint", 10 * time.Second, 0, time.Hour, 10 * time.Second},
		{"negative hint is no hint", 10 * time.Second, -5 * m, time.Hour, 10 * time.Second},
		{"hint sooner than policy", 10 * m, 30 * time.Second, time.Hour, 10 * m},
		{"hint equal to policy", 10 * m, 10 * m, time.Hour, 10 * m},
		{"hint between policy and max", 10 * time.Second, 2 * m, time.Hour, 2 * m},
		{"hint equal to max", 10 * time.Second, time.Hour, time.Hour, time.Hour},
		{"hint above max", 10 * time.Second, 3 * time.Hour, time.Hour, time.Hour},
		{"largest hint", 10 * time.Second, math.MaxInt64, time.Hour, time.Hour},
		{"policy above max wins over hint", 6 * time.Hour, 12 * time.Hour, time.Hour, 6 * time.Hour},
		{"max 0 ignores hints", 10 * time.Second, 2 * m, 0, 10 * time.Second},
		{"negative max ignores hints", 10 * time.Second, 2 * m, -time.Hour, 10 * time.Second},
		{"zero policy takes the hint", 0, 2 * m, time.Hour, 2 * m},
		{"negative policy, no hint, is 0", -time.Second, 0, time.Hour, 0},
		{"negative policy and max, with hint, is 0", -time.Second, time.Second, -time.Hour, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := retry.WithRetryAfter(tt.policy, tt.hint, tt.max); got != tt.want {
				t.Fatalf("WithRetryAfter(%v, %v, %v) = %v, want %v", tt.policy, tt.hint, tt.max, got, tt.want)
			}
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	// A Sunday, so the weekday names below are right.
	now := time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		v      string
		now    time.Time
		want   time.Duration
		wantOK bool
	}{
		{"seconds", "120", now, 2 * time.Minute, true},
		{"seconds with spaces", " \t120 ", now, 2 * time.Minute, true},
		{"zero seconds", "0", now, 0, true},
		{"leading zeros", "007", now, 7 * time.Second, true},
		{"largest representable seconds", "9223372036", now, 9223372036 * time.Second, true},
		{"one more second saturates", "9223372037", now, math.MaxInt64, true},
		{"huge seconds saturate", "99999999999999999999999999999999999999", now, math.MaxInt64, true},
		{"IMF-fixdate", "Sun, 01 Mar 2026 12:01:30 GMT", now, 90 * time.Second, true},
		{"RFC 850 date", "Sunday, 01-Mar-26 12:01:30 GMT", now, 90 * time.Second, true},
		{"asctime date", "Sun Mar  1 12:01:30 2026", now, 90 * time.Second, true},
		{"date is relative to now", "Sun, 01 Mar 2026 12:01:30 GMT", now.Add(30 * time.Second), time.Minute, true},
		{"date with now in another zone", "Sun, 01 Mar 2026 12:01:30 GMT", now.In(time.FixedZone("UTC+5", 5*3600)), 90 * time.Second, true},
		{"date equal to now", "Sun, 01 Mar 2026 12:00:00 GMT", now, 0, true},
		{"far-future date saturates", "Fri, 31 Dec 9999 23:59:59 GMT", now, math.MaxInt64, true},
		{"date before a far-past now saturates", "Sun, 01 Mar 2026 12:00:00 GMT", time.Date(-292277022399, 1, 1, 0, 0, 0, 0, time.UTC), math.MaxInt64, true},
		{"empty", "", now, 0, false},
		{"blank", "   ", now, 0, false},
		{"negative seconds", "-5", now, 0, false},
		{"plus sign", "+5", now, 0, false},
		{"fraction", "1.5", now, 0, false},
		{"unit suffix", "120s", now, 0, false},
		{"Go duration", "2m", now, 0, false},
		{"garbage", "soon, please", now, 0, false},
		{"past date", "Sun, 01 Mar 2026 11:59:59 GMT", now, 0, false},
		{"date in another zone", "Sun, 01 Mar 2026 12:01:30 PST", now, 0, false},
		{"impossible date", "Sun, 32 Mar 2026 12:01:30 GMT", now, 0, false},
		{"date without zone", "Sun, 01 Mar 2026 12:01:30", now, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := retry.ParseRetryAfter(tt.v, tt.now)
			if got != tt.want || ok != tt.wantOK {
				t.Fatalf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tt.v, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}
