//go:build unix && !linux

package main

import "syscall"

// childAttr puts a child in its own process group, so that Ctrl-C reaches only the demo,
// which then stops its children in order. Without Pdeathsig, a child outlives a demo that is
// killed outright; workers then notice their closed stdin and exit.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
