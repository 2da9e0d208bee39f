//go:build unix

package main

import (
	"errors"
	"os"
	"syscall"
)

// signalGroup sends sig to the process group of p (run starts its command as a group leader),
// so that the command's own children get it too. A group that is gone already is no error.
func signalGroup(p *os.Process, sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return p.Signal(sig)
	}
	err := syscall.Kill(-p.Pid, s)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// exitStatus is the exit code a shell would report for a finished process: its own, or
// 128+N when signal N ended it.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
