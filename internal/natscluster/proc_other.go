//go:build !linux

package natscluster

import "syscall"

// serverProcAttr puts a server in its own process group, away from
// signals meant for this one (Ctrl-C). (Outside Linux there is no
// parent-death signal: a test binary killed mid-way leaves its servers
// running.)
func serverProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
