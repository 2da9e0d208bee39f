//go:build !unix

package redisproc

import (
	"errors"
	"os"
)

var errNoSignals = errors.New("pausing a process needs SIGSTOP and SIGCONT (a Unix system)")

func pause(*os.Process) error { return errNoSignals }

func resume(*os.Process) error { return errNoSignals }

// terminate kills p: there is no SIGTERM to send.
func terminate(p *os.Process) error { return p.Kill() }
