// Command dlock is the command-line face of the dlock library: a self-contained demo of the
// problem it solves, "dlock run" to run a command under a lock (a distributed flock), or
// under several at once, "dlock elect" to run a command only while leading an election and
// "dlock leader" to see who leads, "dlock status", "list" and "unlock" to inspect and
// administer locks, "dlock web" to watch them live in a browser, and "dlock latch" for
// countdown latches.
//
// Usage:
//
//	dlock [--redis URL] [--key-prefix PREFIX] <command> [flags]
//
// Run "dlock help" for the list of commands and "dlock <command> --help" for one command.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3"; otherwise the module
// version recorded in the binary is shown.
var version = ""

// stdio is where a command reads and writes; tests and the demo's worker protocol use it.
type stdio struct {
	in       io.Reader
	out, err io.Writer
}

// command is one subcommand. To add one, write its run function (with its own flag.FlagSet,
// see newFlagSet) in a file named after it and list it in init below.
type command struct {
	name    string
	summary string // one line for "dlock help"
	hidden  bool   // internal: not listed by help
	run     func(ctx context.Context, std *stdio, args []string) int
}

var commands map[string]*command

func init() {
	commands = make(map[string]*command)
	for _, c := range []*command{
		{name: "demo", summary: "oversell a stock without a lock, with a hand-made SETNX lock, and not with dlock", run: runDemo},
		{name: demoWorkerCmd, summary: "one buyer process of the demo (started by demo)", hidden: true, run: runDemoWorker},
		{name: "run", summary: "run a command while holding a lock (a distributed flock)", run: runRun},
		{name: "elect", summary: "run a command only while leading an election (one leader among the replicas)", run: runElect},
		{name: "leader", summary: "show who leads an election, or watch it change", run: runLeader},
		{name: "status", summary: "show whether a lock is held, by whom, and its token and lease", run: runStatus},
		{name: "list", summary: "list the held locks", run: runList},
		{name: "unlock", summary: "release a lock whoever holds it (admin; needs --force)", run: runUnlock},
		{name: "resize", summary: "set the size of a semaphore (admin)", run: runResize},
		{name: "latch", summary: "wait for, count down or show a countdown latch", run: runLatch},
		{name: "web", summary: "serve a live page of the held locks, with JSON and Prometheus metrics", run: runWeb},
		{name: "help", summary: "show the commands, or one command's flags", run: runHelp},
		{name: "version", summary: "print the version", run: runVersion},
	} {
		commands[c.name] = c
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := dispatch(ctx, &stdio{in: os.Stdin, out: os.Stdout, err: os.Stderr}, os.Args[1:])
	stop()
	os.Exit(code)
}

// Exit codes.
const (
	exitOK        = 0
	exitFailure   = 1   // the command ran and reports a failure
	exitUsage     = 2   // bad command line
	exitNoServer  = 69  // the Redis server cannot be reached, or cannot be used (EX_UNAVAILABLE)
	exitBusy      = 75  // run: the lock was busy and --wait ran out (EX_TEMPFAIL)
	exitLost      = 76  // run: the lock was lost while the command ran; it was terminated
	exitDenied    = 77  // the server refused the login or a command to the user (EX_NOPERM)
	exitInterrupt = 130 // stopped by Ctrl-C or SIGTERM
)

func dispatch(ctx context.Context, std *stdio, args []string) int {
	common, args, err := leadingFlags(args)
	if err != nil {
		fmt.Fprintf(std.err, "dlock: %v\nRun \"dlock help\" for the commands.\n", err)
		return exitUsage
	}
	if len(args) == 0 {
		printCommands(std.err)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help":
		name = "help"
	case "-version", "--version":
		name = "version"
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(std.err, "dlock: unknown command %q\n\n", args[0])
		printCommands(std.err)
		return exitUsage
	}
	return c.run(ctx, std, append(common, args[1:]...))
}

// leadingFlags takes the common flags (commonFlags: --redis, --key-prefix) given before the
// command, "dlock --redis URL status NAME", and returns them in the form "--name=value", to be
// given to the command first, and the rest of args, the command first.
func leadingFlags(args []string) (common, rest []string, err error) {
	for len(args) > 0 && len(args[0]) > 1 && args[0][0] == '-' {
		a := args[0]
		switch a {
		case "-h", "-help", "--help", "-version", "--version":
			return common, args, nil
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if !slices.Contains(commonFlags, name) {
			return nil, nil, fmt.Errorf("%s before the command: only --%s may come before it; give the command's other flags after it", a, strings.Join(commonFlags, " and --"))
		}
		args = args[1:]
		if !hasValue {
			if len(args) == 0 {
				return nil, nil, fmt.Errorf("%s needs a value", a)
			}
			value, args = args[0], args[1:]
		}
		common = append(common, "--"+name+"="+value)
	}
	return common, args, nil
}

func printCommands(w io.Writer) {
	fmt.Fprintln(w, "dlock: distributed locks on Redis.")
	fmt.Fprintln(w, "\nUsage:\n  dlock [--redis URL] [--key-prefix PREFIX] <command> [flags]\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n, c := range commands {
		if !c.hidden {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-9s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\n--redis and --key-prefix, the flags of every command that talks to a server, may come before")
	fmt.Fprintln(w, "the command or after it.")
	fmt.Fprintln(w, "\nRun \"dlock <command> --help\" for a command's flags and an example.")
}

// newFlagSet returns the flag set of a command; usage is the text shown by --help above the
// flag list: what the command does and at least one example.
func newFlagSet(name, usage string) *flag.FlagSet {
	return newFlagSetSynopsis(name, "[flags]", usage)
}

// newFlagSetSynopsis is newFlagSet for a command that takes arguments besides flags: synopsis
// follows the command's name on the usage line, e.g. "[flags] NAME".
func newFlagSetSynopsis(name, synopsis, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet("dlock "+name, flag.ContinueOnError)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: dlock %s %s\n\n%s\n", name, synopsis, strings.TrimSpace(usage))
		shown := shownFlags(fs)
		var hasFlags bool
		shown.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprintln(w, "\nFlags:")
			shown.SetOutput(w)
			shown.PrintDefaults()
		}
	}
	return fs
}

// aliasFlag is the Value of an old name of a flag (addAlias): it sets the flag's value, and
// --help does not list it.
type aliasFlag struct{ flag.Value }

// addAlias makes --alias another name of the flag --name, kept for the command lines written
// before the flag was renamed. --help lists only --name.
func addAlias(fs *flag.FlagSet, alias, name string) {
	fs.Var(aliasFlag{fs.Lookup(name).Value}, alias, "old name of --"+name)
}

// shownFlags returns a copy of fs's flags without the aliases, with their defaults, for --help.
func shownFlags(fs *flag.FlagSet) *flag.FlagSet {
	shown := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	fs.VisitAll(func(f *flag.Flag) {
		if _, alias := f.Value.(aliasFlag); alias {
			return
		}
		shown.Var(f.Value, f.Name, f.Usage)
		shown.Lookup(f.Name).DefValue = f.DefValue // not the value parsed before --help
	})
	return shown
}

// parseFlags parses args into fs; positional arguments after the flags (fs.Args) are an error
// unless positional is set. It returns done=true with the exit code when the command must
// stop: after --help (usage on stdout, exit 0) or a bad command line (error on stderr, exit 2).
func parseFlags(fs *flag.FlagSet, std *stdio, args []string, positional bool) (done bool, code int) {
	fs.SetOutput(io.Discard) // errors are reported below, in one line
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(std.out)
		fs.Usage()
		return true, exitOK
	case err != nil:
		fmt.Fprintf(std.err, "%s: %v\nRun \"%s --help\" for usage.\n", fs.Name(), err, fs.Name())
		return true, exitUsage
	case fs.NArg() > 0 && !positional:
		fmt.Fprintf(std.err, "%s: unexpected argument %q\nRun \"%s --help\" for usage.\n", fs.Name(), fs.Arg(0), fs.Name())
		return true, exitUsage
	}
	return false, exitOK
}

func runHelp(ctx context.Context, std *stdio, args []string) int {
	if len(args) == 0 {
		printCommands(std.out)
		return exitOK
	}
	c, ok := commands[args[0]]
	if !ok || c.name == "help" {
		if !ok {
			fmt.Fprintf(std.err, "dlock help: unknown command %q\n\n", args[0])
			printCommands(std.err)
			return exitUsage
		}
		printCommands(std.out)
		return exitOK
	}
	return c.run(ctx, std, []string{"--help"})
}

func runVersion(_ context.Context, std *stdio, args []string) int {
	fs := newFlagSet("version", `
Print the version of dlock and of the Go toolchain that built it.

Example:
  dlock version`)
	if done, code := parseFlags(fs, std, args, false); done {
		return code
	}
	fmt.Fprintf(std.out, "dlock %s (%s %s/%s)\n", buildVersion(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return exitOK
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
