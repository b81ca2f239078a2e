package retry_test

import (
	"fmt"
	"time"

	"github.com/txhook/txhook/retry"
)

func ExampleDefault() {
	s := retry.Default()
	s.Rand = func() float64 { return 0.5 } // the middle of the ±25% jitter, for a stable output

	var at time.Duration
	fmt.Printf("attempt 1 at T+%v\n", at)
	for n := 1; ; n++ {
		delay, ok := s.Next(n)
		if !ok {
			fmt.Printf("after attempt %d of %d: dead-letter\n", n, s.MaxAttempts())
			break
		}
		at += delay
		fmt.Printf("attempt %d at T+%v (wait %v)\n", n+1, at, delay)
	}
	// Output:
	// attempt 1 at T+0s
	// attempt 2 at T+10s (wait 10s)
	// attempt 3 at T+30s (wait 20s)
	// attempt 4 at T+1m0s (wait 30s)
	// attempt 5 at T+5m0s (wait 4m0s)
	// attempt 6 at T+15m0s (wait 10m0s)
	// attempt 7 at T+1h0m0s (wait 45m0s)
	// attempt 8 at T+6h0m0s (wait 5h0m0s)
	// attempt 9 at T+24h0m0s (wait 18h0m0s)
	// after attempt 9 of 9: dead-letter
}

func ExampleExponential() {
	e := retry.Exponential{Base: time.Second, Cap: time.Minute, Attempts: 9}
	if err := e.Validate(); err != nil {
		panic(err)
	}
	for n := 1; n < e.MaxAttempts(); n++ {
		delay, _ := e.Next(n)
		fmt.Print(delay, " ")
	}
	fmt.Println()
	// Output: 1s 2s 4s 8s 16s 32s 1m0s 1m0s
}

func ExampleIntervals() {
	// Standard Webhooks' recommended waits, with Svix-style ±20% jitter.
	s := retry.Intervals(5*time.Second, 5*time.Minute, 30*time.Minute, 2*time.Hour, 5*time.Hour, 10*time.Hour, 10*time.Hour)
	s.Jitter = 0.2
	fmt.Println(s.MaxAttempts(), s.Validate())

	bad := retry.Intervals(time.Minute, 0)
	fmt.Println(bad.Validate())
	// Output:
	// 8 <nil>
	// retry: invalid policy: Offsets[2] (1m0s) must be after Offsets[1] (1m0s)
}

func ExampleWithRetryAfter() {
	now := time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)
	policyDelay := 30 * time.Second

	for _, header := range []string{"", "10", "120", "86400", "Sun, 01 Mar 2026 12:05:00 GMT"} {
		hint, _ := retry.ParseRetryAfter(header, now)
		fmt.Printf("%q -> %v\n", header, retry.WithRetryAfter(policyDelay, hint, time.Hour))
	}
	// Output:
	// "" -> 30s
	// "10" -> 30s
	// "120" -> 2m0s
	// "86400" -> 1h0m0s
	// "Sun, 01 Mar 2026 12:05:00 GMT" -> 5m0s
}

// Span is how long a policy keeps a failing delivery before it is
// dead-lettered, without jitter: what a relay waits by default before it
// dead-letters a delivery that the target rules refuse
// (outbox.RelayConfig.RefusedLimit).
func ExampleSpan() {
	fmt.Println(retry.Span(retry.Default()))
	fmt.Println(retry.Span(retry.Intervals(time.Second, 5*time.Second, 30*time.Second)))
	fmt.Println(retry.Span(retry.Exponential{Base: time.Minute, Cap: time.Hour, Attempts: 10}))
	// Output:
	// 24h0m0s
	// 36s
	// 4h3m0s
}
