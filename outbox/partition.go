package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/txhook/txhook/internal/store"
)

// PartitionConfig configures Outbox.Partition.
type PartitionConfig struct {
	// Interval is the time range of one partition. Default 24 hours; at
	// least one hour, in whole minutes. Partitions start at multiples of it
	// counted from the Unix epoch (midnight UTC for daily ones). Pick it so
	// that one partition holds what a few minutes of retention work can
	// scan: hourly above a few million deliveries a day.
	Interval time.Duration
	// Ahead is how many partitions after the current one are kept created.
	// Default 3. Rows past the last partition land in the DEFAULT
	// partition and move into their own when it is created.
	Ahead int
}

// Defaults of PartitionConfig.
const (
	DefaultPartitionInterval = 24 * time.Hour
	DefaultPartitionAhead    = 3
)

// ErrPartitionUnsupported is returned by Partition on SQLite.
var ErrPartitionUnsupported = store.ErrPartitionUnsupported

// ErrNotEmpty is returned by Partition when the tables hold events,
// deliveries or attempts: partitioning is chosen for a new database.
var ErrNotEmpty = store.ErrNotEmpty

// Partition turns txhook_events, txhook_deliveries and txhook_attempts
// into tables partitioned by time (PostgreSQL declarative RANGE
// partitioning on events.created_at, deliveries.created_at and
// attempts.started_at), so that retention drops whole partitions instead
// of deleting rows one by one. Call it once, after Migrate and before the
// first event is enqueued: the tables must be empty (ErrNotEmpty
// otherwise). It is idempotent; on SQLite it returns
// ErrPartitionUnsupported.
//
// The partitioned tables are derived from the migrated ones through the
// catalog: same columns, checks and indexes. Primary keys gain the
// partition column, as PostgreSQL requires; the uniqueness of event IDs
// and idempotency keys, which callers choose, is kept across partitions by
// a small table (txhook_events_keys) that triggers maintain. Relays create
// partitions ahead and drop expired ones as part of pruning (see
// Retention); Prune does the same when you prune from a cron job.
func (o *Outbox) Partition(ctx context.Context, cfg PartitionConfig) error {
	if o.st.Dialect != store.Postgres {
		return ErrPartitionUnsupported
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultPartitionInterval
	}
	if cfg.Ahead == 0 {
		cfg.Ahead = DefaultPartitionAhead
	}
	if cfg.Interval < time.Hour || cfg.Interval%time.Minute != 0 {
		return fmt.Errorf("%w: PartitionConfig.Interval %s: want at least one hour, in whole minutes", ErrInvalidConfig, cfg.Interval)
	}
	if cfg.Ahead < 0 || cfg.Ahead > 1000 {
		return fmt.Errorf("%w: PartitionConfig.Ahead %d: want 0 to 1000", ErrInvalidConfig, cfg.Ahead)
	}
	if err := o.st.Partition(ctx, cfg.Interval, cfg.Ahead, o.clock.Now()); err != nil {
		return err
	}
	o.prepare(ctx)
	return nil
}

// Partition maintenance bounds.
const (
	// partitionLockWait is how long dropping a partition waits for its
	// table's lock before giving up until the next round: while it waits,
	// claims queue behind it.
	partitionLockWait = 2 * time.Second
	// partitionCheckInterval is how often a relay makes sure the
	// partitions ahead exist.
	partitionCheckInterval = 5 * time.Minute
)

// maxMovedPerPartition is how many rows of an expired partition retention
// moves to the DEFAULT partition (unfinished deliveries, undispatched
// events, what a dead letter needs) so that it can drop the rest; a
// partition with more is kept, and pruned row by row. Tests lower it per
// Outbox (Outbox.maxMoved).
const maxMovedPerPartition = 10000

// ensurePartitions creates the partitions ahead, if the tables are
// partitioned.
func (o *Outbox) ensurePartitions(ctx context.Context) (int, error) {
	if o.st.Dialect != store.Postgres {
		return 0, nil
	}
	n, err := o.st.EnsurePartitions(ctx, o.clock.Now())
	if err != nil {
		return n, fmt.Errorf("txhook: partitions: %w", err)
	}
	return n, nil
}

// dropPartitions drops the partitions that ended before cut, moving what
// must be kept, if the tables are partitioned.
func (o *Outbox) dropPartitions(ctx context.Context, cut time.Time, p *Pruned) error {
	if o.st.Dialect != store.Postgres {
		return nil
	}
	if _, err := o.ensurePartitions(ctx); err != nil {
		return err
	}
	maxMove := int(o.maxMoved.Load())
	if maxMove <= 0 {
		maxMove = maxMovedPerPartition
	}
	d, err := o.st.DropPartitions(ctx, cut, maxMove, partitionLockWait)
	p.Partitions += len(d.Dropped)
	p.Deliveries += d.Deliveries
	p.Attempts += d.Attempts
	p.Events += d.Events
	p.Moved += d.Moved
	p.KeptPartitions += len(d.Kept)
	p.PartitionLock = max(p.PartitionLock, d.MaxLockHeld)
	if len(d.Kept) > 0 {
		o.log.Warn("txhook: expired partitions kept: too many rows to keep in them, or their lock was busy; pruning them row by row",
			"partitions", d.Kept)
	}
	if err != nil {
		return fmt.Errorf("txhook: prune: %w", err)
	}
	return nil
}
