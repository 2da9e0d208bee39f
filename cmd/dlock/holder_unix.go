//go:build unix

package main

import (
	"errors"
	"syscall"
)

// probeProcess looks pid up with signal 0 and, where procStart can, reads its start time.
func probeProcess(pid int) procState {
	switch err := syscall.Kill(pid, 0); {
	case errors.Is(err, syscall.ESRCH):
		return procState{gone: true}
	case err != nil && !errors.Is(err, syscall.EPERM): // EPERM: it exists, another user's
		return procState{}
	}
	start, zombie, err := procStart(pid)
	switch {
	case err != nil:
		return procState{exists: true}
	case zombie:
		return procState{gone: true}
	}
	return procState{exists: true, start: start}
}
