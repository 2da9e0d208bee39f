// Command bench measures dlock side by side with its peers (go-redsync/redsync, bsm/redislock,
// rueidis/rueidislock) and the raw SET NX PX + DEL floors, against its own private redis-server
// on loopback, and prints one markdown table per scenario:
//
//	go run .                 # full run (at most 6 minutes); make bench adds --write-docs
//	go run . --quick         # the same scenarios, shorter (at most a minute): make bench-quick
//	go run . --write-docs    # also write the tables into ../docs/BENCHMARKS.md
//	go run . --scenarios 1,2 --reps 5
//	go run . --scenarios 12  # leader failover (elections beside lock-and-retry loops), only when named
//	go run . --fenced-sql    # instead: fenced SQL writes beside unfenced ones (PostgreSQL, MariaDB, SQLite)
//
// It is its own module so that the peers never enter the library's dependencies.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// config is what one run measures.
type config struct {
	quick     bool
	reps      int
	scenarios []int
	// Scenario 1 (uncontended.go); its warm-up also precedes scenario 4's measurements.
	uncontendedGoroutines []int
	uncontendedDuration   time.Duration
	warmUp                time.Duration
	pairTimeout           time.Duration // a Lock+Unlock pair on a free name slower than this is a stall
	hotDuration           time.Duration // scenario 2 (hotname.go)
	hotProcsDuration      time.Duration // scenario 3 (hotname_procs.go)
	redlockDuration       time.Duration // scenario 4 (redlock.go)
	// Scenario 5 (renewal_cost.go).
	renewalLeases  []int         // how many leases scenario 5 holds, one measurement per count
	renewalTTL     time.Duration // renewal every TTL/3
	renewalPeriods int           // renewal periods measured
	renewalAcquire time.Duration // a contender that cannot take every lease within this is not measured
	// Scenario 6 (crash_recovery.go).
	crashTTL  time.Duration
	crashHold time.Duration // how long after acquiring the holder is killed
	// Scenario 7 (clients.go).
	clientsDuration time.Duration   // per measurement
	frozenTTLs      []time.Duration // the TTLs of the frozen-majority TryLock case
	frozenTries     int             // TryLocks per contender and TTL
	log             io.Writer
	fig             *figures // filled by scenarios 1 and 2 for the plot
	plotDir         string   // where to write the plot ("" = no plot)
	plotLink        string   // the plot's path as the markdown links it

	// Scenario 8 (adaptive.go).
	adaptiveNames      int           // names per way
	adaptiveRun        time.Duration // the main phase
	adaptiveCrashAfter time.Duration // how long the holder processes run before the kill
	adaptiveWaiters    bool          // measure recovery with waiters (kill → a waiter holds the name), not only PTTL
	adaptiveWatchdog   time.Duration // the watchdog's fixed lease (renewed every third of it)

	// Scenario 9 (transfers.go).
	transfersDuration time.Duration // per measurement

	// Scenario 10 (readmostly.go).
	readMostlyDuration time.Duration

	floor floorConfig // the floors beside scenarios 1 and 7 (floor.go)
	// Scenario 11 (fenced_redis.go); not in the default list.
	fencedDuration time.Duration // per measurement
	// Scenario 12 (election.go); not in the default list.
	electTTL   time.Duration // every contender's lease
	electKills int           // leaders SIGKILLed per contender
}

func (c config) logf(format string, args ...any) {
	if c.log != nil {
		fmt.Fprintf(c.log, format+"\n", args...)
	}
}

func defaultConfig(quick bool) config {
	c := config{
		reps:                  3,
		scenarios:             []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10},
		uncontendedGoroutines: []int{1, 4, 16, 64},
		uncontendedDuration:   350 * time.Millisecond, // 1 and 4 goroutines are measured twice (floor_awake.go)
		warmUp:                100 * time.Millisecond,
		pairTimeout:           5 * time.Second,
		hotDuration:           time.Second,
		hotProcsDuration:      time.Second,
		redlockDuration:       700 * time.Millisecond,
		renewalLeases:         []int{10_000, 100_000},
		renewalTTL:            3 * time.Second,
		renewalPeriods:        3,
		renewalAcquire:        20 * time.Second,
		crashTTL:              time.Second,
		crashHold:             200 * time.Millisecond,
		clientsDuration:       3 * time.Second,
		frozenTTLs:            []time.Duration{3 * time.Second, 30 * time.Second},
		frozenTries:           3,
		readMostlyDuration:    time.Second,
		adaptiveNames:         64,
		adaptiveRun:           15 * time.Second,
		adaptiveCrashAfter:    2 * time.Second,
		adaptiveWaiters:       true,
		adaptiveWatchdog:      30 * time.Second,
		transfersDuration:     time.Second,
		fencedDuration:        time.Second,
		electTTL:              time.Second,
		electKills:            20,
		log:                   os.Stderr,
		floor:                 defaultFloorConfig(quick),
	}
	if quick {
		c.quick = true
		c.reps = 1
		c.uncontendedDuration = 300 * time.Millisecond
		c.warmUp = 50 * time.Millisecond
		c.pairTimeout = 2 * time.Second
		c.hotDuration = 800 * time.Millisecond
		c.hotProcsDuration = 500 * time.Millisecond
		c.redlockDuration = 500 * time.Millisecond
		c.renewalLeases = []int{10_000, 100_000}
		c.renewalAcquire = 8 * time.Second
		c.crashTTL = 500 * time.Millisecond
		c.crashHold = 100 * time.Millisecond
		c.clientsDuration = 400 * time.Millisecond
		c.frozenTTLs = []time.Duration{time.Second, 2 * time.Second}
		c.frozenTries = 1
		c.readMostlyDuration = 500 * time.Millisecond
		c.adaptiveRun = 4 * time.Second
		c.adaptiveCrashAfter = time.Second
		c.adaptiveWaiters = false
		c.transfersDuration = 300 * time.Millisecond
		c.fencedDuration = 300 * time.Millisecond
		c.electKills = 5
	}
	return c
}

func main() {
	runFloorChild()
	if len(os.Args) > 1 && os.Args[1] == holderFlag {
		os.Exit(runHolder(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == workerFlag {
		os.Exit(runWorker(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == rwWorkerFlag {
		os.Exit(runRWWorker(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == adaptiveHolderFlag {
		os.Exit(runAdaptiveHolder(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == electWorkerFlag {
		os.Exit(runElectWorker(os.Args[2:]))
	}
	os.Exit(run(os.Args[1:], os.Stdout))
}

func run(args []string, stdout io.Writer) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "the same scenarios, shorter (under a minute)")
	reps := fs.Int("reps", 0, "repetitions per measurement, the tables give medians; scenario 8: SIGKILLs per way (default: 3, or 1 with --quick)")
	scen := fs.String("scenarios", "1,2,3,4,5,6,7,8,9,10", "comma-separated scenarios to run (1 to 12; 11, fenced operations, and 12, leader failover, only when named)")
	writeDocs := fs.Bool("write-docs", false, "write the tables into the bench-peers section of the docs file")
	docs := fs.String("docs", "../docs/BENCHMARKS.md", "the docs file --write-docs writes")
	leases := fs.String("leases", "", "comma-separated lease counts for scenario 5 (default: the mode's)")
	goroutines := fs.String("goroutines", "", "comma-separated goroutine counts for scenario 1 (default: 1,4,16,64)")
	plotDir := fs.String("plot", "", "write a plot of scenarios 1 and 2 into this directory (as "+plotFile+")")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (client side) to this file")
	via := fs.String("via", "", "the command that ran this one, for the docs (e.g. \"make bench\")")
	fencedSQL := fs.Bool("fenced-sql", false, "instead of the scenarios: the cost of a fenced SQL write (package fence) beside the same write unfenced, "+
		"on private PostgreSQL, MariaDB and SQLite (fenced_sql.go; a database not installed is skipped); prints the table")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *fencedSQL {
		round, n := 3*time.Second, 5
		if *quick {
			round, n = 500*time.Millisecond, 1
		}
		if *reps > 0 {
			n = *reps
		}
		if err := runFencedSQL(stdout, round, n, func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }); err != nil {
			fmt.Fprintln(os.Stderr, "bench: fenced SQL:", err)
			return 1
		}
		return 0
	}
	cfg := defaultConfig(*quick)
	if *reps < 0 || *reps > 100 {
		fmt.Fprintln(os.Stderr, "bench: --reps must be 1..100")
		return 2
	}
	if *reps > 0 {
		cfg.reps = *reps
	}
	cfg.scenarios = nil
	for _, f := range strings.Split(*scen, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 12 {
			fmt.Fprintf(os.Stderr, "bench: unknown scenario %q (scenarios: 1 to 12)\n", f)
			return 2
		}
		cfg.scenarios = append(cfg.scenarios, n)
	}
	// The command as the docs show it: without --via, which only names the make target.
	var shown []string
	for i := 0; i < len(args); i++ {
		switch {
		case args[i] == "--via" || args[i] == "-via":
			i++
		case strings.HasPrefix(args[i], "--via=") || strings.HasPrefix(args[i], "-via="):
		default:
			shown = append(shown, args[i])
		}
	}
	command := "`" + strings.TrimSpace("cd bench && go run . "+strings.Join(shown, " ")) + "`"
	if *via != "" {
		command = "`" + *via + "` (= " + command + ")"
	}
	if *goroutines != "" {
		cfg.uncontendedGoroutines = nil
		for _, f := range strings.Split(*goroutines, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 || n > 1024 {
				fmt.Fprintf(os.Stderr, "bench: --goroutines: %q is not a count in 1..1024\n", f)
				return 2
			}
			cfg.uncontendedGoroutines = append(cfg.uncontendedGoroutines, n)
		}
	}
	if *leases != "" {
		cfg.renewalLeases = nil
		for _, f := range strings.Split(*leases, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 || n > 1_000_000 {
				fmt.Fprintf(os.Stderr, "bench: --leases: %q is not a count in 1..1000000\n", f)
				return 2
			}
			cfg.renewalLeases = append(cfg.renewalLeases, n)
		}
	}
	if *plotDir != "" {
		cfg.plotDir = *plotDir
		cfg.plotLink = filepath.Join(*plotDir, plotFile)
		if *writeDocs {
			if rel, err := filepath.Rel(filepath.Dir(*docs), cfg.plotLink); err == nil {
				cfg.plotLink = rel
			}
		}
		cfg.plotLink = filepath.ToSlash(cfg.plotLink)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	out, ok, err := runScenarios(cfg, command)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	fmt.Fprint(stdout, out)
	if *writeDocs {
		if err := writeSection(*docs, out); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "bench: wrote %s\n", *docs)
	}
	if !ok {
		fmt.Fprintln(os.Stderr, "bench: FAILED: a dlock measurement failed or mutual exclusion was broken (see above)")
		return 1
	}
	return 0
}

// runScenarios starts the server, runs cfg's scenarios and returns the markdown.
func runScenarios(cfg config, command string) (string, bool, error) {
	srv, err := startServer()
	if err != nil {
		return "", false, err
	}
	defer srv.Close()
	// Kill the server on an interrupt too (Pdeathsig covers a crash of this process).
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	stopSig := make(chan struct{})
	defer close(stopSig)
	go func() {
		select {
		case s := <-sig:
			srv.Close()
			fmt.Fprintln(os.Stderr, "bench: interrupted:", s)
			os.Exit(130)
		case <-stopSig:
			signal.Stop(sig)
		}
	}()

	start := time.Now()
	cfg.fig = newFigures()
	loadBefore := loadavg()
	var b strings.Builder
	ok := true
	for _, s := range cfg.scenarios {
		var out string
		var sok bool
		t0 := time.Now()
		switch s {
		case 1:
			out, sok = measureUncontended(srv, cfg)
		case 2:
			out, sok = measureHotName(srv, cfg)
		case 3:
			out, sok = measureHotNameProcs(srv, cfg)
		case 4:
			out, sok = measureRedlock(cfg)
		case 5:
			out, sok = measureRenewalCost(srv, cfg)
		case 6:
			out, sok = measureCrashRecovery(srv, cfg)
		case 7:
			out, sok = measureClients(srv, cfg)
		case 8:
			out, sok = measureAdaptive(srv, cfg)
		case 9:
			out, sok = measureTransfers(srv, cfg)
		case 10:
			out, sok = measureReadMostly(srv, cfg)
		case 11:
			out, sok = measureFenced(srv, cfg)
		case 12:
			out, sok = measureElection(srv, cfg)
		}
		b.WriteString("\n" + out)
		ok = ok && sok
		cfg.logf("bench: scenario %d took %v", s, time.Since(t0).Round(100*time.Millisecond))
	}
	if cfg.plotDir != "" && (len(cfg.fig.uncontended) > 0 || len(cfg.fig.hot) > 0) {
		mode := "full run"
		if cfg.quick {
			mode = "quick run"
		}
		path, err := writePlot(cfg.plotDir, cfg.fig, fmt.Sprintf("%s, %s, %s, load average %s at the start", mode, start.UTC().Format("2006-01-02 15:04 MST"), shortMachine(), strings.Fields(loadBefore + " ?")[0]))
		if err != nil {
			return "", false, err
		}
		cfg.logf("bench: wrote %s", path)
		fmt.Fprintf(&b, "\n![Scenario 1: pairs/s by goroutines per contender; scenario 2: handoffs/s and Jain's index per contender](%s)\n", cfg.plotLink)
	}
	fmt.Fprintf(&b, "\nWhole run: %v.\n", time.Since(start).Round(time.Second))
	// The header goes first, but it says what the run's conditions were: it is written last.
	head := header(cfg, command, start, loadBefore, loadavg())
	if t := cfg.fig.targetsTable(); t != "" {
		head += "\n" + t
	}
	return head + b.String(), ok, nil
}

// gitCommit names the commit the run measured (", at commit abc1234", "+ local changes" when the
// work tree differs), or "" outside a git work tree.
func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return ""
	}
	s := ", at commit " + strings.TrimSpace(string(out))
	// The docs are left out: the run itself writes the plot before this is asked.
	if err := exec.Command("git", "diff", "--quiet", "HEAD", "--", "..", ":(exclude)../docs").Run(); err != nil {
		s += " + local changes"
	}
	return s
}

// loadavg returns the 1, 5 and 15 minute load averages from /proc/loadavg ("" elsewhere).
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func header(cfg config, command string, start time.Time, loadBefore, loadAfter string) string {
	mode := "full"
	if cfg.quick {
		mode = "quick"
	}
	return fmt.Sprintf("## Peers: dlock beside redsync, bsm/redislock, rueidislock and the raw floors\n\n"+
		"Measured by the separate `bench/` module against a private `redis-server` on loopback that it "+
		"starts itself; client and server share the machine. Medians of %d repetitions (%s mode); "+
		"\"× best peer\" divides by the best of redsync, redislock and rueidislock in the same table. "+
		"Scenario 4 (Redlock) and scenario 7's quorum cases run against 5 more private servers each.\n\n"+
		"**Command:** %s\n**Machine:** %s\n**Run:** started %s%s\n**Load average** (1, 5, 15 min, `/proc/loadavg`; the machine is shared): %s before the run, %s after it\n",
		cfg.reps, mode, strings.TrimSpace(command), machine(), start.UTC().Format("2006-01-02 15:04 MST"), gitCommit(), loadBefore, loadAfter)
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// watchdog ends the run, printing every goroutine's stack, if one measurement outlives limit:
// a hung contender must not hang the run (redis-server dies with this process by Pdeathsig).
func watchdog(what string, limit time.Duration) (stop func()) {
	t := time.AfterFunc(limit, func() {
		fmt.Fprintf(os.Stderr, "bench: %s did not finish within %v; goroutines:\n", what, limit)
		pprof.Lookup("goroutine").WriteTo(os.Stderr, 2)
		os.Exit(3)
	})
	return func() { t.Stop() }
}
