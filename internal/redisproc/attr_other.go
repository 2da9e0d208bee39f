//go:build !unix

package redisproc

import "syscall"

// sysProcAttr: no process groups or Pdeathsig here; a child outlives a program that dies
// before it closes it.
func sysProcAttr(bool) *syscall.SysProcAttr { return nil }
