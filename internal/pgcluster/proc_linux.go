package pgcluster

import "syscall"

// serverProcAttr puts the postmaster in its own process group, so Kill
// reaches its backends too, and has the kernel kill it when this process
// dies.
func serverProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
