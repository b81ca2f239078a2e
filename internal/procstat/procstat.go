// Package procstat reads the CPU time of a process from Linux's /proc, for
// the benchmarks that count what the relay and PostgreSQL's processes
// spend (examples/bench, internal/store's BenchmarkPGDeliveryCost).
package procstat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ClockTicks is USER_HZ, the unit of Ticks: 100 on every Linux
// architecture Go supports.
const ClockTicks = 100

// Ticks returns the user + system CPU time of process pid in clock ticks,
// or -1 when /proc cannot tell (not Linux, the process is gone, or a
// server on another machine).
func Ticks(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	// Fields after the command name, which is in parentheses and may
	// contain spaces: state is field 3, utime 14, stime 15.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return -1
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return u + st
}
