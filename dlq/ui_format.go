package dlq

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/txhook/txhook/outbox"
)

// path is the URL of a page of the UI: the prefix and the escaped parts.
func (u *ui) path(parts ...any) string {
	var b strings.Builder
	b.WriteString(u.cfg.Prefix)
	for i, p := range parts {
		if i > 0 {
			b.WriteByte('/')
		}
		b.WriteString(url.PathEscape(fmt.Sprint(p)))
	}
	return b.String()
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// ago says how long before now t was, roughly.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "in " + roughly(-d)
	case d < time.Second:
		return "just now"
	}
	return roughly(d) + " ago"
}

func roughly(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 24*time.Hour:
		h, m := int(d/time.Hour), int(d%time.Hour/time.Minute)
		if m == 0 {
			return fmt.Sprintf("%dh", h)
		}
		return fmt.Sprintf("%dh %dm", h, m)
	}
	days, h := int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour)
	if h == 0 {
		return fmt.Sprintf("%dd", days)
	}
	return fmt.Sprintf("%dd %dh", days, h)
}

// span names a window: "24 hours", "7 days".
func span(d time.Duration) string {
	switch {
	case d >= 48*time.Hour && d%(24*time.Hour) == 0:
		return fmt.Sprintf("%d days", d/(24*time.Hour))
	case d == time.Hour:
		return "hour"
	case d%time.Hour == 0:
		return fmt.Sprintf("%d hours", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%d minutes", d/time.Minute)
	}
	return d.String()
}

// reason says why an attempt failed: its error, which names the status
// when there was one.
func reason(status int, err string) string {
	if err != "" {
		return err
	}
	return fmtStatus(status)
}

func fmtDur(d time.Duration) string {
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

func fmtStatus(s int) string {
	if s == 0 {
		return "—"
	}
	return fmt.Sprint(s)
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// healthClass sums an endpoint's health up in one word, for its badge.
func healthClass(h outbox.Health) string {
	switch {
	case !h.Enabled:
		return "disabled"
	case h.ConsecutiveFailures >= 3 || h.Attempts > 0 && h.SuccessRate < 0.9:
		return "failing"
	case h.ConsecutiveFailures > 0 || h.Attempts > 0 && h.SuccessRate < 0.99:
		return "degraded"
	case h.Attempts == 0:
		return "idle"
	}
	return "healthy"
}
