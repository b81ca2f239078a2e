package main

import (
	"context"
	"fmt"
)

// partSQLite drains a backlog on SQLite against the bare POST loop.
func partSQLite(ctx context.Context, cfg config, rep *report, p *progress, rcv *receiver) error {
	bare, relay, err := drainRounds(ctx, cfg.SQLiteRounds, cfg.SQLiteConc, cfg.SQLiteEvents, p, "sqlite", rcv, func() (drainResult, error) {
		s, err := newSQLite(ctx, localOutbox())
		if err != nil {
			return drainResult{}, err
		}
		defer s.drop()
		return drainBacklog(ctx, s.db, "", s.ob, rcv.URL, cfg.SQLiteConc, cfg.SQLiteEvents, false)
	})
	if err != nil {
		return err
	}
	br, rr := median(drainRates(bare)), median(drainRates(relay))
	x := row{
		Part:     fmt.Sprintf("drain, SQLite (WAL file), %d in flight, %s backlog (deliveries/s)", cfg.SQLiteConc, commas(int64(cfg.SQLiteEvents))),
		Value:    rate(rr),
		Baseline: rate(br) + " (bare POST loop)",
		Ratio:    ratio(rr / br),
	}
	if cfg.SQLiteConc == 16 {
		x.Target, x.Verdict = "≥ 3,000/s", verdict(rr >= 3000)
	}
	rep.add(x)
	if c := cpuSummary(relay, false); c != "" {
		rep.add(row{
			Part:     "… CPU per delivery, SQLite: this process (relay, SQLite, receiver) (µs)",
			Value:    c,
			Baseline: cpuSummary(bare, false) + " (bare loop, receiver)",
		})
	}
	rep.section("Drain rounds (SQLite)", fmt.Sprintf("%d in flight, %d rounds\n  bare   /s: %s\n  txhook /s: %s", cfg.SQLiteConc, len(relay), rates(drainRates(bare)), rates(drainRates(relay))))
	return nil
}
