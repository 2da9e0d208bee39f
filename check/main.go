// Command dlock-check is dlock's fault-injection checker: it measures what the lock
// guarantees under process pauses, crashes, partitions, latency, Redis restarts and failovers,
// and server memory pressure (eviction, out of memory), in fenced and unfenced mode, and exits
// non-zero when a claimed guarantee breaks.
//
// It starts its own redis-server (real processes, loopback only), a resource server (one
// register that timestamps every operation and, in fenced mode, refuses stale tokens) and P
// worker processes (this binary again, in the worker role), each reaching Redis through its
// own fault proxy. Each worker process runs G goroutines that share its one dlock.Client, so
// the lock also passes between goroutines of one process without Redis (local handoffs); each
// goroutine loops Lock → read → write value+1 → Unlock with the lease's token, and counts as a
// client of its own in every analysis. Faults hit whole processes.
//
//	cd check && go run . --help
//	make test-check      # short: every scenario (but the few marked full-run only), both modes (CI)
//	make check-faults    # full: ≥ 10,000 operations per run; writes docs/CORRECTNESS.md
//
// It is its own module so that porcupine never enters the library's dependencies.
//
// Its files: scenario.go is the table of scenarios, one row each with everything the rest
// reads about it; faults.go the faults the rows name; run.go one run of a scenario in one mode;
// worker.go the worker role; resource.go the register the lock protects; store.go where the
// store rows keep it (an SQLite row fenced by package fence, a Redis key fenced by the Client's
// fenced operations); memory.go the memory
// limits of the scenarios that put the server under memory pressure, and the filler that loads
// an evicting server as a cache; waiter.go the faults that hit a process queued for the lock on
// the server rather than the holder, and the stalls they cause; adaptive.go the lease of the
// adaptive-lease rows (dlock.WithAdaptiveTTL); turns.go the turn rows (dlock.WithTurnSlice) and
// their faults between holds; election.go the election rows (candidates of dlock's Election,
// their terms, and what an election promises); analyze.go the figures and
// guarantees of a run; report.go the
// printed table and the docs section; clock.go the one clock every process stamps events with;
// stop_linux.go the wait for a SIGSTOPped process to freeze; main.go the command line.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"
)

// defaultGoroutines is --goroutines: 2 or more, so that every run (the short ones of CI
// included) passes the lock between goroutines of one Client under faults.
const defaultGoroutines = 2

type options struct {
	scenarios  []string
	modes      []bool // fenced?
	seed       uint64
	workers    int
	goroutines int
	ttl        time.Duration
	sentTTL    time.Duration
	waiterTTL  time.Duration
	cycles     int
	minFaults  int
	sentFaults int
	maxRun     time.Duration
	quorumMax  time.Duration
	linTimeout time.Duration
	writeDocs  string
	keep       bool
	quiet      bool
	short      bool
}

const usage = `dlock-check: fault-injection checker for dlock.

Usage (from the check/ directory; it is its own Go module):
  go run . [flags]
  make test-check     short run of every scenario in both modes (CI, under 3 minutes; the rows marked full-run only, two Sentinel election rows, run when named)
  make check-faults   full run (>= 10,000 operations per run) that writes docs/CORRECTNESS.md

Each run starts its own redis-server, a resource server (one register; in fenced mode it
refuses reads and writes whose fencing token is below the highest it has seen; pause-sql and
pause-redis keep the register in SQLite or Redis, where the library's fenced writes refuse
them: package fence, Client.FencedGet/FencedSet) and P worker
processes (this binary again, in the worker role), each reaching Redis through its own fault
proxy. Each worker process runs G goroutines (--goroutines) sharing its one dlock.Client and
so the same Mutex: when a holder unlocks while a sibling waits, the lock passes to the
sibling inside the Client, most times without a round trip to Redis (a local handoff, token
+1). Each goroutine loops: Lock -> check the lease context -> read -> (work) -> check ->
write value+1 -> Unlock, with its own resource connection, every request carrying the lease's
token, every event stamped with CLOCK_MONOTONIC (one clock for all processes on the
machine). Every analysis treats each goroutine as a client of its own ("worker S.I gG":
goroutine G of incarnation I of the process in slot S); a fault hits a whole process.

Scenarios (faults start ~1 s into traffic, one at a time, on a schedule fixed by --seed):
%s
Not run (the deployment or API is not in the library yet):
%s
Findings per run: register operations, cycles (acquisitions), local handoffs (acquisitions
whose token is the previous holder's + 1, from another goroutine of its process, or in the
turn-* scenarios taken back from the process's parked turn), overlaps
(critical sections of two clients intersecting on the resource's timeline), lost updates
(writes applied minus the final register), stale operations refused by the fence (or,
unfenced, applied although a newer token had been seen), acquire latency p50/p99, recovery
after each fault (fault start -> next successful acquisition; oom: memory back -> next grant
by the server; waiter-faults: fault start -> the next acquisition by another process after the
hit waiter's grant; frozen-waiters: the longest time the other processes went without an
acquisition, from the freeze to a window after it), lost-lock signals (before / during / after the next holder's acquire), and a
porcupine linearizability check of the lock-guarded read-modify-write. The scenarios with a
memory limit add their own figures (memory pressure): Dials refused; keys evicted, the
lock's among them and how many under a holder, and the clients' warnings; or, out of memory,
acquisitions refused with ErrOutOfMemory and what the lock's key read right after each
Unlock. The election rows (elect-*) add terms believed at once (a leader that still acted,
its leadership context saying "leading", after the next term was granted: a hazard figure
where the deployment can lose the leader's lease) and, after each fault that deposes the
leader, how soon another process led.

Exit status: 0 when every claimed guarantee held; 1 when one broke (the report names the
scenario, seed and operations); 2 on a bad command line; 3 when the harness could not run.
%s

Flags:
`

func parseFlags(args []string, out io.Writer) (options, error) {
	fs := flag.NewFlagSet("dlock-check", flag.ContinueOnError)
	fs.SetOutput(out)
	var o options
	var scen, modes string
	fs.StringVar(&scen, "scenarios", strings.Join(scenarioNames(), ","), "comma-separated scenarios to run")
	fs.StringVar(&modes, "modes", "fenced,unfenced", "comma-separated modes: fenced, unfenced")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the fault schedule (the same seed gives the same kinds, gaps, durations and variants)")
	fs.IntVar(&o.workers, "workers", 5, "worker processes (at least 5 for the published figures)")
	fs.IntVar(&o.goroutines, "goroutines", defaultGoroutines, "goroutines per worker process, sharing its one dlock.Client (so the lock passes between them locally); each is a client of its own in every analysis (the frozen-waiters scenarios run at least 6)")
	fs.DurationVar(&o.ttl, "ttl", 500*time.Millisecond, "lease TTL of every lock (but the Sentinel, waiter-faults and frozen-waiters scenarios')")
	fs.DurationVar(&o.sentTTL, "sentinel-ttl", 3*time.Second, "lease TTL in the Sentinel scenarios: longer than a failover (Sentinel's down-after is 1.5 s), so that a lock can outlive one")
	fs.DurationVar(&o.waiterTTL, "waiter-ttl", 2*time.Second, "lease TTL in the waiter-faults and frozen-waiters scenarios: longer than the acceptance window (min(TTL, 1 s)) by more than a pause that outlasts the window")
	fs.IntVar(&o.cycles, "cycles", 5000, "run until this many writes were applied (each cycle is a read and a write: 2 register operations)...")
	fs.IntVar(&o.minFaults, "min-faults", 5, "...and at least this many faults played out")
	fs.IntVar(&o.sentFaults, "sentinel-faults", 10, "...at least this many failovers per Sentinel run")
	fs.DurationVar(&o.maxRun, "max-run", 80*time.Second, "...or until this much time passed, per run")
	fs.DurationVar(&o.quorumMax, "max-run-redlock", 115*time.Second, "...or this long in the Redlock scenarios (quorum handoffs under contention are slower: see docs/CORRECTNESS.md)")
	fs.DurationVar(&o.linTimeout, "lin-timeout", 30*time.Second, "porcupine time limit per run (a timeout reports Unknown; fenced: a failure)")
	fs.BoolVar(&o.short, "short", false, "short preset for CI: --cycles 100 --min-faults 1 (pause: 2) --sentinel-faults 1 --max-run 15s --max-run-redlock 15s --lin-timeout 20s, gaps between faults halved (explicit flags win)")
	fs.StringVar(&o.writeDocs, "write-docs", "", "write the table between the check markers of this file (docs/CORRECTNESS.md)")
	fs.BoolVar(&o.keep, "keep", false, "keep the run directories (worker logs) under $TMPDIR")
	fs.BoolVar(&o.quiet, "q", false, "print only the table and failures")
	fs.Usage = func() {
		var sc, nr strings.Builder
		for _, s := range scenarios {
			fmt.Fprintf(&sc, "  %s\n      %s\n", s.name, s.help)
		}
		for _, s := range notRun {
			fmt.Fprintf(&nr, "  %s: %s\n", s.name, s.why)
		}
		if len(notRun) == 0 {
			nr.WriteString("  (none: every scenario the checker was built for runs)\n")
		}
		fmt.Fprintf(out, usage, sc.String(), nr.String(), guaranteesHelp())
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if o.short {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["cycles"] {
			o.cycles = 100
		}
		if !set["min-faults"] {
			o.minFaults = 1 // the pause scenario always runs two: one of each variant
		}
		if !set["sentinel-faults"] {
			o.sentFaults = 1
		}
		if !set["max-run"] {
			o.maxRun = 15 * time.Second
		}
		if !set["max-run-redlock"] {
			o.quorumMax = 15 * time.Second
		}
		if !set["lin-timeout"] {
			o.linTimeout = 20 * time.Second
		}
	}
	named := false
	fs.Visit(func(f *flag.Flag) { named = named || f.Name == "scenarios" })
	for _, s := range strings.Split(scen, ",") {
		s = strings.TrimSpace(s)
		sc, ok := scenarioNamed(s)
		if !ok {
			return o, fmt.Errorf("unknown scenario %q (have %s)", s, strings.Join(scenarioNames(), ", "))
		}
		if o.short && !named && sc.fullRunOnly {
			continue
		}
		o.scenarios = append(o.scenarios, s)
	}
	for _, m := range strings.Split(modes, ",") {
		switch strings.TrimSpace(m) {
		case "fenced":
			o.modes = append(o.modes, true)
		case "unfenced":
			o.modes = append(o.modes, false)
		default:
			return o, fmt.Errorf("unknown mode %q (fenced, unfenced)", m)
		}
	}
	if o.workers < 2 || o.goroutines < 1 || o.ttl < 50*time.Millisecond || o.cycles < 1 || o.maxRun <= 0 {
		return o, fmt.Errorf("need --workers >= 2, --goroutines >= 1, --ttl >= 50ms, --cycles >= 1, --max-run > 0")
	}
	if o.waiterTTL < minWaiterTTL() {
		return o, fmt.Errorf("need --waiter-ttl >= %v: a waiter is frozen past its acceptance window and within the TTL, with a margin on either side", minWaiterTTL())
	}
	return o, nil
}

func main() {
	if os.Getenv(roleEnv) == "worker" {
		os.Exit(runWorker())
	}
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		if err == flag.ErrHelp {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "dlock-check:", err)
		os.Exit(2)
	}
	os.Exit(check(o, os.Stdout, os.Stderr, strings.Join(append([]string{"dlock-check"}, os.Args[1:]...), " ")))
}

// check runs every requested scenario in every mode, prints the report and returns the exit
// status.
func check(o options, out, logw io.Writer, cmdline string) int {
	logf := func(format string, args ...any) {
		if !o.quiet {
			fmt.Fprintf(logw, format+"\n", args...)
		}
	}
	root, err := os.MkdirTemp("", "dlock-check-")
	if err != nil {
		fmt.Fprintln(logw, "dlock-check:", err)
		return 3
	}
	defer func() {
		if !o.keep {
			os.RemoveAll(root)
		}
	}()
	env := describeMachine()
	began := time.Now()
	var all []*findings
	for _, sc := range o.scenarios {
		s, _ := scenarioNamed(sc) // parseFlags checked every name
		for _, fenced := range s.modes(o.modes) {
			ttl := s.ttl(o)
			conf := runConf{
				Scenario: sc, Fenced: fenced, Seed: o.seed, Workers: o.workers, Goroutines: s.goroutinesPerProcess(o), TTL: ttl,
				Cycles: o.cycles, MinFaults: s.faults(o), MaxRun: s.deploy.maxRun(o), Short: o.short, Logf: logf,
			}
			conf.Dir = filepath.Join(root, sc+"-"+conf.mode())
			logf("run %s %s (seed %d, %d workers × %d goroutines, TTL %v)", sc, conf.mode(), o.seed, o.workers, conf.Goroutines, ttl)
			t0 := time.Now()
			d, err := run(conf)
			if err != nil {
				fmt.Fprintf(logw, "dlock-check: %s %s: the harness could not run: %v\n", sc, conf.mode(), err)
				return 3
			}
			f := analyze(d, o.linTimeout)
			logf("  %s in %v: %d ops, %d acquisitions (%d local handoffs), %d faults, %d overlaps, %d lost updates, linearizable %s, %d failures",
				sc, time.Since(t0).Round(time.Millisecond), f.Ops, f.Cycles, f.LocalHandoffs, f.Faults, f.Overlaps, f.LostUpdates, f.Linearizable, len(f.Failures))
			if sc, _ := scenarioNamed(f.Scenario); sc.election {
				logf("  %s", electionLine(f))
			}
			if m := memoryCell(f); m != "–" {
				logf("  memory pressure: %s", m)
			}
			for _, n := range f.Notes {
				logf("  note: %s", n)
			}
			if len(f.Failures) > 0 && !o.keep {
				logf("  worker logs kept in %s", conf.Dir)
				o.keep = true // keep the evidence
			}
			all = append(all, f)
		}
	}
	elapsed := time.Since(began)
	table := markdownTable(all)
	fmt.Fprintln(out, setupLine(o))
	fmt.Fprintln(out)
	fmt.Fprintln(out, table)
	failed := 0
	for _, f := range all {
		for _, msg := range f.Failures {
			failed++
			fmt.Fprintf(out, "FAIL %s %s seed %d: %s\n", f.Scenario, f.Mode, f.Seed, msg)
		}
	}
	for _, s := range notRun {
		fmt.Fprintf(out, "not run: %s (%s)\n", s.name, s.why)
	}
	fmt.Fprintf(out, "%d runs in %v; %d guarantee failures\n", len(all), elapsed.Round(time.Second), failed)
	if o.writeDocs != "" {
		if err := writeDocs(o.writeDocs, docsSection(cmdline, o, env, elapsed, all, table)); err != nil {
			fmt.Fprintln(logw, "dlock-check: write docs:", err)
			return 3
		}
		fmt.Fprintf(out, "wrote %s\n", o.writeDocs)
	}
	if failed > 0 {
		return 1
	}
	return 0
}

// guaranteesHelp says, for --help, which guarantees fail a run, and which scenarios the
// scenario table excuses from which of them.
func guaranteesHelp() string {
	list := func(keep func(*scenario) bool) string {
		var names []string
		for i := range scenarios {
			if keep(&scenarios[i]) {
				names = append(names, scenarios[i].name)
			}
		}
		if len(names) < 2 {
			return strings.Join(names, "")
		}
		return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
	}
	text := "Broken guarantees: a token handed out twice, or not increasing with the order of " +
		"grants; a lease context that said \"held\" after another holder had acquired; fenced, " +
		"a lost update or a non-linearizable history; a fault no acquisition followed"
	if l := list(func(s *scenario) bool { return s.store != memoryStore }); l != "" {
		text += "; fenced, in " + l + " (the register in SQLite or Redis, fenced by package fence or the " +
			"Client's fenced operations), a request the store's fence refused although its token was the " +
			"highest seen, or accepted although it was below"
	}
	if l := list(func(s *scenario) bool { return s.mustSignal }); l != "" {
		text += "; in " + l + ", a hit holder that never got a lost-lock signal"
	}
	if l := list(func(s *scenario) bool { return s.boundedRecovery }); l != "" {
		text += fmt.Sprintf("; in %s, recovery over TTL + %d ms", l, killRecoverySlack.Milliseconds())
	}
	for i := range scenarios {
		if s := &scenarios[i]; s.dialRefused != "" {
			text += fmt.Sprintf("; in %s, a worker's Dial not refused with an error wrapping %s, or any operation run", s.name, errName(s.dialRefused))
		}
	}
	if l := list(func(s *scenario) bool { return s.unsafeEviction }); l != "" {
		text += "; in " + l + " (WithUnsafeEviction), a client that does more than warn: a refused Dial, " +
			"a lease ended or an acquisition refused for the eviction policy, or no warning at all"
	}
	if l := list(func(s *scenario) bool { return s.evictsLocks }); l != "" {
		text += "; in " + l + ", a run in which the lock's key was never evicted under a holder (it proves nothing)"
	}
	if l := list(func(s *scenario) bool { return s.outOfMemory }); l != "" {
		text += "; in " + l + ", an Unlock that fails while the server is out of memory, or that " +
			"returns nil and leaves the lock held; while it is out of memory, an acquisition the " +
			"server grants, or refuses with an error that does not wrap ErrOutOfMemory; no grant " +
			"by the server once memory is back; or a run in which no acquisition was refused for " +
			"memory, or no release reached the server while it was out of memory (it proves nothing)"
	}
	if l := list(func(s *scenario) bool { return s.waiterFaults }); l != "" {
		text += "; in " + l + ", a fault on a waiting process after which no other process got the " +
			"lock within the acceptance window + TTL (the queue stalled), or a run in which no hit " +
			"waiter was granted the lock while frozen or dead (it proves nothing)"
	}
	if l := list(func(s *scenario) bool { return s.frozenWaiters }); l != "" {
		text += "; in " + l + ", a fault on a waiting process (frozen past its acceptance window while " +
			"the server granted it units) after which the other processes went longer than the acceptance " +
			"window + TTL without an acquisition, or a run in which no frozen waiter was granted units that " +
			"lapsed before it ran again (it proves nothing)"
	}
	if l := list(func(s *scenario) bool { return s.shared != "" }); l != "" {
		text += "; in " + l + " (a read-write lock or a semaphore, shared.go), holds believed held at one instant " +
			"(acquired, and their lease context said \"held\") that put a writer with another holder or more permits " +
			"than the size, or a hit holder never told (pause, partition); their token order, context-after-next-grant " +
			"and recovery bounds are a mutex's and not checked there"
	}
	if l := list(func(s *scenario) bool { return s.election }); l != "" {
		text += "; in " + l + " (an election, election.go), two terms believed at once (a leader that " +
			"acted, its leadership context saying \"leading\", after the next term was granted), a term " +
			"passed between campaigns of one process without the server"
		if d := list(func(s *scenario) bool { return s.election && s.deposes }); d != "" {
			text += ", or, in " + d + ", a fault after which no other process led"
		}
	}
	text += ". Unfenced overlaps and lost updates are measured, not failures."
	if l := list(func(s *scenario) bool { return s.forgetsLocks }); l != "" {
		text += " Where the deployment can forget a held lock (" + l + "), a lease context " +
			"that said \"held\" after the next grant, a local handoff of the lost hold " +
			"after a larger token, and (elections) two terms believed at once are noted " +
			"instead: the last is the hazard figure of the report."
	}
	if l := list(func(s *scenario) bool { return s.tokensUnclaimed }); l != "" {
		text += " In " + l + " (a quorum member restarts empty while the holder holds the " +
			"lock on a bare majority) increasing tokens are not claimed, and so neither is the " +
			"fence: both are noted instead."
	}
	return wrap(text, 92)
}

// wrap breaks text into lines of at most width characters, at spaces.
func wrap(text string, width int) string {
	var b strings.Builder
	n := 0
	for i, w := range strings.Fields(text) {
		l := utf8.RuneCountInString(w)
		switch {
		case i == 0:
		case n+1+l > width:
			b.WriteByte('\n')
			n = 0
		default:
			b.WriteByte(' ')
			n++
		}
		b.WriteString(w)
		n += l
	}
	return b.String()
}
