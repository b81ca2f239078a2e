package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/txhook/txhook/internal/clock"
	"github.com/txhook/txhook/internal/pgcluster"
	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/outbox"
)

// The partition part: retention of many rows by DELETE (Outbox.Prune on
// plain tables) against dropping partitions (Outbox.Prune on tables made
// by Outbox.Partition), in time and WAL bytes, and the cost of the relay's
// claim and of a lookup by delivery ID with those rows retained. It starts
// its own PostgreSQL cluster (internal/pgcluster, Production settings:
// autovacuum on) so that WAL figures are this part's alone, and prints the
// settings it ran with.
//
// The rows are split evenly between events, deliveries (succeeded) and
// attempts, one of each per delivery, spread over PartitionDays days that
// all end before the 7-day retention cut; the partitioned schema has one
// partition a day. A small set of due pending deliveries in today's
// partition is what the claim takes.

// settableClock is a clock the part moves: the rows are written "in the
// past", where the partitions must exist, and pruned now.
type settableClock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *settableClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (c *settableClock) NewTimer(d time.Duration) outbox.Timer { return clock.Real{}.NewTimer(d) }

func (c *settableClock) set(off time.Duration) {
	c.mu.Lock()
	c.off = off
	c.mu.Unlock()
}

// partitionArm is one schema of the part: plain or partitioned.
type partitionArm struct {
	name  string
	s     *pgSchema
	clock *settableClock
	ids   []int64 // a sample of retained delivery IDs, for lookups
}

func partPartition(ctx context.Context, cfg config, rep *report, p *progress) error {
	if _, err := pgcluster.Available(); err != nil {
		rep.note("partition: skipped: %v", err)
		return nil
	}
	c, err := pgcluster.Start(ctx, pgcluster.Options{Settings: pgcluster.Production()})
	if err != nil {
		return err
	}
	defer c.Close()
	dsn := c.DSN("postgres")
	settings, err := c.ShowSettings(ctx)
	if err != nil {
		return err
	}
	var set []string
	for _, s := range settings {
		set = append(set, s.String())
	}
	load0 := loadAvg()

	per := max(1, cfg.PartitionRows/3)
	days := max(1, cfg.PartitionDays)
	// Day 0 of the data is days+8 days ago: the newest rows are 8 days
	// old, past the 7-day retention.
	back := time.Duration(days+8) * 24 * time.Hour
	var arms []*partitionArm
	for _, partitioned := range []bool{false, true} {
		name := "plain"
		if partitioned {
			name = "partitioned"
		}
		clk := &settableClock{}
		clk.set(-back)
		s, err := newSchema(ctx, dsn, "pgx", 8, outbox.Config{Clock: clk})
		if err != nil {
			return err
		}
		defer s.drop()
		if partitioned {
			if err := s.ob.Partition(ctx, outbox.PartitionConfig{Interval: 24 * time.Hour, Ahead: days + 9}); err != nil {
				return err
			}
		}
		clk.set(0)
		a := &partitionArm{name: name, s: s, clock: clk}
		p.logf("partition: %s: writing %s events, deliveries and attempts over %d days", name, commas(int64(per)), days)
		t0 := time.Now()
		if err := fillFinished(ctx, s.db, p, per, days, back); err != nil {
			return fmt.Errorf("%s: fill: %w", name, err)
		}
		if err := fillDue(ctx, s.db, cfg.ClaimSamples*claimBatch+claimWarmup*claimBatch); err != nil {
			return fmt.Errorf("%s: fill due: %w", name, err)
		}
		if _, err := s.db.ExecContext(ctx, "ANALYZE"); err != nil {
			return err
		}
		p.logf("partition: %s: written in %s", name, time.Since(t0).Round(time.Second))
		// A 1% sample of pages; all of a small table.
		sample := `SELECT id FROM txhook_deliveries TABLESAMPLE SYSTEM (1) LIMIT 2000`
		if per < 100000 {
			sample = `SELECT id FROM txhook_deliveries LIMIT 2000`
		}
		rows, err := s.db.QueryContext(ctx, sample)
		if err != nil {
			return err
		}
		a.ids, err = scanInt64s(rows)
		if err != nil {
			return err
		}
		arms = append(arms, a)
	}

	// Claim and lookup cost with the rows retained, alternating arms.
	var detail strings.Builder
	claims := make([][]float64, len(arms))
	lookups := make([][]float64, len(arms))
	sts := make([]*store.Store, len(arms))
	for i, a := range arms {
		sts[i] = store.New(a.s.db, store.Postgres)
		if err := sts[i].Prepare(ctx, sts[i].ClaimQueries(100)...); err != nil {
			return err
		}
	}
	for i := -claimWarmup; i < cfg.ClaimSamples; i++ {
		for k := range arms {
			j := (k + max(i, 0)) % len(arms)
			t0 := time.Now()
			got, err := sts[j].Claim(ctx, "bench-claim", time.Now(), 24*time.Hour, claimBatch)
			el := time.Since(t0)
			if err != nil {
				return fmt.Errorf("%s: claim: %w", arms[j].name, err)
			}
			if len(got) != claimBatch {
				return fmt.Errorf("%s: claim took %d rows, want %d", arms[j].name, len(got), claimBatch)
			}
			// One lookup by ID of a retained delivery (what completions,
			// the operations UI and dead-letter replay do).
			id := arms[j].ids[rand.IntN(len(arms[j].ids))]
			t1 := time.Now()
			if _, err := sts[j].Delivery(ctx, id); err != nil {
				return fmt.Errorf("%s: lookup: %w", arms[j].name, err)
			}
			el1 := time.Since(t1)
			if i >= 0 {
				claims[j] = append(claims[j], float64(el))
				lookups[j] = append(lookups[j], float64(el1))
			}
		}
	}
	for i, a := range arms {
		fmt.Fprintf(&detail, "%-12s claim of %d: %s   lookup by delivery ID: %s\n", a.name, claimBatch, msStats(claims[i]), msStats(lookups[i]))
	}
	total := 3 * per
	rep.add(row{
		Part:     fmt.Sprintf("partition: claim of %d with %s rows retained, median", claimBatch, commas(int64(total))),
		Value:    ms(time.Duration(median(claims[1]))),
		Baseline: ms(time.Duration(median(claims[0]))) + " (plain tables)",
		Ratio:    ratio(median(claims[1]) / median(claims[0])),
	})
	rep.add(row{
		Part:     fmt.Sprintf("partition: lookup by delivery ID, %d daily partitions + DEFAULT, median", days+10),
		Value:    ms(time.Duration(median(lookups[1]))),
		Baseline: ms(time.Duration(median(lookups[0]))) + " (plain tables)",
		Ratio:    ratio(median(lookups[1]) / median(lookups[0])),
	})

	// Retention: everything written above is past the cut.
	type result struct {
		took   time.Duration
		wal    int64
		pruned outbox.Pruned
	}
	res := make([]result, len(arms))
	for i, a := range arms {
		p.logf("partition: %s: pruning", a.name)
		lsn0, err := walLSN(ctx, a.s.db)
		if err != nil {
			return err
		}
		t0 := time.Now()
		var sum outbox.Pruned
		for {
			pr, err := a.s.ob.Prune(ctx, outbox.Retention{})
			if err != nil {
				return fmt.Errorf("%s: prune: %w", a.name, err)
			}
			sum.Deliveries += pr.Deliveries
			sum.Attempts += pr.Attempts
			sum.Events += pr.Events
			sum.Partitions += pr.Partitions
			sum.Moved += pr.Moved
			sum.KeptPartitions += pr.KeptPartitions
			sum.PartitionLock = max(sum.PartitionLock, pr.PartitionLock)
			if pr.Deliveries == 0 && pr.Events == 0 && pr.Attempts == 0 {
				break
			}
		}
		res[i].took = time.Since(t0)
		lsn1, err := walLSN(ctx, a.s.db)
		if err != nil {
			return err
		}
		if err := a.s.db.QueryRowContext(ctx, `SELECT pg_wal_lsn_diff($1, $2)::bigint`, lsn1, lsn0).Scan(&res[i].wal); err != nil {
			return err
		}
		res[i].pruned = sum
		left := 0
		if err := a.s.db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded') + (SELECT count(*) FROM txhook_events WHERE dispatched_at IS NOT NULL AND tenant = 'old')`).Scan(&left); err != nil {
			return err
		}
		if left != 0 {
			return fmt.Errorf("%s: %d finished rows left after pruning", a.name, left)
		}
		fmt.Fprintf(&detail, "%-12s retention: %s, WAL %s bytes; pruned %+v\n", a.name, res[i].took.Round(time.Millisecond), commas(res[i].wal), sum)
	}
	rep.add(row{
		Part:     fmt.Sprintf("partition: retention of %s rows (%d days), time", commas(int64(total)), days),
		Value:    res[1].took.Round(time.Millisecond).String() + " (drop partitions)",
		Baseline: res[0].took.Round(time.Millisecond).String() + " (DELETE, Prune)",
		Ratio:    ratio(float64(res[1].took) / float64(res[0].took)),
	})
	rep.add(row{
		Part:     fmt.Sprintf("partition: retention of %s rows, WAL bytes", commas(int64(total))),
		Value:    commas(res[1].wal),
		Baseline: commas(res[0].wal),
		Ratio:    ratio(float64(res[1].wal) / float64(max(1, res[0].wal))),
	})
	fmt.Fprintf(&detail, "load average: %s at start, %s at end\n", load0, loadAvg())
	fmt.Fprintf(&detail, "cluster settings: %s\n", strings.Join(set, " "))
	rep.section("Partitioned tables", detail.String())
	return nil
}

// fillFinished writes per events, each with one succeeded delivery and
// one attempt, spread evenly over days days from back ago.
func fillFinished(ctx context.Context, db *sql.DB, p *progress, per, days int, back time.Duration) error {
	span := time.Duration(days) * 24 * time.Hour
	step := span / time.Duration(per)
	start := time.Now().Add(-back).UTC()
	// Days apart, so that each statement touches one partition.
	for from := 0; from < per; from += fillChunk {
		to := min(per, from+fillChunk) - 1
		args := []any{start, step.Microseconds(), from, to}
		for _, q := range []string{
			`INSERT INTO txhook_events (id, tenant, type, payload, created_at, dispatched_at)
			SELECT 'evt_old_' || g, 'old', 'payment.succeeded', '{"amount":1000,"currency":"EUR"}',
			       $1::timestamptz + g * $2::bigint * interval '1 microsecond', $1::timestamptz + g * $2::bigint * interval '1 microsecond'
			FROM generate_series($3::bigint, $4::bigint) g`,
			`INSERT INTO txhook_deliveries (id, event_id, endpoint_id, state, attempts, next_attempt_at, last_status, created_at, updated_at)
			SELECT g + 1, 'evt_old_' || g, 'ep_old', 'succeeded', 1, $1::timestamptz + g * $2::bigint * interval '1 microsecond', 200,
			       $1::timestamptz + g * $2::bigint * interval '1 microsecond', $1::timestamptz + g * $2::bigint * interval '1 microsecond' + interval '50 milliseconds'
			FROM generate_series($3::bigint, $4::bigint) g`,
			`INSERT INTO txhook_attempts (delivery_id, endpoint_id, attempt, started_at, duration_us, status)
			SELECT g + 1, 'ep_old', 1, $1::timestamptz + g * $2::bigint * interval '1 microsecond' + interval '1 millisecond', 40000, 200
			FROM generate_series($3::bigint, $4::bigint) g`,
		} {
			if _, err := db.ExecContext(ctx, q, args...); err != nil {
				return err
			}
		}
		p.logf("partition: %s of %s rows of each table written", commas(int64(to+1)), commas(int64(per)))
	}
	_, err := db.ExecContext(ctx, `SELECT setval(pg_get_serial_sequence('txhook_deliveries', 'id'), $1)`, per+1)
	return err
}

// fillDue writes n due pending deliveries created now, for the claim.
func fillDue(ctx context.Context, db *sql.DB, n int) error {
	if _, err := db.ExecContext(ctx, `INSERT INTO txhook_endpoints (id, tenant, url, secrets, created_at, updated_at)
VALUES ('ep_due', 'due', 'http://127.0.0.1:9/', '[{"secret":"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw","expires_at":null}]', now(), now())`); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO txhook_events (id, tenant, type, payload, created_at, dispatched_at)
SELECT 'evt_due_' || g, 'due', 'payment.succeeded', '{}', now(), now() FROM generate_series(1, $1::bigint) g`, n); err != nil {
		return err
	}
	_, err := db.ExecContext(ctx, `INSERT INTO txhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at, created_at, updated_at)
SELECT 'evt_due_' || g, 'ep_due', 'pending', 1, now() - interval '1 minute' + g * interval '1 microsecond', now(), now()
FROM generate_series(1, $1::bigint) g`, n)
	return err
}

func walLSN(ctx context.Context, db *sql.DB) (string, error) {
	var lsn string
	err := db.QueryRowContext(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn)
	return lsn, err
}

func scanInt64s(rows *sql.Rows) ([]int64, error) {
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("no delivery sampled")
	}
	return out, nil
}

// loadAvg is the 1, 5 and 15-minute load average.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
