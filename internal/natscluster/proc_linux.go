package natscluster

import "syscall"

// serverProcAttr puts a server in its own process group, away from
// signals meant for this one (Ctrl-C), and has the kernel kill it when
// this process dies.
func serverProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
