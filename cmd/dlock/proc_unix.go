//go:build unix

package main

import (
	"os"
	"syscall"
)

// pauseProcess freezes p (SIGSTOP), as a long GC pause, a VM migration or a swapped-out
// process would: it neither runs nor renews its leases until resumeProcess.
func pauseProcess(p *os.Process) error { return p.Signal(syscall.SIGSTOP) }

func resumeProcess(p *os.Process) error { return p.Signal(syscall.SIGCONT) }
