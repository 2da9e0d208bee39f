//go:build linux

package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of the start time in /proc/PID/stat: 100 on every Linux
// architecture Go supports.
const clockTicks = 100

// procStart reads from /proc when process pid started, and whether it is a zombie.
func procStart(pid int) (start time.Time, zombie bool, err error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return time.Time{}, false, err
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses; the fields after the
	// last ')' start with the state (field 3); the start time is field 22, in clock ticks
	// since boot.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return time.Time{}, false, errors.New("unexpected /proc stat")
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 20 {
		return time.Time{}, false, errors.New("unexpected /proc stat")
	}
	ticks, err := strconv.ParseInt(f[19], 10, 64)
	if err != nil {
		return time.Time{}, false, err
	}
	boot, err := bootTime()
	if err != nil {
		return time.Time{}, false, err
	}
	return boot.Add(time.Duration(ticks) * (time.Second / clockTicks)), f[0] == "Z" || f[0] == "X", nil
}

// bootTime is the btime line of /proc/stat: when the system booted, in whole seconds.
func bootTime() (time.Time, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			sec, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return time.Time{}, err
			}
			return time.Unix(sec, 0), nil
		}
	}
	return time.Time{}, errors.New("no btime in /proc/stat")
}
