package webui

import (
	"fmt"
	"time"
)

// Time formats t in UTC to the second; "—" when zero.
func Time(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// Duration formats a latency: µs, ms with one decimal, or s with two; "—"
// when not positive.
func Duration(d time.Duration) string {
	switch {
	case d <= 0:
		return "—"
	case d < time.Millisecond:
		return fmt.Sprintf("%d µs", d.Microseconds())
	case d < time.Second:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

// Status formats an HTTP status; "—" for 0 (no response).
func Status(s int) string {
	if s == 0 {
		return "—"
	}
	return fmt.Sprint(s)
}

// Units names the units Roughly writes; English is "s", "m", "h", "d".
type Units struct{ S, M, H, D string }

// Roughly writes d in its two largest units: "45s", "3m", "2h 5m", "1d 3h".
func Roughly(d time.Duration, u Units) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%d%s", int(d/time.Second), u.S)
	case d < time.Hour:
		return fmt.Sprintf("%d%s", int(d/time.Minute), u.M)
	case d < 24*time.Hour:
		h, m := int(d/time.Hour), int(d%time.Hour/time.Minute)
		if m == 0 {
			return fmt.Sprintf("%d%s", h, u.H)
		}
		return fmt.Sprintf("%d%s %d%s", h, u.H, m, u.M)
	}
	days, h := int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour)
	if h == 0 {
		return fmt.Sprintf("%d%s", days, u.D)
	}
	return fmt.Sprintf("%d%s %d%s", days, u.D, h, u.H)
}
