package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/txhook/txhook/internal/store"
)

// Retention says how long finished work is kept. The zero value keeps
// succeeded deliveries 7 days and dead letters until they are purged.
type Retention struct {
	// Succeeded is how long succeeded deliveries and their attempt logs are
	// kept after they finish (also replayed or purged dead letters'
	// deliveries). Events go when none of their deliveries or dead letters
	// remain; until then an idempotency key or event ID stays taken.
	// Default 7 days; negative keeps them forever.
	Succeeded time.Duration
	// DeadLetters is how long dead letters are kept; zero or negative keeps
	// them until purged.
	DeadLetters time.Duration
	// Audit is how long audit log entries (see AuditLog) are kept.
	// Default 400 days; negative keeps them forever.
	Audit time.Duration
	// Interval is how often a relay prunes. Default 10 minutes; negative
	// turns pruning off in the relay (call Outbox.Prune yourself).
	Interval time.Duration
	// BatchSize bounds each pruning transaction. Default 1000.
	BatchSize int
}

// Default retention.
const (
	DefaultRetainSucceeded   = 7 * 24 * time.Hour
	DefaultRetainAudit       = 400 * 24 * time.Hour
	DefaultRetentionInterval = 10 * time.Minute
	DefaultPruneBatch        = 1000
)

func (r Retention) withDefaults() Retention {
	if r.Succeeded == 0 {
		r.Succeeded = DefaultRetainSucceeded
	}
	if r.Audit == 0 {
		r.Audit = DefaultRetainAudit
	}
	if r.Interval == 0 {
		r.Interval = DefaultRetentionInterval
	}
	if r.BatchSize <= 0 {
		r.BatchSize = DefaultPruneBatch
	}
	return r
}

// Pruned counts what Prune deleted.
type Pruned struct {
	Deliveries  int
	Attempts    int
	Events      int
	DeadLetters int
	Audit       int // audit log entries
	// On partitioned tables (Outbox.Partition), the rows above include
	// those dropped with their partitions, as counted just before. Also:
	// partitions dropped, rows
	// moved out of them to the DEFAULT partition because retention keeps
	// them, and expired partitions kept (too many such rows, or their lock
	// was busy), which row-by-row pruning then thins.
	Partitions     int
	Moved          int
	KeptPartitions int
	// PartitionLock is the longest a partition drop held its table's lock:
	// how long enqueues, claims or completions on it waited at most.
	PartitionLock time.Duration
}

// maxPruneBatches bounds one Prune call, so a relay's pruning round never
// runs unbounded after a long outage; the next round continues.
const maxPruneBatches = 1000

// Prune deletes what r no longer keeps, in transactions of at most
// r.BatchSize rows. Relays call it every r.Interval; call it yourself to
// prune from a cron job. On partitioned tables (Outbox.Partition) it first
// creates the partitions ahead and drops the partitions that ended before
// the retention cut, moving the rows retention keeps to the DEFAULT
// partition; it then prunes the remaining tables row by row as usual.
func (o *Outbox) Prune(ctx context.Context, r Retention) (Pruned, error) {
	r = r.withDefaults()
	now := o.clock.Now()
	var p Pruned
	loop := func(step func() (int, error)) error {
		for range maxPruneBatches {
			n, err := step()
			if err != nil {
				return fmt.Errorf("txhook: prune: %w", err)
			}
			if n < r.BatchSize {
				return nil
			}
		}
		return nil
	}
	if r.DeadLetters > 0 {
		if err := loop(func() (int, error) {
			n, err := o.st.PruneDeadLetters(ctx, now.Add(-r.DeadLetters), r.BatchSize)
			p.DeadLetters += n
			return n, err
		}); err != nil {
			return p, err
		}
	}
	if r.Audit > 0 {
		if err := loop(func() (int, error) {
			n, err := o.st.PruneAudit(ctx, now.Add(-r.Audit), r.BatchSize)
			p.Audit += n
			return n, err
		}); err != nil {
			return p, err
		}
	}
	if r.Succeeded < 0 {
		return p, nil
	}
	cut := now.Add(-r.Succeeded)
	if err := o.dropPartitions(ctx, cut, &p); err != nil {
		return p, err
	}
	// Finished deliveries: one walk by ID over those created before the
	// cut (see store.PruneFinished), bounded like the loops.
	var walk store.PruneCursor
	for range maxPruneBatches * 4 {
		n, a, e, err := o.st.PruneFinished(ctx, cut, r.BatchSize, &walk)
		p.Deliveries += n
		p.Attempts += a
		p.Events += e
		if err != nil {
			return p, fmt.Errorf("txhook: prune: %w", err)
		}
		if walk.Done {
			break
		}
	}
	// Unrouted events: one walk over the tenants (see store.PruneEvents).
	var events store.EventsWalk
	for range maxPruneBatches {
		n, err := o.st.PruneEvents(ctx, cut, r.BatchSize, &events)
		p.Events += n
		if err != nil {
			return p, fmt.Errorf("txhook: prune: %w", err)
		}
		if events.Done {
			break
		}
	}
	return p, nil
}

// sweepInterval is how often a relay looks for ordered deliveries left
// blocked behind a finished one, which only a crash between a completion
// and its unblocking can cause.
const sweepInterval = 5 * time.Second

// maintain prunes every Retention.Interval, sweeps blocked ordered
// deliveries and repairs endpoints' health, until ctx ends.
func (r *Relay) maintain(ctx context.Context) {
	iv := r.cfg.Retention.Interval
	var pruneC <-chan time.Time // nil, never ready, when pruning is off
	var prune Timer
	if iv >= 0 {
		prune = r.clock.NewTimer(iv)
		defer prune.Stop()
		pruneC = prune.C()
	}
	sweep := r.clock.NewTimer(sweepInterval)
	defer sweep.Stop()
	health := r.clock.NewTimer(healthSweepInterval)
	defer health.Stop()
	parts := r.clock.NewTimer(partitionCheckInterval)
	defer parts.Stop()
	r.ensurePartitions(ctx)
	var cur healthCursor
	for {
		select {
		case <-ctx.Done():
			return
		case <-parts.C():
			r.ensurePartitions(ctx)
			parts.Reset(partitionCheckInterval)
			continue
		case <-sweep.C():
			r.sweepBlocked(ctx)
			sweep.Reset(sweepInterval)
			continue
		case <-health.C():
			r.sweepHealth(ctx, &cur)
			health.Reset(healthSweepInterval)
			continue
		case <-pruneC:
		}
		p, err := r.o.Prune(ctx, r.cfg.Retention)
		switch {
		case err != nil && ctx.Err() == nil:
			r.log.Warn("txhook: pruning failed", "error", err)
		case p != Pruned{}:
			r.log.Info("txhook: pruned", "deliveries", p.Deliveries, "attempts", p.Attempts, "events", p.Events, "dead_letters", p.DeadLetters,
				"partitions", p.Partitions, "moved", p.Moved, "kept_partitions", p.KeptPartitions, "partition_lock", p.PartitionLock)
		}
		prune.Reset(iv)
	}
}

// ensurePartitions creates the partitions ahead on partitioned tables.
func (r *Relay) ensurePartitions(ctx context.Context) {
	n, err := r.o.ensurePartitions(ctx)
	if err != nil && ctx.Err() == nil {
		r.log.Warn("txhook: creating partitions failed; rows go to the DEFAULT partition meanwhile", "error", err)
	}
	if n > 0 {
		r.log.Info("txhook: created partitions", "count", n)
	}
}

func (r *Relay) sweepBlocked(ctx context.Context) {
	lines, err := r.st.BlockedLines(ctx, 1000)
	if err == nil && len(lines) > 0 {
		var n int
		if n, err = r.st.Unblock(ctx, r.clock.Now(), lines); n > 0 {
			r.log.Info("txhook: released ordered deliveries left blocked", "count", n)
			r.Wake()
		}
	}
	if err != nil && ctx.Err() == nil {
		r.log.Warn("txhook: sweeping ordered deliveries failed", "error", err)
	}
}

// healthSweepInterval is how often a relay repairs endpoints' recorded
// health from the attempt log. A variable so that tests can shorten it.
var healthSweepInterval = 30 * time.Second

const (
	// healthSweepPage is how many endpoints a round looks at, of those in a
	// run of failures and, a page further each round, of all of them.
	healthSweepPage = 500
	// healthSweepChunk is how many endpoints one repair statement locks,
	// so that completions recording their health wait briefly at most.
	healthSweepChunk = 50
	// healthSweepScan is how many of an endpoint's attempts since its
	// recorded last success a round reads looking for a later one. A
	// success buried deeper is found before the endpoint could be disabled:
	// disabling reads the whole log since then.
	healthSweepScan = 100
)

// healthCursor is where the next round of the health sweep starts.
type healthCursor struct{ failing, all string }

// sweepHealth recomputes the recorded health of endpoints from the attempt
// log. Each completion batch records its endpoints' health right after it
// is written, so this repairs what that cannot: a relay that died between
// the two, a recording that failed, and the approximation of batches that
// landed at the same time. Endpoints in a run of failures, whose run
// decides whether they are disabled, are looked at every round; the others
// a page at a time.
func (r *Relay) sweepHealth(ctx context.Context, cur *healthCursor) {
	var ids []string
	seen := map[string]bool{}
	for _, failing := range []bool{true, false} {
		after := &cur.all
		if failing {
			after = &cur.failing
		}
		page, err := r.st.EndpointIDs(ctx, failing, *after, healthSweepPage)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("txhook: sweeping endpoint health failed", "error", err)
			}
			return
		}
		*after = ""
		if len(page) == healthSweepPage {
			*after = page[len(page)-1]
		}
		for _, id := range page {
			if !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
	}
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), healthSweepChunk)]
		ids = ids[len(chunk):]
		states, err := r.st.RepairHealth(ctx, chunk, healthSweepScan)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("txhook: sweeping endpoint health failed", "error", err)
			}
			return
		}
		r.comp.healthChanged(ctx, states, nil)
	}
}
