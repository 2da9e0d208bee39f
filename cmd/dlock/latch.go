package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/dlock-go/dlock"
)

const latchUsage = `
Countdown latches: a count kept on the Redis server that workers lower and a coordinator waits
to see at zero (see "Countdown latches" in the package documentation).

  dlock latch wait [flags] NAME          wait until the count is zero
  dlock latch count-down [flags] NAME    lower the count by one
  dlock latch status [flags] NAME        show the count left and the time left

The first wait or count-down on a NAME with --count N creates the latch with count N for
--ttl; a latch that reached zero stays open until its TTL; one whose TTL ran out first is
expired (wait and count-down fail; status says so) for a while (the token retention of the
client that created it: a minute by default), then the name is free again.
Without --count, the latch must exist.

Example: a batch of 5 workers, each counting down when done, and a coordinator:
  dlock latch wait --count 5 --ttl 10m batch-7 && ./publish-batch.sh
  dlock latch count-down --count 5 --ttl 10m --id worker-3 batch-7     # in each worker

Run "dlock latch <wait|count-down|status> --help" for each one's flags and exit codes.`

// runLatch dispatches "dlock latch <wait|count-down|status>".
func runLatch(ctx context.Context, std *stdio, args []string) int {
	if len(args) == 0 {
		fmt.Fprintf(std.err, "dlock latch: missing wait, count-down or status\n%s\n", latchUsage)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprintf(std.out, "Usage: dlock latch <wait|count-down|status> [flags] NAME\n%s\n", latchUsage)
		return exitOK
	case "wait":
		return runLatchWait(ctx, std, args[1:])
	case "count-down":
		return runLatchCountDown(ctx, std, args[1:])
	case "status":
		return runLatchStatus(ctx, std, args[1:])
	}
	fmt.Fprintf(std.err, "dlock latch: unknown subcommand %q (want wait, count-down or status)\nRun \"dlock latch --help\" for usage.\n", args[0])
	return exitUsage
}

// latchFlags are the flags of every latch subcommand that may create the latch.
type latchFlags struct {
	serverFlags
	count int
	ttl   time.Duration
	b64   *bool
}

func (f *latchFlags) add(fs *flag.FlagSet) {
	f.serverFlags.add(fs)
	f.serverFlags.addLocking(fs)
	f.b64 = addB64Flag(fs)
	fs.IntVar(&f.count, "count", 0, "the latch's initial `count`: creates it with this count when there is none (and must match the count of one that exists); 0: the latch must exist")
	fs.DurationVar(&f.ttl, "ttl", dlock.DefaultLatchTTL, "the latch's life from its creation, when this command creates it")
}

// open parses args, dials and returns the latch; on failure it returns nil and the exit code.
func (f *latchFlags) open(ctx context.Context, fs *flag.FlagSet, std *stdio, args []string) (*dlock.Client, *dlock.Latch, int) {
	name, done, code := parseOneName(fs, std, args, f.b64)
	if done {
		return nil, nil, code
	}
	if f.count < 0 {
		return nil, nil, usageLine(fs, std, "--count must not be negative")
	}
	cmd := fs.Name()[len("dlock "):]
	c, code := f.dial(ctx, std, cmd)
	if c == nil {
		return nil, nil, code
	}
	return c, c.Latch(name, f.count, dlock.WithTTL(f.ttl)), exitOK
}

// latchErrCode is the exit code of a latch call's error: a latch that expired or does not exist
// is 1, the rest as for every command (errCode).
func latchErrCode(std *stdio, cmd string, err error) int {
	if errors.Is(err, dlock.ErrExpired) || errors.Is(err, dlock.ErrNotFound) {
		fail(std, cmd, err)
		return exitFailure
	}
	return report(std, cmd, err)
}

const latchExitHelp = `Exit codes: 0 done; 1 the latch expired before reaching zero, or does not exist (no
--count); 2 bad command line or --redis URL; 69 the server cannot be reached (or used); 77
access denied (see "The minimal ACL rule" in docs/SECURITY.md)`

func runLatchWait(ctx context.Context, std *stdio, args []string) int {
	fs := newFlagSetSynopsis("latch wait", "[flags] NAME", `
Wait until the count of the latch NAME is zero (at once if it is), woken by the count-down
that gets it there (no polling).

Examples:
  dlock latch wait --count 5 --ttl 10m batch-7
  dlock latch wait --timeout 30s batch-7

`+latchExitHelp+`; 75 --timeout ran out first; 130 interrupted.`)
	var f latchFlags
	f.add(fs)
	var timeout waitFlag
	fs.Var(&timeout, "timeout", "how long to wait (default: until the latch opens or expires)")
	c, lt, code := f.open(ctx, fs, std, args)
	if c == nil {
		return code
	}
	defer c.Close()
	wctx := ctx
	if timeout.set {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, timeout.d)
		defer cancel()
	}
	err := lt.Wait(wctx)
	switch {
	case err == nil:
		return exitOK
	case ctx.Err() != nil:
		fmt.Fprintf(std.err, "dlock latch wait: interrupted while waiting for latch %q\n", lt.Name())
		return exitInterrupt
	case errors.Is(err, context.DeadlineExceeded):
		fail(std, "latch wait", err)
		return exitBusy
	}
	return latchErrCode(std, "latch wait", err)
}

func runLatchCountDown(ctx context.Context, std *stdio, args []string) int {
	fs := newFlagSetSynopsis("latch count-down", "[flags] NAME", `
Lower the count of the latch NAME by one. With --id, a second count-down with the same id
counts nothing (a worker that runs again counts once). Counting down a latch at zero changes
nothing.

Examples:
  dlock latch count-down --count 5 --ttl 10m --id worker-3 batch-7
  dlock latch count-down batch-7

`+latchExitHelp+".")
	var f latchFlags
	f.add(fs)
	id := fs.String("id", "", "the count-down's `id`: the same id counts once")
	c, lt, code := f.open(ctx, fs, std, args)
	if c == nil {
		return code
	}
	defer c.Close()
	var err error
	if *id != "" {
		err = lt.CountDownAs(ctx, *id)
	} else {
		err = lt.CountDown(ctx)
	}
	if err != nil {
		return latchErrCode(std, "latch count-down", err)
	}
	return exitOK
}

// jsonLatch is the JSON form of "dlock latch status --json".
type jsonLatch struct {
	Name    string `json:"name"`
	NameB64 string `json:"name_b64"`
	Exists  bool   `json:"exists"`
	Left    int    `json:"left"`
	Count   int    `json:"count"`
	TTLms   int64  `json:"ttl_ms"`
	Open    bool   `json:"open"`
	Expired bool   `json:"expired"`
}

func runLatchStatus(ctx context.Context, std *stdio, args []string) int {
	fs := newFlagSetSynopsis("latch status", "[flags] NAME", `
Show the count left of the latch NAME, its initial count and the time until it expires;
whether it is open (at zero) or expired. It never creates the latch, and exits 0 whether
there is one or not.

Example:
  dlock latch status batch-7
  dlock latch status --json batch-7

JSON fields: name, name_b64 (the name's bytes in standard base64), exists, left (count left), count (initial count), ttl_ms (until it
expires), open (at zero), expired (its TTL ran out before zero).

`+serverExitHelp)
	var sf serverFlags
	sf.add(fs)
	asJSON := fs.Bool("json", false, "print one JSON object")
	b64 := addB64Flag(fs)
	name, done, code := parseOneName(fs, std, args, b64)
	if done {
		return code
	}
	c, code := sf.dial(ctx, std, "latch status")
	if c == nil {
		return code
	}
	defer c.Close()
	info, err := c.Latch(name, 0).Inspect(ctx)
	if err != nil {
		return report(std, "latch status", err)
	}
	if *asJSON {
		return printJSON(std, "latch status", jsonLatch{
			Name: info.Name, NameB64: b64Name(info.Name), Exists: info.Exists, Left: info.Left, Count: info.Count,
			TTLms: info.TTL.Milliseconds(), Open: info.Exists && info.Left == 0, Expired: info.Expired,
		})
	}
	printLatch(std.out, info)
	return exitOK
}

func printLatch(w io.Writer, i dlock.LatchInfo) {
	name := display(i.Name)
	switch {
	case !i.Exists:
		fmt.Fprintf(w, "%s: no latch\n", name)
	case i.Expired:
		fmt.Fprintf(w, "%s: expired before reaching zero (%d of %d left)\n", name, i.Left, i.Count)
	case i.Left == 0:
		fmt.Fprintf(w, "%s: open (0 of %d left), expires in %v\n", name, i.Count, i.TTL.Round(time.Millisecond))
	default:
		fmt.Fprintf(w, "%s: %d of %d left, expires in %v\n", name, i.Left, i.Count, i.TTL.Round(time.Millisecond))
	}
}
