package outbox

import "time"

// A claim leases a delivery for RelayConfig.Lease, timed by the database's
// clock from the moment the claim statement runs; only then may another
// relay take the delivery over. The relay times the same lease on its own
// monotonic clock from just before it sent the statement, so the end it
// sees is never later than the database's, however far the two clocks'
// readings are apart.
//
// Every lease ends with a safety margin, leaseMargin, in which its holder
// has no request open: a request starts only while Timeout still fits
// before the margin (leaseTimes.startBy), and whatever ran before it (a
// Catalog converter, a Cipher asking a key service, a stalled machine) is
// checked again just before sending, and the request is cut when the
// margin begins (leaseTimes.cutOff) whatever delayed it. So when another
// relay takes the delivery over, the previous holder's request has been
// over for at least the margin: time for the receiver to notice the
// closed connection before the next request arrives, and for the holder
// to write the outcome (the completer gives up at the lease's end).
//
// The margin does not cover a holder that is itself frozen mid-request (a
// paused VM or process keeps its connections open, and its timers do not
// run), nor a database crash that forgets the claim itself (relay commits
// are asynchronous unless Config.SyncRelayCommits): receivers deduplicate
// by webhook-id for those. A retry after a failed attempt waits for the
// retry policy's delay from the attempt's end instead (see Relay.fail).
//
// Anything that delivers under a lease (a relay; a broker's consumer under
// its acknowledgement deadline) takes its times from leaseWindow.

// leaseMarginDivisor makes the margin a fifth of the lease: 6 s of the
// default 30 s lease.
const leaseMarginDivisor = 5

// leaseMargin is the end part of a lease of the given length in which its
// holder has no request open (see above). RelayConfig.validate requires
// Timeout to fit in the lease less the margin; a relay's clock further
// than the margin from the database's is warned about (clockcheck.go).
func leaseMargin(lease time.Duration) time.Duration { return lease / leaseMarginDivisor }

// leaseTimes are one claim's lease on the local monotonic clock.
type leaseTimes struct {
	// startBy is the last moment a request may start: it can then run its
	// whole Timeout and end by cutOff.
	startBy time.Time
	// cutOff is when any request still open is cut: leaseMargin before
	// end.
	cutOff time.Time
	// end is the lease's end, no later than the database's.
	end time.Time
}

// leaseWindow returns the times of a lease of length lease taken by a
// statement sent at sent (read from time.Now, before sending), for
// requests bounded by timeout.
func leaseWindow(sent time.Time, lease, timeout time.Duration) leaseTimes {
	end := sent.Add(lease)
	cut := end.Add(-leaseMargin(lease))
	return leaseTimes{startBy: cut.Add(-timeout), cutOff: cut, end: end}
}
