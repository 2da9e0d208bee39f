//go:build unix && !linux

package main

import (
	"errors"
	"time"
)

// procStart: without /proc, the start time of another process is not read here, so a live
// pid may be the holder's or a reused one (holderAlive then says nothing).
func procStart(int) (time.Time, bool, error) {
	return time.Time{}, false, errors.New("process start time unknown on this system")
}
