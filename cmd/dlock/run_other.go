//go:build !unix

package main

import "os"

// signalGroup delivers sig to p alone: without Unix process groups, and where only killing is
// supported, any terminating signal kills it.
func signalGroup(p *os.Process, sig os.Signal) error {
	if err := p.Signal(sig); err != nil && sig != os.Interrupt {
		return p.Kill()
	}
	return nil
}

func exitStatus(ps *os.ProcessState) int { return ps.ExitCode() }
