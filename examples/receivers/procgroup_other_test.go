//go:build !unix

package receivers_test

import "os/exec"

// ownProcessGroup is a no-op here: the context's cancellation kills the
// receiver process itself.
func ownProcessGroup(cmd *exec.Cmd) {}
