package main

import (
	"context"
	"database/sql"
	"os"

	"github.com/txhook/txhook/internal/procstat"
)

// On a shared machine throughput swings with the neighbours' load, but the
// CPU a transaction costs does not: cpuMeter adds up the CPU time of this
// process and of the PostgreSQL backends serving a pool, from /proc.
type cpuMeter struct {
	db      *sql.DB
	appName string
	self    int64
	backend map[int]int64 // pid -> ticks at start
}

// clockTicks is USER_HZ, the unit of procTicks.
const clockTicks = procstat.ClockTicks

// procTicks returns utime+stime of pid in clock ticks, or -1.
func procTicks(pid int) int64 { return procstat.Ticks(pid) }

// backends returns the PIDs of the server processes of connections named
// appName (on a server on this machine).
func backends(ctx context.Context, db *sql.DB, appName string) ([]int, error) {
	rows, err := db.QueryContext(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, appName)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			return nil, err
		}
		out = append(out, pid)
	}
	return out, rows.Err()
}

func startCPU(ctx context.Context, db *sql.DB, appName string) *cpuMeter {
	m := &cpuMeter{db: db, appName: appName, self: procTicks(os.Getpid()), backend: map[int]int64{}}
	if db == nil {
		return m
	}
	pids, _ := backends(ctx, db, appName)
	for _, pid := range pids {
		m.backend[pid] = procTicks(pid)
	}
	return m
}

// stop returns the CPU seconds this process and the pool's backends used
// since startCPU; ok is false when /proc or the backends could not be read
// (a server on another machine). With a nil pool only this process counts.
func (m *cpuMeter) stop(ctx context.Context) (client, server float64, ok bool) {
	self := procTicks(os.Getpid())
	if self < 0 || m.self < 0 {
		return 0, 0, false
	}
	if m.db == nil {
		return float64(self-m.self) / clockTicks, 0, true
	}
	pids, err := backends(ctx, m.db, m.appName)
	if err != nil {
		return 0, 0, false
	}
	var ticks int64
	for _, pid := range pids {
		t := procTicks(pid)
		if t < 0 {
			return 0, 0, false
		}
		ticks += t - m.backend[pid] // a backend started meanwhile counts from 0
	}
	return float64(self-m.self) / clockTicks, float64(ticks) / clockTicks, len(pids) > 0
}
