//go:build linux

package redistest

import "syscall"

// sysProcAttr makes the kernel SIGKILL the child when the test binary dies,
// so a crashed or killed test run leaves no redis-server behind. (Pdeathsig
// fires when the forking OS thread exits; the Go runtime keeps its threads
// unless a goroutine exits while locked to one.)
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
