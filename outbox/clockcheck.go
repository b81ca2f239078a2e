package outbox

import (
	"context"
	"time"

	"github.com/txhook/txhook/internal/store"
)

// The database's clock times every lease (store.Claim), so a relay whose
// clock is off cannot take over deliveries another relay still has in
// flight. Its clock still schedules what it writes as pending (retries,
// postponed and released deliveries), decides which pending deliveries
// are due when it claims, and stamps what it records. An offset beyond a
// fifth of the lease is worth an operator's attention, so the relay
// measures it.

const (
	// clockCheckInterval is how often a relay measures its clock against
	// the database's after the first claim of its run.
	clockCheckInterval = 5 * time.Minute
	// clockRetryInterval is how soon a measurement that failed is retried.
	clockRetryInterval = 10 * time.Second
	// clockSamples is how many round trips one measurement takes: the
	// quickest bounds the offset most tightly.
	clockSamples = 3
)

// clockCheck is what a relay remembers of its clock's offset to the
// database's. Only the fetch loop uses it.
type clockCheck struct {
	next   time.Time // real time of the next measurement; zero: the next claim
	beyond bool      // the last measurement was beyond tolerance, and said so
}

// checkClock measures, before the relay's first claim and every
// clockCheckInterval after, how far its clock (Config.Clock) is from the
// database's. It warns when the offset, less the round trip's
// uncertainty, goes beyond a fifth of the lease, and says when it is back
// within: once each, not at every measurement.
func (r *Relay) checkClock(ctx context.Context) {
	c := &r.clockCheck
	if !c.next.IsZero() && time.Now().Before(c.next) {
		return
	}
	mctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	offset, rtt, err := measureOffset(mctx, r.st, r.clock)
	cancel()
	if err != nil {
		c.next = time.Now().Add(clockRetryInterval)
		if ctx.Err() == nil {
			r.log.Debug("txhook: measuring the clock offset to the database failed", "error", err)
		}
		return
	}
	c.next = time.Now().Add(clockCheckInterval)
	tolerance := leaseMargin(r.cfg.Lease)
	beyond := offset.Abs()-rtt/2 > tolerance
	switch {
	case beyond && !c.beyond:
		r.log.Warn("txhook: this relay's clock is off from the database's by more than a fifth of the lease; "+
			"tolerated, as the database's clock times leases, but retry and postponement times, which pending "+
			"deliveries are due, and the times this relay records follow its own clock and are off by as much",
			"offset", offset.Round(time.Millisecond), "round_trip", rtt.Round(time.Microsecond), "tolerance", tolerance)
	case !beyond && c.beyond:
		r.log.Info("txhook: this relay's clock is back within a fifth of the lease of the database's",
			"offset", offset.Round(time.Millisecond), "round_trip", rtt.Round(time.Microsecond))
	}
	c.beyond = beyond
}

// measureOffset returns how far clk is ahead of the database's clock
// (negative: behind), from the quickest of clockSamples round trips,
// assuming the database read its clock halfway through; rtt bounds the
// error at rtt/2. Round trips are timed on the real monotonic clock, as clk
// may be a fake that does not move.
func measureOffset(ctx context.Context, st *store.Store, clk Clock) (offset, rtt time.Duration, err error) {
	rtt = -1
	for range clockSamples {
		sent := time.Now()
		local := clk.Now()
		db, err := st.DBNow(ctx)
		took := time.Since(sent)
		if err != nil {
			return 0, 0, err
		}
		if rtt < 0 || took < rtt {
			rtt = took
			offset = local.Add(took / 2).Sub(db)
		}
	}
	return offset, rtt, nil
}
