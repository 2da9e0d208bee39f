//go:build linux

package main

import "syscall"

// childAttr puts a child (a worker; redisproc does the same for redis-server) in its own
// process group, so that Ctrl-C reaches only the demo, which then stops its children in
// order, and has the kernel SIGKILL it if the demo dies first. (Pdeathsig fires when the OS
// thread that started the child exits; the Go runtime does not end its threads unless a
// goroutine exits while locked to one.)
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
