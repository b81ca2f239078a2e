package main

import (
	"context"
	"fmt"
)

// partSQLite drains a backlog on SQLite against the bare POST loop.
func partSQLite(ctx context.Context, cfg config, rep *report, p *progress, rcv *receiver) error {
	bare, relay, err := drainRounds(ctx, cfg.SQLiteRounds, cfg.SQLiteConc, cfg.SQLiteEvents, p, "sqlite", rcv, func() (float64, error) {
		s, err := newSQLite(ctx, localOutbox())
		if err != nil {
			return 0, err
		}
		defer s.drop()
		return drainBacklog(ctx, s.db, s.ob, rcv.URL, cfg.SQLiteConc, cfg.SQLiteEvents, false)
	})
	if err != nil {
		return err
	}
	x := row{
		Part:     fmt.Sprintf("drain, SQLite (WAL file), %d in flight, %s backlog (deliveries/s)", cfg.SQLiteConc, commas(int64(cfg.SQLiteEvents))),
		Value:    rate(median(relay)),
		Baseline: rate(median(bare)) + " (bare POST loop)",
		Ratio:    ratio(median(relay) / median(bare)),
	}
	if cfg.SQLiteConc == 16 {
		x.Target, x.Verdict = "≥ 3,000/s", verdict(median(relay) >= 3000)
	}
	rep.add(x)
	rep.section("Drain rounds (SQLite)", fmt.Sprintf("%d in flight, %d rounds\n  bare   /s: %s\n  txhook /s: %s", cfg.SQLiteConc, len(relay), rates(bare), rates(relay)))
	return nil
}
