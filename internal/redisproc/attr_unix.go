//go:build unix && !linux

package redisproc

import "syscall"

// sysProcAttr: without Pdeathsig, a child outlives a program that dies before it closes it.
func sysProcAttr(ownGroup bool) *syscall.SysProcAttr {
	if !ownGroup {
		return nil
	}
	return &syscall.SysProcAttr{Setpgid: true}
}
