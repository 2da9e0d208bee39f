//go:build unix

package redisproc

import (
	"os"
	"syscall"
)

func pause(p *os.Process) error { return p.Signal(syscall.SIGSTOP) }

func resume(p *os.Process) error { return p.Signal(syscall.SIGCONT) }

// terminate asks p to shut down, and continues it should it be paused, so that it can.
func terminate(p *os.Process) error {
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	_ = p.Signal(syscall.SIGCONT) // fails only if p has exited already
	return nil
}
