package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

const demoUsage = `
The articles' stock deduction, run for real: worker processes of buyers read a stock in
Redis and, if it is above zero, work a few milliseconds and write back one less. It runs
three ways, each on a fresh stock, and prints one row per way:

  no lock       plain GET and SET
  naive SETNX   the hand-made lock: SET lock NX PX ttl ... DEL lock (no owner check,
                no renewal, no fencing), retried after a sleep while busy
  dlock         c.Do with lease renewal, and fenced reads and writes of the stock
                (c.FencedGet, c.FencedSet: the server refuses an older token)

In every mode the demo freezes (SIGSTOP) the worker that is inside a purchase for longer
than the lease, then lets it go on (SIGCONT), a few times: the fault of a long GC pause.
It exits 0 only if the dlock row sold exactly the stock; when the --redis server cannot be
used, with the codes of the other commands: 2 for a bad URL, 69 when the server cannot be
reached, 77 when it refuses the login or a command (see "The minimal ACL rule" in
docs/SECURITY.md).

Without --redis it starts a private server: redis-server on a free loopback port when one
is on PATH, else an embedded one (miniredis) inside this process.

Examples:
  dlock demo
  dlock demo --redis redis://127.0.0.1:6379/0 --mode dlock --stock 1000
  dlock demo --stock 60 --procs 3 --goroutines 4 --ttl 200ms --pauses 1`

// Limits on the flags, to keep a mistyped value from forking a thousand processes.
const (
	maxStock      = 1_000_000
	maxProcs      = 64
	maxGoroutines = 256
	maxPauses     = 20
)

const (
	monitorTick  = 10 * time.Millisecond // how often the parent looks at the stock
	readyTimeout = 20 * time.Second      // for the workers to start and connect
	stopTimeout  = 5 * time.Second       // for the workers to exit after "stop"
)

type demoConfig struct {
	redisURL   string
	stock      int
	procs      int
	goroutines int
	ttl        time.Duration
	pauses     int
	pause      time.Duration
	modes      []string
	seed       uint64
	transport  string
	timeout    time.Duration
}

// modeResult is one row of the table.
type modeResult struct {
	mode     string
	initial  int64
	left     int64 // stock at the end
	stats    map[string]int64
	freezes  int
	duration time.Duration // from "go" to the moment the stock ran out for good
	timedOut bool
	err      error
}

func (r *modeResult) sold() int64 { return r.stats[statSold] }

// oversold counts the sales beyond the stock actually given up.
func (r *modeResult) oversold() int64 { return r.sold() - (r.initial - r.left) }

func (r *modeResult) exact() bool {
	return r.err == nil && !r.timedOut && r.sold() == r.initial && r.left == 0 && r.oversold() == 0
}

type demo struct {
	cfg  demoConfig
	std  *stdio
	exe  string // this binary, run again as the workers
	url  string
	rdb  *redis.Client
	run  string // names this run's keys
	prog *progress
}

func runDemo(ctx context.Context, std *stdio, args []string) int {
	fs := newFlagSet("demo", demoUsage)
	var cfg demoConfig
	fs.StringVar(&cfg.redisURL, "redis", "", "use the Redis server at this URL (redis://host:port/db) instead of a private one")
	fs.IntVar(&cfg.stock, "stock", 500, "items in stock at the start of each mode")
	fs.IntVar(&cfg.procs, "procs", 4, "worker processes")
	fs.IntVar(&cfg.goroutines, "goroutines", 8, "buyers (goroutines) in each worker process")
	fs.DurationVar(&cfg.ttl, "ttl", 200*time.Millisecond, "lease of the naive lock and of dlock's locks")
	fs.IntVar(&cfg.pauses, "pauses", 3, "how many times each mode freezes the worker inside a purchase")
	fs.DurationVar(&cfg.pause, "pause", 0, "how long each freeze lasts (default 3 × --ttl)")
	mode := fs.String("mode", "all", "which modes to run: all, nolock, naive or dlock")
	fs.Uint64Var(&cfg.seed, "seed", 1, "seed of the buyers' random work times (0 picks one)")
	fs.StringVar(&cfg.transport, "transport", "rueidis", "dlock's Redis client in the workers: rueidis or goredis")
	fs.DurationVar(&cfg.timeout, "timeout", time.Minute, "hard limit on each mode; its workers are then killed")
	if done, code := parseFlags(fs, std, args, false); done {
		return code
	}
	if cfg.pause == 0 {
		cfg.pause = 3 * cfg.ttl
	}
	switch *mode {
	case "all":
		cfg.modes = []string{modeNoLock, modeNaive, modeDlock}
	case modeNoLock, modeNaive, modeDlock:
		cfg.modes = []string{*mode}
	default:
		return usageError(std, "--mode must be all, nolock, naive or dlock, not %q", *mode)
	}
	switch {
	case cfg.stock < 1 || cfg.stock > maxStock:
		return usageError(std, "--stock must be between 1 and %d", maxStock)
	case cfg.procs < 1 || cfg.procs > maxProcs:
		return usageError(std, "--procs must be between 1 and %d", maxProcs)
	case cfg.goroutines < 1 || cfg.goroutines > maxGoroutines:
		return usageError(std, "--goroutines must be between 1 and %d", maxGoroutines)
	case cfg.ttl < 10*time.Millisecond:
		return usageError(std, "--ttl must be at least 10ms")
	case cfg.pauses < 0 || cfg.pauses > maxPauses:
		return usageError(std, "--pauses must be between 0 and %d", maxPauses)
	case cfg.pause < 0:
		return usageError(std, "--pause must not be negative")
	case cfg.timeout <= 0:
		return usageError(std, "--timeout must be positive")
	case cfg.transport != "rueidis" && cfg.transport != "goredis":
		return usageError(std, "--transport must be rueidis or goredis")
	}
	if cfg.seed == 0 {
		cfg.seed = uint64(time.Now().UnixNano())
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(std.err, "dlock demo: cannot find this program to start workers: %v\n", err)
		return exitFailure
	}
	var runID [4]byte
	rand.Read(runID[:])

	srv, err := openServer(ctx, cfg.redisURL)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(std.err, "dlock demo: interrupted")
			return exitInterrupt
		}
		var se *serverError
		if errors.As(err, &se) {
			if se.code == exitDenied {
				fmt.Fprintf(std.err, "dlock demo: access denied: %s; %s\n", se.msg, deniedHint(se.msg))
			} else {
				fmt.Fprintf(std.err, "dlock demo: %s\n", se.msg)
			}
			return se.code
		}
		fmt.Fprintf(std.err, "dlock demo: %v\n", err)
		return exitFailure
	}
	if srv.stop != nil {
		defer srv.stop()
	}
	rdb, err := newRedisClient(srv.url, 4)
	if err != nil {
		fmt.Fprintf(std.err, "dlock demo: %v\n", err)
		return exitFailure
	}
	defer rdb.Close()
	d := &demo{
		cfg: cfg, std: std, exe: exe, url: srv.url, rdb: rdb,
		run:  hex.EncodeToString(runID[:]),
		prog: newProgress(std.out),
	}
	return d.main(ctx, srv)
}

func usageError(std *stdio, format string, args ...any) int {
	fmt.Fprintf(std.err, "dlock demo: "+format+"\nRun \"dlock demo --help\" for usage.\n", args...)
	return exitUsage
}

func (d *demo) main(ctx context.Context, srv *demoServer) int {
	cfg, out := d.cfg, d.std.out
	fmt.Fprintf(out, "dlock demo: %d worker processes × %d buyers sell a stock of %d items kept in Redis.\n",
		cfg.procs, cfg.goroutines, cfg.stock)
	if cfg.pauses > 0 {
		fmt.Fprintf(out, "fault: %s per mode, the worker inside a purchase is frozen (SIGSTOP) for %v; the lease is %v.\n",
			plural(cfg.pauses, "time", "times"), cfg.pause, cfg.ttl)
	} else {
		fmt.Fprintf(out, "fault: none (--pauses 0); the lease is %v.\n", cfg.ttl)
	}
	fmt.Fprintf(out, "server: %s\n", srv.about)
	if srv.stop == nil {
		fmt.Fprintf(out, "keys: demo:{%s}:* (deleted after each mode)\n", d.run)
	}
	fmt.Fprintf(out, "seed: %d\n\n", cfg.seed)
	// On a terminal the rows appear as the modes finish, under a progress line rewritten in
	// place; otherwise the progress lines come first and the table after them.
	if d.prog.tty {
		printHeader(out)
	}
	var results []*modeResult
	for _, m := range cfg.modes {
		r := d.runMode(ctx, m)
		d.prog.clear()
		if ctx.Err() != nil {
			fmt.Fprintln(d.std.err, "dlock demo: interrupted")
			return exitInterrupt
		}
		if d.prog.tty {
			printRow(out, r)
		}
		results = append(results, r)
	}
	if !d.prog.tty {
		fmt.Fprintln(out)
		printHeader(out)
		for _, r := range results {
			printRow(out, r)
		}
	}
	printFooter(out, cfg, results)

	code := exitOK
	for _, r := range results {
		switch {
		case r.timedOut:
			fmt.Fprintf(d.std.err, "dlock demo: FAIL: the %s mode timed out after %v\n", modeTitles[r.mode], cfg.timeout)
			code = exitFailure
		case r.err != nil:
			fmt.Fprintf(d.std.err, "dlock demo: FAIL: the %s mode failed: %v\n", modeTitles[r.mode], r.err)
			code = exitFailure
		case r.mode == modeDlock && !r.exact():
			fmt.Fprintf(d.std.err, "dlock demo: FAIL: dlock is not exact: sold %d of %d, stock left %d, oversold %d\n",
				r.sold(), r.initial, r.left, r.oversold())
			code = exitFailure
		}
	}
	return code
}

// runMode sells a fresh stock in one mode and returns its row.
func (d *demo) runMode(ctx context.Context, mode string) *modeResult {
	cfg := d.cfg
	r := &modeResult{mode: mode, initial: int64(cfg.stock), stats: map[string]int64{}}
	keys := newDemoKeys(d.run, mode)
	if err := d.rdb.Del(ctx, keys.all()...).Err(); err != nil {
		r.err = err
		return r
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		d.rdb.Del(cctx, keys.all()...)
		cancel()
	}()
	if err := d.rdb.Set(ctx, keys.stock, cfg.stock, 0).Err(); err != nil {
		r.err = err
		return r
	}

	workers := make([]*workerProc, 0, cfg.procs)
	defer func() {
		for _, w := range workers {
			w.kill()
		}
	}()
	for i := range cfg.procs {
		w, err := startWorker(d.exe, i, []string{
			demoWorkerCmd, "--redis", d.url, "--mode", mode, "--run", d.run,
			"--goroutines", strconv.Itoa(cfg.goroutines), "--ttl", cfg.ttl.String(),
			"--seed", strconv.FormatUint(cfg.seed, 10), "--id", strconv.Itoa(i),
			"--transport", cfg.transport, "--timeout", (cfg.timeout + readyTimeout + stopTimeout).String(),
		})
		if err != nil {
			r.err = err
			return r
		}
		workers = append(workers, w)
	}
	d.prog.update(fmt.Sprintf("  %-12s starting %d workers", modeTitles[mode], cfg.procs), true)
	if err := waitReady(ctx, workers); err != nil {
		r.err = err
		return r
	}
	for _, w := range workers {
		w.send("go")
	}
	start := time.Now()
	d.watch(ctx, r, keys, workers, start)
	if r.err == nil && !r.timedOut {
		r.err = stopWorkers(workers)
	}
	if r.duration == 0 {
		r.duration = time.Since(start)
	}
	for _, w := range workers {
		w.kill() // before the final count: nothing may write after it
	}
	if err := d.readCounts(context.WithoutCancel(ctx), keys, r); err != nil && r.err == nil {
		r.err = err
	}
	if !d.prog.tty && r.err == nil {
		end := "  done"
		if r.timedOut {
			end = "  timed out"
		}
		d.prog.update(d.progressLine(r, nil, r.duration)+end, true)
	}
	return r
}

// watch follows the sale until the stock has run out for good, freezing the worker inside a
// purchase cfg.pauses times along the way, and updates the progress line. The k-th freeze
// comes once k/(pauses+2) of the stock is gone, at least a quarter lease after the previous
// one ended: the other buyers sell while a worker is frozen, and the last freeze must still
// find stock to fight over.
func (d *demo) watch(ctx context.Context, r *modeResult, keys demoKeys, workers []*workerProc, start time.Time) {
	cfg := d.cfg
	// The sale is over once the stock has stayed at zero this long with no worker frozen:
	// time for a worker just let go to write what it had computed before its freeze.
	settle := max(2*cfg.ttl, 100*time.Millisecond)
	ticker := time.NewTicker(monitorTick)
	defer ticker.Stop()
	hard := time.NewTimer(cfg.timeout)
	defer hard.Stop()
	var (
		frozen               *workerProc
		thawAt, thawed, zero time.Time
	)
	defer func() {
		if frozen != nil {
			frozen.resume()
		}
	}()
	for range int(cfg.timeout/monitorTick) + 1000 { // the timer ends it first; the count is a backstop
		select {
		case <-ctx.Done():
			r.err = ctx.Err()
			return
		case <-hard.C:
			r.timedOut = true
			return
		case <-ticker.C:
		}
		for _, w := range workers {
			if w.hasExited() {
				r.err = w.exitError("exited during the sale")
				return
			}
		}
		if err := d.readCounts(ctx, keys, r); err != nil {
			r.err = err
			return
		}
		now := time.Now()
		if frozen != nil && !now.Before(thawAt) {
			if err := frozen.resume(); err != nil {
				r.err = err
				return
			}
			frozen, thawed = nil, now
		}
		gone := float64(r.initial-r.left) / float64(r.initial)
		if frozen == nil && r.freezes < cfg.pauses && now.Sub(thawed) >= cfg.ttl/4 &&
			gone >= float64(r.freezes+1)/float64(cfg.pauses+2) {
			if w := d.inside(ctx, keys, workers); w != nil {
				if err := w.pause(); err != nil {
					r.err = err
					return
				}
				frozen, thawAt = w, time.Now().Add(cfg.pause)
				r.freezes++
			}
		}
		if r.left <= 0 && frozen == nil {
			if zero.IsZero() {
				zero = now
			}
			if now.Sub(zero) >= settle && now.Sub(thawed) >= settle {
				r.duration = zero.Sub(start)
				return
			}
		} else {
			zero = time.Time{}
		}
		d.prog.update(d.progressLine(r, frozen, now.Sub(start)), false)
	}
	r.timedOut = true
}

func (d *demo) progressLine(r *modeResult, frozen *workerProc, elapsed time.Duration) string {
	cfg := d.cfg
	line := fmt.Sprintf("  %-12s stock %*d/%d  sold %6d", modeTitles[r.mode],
		len(strconv.Itoa(cfg.stock)), r.left, cfg.stock, r.sold())
	if cfg.pauses > 0 {
		line += fmt.Sprintf("  freezes %d/%d", r.freezes, cfg.pauses)
		if frozen != nil {
			line += fmt.Sprintf(" (pid %d frozen)", frozen.pid())
		}
	}
	return line + fmt.Sprintf("  %5.1fs", elapsed.Seconds())
}

// inside returns a worker that is in the middle of a purchase, looking for one for up to
// insideTries milliseconds; nil if it found none.
func (d *demo) inside(ctx context.Context, keys demoKeys, workers []*workerProc) *workerProc {
	const insideTries = 50
	for range insideTries {
		pid, err := d.rdb.Get(ctx, keys.inside).Int()
		if err == nil {
			for _, w := range workers {
				if w.pid() == pid && !w.hasExited() {
					return w
				}
			}
		}
		if !sleepCtx(ctx, time.Millisecond) {
			return nil
		}
	}
	return nil
}

func (d *demo) readCounts(ctx context.Context, keys demoKeys, r *modeResult) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var (
		left  *redis.StringCmd
		stats *redis.MapStringStringCmd
	)
	_, err := d.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		left = p.Get(ctx, keys.stock)
		stats = p.HGetAll(ctx, keys.stats)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("read the stock: %w", err)
	}
	n, err := left.Int64()
	if err != nil {
		return fmt.Errorf("read the stock: %w", err)
	}
	r.left = n
	for k, v := range stats.Val() {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			r.stats[k] = n
		}
	}
	return nil
}

// The table. Its columns are sized for five-digit counts.
const rowFormat = "%-12s %6s %11s %9s %22s %9s %12s\n"

func printHeader(w io.Writer) {
	fmt.Fprintf(w, rowFormat, "mode", "sold", "stock left", "oversold", "rejected stale writes", "duration", "purchases/s")
}

func printRow(w io.Writer, r *modeResult) {
	rejected := "-"
	if r.mode == modeDlock {
		rejected = strconv.FormatInt(r.stats[statRejectedWrites], 10)
	}
	rate := "-"
	if s := r.duration.Seconds(); s > 0 {
		rate = strconv.FormatFloat(float64(r.sold())/s, 'f', 0, 64)
	}
	fmt.Fprintf(w, rowFormat, modeTitles[r.mode], strconv.FormatInt(r.sold(), 10), strconv.FormatInt(r.left, 10),
		strconv.FormatInt(r.oversold(), 10), rejected, fmt.Sprintf("%.2fs", r.duration.Seconds()), rate)
	var notes []string
	switch {
	case r.timedOut:
		notes = append(notes, "TIMED OUT: workers killed; the counts are partial")
	case r.err != nil:
		notes = append(notes, "FAILED: "+r.err.Error())
	}
	if r.freezes > 0 {
		notes = append(notes, fmt.Sprintf("%s, %s frozen past the lease",
			plural(r.freezes, "freeze", "freezes"), plural(int(r.stats[statOverran]), "purchase", "purchases")))
	}
	if n := r.stats[statForeignDel]; n > 0 {
		notes = append(notes, plural(int(n), "DEL", "DELs")+" freed another buyer's lock")
	}
	if r.mode == modeDlock {
		notes = append(notes, plural(int(r.stats[statLost]), "lease", "leases")+" lost")
		if n := r.stats[statRejectedReads]; n > 0 {
			notes = append(notes, plural(int(n), "stale read", "stale reads")+" refused")
		}
	}
	if len(notes) > 0 {
		fmt.Fprintf(w, "%-12s └ %s\n", "", strings.Join(notes, "; "))
	}
}

func printFooter(w io.Writer, cfg demoConfig, results []*modeResult) {
	fmt.Fprintf(w, "\noversold = sold − (%d − stock left): sales recorded beyond the stock actually given up.\n", cfg.stock)
	fmt.Fprintln(w, "rejected stale writes = writes refused by the stock's fence (dlock mode); its buyers write even after losing the lease, to test the fence.")
	var says []string
	for _, r := range results {
		if r.err != nil || r.timedOut {
			continue
		}
		switch {
		case r.mode == modeNoLock && r.oversold() > 0:
			says = append(says, fmt.Sprintf("Without a lock, buyers overwrite each other's stock updates and sell %d items from a stock of %d.", r.sold(), r.initial))
		case r.mode == modeNaive && r.oversold() > 0:
			s := "The hand-made SETNX lock works until a frozen holder outlives its lease: another buyer gets in and the late one writes back a stale stock"
			if r.stats[statForeignDel] > 0 {
				s += ", then its DEL frees another buyer's lock"
			}
			says = append(says, fmt.Sprintf("%s (%d oversold).", s, r.oversold()))
		case r.mode == modeDlock && r.exact():
			says = append(says, fmt.Sprintf("With dlock a frozen holder loses its lease and the fence refuses its late writes: exactly %d sold.", r.initial))
		}
	}
	if len(says) > 0 {
		fmt.Fprintln(w, strings.Join(says, "\n"))
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}
