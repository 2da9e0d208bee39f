package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
)

// Scenario 10: dlock's read-write lock and semaphore beside its Mutex, on the same workloads, in
// several processes (rwWorkerFlag re-executes this binary as one of them).
//
//   - Read-mostly: 4 processes × 16 goroutines on one name, 95 % of the holds reads and 5 %
//     writes, each hold 1 ms long (a read of a catalog). The RWMutex takes RLock or Lock; the
//     Mutex takes Lock for both. Holds/s, the writers' wait (p50, p99) under the stream of
//     readers, and, across processes, that no write overlapped another hold.
//   - Permits: the same processes and goroutines, empty holds. The Semaphore's size is the
//     number of goroutines (no acquisition waits), against a Mutex per goroutine (no
//     acquisition waits either): the cost of an acquire+release pair, and that the holds at
//     once never exceeded the size.

// rwWorkerFlag re-executes this binary as one process of scenario 10. Args: MODE ADDR NAME
// DURATION GOROUTINES PROC HOLD SIZE. MODE: rw, mutex (the read-mostly workload), sem, or
// mutexes (the permits workload).
const rwWorkerFlag = "__rw-worker"

const (
	rmProcs      = 4
	rmGoroutines = 16
	rmWriteShare = 0.05
	rmHold       = time.Millisecond
	rmLongHold   = 5 * time.Millisecond // shown beside: how the ratio grows with the hold
)

// rmHold is one hold as a worker of scenario 10 records it: its kind (r, w, or p for a permit),
// the wall-clock time Lock returned and the time just before Unlock was called, and the wait.
type rmHoldRec struct {
	kind               byte
	acquired, released int64
	wait               int64
	counted            bool
}

func runRWWorker(args []string) int {
	time.AfterFunc(2*time.Minute, func() { os.Exit(4) })
	out := bufio.NewWriterSize(os.Stdout, 1<<16)
	defer out.Flush()
	fail := func(err error) int {
		fmt.Fprintln(out, "error:", oneLine(err))
		return 1
	}
	if len(args) != 8 {
		return fail(errors.New("usage: __rw-worker MODE ADDR NAME DURATION GOROUTINES PROC HOLD SIZE"))
	}
	mode, addr, name := args[0], args[1], args[2]
	d, err1 := time.ParseDuration(args[3])
	g, err2 := strconv.Atoi(args[4])
	proc, err3 := strconv.Atoi(args[5])
	hold, err4 := time.ParseDuration(args[6])
	size, err5 := strconv.Atoi(args[7])
	if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
		return fail(err)
	}
	octx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	c, err := dlock.Dial(octx, "redis://"+addr+"/0", dlock.WithTTL(10*time.Second))
	cancel()
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	// take returns the lock function of goroutine i for a hold of kind.
	take := func(i int) func(ctx context.Context, write bool) (*dlock.Lease, error) {
		switch mode {
		case "rw":
			rw := c.RWMutex(name)
			return func(ctx context.Context, write bool) (*dlock.Lease, error) {
				if write {
					return rw.Lock(ctx)
				}
				return rw.RLock(ctx)
			}
		case "sem":
			s := c.Semaphore(name, size)
			return func(ctx context.Context, _ bool) (*dlock.Lease, error) { return s.Acquire(ctx, 1) }
		case "mutexes":
			m := c.Mutex(fmt.Sprintf("%s:%d:%d", name, proc, i))
			return func(ctx context.Context, _ bool) (*dlock.Lease, error) { return m.Lock(ctx) }
		}
		m := c.Mutex(name)
		return func(ctx context.Context, _ bool) (*dlock.Lease, error) { return m.Lock(ctx) }
	}
	fmt.Fprintln(out, "ready")
	out.Flush()
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "go" {
		return fail(fmt.Errorf("no go signal: %q %v", line, err))
	}
	end := time.Now().Add(d)
	runCtx, cancelRun := context.WithDeadline(context.Background(), end)
	defer cancelRun()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		holds = make([][]rmHoldRec, g)
	)
	for i := range g {
		wg.Go(func() {
			lock := take(i)
			rng := rand.New(rand.NewPCG(uint64(proc), uint64(i)))
			mine := make([]rmHoldRec, 0, 1024)
			for n := 0; n < maxHoldsPerGoroutine && runCtx.Err() == nil; n++ {
				write := (mode == "rw" || mode == "mutex") && rng.Float64() < rmWriteShare
				t0 := time.Now()
				l, err := lock(runCtx, write)
				if err != nil {
					if runCtx.Err() == nil {
						mu.Lock()
						first = cmp(first, fmt.Errorf("lock: %w", err))
						mu.Unlock()
					}
					break
				}
				held := time.Now()
				if hold > 0 {
					time.Sleep(hold)
				}
				rel := time.Now()
				uctx, ucancel := context.WithTimeout(context.Background(), 10*time.Second)
				err = l.Unlock(uctx)
				ucancel()
				kind := byte('r')
				switch {
				case mode == "sem" || mode == "mutexes":
					kind = 'p'
				case write:
					kind = 'w'
				}
				mine = append(mine, rmHoldRec{kind: kind, acquired: held.UnixNano(), released: rel.UnixNano(), wait: int64(held.Sub(t0)), counted: held.Before(end)})
				if err != nil {
					mu.Lock()
					first = cmp(first, fmt.Errorf("unlock: %w", err))
					mu.Unlock()
					break
				}
			}
			holds[i] = mine
		})
	}
	wg.Wait()
	for _, hs := range holds {
		for _, h := range hs {
			c := 0
			if h.counted {
				c = 1
			}
			fmt.Fprintf(out, "h %c %d %d %d %d\n", h.kind, h.acquired, h.released, h.wait, c)
		}
	}
	if first != nil {
		fmt.Fprintln(out, "error:", oneLine(first))
	}
	fmt.Fprintln(out, "done")
	return 0
}

// rmResult is one measurement of scenario 10.
type rmResult struct {
	err                 error
	elapsed             time.Duration
	holds, reads, write int
	writeWaits          []time.Duration
	readWaits           []time.Duration
	most                int // the most holds at once
	violations          int // writes that overlapped another hold; holds beyond the size
	checked             int
}

func (r rmResult) rate() float64 { return float64(r.holds) / r.elapsed.Seconds() }

// runReadMostly runs one measurement: rmProcs processes of rmGoroutines goroutines in mode.
func runReadMostly(srv *server, mode, name string, d, hold time.Duration, size int) rmResult {
	exe, err := os.Executable()
	if err != nil {
		return rmResult{err: err}
	}
	type worker struct {
		cmd   *exec.Cmd
		in    io.WriteCloser
		lines chan string
		done  chan struct{}
	}
	var ws []*worker
	defer func() {
		for _, w := range ws {
			w.in.Close()
			w.cmd.Process.Kill()
			<-w.done
		}
	}()
	fail := func(err error) rmResult { return rmResult{err: err} }
	for p := range rmProcs {
		cmd := exec.Command(exe, rwWorkerFlag, mode, srv.Addr, name, d.String(), strconv.Itoa(rmGoroutines),
			strconv.Itoa(p), hold.String(), strconv.Itoa(size))
		cmd.SysProcAttr = childAttr()
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return fail(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return fail(err)
		}
		if err := cmd.Start(); err != nil {
			return fail(err)
		}
		w := &worker{cmd: cmd, in: in, lines: make(chan string, 1024), done: make(chan struct{})}
		ws = append(ws, w)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				w.lines <- sc.Text()
			}
			close(w.lines)
			cmd.Wait()
			close(w.done)
		}()
	}
	for p, w := range ws {
		select {
		case l, ok := <-w.lines:
			if !ok || l != "ready" {
				return fail(fmt.Errorf("worker %d: %q", p, l))
			}
		case <-time.After(20 * time.Second):
			return fail(fmt.Errorf("worker %d not ready within 20s", p))
		}
	}
	for _, w := range ws {
		io.WriteString(w.in, "go\n")
	}
	var all []rmHoldRec
	var first error
	deadline := time.After(d + 30*time.Second)
	for p, w := range ws {
		for finished := false; !finished; {
			select {
			case l, ok := <-w.lines:
				switch {
				case !ok:
					return fail(fmt.Errorf("worker %d exited without finishing", p))
				case l == "done":
					finished = true
				case strings.HasPrefix(l, "error:"):
					first = cmp(first, fmt.Errorf("worker %d: %s", p, strings.TrimSpace(l[6:])))
				case strings.HasPrefix(l, "h "):
					var h rmHoldRec
					var counted int
					if _, err := fmt.Sscanf(l, "h %c %d %d %d %d", &h.kind, &h.acquired, &h.released, &h.wait, &counted); err != nil {
						return fail(fmt.Errorf("worker %d: bad line %q", p, l))
					}
					h.counted = counted == 1
					all = append(all, h)
				}
			case <-deadline:
				return fail(fmt.Errorf("worker %d did not finish within %v", p, d+30*time.Second))
			}
		}
	}
	r := rmResult{err: first, elapsed: d, checked: len(all)}
	for _, h := range all {
		if !h.counted {
			continue
		}
		r.holds++
		switch h.kind {
		case 'w':
			r.write++
			r.writeWaits = append(r.writeWaits, time.Duration(h.wait))
		case 'r':
			r.reads++
			r.readWaits = append(r.readWaits, time.Duration(h.wait))
		}
	}
	limit := size
	switch mode {
	case "rw":
		limit = rmProcs * rmGoroutines
	case "mutex":
		limit = 1
	case "mutexes":
		limit = rmProcs * rmGoroutines
	}
	r.most, r.violations = rmCheck(all, limit)
	if r.holds == 0 {
		r.err = cmp(r.err, errors.New("no acquisition"))
	}
	return r
}

// rmCheck sweeps the holds in time: a write counts as every unit, so it overlaps any other hold;
// it returns the most units held at once and the holds that began while more than limit were.
// The times are taken inside the holds (after Lock returned, before Unlock was called), so two
// that overlap did overlap on the server too.
func rmCheck(all []rmHoldRec, limit int) (most, violations int) {
	type edge struct {
		t    int64
		open bool
		w    int
	}
	var edges []edge
	for _, h := range all {
		w := 1
		if h.kind == 'w' {
			w = limit
		}
		edges = append(edges, edge{h.acquired, true, w}, edge{h.released, false, w})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if a.t != b.t {
			return compareInt(a.t, b.t)
		}
		if a.open == b.open {
			return 0
		}
		if a.open {
			return 1 // closes first: holds that merely touch do not overlap
		}
		return -1
	})
	sum := 0
	for _, e := range edges {
		if !e.open {
			sum -= e.w
			continue
		}
		sum += e.w
		most = max(most, sum)
		if sum > limit {
			violations++
		}
	}
	return most, violations
}

func pctOf(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

// measureReadMostly is scenario 10.
func measureReadMostly(srv *server, cfg config) (string, bool) {
	type run struct {
		mode, what string
		hold       time.Duration
		size       int
	}
	g := rmProcs * rmGoroutines
	runs := []run{
		{"rw", "RWMutex: RLock / Lock", rmHold, 0},
		{"mutex", "Mutex: Lock for both", rmHold, 0},
		{"rw", "RWMutex: RLock / Lock", rmLongHold, 0},
		{"mutex", "Mutex: Lock for both", rmLongHold, 0},
		{"sem", fmt.Sprintf("Semaphore of %d: Acquire(1)", g), 0, g},
		{"mutexes", "a Mutex per goroutine: Lock", 0, 0},
	}
	key := func(rn run) string { return rn.mode + "@" + rn.hold.String() }
	res := map[string][]rmResult{}
	ok := true
	for rep := 0; rep < cfg.reps; rep++ {
		for i := range runs {
			rn := runs[(i+rep)%len(runs)]
			srv.flush()
			stop := watchdog("scenario 10, "+rn.mode, cfg.readMostlyDuration+90*time.Second)
			r := runReadMostly(srv, rn.mode, fmt.Sprintf("rm10:%d:%d", rep, i), cfg.readMostlyDuration, rn.hold, rn.size)
			stop()
			if r.err != nil {
				ok = false
				cfg.logf("scenario 10, rep %d, %s: %v", rep+1, rn.mode, r.err)
			}
			if r.violations != 0 {
				ok = false
				cfg.logf("scenario 10, %s: EXCLUSION BROKEN: %d holds began beyond the limit, of %d", rn.mode, r.violations, r.checked)
			}
			cfg.logf("scenario 10, rep %d, %-8s %8.0f holds/s (%d reads, %d writes), write wait p99 %v, at most %d at once",
				rep+1, rn.mode, r.rate(), r.reads, r.write, pctOf(r.writeWaits, 99).Round(time.Microsecond), r.most)
			res[key(rn)] = append(res[key(rn)], r)
		}
	}
	med := func(k string, f func(rmResult) float64) float64 {
		var xs []float64
		for _, r := range res[k] {
			xs = append(xs, f(r))
		}
		return median(xs)
	}
	rate := func(r rmResult) float64 { return r.rate() }
	checked := func(k string) (n, v, most int) {
		for _, r := range res[k] {
			n += r.checked
			v += r.violations
			most = max(most, r.most)
		}
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "### 10. Read-write lock and semaphore beside the Mutex: %d processes × %d goroutines\n\n", rmProcs, rmGoroutines)
	fmt.Fprintf(&b, "%v per measurement, median of %d repetitions. Each process has its own client. "+
		"**Read-mostly:** one name, %.0f %% of the holds reads and %.0f %% writes (drawn per hold), each hold %v long (the target), "+
		"and %v long beside it; "+
		"the RWMutex takes RLock or Lock, the Mutex Lock for both. Writer wait: from calling Lock to holding, "+
		"under the stream of readers (writers are preferred: a reader that comes while a writer waits waits behind it). "+
		"**Permits:** empty holds; a Semaphore whose size is the number of goroutines (no acquisition waits) "+
		"against a Mutex per goroutine (none waits either): what an acquire+release pair costs. Checked: every "+
		"process records each hold (wall-clock time Lock returned, time just before Unlock); the parent "+
		"sweeps them all and counts holds that began while a write overlapped another hold, or more "+
		"than the size were held.\n\n", cfg.readMostlyDuration, cfg.reps, 100*(1-rmWriteShare), 100*rmWriteShare, rmHold, rmLongHold)
	b.WriteString("| workload | lock | holds/s | × Mutex | reads/s | writes/s | writer wait p50 / p99 | reader wait p99 | most held at once | checked |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|---|\n")
	at := func(mode string, hold time.Duration) string { return mode + "@" + hold.String() }
	rwRate, mRate := med(at("rw", rmHold), rate), med(at("mutex", rmHold), rate)
	sRate, msRate := med(at("sem", 0), rate), med(at("mutexes", 0), rate)
	for _, rn := range runs {
		workload, base := fmt.Sprintf("read-mostly, %v holds", rn.hold), med(at("mutex", rn.hold), rate)
		if rn.mode == "sem" || rn.mode == "mutexes" {
			workload, base = "permits", msRate
		}
		k := key(rn)
		n, v, most := checked(k)
		verdict := fmt.Sprintf("exact (%s holds)", thousands(float64(n)))
		if v != 0 {
			verdict = fmt.Sprintf("**BROKEN**: %d of %s", v, thousands(float64(n)))
		}
		ww := "–"
		if rn.mode == "rw" || rn.mode == "mutex" {
			ww = fmt.Sprintf("%s / %s", rmMS(med(k, func(r rmResult) float64 { return float64(pctOf(r.writeWaits, 50)) })),
				rmMS(med(k, func(r rmResult) float64 { return float64(pctOf(r.writeWaits, 99)) })))
		}
		rw := "–"
		if rn.mode == "rw" || rn.mode == "mutex" {
			rw = rmMS(med(k, func(r rmResult) float64 { return float64(pctOf(r.readWaits, 99)) }))
		}
		reads := med(k, func(r rmResult) float64 { return float64(r.reads) / r.elapsed.Seconds() })
		writes := med(k, func(r rmResult) float64 { return float64(r.write) / r.elapsed.Seconds() })
		fmt.Fprintf(&b, "| %s | %s | %s | %.2f× | %s | %s | %s | %s | %d | %s |\n", workload, rn.what,
			thousands(med(k, rate)), med(k, rate)/base, thousands(reads), thousands(writes), ww, rw, most, verdict)
	}
	b.WriteString("\nWaits in ms.\n")
	cfg.fig.target("10, read-mostly", "RWMutex ≥ 5× the Mutex's holds/s", rwRate >= 5*mRate, "%.1f× (%s vs %s holds/s)", rwRate/mRate, thousands(rwRate), thousands(mRate))
	cfg.fig.target("10, permits", "Semaphore ≥ 0.8× the Mutex's acquire+release pairs/s", sRate >= 0.8*msRate, "%.2f× (%s vs %s pairs/s)", sRate/msRate, thousands(sRate), thousands(msRate))
	cfg.fig.info("10, read-mostly", "RWMutex writer wait p99 under the read stream", "%s ms",
		rmMS(med(at("rw", rmHold), func(r rmResult) float64 { return float64(pctOf(r.writeWaits, 99)) })))
	return b.String(), ok
}

// msText is a duration given in ns as float, in ms.
func rmMS(ns float64) string {
	ms := ns / 1e6
	switch {
	case ms < 10:
		return fmt.Sprintf("%.2f", ms)
	case ms < 100:
		return fmt.Sprintf("%.1f", ms)
	}
	return fmt.Sprintf("%.0f", ms)
}
