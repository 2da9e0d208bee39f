//go:build linux

package redisproc

import "syscall"

// sysProcAttr has the kernel SIGKILL the child when the program that started it dies, so that
// a crashed or killed run leaves no redis-server behind. (Pdeathsig fires when the OS thread
// that started the child exits; the Go runtime does not end its threads unless a goroutine
// exits while locked to one.)
func sysProcAttr(ownGroup bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: ownGroup}
}
