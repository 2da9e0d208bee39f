//go:build linux

package main

import "syscall"

// childAttr makes the kernel SIGKILL a child (a hot-name worker, a crash-test holder) when this
// process dies, so that an interrupted run leaves nothing behind.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
