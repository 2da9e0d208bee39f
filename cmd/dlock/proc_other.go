//go:build !unix

package main

import (
	"errors"
	"os"
	"syscall"
)

var errNoPause = errors.New("pausing a process needs SIGSTOP (a Unix system)")

func childAttr() *syscall.SysProcAttr { return nil }

func pauseProcess(*os.Process) error { return errNoPause }

func resumeProcess(*os.Process) error { return errNoPause }
