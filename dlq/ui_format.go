package dlq

import (
	"fmt"
	"time"

	"github.com/txhook/txhook/internal/webui"
	"github.com/txhook/txhook/outbox"
)

// path is the URL of a page of the UI: the prefix and the escaped parts.
func (u *ui) path(parts ...any) string { return webui.Path(u.cfg.Prefix, parts...) }

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
	return webui.Roughly(d, webui.Units{S: "s", M: "m", H: "h", D: "d"})
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
	return webui.Status(status)
}

// deadReason names why a delivery was dead-lettered (Entry.Reason).
func deadReason(r string) string {
	switch r {
	case outbox.DeadReasonRefused:
		return "refused by target rules"
	case outbox.DeadReasonFailed:
		return "attempts failed"
	}
	return r
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
