package main

import (
	"fmt"
	"os"
	"time"

	"github.com/dlock-go/dlock"
)

// procState is what this machine tells of a process id (probeProcess).
type procState struct {
	gone   bool      // no process has the pid, or only a zombie (it exited, unreaped)
	exists bool      // a live process has the pid
	start  time.Time // when that process started; zero when unknown
}

// startSlack is how far apart the start the holder stored (dlock's package initialisation,
// truncated to the second) and the start the system reports for its pid (on Linux from the
// boot time, also in whole seconds) may be for one process.
const startSlack = 3 * time.Second

// holderAlive tells whether the process holding the lock i still runs. It knows only for a
// holder on this host (its host name is os.Hostname's); then false means that no live
// process has the holder's pid, or that the one that has it started after the holder did
// (the pid was reused), and why says which. nil: unknown, another host, or not held.
//
// A holder in another PID namespace (a container) that has this host's name is judged by
// this host's processes: there the answer may be wrong.
func holderAlive(i dlock.Info) (alive *bool, why string) {
	h := i.Holder
	if !i.Held || h.Host == "" || h.PID <= 0 {
		return nil, ""
	}
	if host, err := os.Hostname(); err != nil || host != h.Host {
		return nil, ""
	}
	yes, no := true, false
	p := probeProcess(h.PID)
	switch {
	case p.gone:
		return &no, fmt.Sprintf("no process %d on this host", h.PID)
	case !p.exists, h.Start.IsZero(), p.start.IsZero():
		return nil, "" // a process has the pid, but it cannot be told whether it is the holder
	case p.start.After(h.Start.Add(startSlack)):
		return &no, fmt.Sprintf("pid %d is another process now, started %s, after the holder's %s",
			h.PID, p.start.UTC().Format(time.RFC3339), h.Start.UTC().Format(time.RFC3339))
	case p.start.Before(h.Start.Add(-startSlack)):
		return nil, "" // started before the holder: another PID namespace, or the clock moved
	}
	return &yes, ""
}
