// Package retry decides when a failed webhook delivery is tried again.
//
// It is pure: schedules and jitter, no I/O, no clock. The relay asks a
// [Policy] for the delay after each failed attempt, persists the resulting
// time, and dead-letters the event when the policy says there is no next
// attempt.
//
// # Why this schedule
//
// [Default] is T+0, 10s, 30s, 1m, 5m, 15m, 1h, 6h, 24h: nine attempts spread
// over a day, each gap jittered by ±25%. The shape answers two failure modes
// at once.
//
// Too aggressive, and the sender becomes the outage. An endpoint that just
// came back from a crash gets every queued event retried at once, several
// times a minute, and falls over again; without jitter, all deliveries that
// failed together retry together, forever in lockstep.
//
// Too gentle, and events are lost to routine operations. A ten-minute deploy
// or a bad config push must not exhaust the retries: the early attempts
// (10s, 30s, 1m) catch blips, 5m and 15m cover a deploy, and the hourly and
// daily tail gives a human time to notice and fix the endpoint before the
// event is dead-lettered.
//
// Other providers pick other points on the same curve, so the schedule is
// configurable: [Intervals] takes the waits between attempts, [Exponential]
// grows them geometrically, and any type with Next and MaxAttempts is a
// [Policy].
//
// # Use
//
// Delays are measured from the end of the failed attempt: when its response
// arrived, or when it failed or was cut at the timeout. A receiver that is
// slow, or still working on a request the sender gave up on, so gets the
// whole pause before the next request; counted from the start, any attempt
// that lasts longer than the next delay (a timeout, with a short first
// interval) would be retried at once, while the receiver may still be
// running the first. A Retry-After hint counts from the response too, as
// HTTP defines it:
//
//	policy := retry.Default()
//	if err := policy.Validate(); err != nil { // once, at configuration time
//		return err
//	}
//
//	// attempt n (1-based) has failed; endedAt is when its response came
//	// (or the timeout or error ended it):
//	delay, ok := policy.Next(n)
//	if !ok {
//		return deadLetter(event) // attempt n was the last
//	}
//	hint, _ := retry.ParseRetryAfter(resp.Header.Get("Retry-After"), endedAt)
//	event.NextRetryAt = endedAt.Add(retry.WithRetryAfter(delay, hint, time.Hour))
//
// The schedule's offsets ([Schedule], [Default]) are therefore the nominal
// times of attempts against a receiver that answers at once; a slow one
// shifts every later attempt by the time its requests took.
//
// Policies are values that are safe for concurrent use. Randomness is
// injectable through the Rand field (a func returning draws in [0,1)), so
// tests can pin the jitter; a Rand you supply is called concurrently and must
// be safe for that.
package retry
