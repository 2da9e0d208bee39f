//go:build unix

package main

import (
	"syscall"
	"time"
)

// selfUsage returns this process's CPU time and context switches so far, over all its threads.
func selfUsage() usage {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return usage{}
	}
	return usage{cpu: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), voluntary: int64(ru.Nvcsw), forced: int64(ru.Nivcsw)}
}

// niceThread lowers the calling thread's priority to nice 19 (on Linux the PRIO_PROCESS
// priority of "0" is the calling thread's; the caller holds its thread with LockOSThread).
func niceThread() error { return syscall.Setpriority(syscall.PRIO_PROCESS, 0, 19) }
