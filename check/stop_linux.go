package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// waitStopped returns once every thread of pid is in the stopped state ('T' in
// /proc/PID/task/TID/stat). SIGSTOP is delivered asynchronously: kill(2) returns while a
// thread running on another core may still execute a little, and a pause fault must not
// answer the worker's request until the worker really is frozen.
func waitStopped(pid int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		stopped, err := allStopped(pid)
		if err != nil {
			return err
		}
		if stopped {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d not stopped %v after SIGSTOP", pid, limit)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func allStopped(pid int) (bool, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(tasks) == 0 {
		return false, fmt.Errorf("process %d: no tasks in /proc (%v)", pid, err)
	}
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // the thread exited
		}
		// The state follows the parenthesised command name, which may contain spaces.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || i+2 >= len(s) {
			return false, fmt.Errorf("process %d: unreadable %s", pid, t)
		}
		if st := s[i+2]; st != 'T' && st != 't' {
			return false, nil
		}
	}
	return true, nil
}
