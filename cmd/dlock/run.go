package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
)

const runUsage = `
Run COMMAND while holding the lock NAME, like flock(1) across machines: wait for the lock,
start the command with the lease renewed in the background, release the lock when the
command exits, and exit with the command's exit code.

The command runs in its own process group with DLOCK_NAME (the lock name) and DLOCK_TOKEN
(the fencing token: pass it to the resource you protect) in its environment; its stdin,
stdout and stderr are dlock's. SIGINT, SIGTERM and SIGHUP sent to dlock are forwarded to
the command; the lock is released after it exits.

Several names (NAME NAME... --, "--" then required) are held together: all of them or none
(a multi-lock: waiting for them cannot deadlock with other runs, whatever order they name them
in). The command then gets DLOCK_NAME with the names one per line, and DLOCK_TOKEN with one
token per name, separated by spaces, in the order of the names on the command line (read
them with: set -- $DLOCK_TOKEN). DLOCK_TOKENS always holds a JSON object of name -> token
(one entry for one name), for names with spaces or newlines.

If the lock is lost while the command runs (a renewal fails, the server is unreachable for
longer than the lease allows, or dlock itself was paused past its lease and finds the lease
gone when it resumes), dlock sends SIGTERM to the command's process group, SIGKILL after
--grace, and exits with 76. The command never keeps running unnoticed without the lock; but
what it did between the loss and its end is not undone: use DLOCK_TOKEN to fence writes.

By default NAME is a lock (dlock.Mutex): one command at a time. With --read the command
shares NAME, a read-write lock (dlock.RWMutex), with other readers, and --write holds it
alone; writers are preferred (a reader that comes while a writer waits waits behind it).
With --permits N/SIZE it holds N permits of NAME, a semaphore (dlock.Semaphore) of SIZE
permits: at most SIZE are held at once across the fleet, callers served in turn (SIZE is
only the size the semaphore is created with: once the server stores one, by use or by
dlock resize, that one counts, whatever SIZE says). Each is its
own object: "dlock run NAME", "dlock run --read NAME" and "dlock run --permits 1/3 NAME" do
not exclude each other.
With --adaptive, the lease is chosen at each run from how long the runs of NAME have held the
lock: the server records each run's hold (from the acquisition to the release) and gives the
next run three times the longest recent one, between --min-ttl and --ttl (--ttl for the
first run). A run killed with SIGKILL then blocks NAME for about three times the longest
recent run, not for the whole --ttl. "dlock status NAME" shows what was recorded.

Flags may come before or after NAME; "--" ends them (needed when COMMAND starts with "-",
and after several names).

dlock run is made for scripts, cron jobs and services. Since the command has its own process
group, on an interactive terminal it is a background job: it may write to the terminal, but
reading from it stops it (SIGTTIN).

Exit codes:
  the command's   it ran (128+N when signal N ended it)
  2               bad command line, or a bad --redis URL
  69              the Redis server cannot be reached (the message names its address), or
                  cannot be used (for example, it may evict lock keys: its maxmemory-policy
                  is not noeviction; the message says why, and --unsafe-eviction goes on)
  75              the lock is busy and --wait ran out (or --wait 0 and it was busy)
  76              the lock was lost while the command ran; the command was terminated (also
                  when the loss is found only at release, after the command exited)
  77              access denied: the server refused the login (user, password) or a command
                  or key to the user; see "The minimal ACL rule" in docs/SECURITY.md
  127             the command could not be started
  130             interrupted while waiting for the lock

Examples:
  dlock run nightly-report -- ./report.sh --since yesterday
  dlock run --wait 0 --ttl 30s deploy -- make deploy       # 75 if a deploy is running
  dlock run balance:alice balance:bob -- ./transfer.sh alice bob 10
  dlock run --adaptive --ttl 1m sync-catalog -- ./sync.sh   # lease learnt from earlier runs
  DLOCK_REDIS_URL=redis://10.0.0.5:6379/0 dlock run --wait 2m db-migrate -- ./migrate up
  dlock run --read catalog -- ./export-catalog.sh          # many at once, none while a --write runs
  dlock run --write catalog -- ./rebuild-catalog.sh
  dlock run --permits 1/3 backups -- ./backup.sh            # at most 3 backups at once
  dlock --redis redis://10.0.0.5:6379/0 run backups -- ./backup.sh
  dlock run --b64 //4geCA= -- ./job.sh                     # NAME in base64 (as --json's name_b64)`

// waitFlag is --wait: unset means wait forever.
type waitFlag struct {
	d   time.Duration
	set bool
}

func (w *waitFlag) String() string {
	if !w.set {
		return ""
	}
	return w.d.String()
}

func (w *waitFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if d < 0 {
		return errors.New("must not be negative")
	}
	w.d, w.set = d, true
	return nil
}

// runLockTimeout bounds one Unlock and one status read after the command exits.
const runLockTimeout = 5 * time.Second

// runPoll is how often run checks the lease besides waiting on its context: the check itself
// ends a lease whose deadline passed while dlock was paused (SIGSTOP, a frozen VM).
const runPoll = 100 * time.Millisecond

func runRun(ctx context.Context, std *stdio, args []string) int {
	fs := newFlagSetSynopsis("run", "[flags] NAME [NAME... --] [--] COMMAND [ARGS...]", runUsage)
	var sf serverFlags
	sf.add(fs)
	sf.addLocking(fs)
	b64 := addB64Flag(fs)
	ttl := fs.Duration("ttl", 10*time.Second, "the lease, renewed automatically (every third of it) while the command runs; with --adaptive, the longest lease")
	adaptive := fs.Bool("adaptive", false, "choose the lease from how long earlier runs of NAME held the lock (see above), between --min-ttl and --ttl")
	minTTL := fs.Duration("min-ttl", time.Second, "with --adaptive: the shortest lease")
	var wait waitFlag
	fs.Var(&wait, "wait", "how long to wait for the lock; 0 = fail at once (exit 75) if it is busy (default: wait forever)")
	grace := fs.Duration("grace", 5*time.Second, "after the lock is lost: time between SIGTERM and SIGKILL of the command")
	label := fs.String("label", "", "label stored with the lock, shown by dlock status and list (default: the command's name)")
	read := fs.Bool("read", false, "hold NAME, a read-write lock, for reading: shared with other readers")
	write := fs.Bool("write", false, "hold NAME, a read-write lock, for writing: alone")
	var permits permitsFlag
	fs.Var(&permits, "permits", "hold `N/SIZE`: N permits of NAME, a semaphore of SIZE permits")

	names, command, done, code := parseRunArgs(fs, std, args)
	if done {
		return code
	}
	names, ok := decodeNames(fs, std, names, *b64)
	if !ok {
		return exitUsage
	}
	switch {
	case *ttl < dlock.MinTTL:
		return usageLine(fs, std, fmt.Sprintf("--ttl must be at least %v", dlock.MinTTL))
	case *grace < 0:
		return usageLine(fs, std, "--grace must not be negative")
	case *read && *write, *read && permits.set, *write && permits.set:
		return usageLine(fs, std, "--read, --write and --permits exclude each other")
	case *adaptive && (*read || *write || permits.set):
		return usageLine(fs, std, "--adaptive is for a lock, not with --read, --write or --permits")
	case len(names) > 1 && (*read || *write || permits.set):
		return usageLine(fs, std, "--read, --write and --permits take one NAME")
	case *adaptive && *minTTL < dlock.MinTTL:
		return usageLine(fs, std, fmt.Sprintf("--min-ttl must be at least %v", dlock.MinTTL))
	case *adaptive && *minTTL > *ttl:
		return usageLine(fs, std, fmt.Sprintf("--min-ttl %v is above --ttl %v", *minTTL, *ttl))
	}
	leaseOpt := dlock.WithTTL(*ttl)
	if *adaptive {
		leaseOpt = dlock.WithAdaptiveTTL(*minTTL, *ttl)
	}
	if *label == "" {
		*label = "dlock run " + filepath.Base(command[0])
	}
	if len(*label) > 256 {
		*label = (*label)[:256]
	}

	c, code := sf.dial(ctx, std, "run", leaseOpt, dlock.WithLabel(*label))
	if c == nil {
		return code
	}
	defer c.Close()

	lease, code := acquire(ctx, std, c, names, wait, runLocker(c, names, *read, *write, permits))
	if lease == nil {
		return code
	}
	return superviseRun(ctx, std, lease, names, command, *grace)
}

// parseRunArgs splits "[flags] NAME [NAME...] [flags] [--] COMMAND [ARGS...]": without "--",
// one NAME and everything after it is the command.
func parseRunArgs(fs *flag.FlagSet, std *stdio, args []string) (names []string, command []string, done bool, code int) {
	if done, code := parseFlags(fs, std, args, true); done {
		return nil, nil, true, code
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return nil, nil, true, usageLine(fs, std, "missing lock name and command")
	}
	names, rest = rest[:1], rest[1:]
	// More names and flags after NAME, up to "--".
	for i, a := range rest {
		if a == "--" {
			more, done, code := parseInterleaved(fs, std, rest[:i])
			if done {
				return nil, nil, true, code
			}
			names = append(names, more...)
			rest = rest[i+1:]
			break
		}
	}
	if len(rest) == 0 {
		return nil, nil, true, usageLine(fs, std, "missing command")
	}
	return names, rest, false, exitOK
}

// locksText names the locks in messages: lock "a", or locks "a", "b".
func locksText(names []string) string {
	if len(names) == 1 {
		return fmt.Sprintf("lock %q", names[0])
	}
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return "locks " + strings.Join(q, ", ")
}

func usageLine(fs *flag.FlagSet, std *stdio, msg string) int {
	fmt.Fprintf(std.err, "%s: %s\nRun \"%s --help\" for usage.\n", fs.Name(), msg, fs.Name())
	return exitUsage
}

// acquire takes the lock (every lock, with several names) as --wait says: m, or, when m is nil,
// the Mutex of the name or the MultiMutex of the names. It returns nil and the exit code when
// it could not.
func acquire(ctx context.Context, std *stdio, c *dlock.Client, names []string, wait waitFlag, m locker) (*dlock.Lease, int) {
	if m == nil {
		m = c.Mutex(names[0])
		if len(names) > 1 {
			m = c.MultiMutex(names)
		}
	}
	var (
		l   *dlock.Lease
		err error
	)
	switch {
	case wait.set && wait.d == 0:
		l, err = m.TryLock(ctx)
	case wait.set:
		wctx, cancel := context.WithTimeout(ctx, wait.d)
		l, err = m.Lock(wctx)
		cancel()
	default:
		l, err = m.Lock(ctx)
	}
	if err == nil {
		return l, exitOK
	}
	name := names[0] // the busy one, below
	var na *dlock.NotAcquiredError
	if errors.As(err, &na) {
		name = na.Name
	}
	switch {
	case ctx.Err() != nil:
		fmt.Fprintf(std.err, "dlock run: interrupted while waiting for %s\n", locksText(names))
		return nil, exitInterrupt
	case errors.Is(err, dlock.ErrNotAcquired), errors.Is(err, context.DeadlineExceeded):
		msg := fmt.Sprintf("lock %q is busy", name)
		if wait.d > 0 {
			msg = fmt.Sprintf("lock %q is still busy after waiting %v", name, wait.d)
		}
		ictx, cancel := context.WithTimeout(context.Background(), runLockTimeout)
		info, ierr := c.Inspect(ictx, name)
		cancel()
		if ierr == nil && info.Shared != nil {
			msg += fmt.Sprintf(" (%s)", info.Shared) // a read-write lock or semaphore: who holds, who waits
		} else if ierr == nil && info.Held {
			msg += fmt.Sprintf(": held by %s, token %d, %v of lease left", holderText(info.Holder), info.Token, info.TTL)
			if alive, why := holderAlive(info); alive != nil && !*alive {
				msg += fmt.Sprintf("; its process is not running (%s)", why)
			}
		}
		fmt.Fprintf(std.err, "dlock run: %s\n", msg)
		return nil, exitBusy
	}
	return nil, report(std, "run", err)
}

// superviseRun runs the command under the lease (runChild) and returns dlock's exit code:
// the command's, or exitLost when the lock was lost before it exited.
func superviseRun(ctx context.Context, std *stdio, lease *dlock.Lease, names []string, command []string, grace time.Duration) int {
	name := locksText(names)
	lctx := lease.Context()
	end, code := child{cmd: "run", what: name, argv: command, env: runEnv(names, lease.Tokens()), lease: lctx, grace: grace}.run(ctx, std)
	switch end {
	case childInterrupted:
		release(std, lease, name)
		fmt.Fprintf(std.err, "dlock run: interrupted before the command started\n")
		return exitInterrupt
	case childNotStarted:
		release(std, lease, name)
		return code
	case childLost:
		return exitLost // the lease has ended locally; there is nothing to release
	}
	if lctx.Err() != nil { // lost while the command ran, noticed only now
		fmt.Fprintf(std.err, "dlock run: %s was lost before the command exited\n", name)
		return exitLost
	}
	if err := release(std, lease, name); errors.Is(err, dlock.ErrLost) {
		return exitLost
	}
	return code
}

// runEnv is what the command finds in its environment about its locks: DLOCK_NAME (the names,
// one per line), DLOCK_TOKEN (one token per name, separated by spaces, in the order of names)
// and DLOCK_TOKENS (a JSON object: name -> token).
func runEnv(names []string, tokens map[string]uint64) []string {
	toks := make([]string, len(names))
	for i, n := range names {
		toks[i] = strconv.FormatUint(tokens[n], 10)
	}
	js, _ := json.Marshal(tokens)
	return []string{"DLOCK_NAME=" + strings.Join(names, "\n"), "DLOCK_TOKEN=" + strings.Join(toks, " "), "DLOCK_TOKENS=" + string(js)}
}

// release unlocks after the command exited, reporting a failure on stderr. name is locksText.
func release(std *stdio, lease *dlock.Lease, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), runLockTimeout)
	defer cancel()
	err := lease.Unlock(ctx)
	switch {
	case errors.Is(err, dlock.ErrLost):
		fmt.Fprintf(std.err, "dlock run: %s was lost before the command exited\n", name)
	case err != nil:
		fail(std, "run", fmt.Errorf("release %s (it expires with its lease): %w", name, err))
	}
	return err
}
