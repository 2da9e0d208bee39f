package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
)

// child is a command that runs only under a lease: dlock run's while it holds its locks, dlock
// elect's while it leads. Both supervise it the same way (runChild): in its own process group,
// with the signals sent to dlock forwarded to it, and terminated when the lease is lost.
type child struct {
	cmd   string          // the dlock command, for messages: "run", "elect"
	what  string          // what it runs under, for messages: `lock "x"`, `leadership of "x"`
	argv  []string        // the command and its arguments
	env   []string        // added to dlock's environment
	lease context.Context // the lease's context: it ends when the lease is lost
	grace time.Duration   // after a loss: between SIGTERM and SIGKILL of its process group
}

// childEnd says how a child's run ended (runChild).
type childEnd int

const (
	childInterrupted childEnd = iota // dlock was interrupted before the start: nothing ran
	childNotStarted                  // the command could not be started (said on stderr)
	childExited                      // it exited by itself (the lease may have ended meanwhile)
	childLost                        // the lease was lost: it was terminated
)

// runChild starts the command and waits for its end, and returns how it ended with its exit
// status (a shell's: 128+N when signal N ended it). ctx is cancelled by SIGINT or SIGTERM (see
// main); from the start of the command on, those signals and SIGHUP are forwarded to its
// process group instead, and it is waited for. When the lease is lost (its context ends, or its
// deadline passes while dlock was paused: checked every runPoll), the group gets SIGTERM, and
// SIGKILL after grace; whatever is left of the group then is killed too, so that nothing started
// under the lease keeps running without it.
func (c child) run(ctx context.Context, std *stdio) (childEnd, int) {
	cmd := exec.Command(c.argv[0], c.argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = std.in, std.out, std.err
	cmd.Env = append(os.Environ(), c.env...)
	cmd.SysProcAttr = childAttr() // own process group; SIGKILLed by the kernel if dlock dies (Linux)

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	if ctx.Err() != nil { // interrupted just as the lease was taken: do not start the command
		return childInterrupted, exitInterrupt
	}
	if err := cmd.Start(); err != nil {
		fail(std, c.cmd, err)
		return childNotStarted, 127
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()

	tick := time.NewTicker(runPoll)
	defer tick.Stop()
	lost := false
	for !lost {
		select {
		case <-exited:
			return childExited, exitStatus(cmd.ProcessState)
		case sig := <-sigs:
			signalGroup(cmd.Process, sig)
		case <-c.lease.Done():
			lost = true
		case <-tick.C:
			lost = c.lease.Err() != nil // Err checks the lease deadline itself
		}
	}

	fmt.Fprintf(std.err, "dlock %s: %s lost: terminating the command (SIGTERM, SIGKILL after %v)\n", c.cmd, c.what, c.grace)
	signalGroup(cmd.Process, syscall.SIGTERM)
	timer := time.NewTimer(c.grace)
	defer timer.Stop()
wait:
	for {
		select {
		case <-exited:
			break wait
		case sig := <-sigs:
			signalGroup(cmd.Process, sig)
		case <-timer.C:
			break wait
		}
	}
	signalGroup(cmd.Process, syscall.SIGKILL)
	<-exited
	return childLost, exitStatus(cmd.ProcessState)
}
