//go:build !linux

package redistest

import "syscall"

// sysProcAttr returns nil: without Pdeathsig, a child outlives a test binary
// that dies before Close runs.
func sysProcAttr() *syscall.SysProcAttr { return nil }
