//go:build !linux

package main

import "syscall"

// childAttr: without Pdeathsig, children outlive a run that dies before its cleanup.
func childAttr() *syscall.SysProcAttr { return nil }
