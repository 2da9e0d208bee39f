package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/dlock-go/dlock"
)

const electUsage = `
Run COMMAND only while leading the election NAME: campaign (wait in the election's queue on
the server, behind the candidates that came first), start the command once leading, and stop
it when the leadership is lost. When the command exits 0, or is stopped because the
leadership was lost, dlock elect steps down (the first candidate queued leads next, within
a few milliseconds) and campaigns again, no sooner than a second after its last term began
(so that a command that exits at once does not make it spin). Run one "dlock elect" per
replica of a service: exactly one of them runs its command at a time, and another takes over
when the leader's machine dies (after about --ttl: its lease runs out).

The command runs as under "dlock run": in its own process group, with dlock's stdin, stdout
and stderr, and with DLOCK_TERM (the term: a fencing token, larger at every new term of
NAME; pass it to the resources the leader writes), and DLOCK_NAME, DLOCK_TOKEN (the term
again) and DLOCK_TOKENS as "dlock run" sets them, in its environment. Its value (--value)
is what "dlock leader NAME" and "dlock web" show while it leads.

If the leadership is lost while the command runs (a renewal fails, the server is unreachable
for longer than the lease allows, dlock was paused past its lease, "dlock unlock --force
NAME"), dlock sends SIGTERM to the command's process group, SIGKILL after --grace, and
campaigns again. What the command did between the loss and its end is not undone: fence its
writes with DLOCK_TERM.

SIGINT, SIGTERM and SIGHUP sent to dlock while the command runs are forwarded to it; once it
exits, dlock steps down and exits with its exit code. Sent while campaigning, SIGINT and
SIGTERM make dlock leave the queue and exit 130.

An election is a lock of the same name: "dlock status NAME" shows its leader, and a
"dlock run NAME" waits in the same queue.

Exit codes (dlock elect runs until one of these):
  the command's   it exited non-zero (128+N when signal N ended it) by itself, or exited after
                  a signal forwarded to it; dlock stepped down first
  2               bad command line, or a bad --redis URL
  69              the Redis server cannot be reached at start (later, campaigns that fail are
                  tried again, 50 ms to 2 s apart, with one line on stderr), or cannot be used
  77              access denied: the server refused the login or a command to the user
  127             the command could not be started
  130             interrupted while campaigning

Examples:
  dlock elect scheduler -- ./scheduler --serve
  dlock elect --ttl 3s --value "$(hostname):8080" api-primary -- ./serve.sh
  dlock leader scheduler                                 # who leads now`

// electRestartGap is the shortest time between the starts of two terms of one dlock elect.
const electRestartGap = time.Second

// electBackoffMax is the longest pause between two campaigns that failed.
const electBackoffMax = 2 * time.Second

func runElect(ctx context.Context, std *stdio, args []string) int {
	fs := newFlagSetSynopsis("elect", "[flags] NAME [--] COMMAND [ARGS...]", electUsage)
	var sf serverFlags
	sf.add(fs)
	sf.addLocking(fs)
	b64 := addB64Flag(fs)
	ttl := fs.Duration("ttl", 10*time.Second, "the leadership's lease, renewed automatically (every third of it) while leading: how long "+
		"the others wait when the leader's process or machine dies")
	grace := fs.Duration("grace", 5*time.Second, "after the leadership is lost: time between SIGTERM and SIGKILL of the command")
	label := fs.String("label", "", "label stored with the leadership, shown by dlock status, list and leader (default: the command's name)")
	value := fs.String("value", "", "what this candidate advertises while it leads (dlock leader, dlock web), at most 4096 bytes (default: HOST:PID)")

	names, command, done, code := parseRunArgs(fs, std, args)
	if done {
		return code
	}
	names, ok := decodeNames(fs, std, names, *b64)
	if !ok {
		return exitUsage
	}
	switch {
	case len(names) > 1:
		return usageLine(fs, std, "one election NAME only")
	case *ttl < dlock.MinTTL:
		return usageLine(fs, std, fmt.Sprintf("--ttl must be at least %v", dlock.MinTTL))
	case *grace < 0:
		return usageLine(fs, std, "--grace must not be negative")
	case len(*value) > dlock.MaxLeaderValue:
		return usageLine(fs, std, fmt.Sprintf("--value is %d bytes, longer than %d", len(*value), dlock.MaxLeaderValue))
	}
	name := names[0]
	if *value == "" {
		host, _ := os.Hostname()
		*value = host + ":" + strconv.Itoa(os.Getpid())
	}
	if *label == "" {
		*label = "dlock elect " + filepath.Base(command[0])
	}
	if len(*label) > 256 {
		*label = (*label)[:256]
	}

	c, code := sf.dial(ctx, std, "elect", dlock.WithTTL(*ttl), dlock.WithLabel(*label))
	if c == nil {
		return code
	}
	defer c.Close()
	e := c.Election(name)
	what := fmt.Sprintf("leadership of %q", name)

	var (
		backoff time.Duration
		lastErr string
	)
	for {
		ld, err := e.Campaign(ctx, *value)
		switch {
		case ctx.Err() != nil:
			if err == nil {
				resign(std, ld, what)
			}
			fmt.Fprintf(std.err, "dlock elect: interrupted while campaigning for %q\n", name)
			return exitInterrupt
		case errors.Is(err, dlock.ErrInvalid), errors.Is(err, dlock.ErrDenied), errors.Is(err, dlock.ErrClosed):
			return report(std, "elect", err)
		case err != nil:
			// The server is unreachable, say: campaign again, saying so once per new error.
			if msg := oneLine(err); msg != lastErr {
				lastErr = msg
				fail(std, "elect", fmt.Errorf("campaign failed (trying again): %w", err))
			}
			backoff = min(max(2*backoff, 50*time.Millisecond), electBackoffMax)
			if !pause(ctx, backoff) {
				fmt.Fprintf(std.err, "dlock elect: interrupted while campaigning for %q\n", name)
				return exitInterrupt
			}
			continue
		}
		backoff, lastErr = 0, ""
		began := time.Now()
		term := ld.Term()
		env := append(runEnv(names, map[string]uint64{name: term}), "DLOCK_TERM="+strconv.FormatUint(term, 10))
		end, code := child{cmd: "elect", what: what, argv: command, env: env, lease: ld.Context(), grace: *grace}.run(ctx, std)
		if end == childExited && ld.Context().Err() != nil {
			fmt.Fprintf(std.err, "dlock elect: %s was lost before the command exited\n", what)
		}
		if end != childLost {
			resign(std, ld, what)
		}
		switch {
		case end == childInterrupted:
			fmt.Fprintf(std.err, "dlock elect: interrupted before the command started\n")
			return exitInterrupt
		case end == childNotStarted:
			return code
		case ctx.Err() != nil: // a signal was forwarded to the command, which has exited
			return code
		case end == childExited && code != 0:
			return code
		}
		if !pause(ctx, electRestartGap-time.Since(began)) {
			fmt.Fprintf(std.err, "dlock elect: interrupted while campaigning for %q\n", name)
			return exitInterrupt
		}
	}
}

// pause waits for d, and reports false when ctx ended first.
func pause(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// resign steps down, reporting a failure on stderr; a leadership found lost by then needs
// nothing more (the next candidate leads already, or soon).
func resign(std *stdio, ld *dlock.Leadership, what string) {
	ctx, cancel := context.WithTimeout(context.Background(), runLockTimeout)
	defer cancel()
	err := ld.Resign(ctx)
	switch {
	case err == nil, errors.Is(err, dlock.ErrLost):
	default:
		fail(std, "elect", fmt.Errorf("step down from the %s (it expires with its lease): %w", what, err))
	}
}
