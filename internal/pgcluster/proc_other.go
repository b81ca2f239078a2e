//go:build !linux

package pgcluster

import "syscall"

// serverProcAttr puts the postmaster in its own process group, so Kill
// reaches its backends too. (Outside Linux there is no parent-death
// signal: orphans are reaped by the next Start.)
func serverProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true}
}
