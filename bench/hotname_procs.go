package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// workerFlag re-executes this binary as one process of scenarios 3 and 7: it opens a client,
// says "ready", waits for "go" on stdin, runs its goroutines on the hot name and prints its holds.
const workerFlag = "__hot-worker"

const (
	hotProcs          = 4
	hotProcGoroutines = 16
)

// hold is one acquisition seen by a worker. Times are wall clock (Unix ns), comparable across
// the processes of one machine. released is taken just before Unlock is called and acquired
// just after Lock returned, so the interval lies inside the time the server gave the lock.
type hold struct {
	proc, g  int
	token    uint64 // dlock's fencing token; 0 for peers
	acquired int64
	released int64
	wait     int64 // ns from calling Lock to holding
	counted  bool  // began before the end of the measured window
}

// runWorker is the body of a worker process. Args: CONTENDER ADDRS NAME DURATION GOROUTINES PROC
// HOLD. ADDRS is one address, or several separated by commas for a quorum contender (scenario
// 4's list); HOLD is how long each hold lasts (a sleep inside the critical section; 0: empty).
func runWorker(args []string) int {
	// A worker never outlives its parent's interest: bound its whole life.
	time.AfterFunc(2*time.Minute, func() { os.Exit(4) })
	out := bufio.NewWriterSize(os.Stdout, 1<<16)
	defer out.Flush()
	fail := func(err error) int {
		fmt.Fprintln(out, "error:", oneLine(err))
		return 1
	}
	if len(args) != 7 {
		return fail(errors.New("usage: __hot-worker CONTENDER ADDRS NAME DURATION GOROUTINES PROC HOLD"))
	}
	d, err1 := time.ParseDuration(args[3])
	g, err2 := strconv.Atoi(args[4])
	proc, err3 := strconv.Atoi(args[5])
	cs, err4 := time.ParseDuration(args[6])
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return fail(errors.New("bad arguments"))
	}
	octx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	cl, err := openNamed(octx, args[0], strings.Split(args[1], ","), 10*time.Second)
	cancel()
	if err != nil {
		return fail(err)
	}
	defer cl.close()
	// Lock functions that report dlock's fencing token.
	locks := make([]func(context.Context) (uint64, func(context.Context) error, error), g)
	for i := range locks {
		if dc, ok := cl.(*dlockClient); ok {
			m := dc.mutexOf(args[2])
			locks[i] = func(ctx context.Context) (uint64, func(context.Context) error, error) {
				l, err := m.Lock(ctx)
				if err != nil {
					return 0, nil, err
				}
				return l.Token(), l.Unlock, nil
			}
			continue
		}
		lf := cl.mutex(args[2])
		locks[i] = func(ctx context.Context) (uint64, func(context.Context) error, error) {
			u, err := lf(ctx)
			return 0, u, err
		}
	}
	fmt.Fprintln(out, "ready")
	out.Flush()
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "go" {
		return fail(fmt.Errorf("no go signal: %q %v", line, err))
	}

	start := time.Now()
	end := start.Add(d)
	runCtx, cancelRun := context.WithDeadline(context.Background(), end)
	defer cancelRun()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		holds = make([][]hold, g)
	)
	for i := 0; i < g; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lock := locks[i]
			mine := make([]hold, 0, 1024)
			for n := 0; n < maxHoldsPerGoroutine && runCtx.Err() == nil; n++ {
				t0 := time.Now()
				tok, unlock, err := lock(runCtx)
				if err != nil {
					if runCtx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
						mu.Lock()
						first = cmp(first, fmt.Errorf("lock: %w", err))
						mu.Unlock()
					}
					break
				}
				held := time.Now()
				if cs > 0 {
					time.Sleep(cs)
				}
				rel := time.Now()
				uctx, ucancel := context.WithTimeout(context.Background(), 10*time.Second)
				err = unlock(uctx)
				ucancel()
				mine = append(mine, hold{proc: proc, g: i, token: tok, acquired: held.UnixNano(),
					released: rel.UnixNano(), wait: int64(held.Sub(t0)), counted: held.Before(end)})
				if err != nil {
					mu.Lock()
					first = cmp(first, fmt.Errorf("unlock: %w", err))
					mu.Unlock()
					break
				}
			}
			holds[i] = mine
		}()
	}
	wg.Wait()
	for _, hs := range holds {
		for _, h := range hs {
			c := 0
			if h.counted {
				c = 1
			}
			fmt.Fprintf(out, "h %d %d %d %d %d %d\n", h.g, h.token, h.acquired, h.released, h.wait, c)
		}
	}
	if first != nil {
		fmt.Fprintln(out, "error:", oneLine(first))
	}
	fmt.Fprintln(out, "done")
	return 0
}

func cmp(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// hotProcsResult is one measurement of scenario 3.
type hotProcsResult struct {
	hotResult
	holdsChecked int
}

// runMultiProc starts hotProcs worker processes of hotProcGoroutines goroutines each on one name,
// starts them together, merges their holds and checks that no two overlap in time.
func runMultiProc(srv *server, c *contender, d time.Duration, name string) hotProcsResult {
	return runProcs(procsRun{contender: c.name, addrs: []string{srv.Addr}, procs: hotProcs, goroutines: hotProcGoroutines,
		d: d, name: name, byToken: c.kind == kindDlock})
}

// procsRun is one multi-process measurement on one name.
type procsRun struct {
	contender         string   // a name in contenders (one address) or quorumContenders (several)
	addrs             []string // the servers
	procs, goroutines int      // worker processes, goroutines in each
	d                 time.Duration
	hold              time.Duration // time inside the critical section (0: empty)
	name              string        // the lock name
	byToken           bool          // order the holds by fencing token (dlock on one server)
}

// runProcs starts run.procs worker processes of run.goroutines goroutines each on one name,
// starts them together, merges their holds and checks that no two overlap in time. Least
// served, Jain's index and "to another" are over all run.procs × run.goroutines goroutines.
func runProcs(run procsRun) hotProcsResult {
	d := run.d
	exe, err := os.Executable()
	if err != nil {
		return hotProcsResult{hotResult: hotResult{err: err}}
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
	fail := func(err error) hotProcsResult { return hotProcsResult{hotResult: hotResult{err: err}} }
	for p := 0; p < run.procs; p++ {
		cmd := exec.Command(exe, workerFlag, run.contender, strings.Join(run.addrs, ","), run.name, d.String(),
			strconv.Itoa(run.goroutines), strconv.Itoa(p), run.hold.String())
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
	var all []hold
	var first error
	deadline := time.After(d + 30*time.Second)
	for p, w := range ws {
		finished := false
		for !finished {
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
					var h hold
					var counted int
					if _, err := fmt.Sscanf(l, "h %d %d %d %d %d %d", &h.g, &h.token, &h.acquired, &h.released, &h.wait, &counted); err != nil {
						return fail(fmt.Errorf("worker %d: bad line %q", p, l))
					}
					h.proc, h.counted = p, counted == 1
					all = append(all, h)
				}
			case <-deadline:
				return fail(fmt.Errorf("worker %d did not finish within %v", p, d+30*time.Second))
			}
		}
	}
	r := hotProcsResult{hotResult: hotResult{err: first, elapsed: d}, holdsChecked: len(all)}
	r.overlaps = overlaps(all, run.byToken)
	// Handoffs to another goroutine: in acquisition order over all processes.
	slices.SortFunc(all, func(a, b hold) int { return compareInt(a.acquired, b.acquired) })
	counts := make([]int64, run.procs*run.goroutines)
	var waits []time.Duration
	prev := -1
	for _, h := range all {
		id := h.proc*run.goroutines + h.g
		if h.counted {
			counts[id]++
			waits = append(waits, time.Duration(h.wait))
			r.handoffs++
			if id != prev {
				r.changes++
			}
		}
		prev = id
	}
	if len(waits) == 0 {
		r.err = cmp(r.err, errors.New("no acquisition"))
		return r
	}
	slices.Sort(waits)
	r.waitP50 = waits[len(waits)/2]
	r.waitP99 = waits[len(waits)*99/100]
	r.waitMax = waits[len(waits)-1]
	r.jain, r.minShare = jain(counts)
	return r
}

func compareInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// overlaps counts holds that overlap the previous one in time. With fencing tokens the holds are
// ordered by token, which must also be strictly increasing; without, by acquisition time.
func overlaps(all []hold, byToken bool) int64 {
	hs := slices.Clone(all)
	if byToken {
		slices.SortFunc(hs, func(a, b hold) int {
			if a.token != b.token {
				return compareInt(int64(a.token), int64(b.token))
			}
			return compareInt(a.acquired, b.acquired)
		})
	} else {
		slices.SortFunc(hs, func(a, b hold) int { return compareInt(a.acquired, b.acquired) })
	}
	var n int64
	for i := 1; i < len(hs); i++ {
		if hs[i].acquired < hs[i-1].released || byToken && hs[i].token <= hs[i-1].token {
			n++
		}
	}
	return n
}

// measureHotNameProcs is scenario 3: scenario 2 spread over several processes with a client each
// (fairness across processes, mutual exclusion checked across them), for every lock, reps times.
func measureHotNameProcs(srv *server, cfg config) (string, bool) {
	var locks []*contender
	for _, c := range contenders {
		if c.kind != kindRaw {
			locks = append(locks, c)
		}
	}
	res := map[*contender][]hotProcsResult{}
	ok := true
	for rep := 0; rep < cfg.reps; rep++ {
		for i := range locks {
			c := locks[(i+rep)%len(locks)]
			srv.flush()
			stop := watchdog("scenario 3, "+c.name, cfg.hotProcsDuration+90*time.Second)
			r := runMultiProc(srv, c, cfg.hotProcsDuration, fmt.Sprintf("hot3:%d:%d", rep, i))
			stop()
			if r.err != nil {
				ok = ok && c.kind != kindDlock
				cfg.logf("scenario 3, rep %d, %s: %v", rep+1, c.name, r.err)
			}
			if r.overlaps != 0 {
				// A peer's overlap is a finding for the table; only dlock's fails the run.
				ok = ok && c.kind != kindDlock
				cfg.logf("scenario 3, %s: MUTUAL EXCLUSION BROKEN: %d overlapping holds of %d", c.name, r.overlaps, r.holdsChecked)
			}
			cfg.logf("scenario 3, rep %d, %-18s %7.0f handoffs/s, wait p50 %v p99 %v, Jain %.3f, %d holds checked",
				rep+1, c.name, r.rate(), r.waitP50.Round(time.Microsecond), r.waitP99.Round(time.Microsecond), r.jain, r.holdsChecked)
			res[c] = append(res[c], r)
		}
	}
	var b strings.Builder
	g := hotProcs * hotProcGoroutines
	fmt.Fprintf(&b, "### 3. Hot name, %d processes: %d goroutines each, one name, empty critical section\n\n", hotProcs, hotProcGoroutines)
	fmt.Fprintf(&b, "%v per measurement, median of %d repetitions, contenders interleaved; each process has its "+
		"own client (connections, pools, renewal loop). Wait, Jain's index (over all %d goroutines), "+
		"\"to another goroutine\" (in acquisition order over all processes) and least served as in "+
		"scenario 2. Mutual exclusion: every process records each hold as (fencing token for dlock, "+
		"wall-clock time Lock returned, wall-clock time just before Unlock was called); the parent "+
		"merges them, orders them by token (dlock: tokens must also strictly increase) or by acquisition "+
		"time (peers) and checks that each hold starts after the previous one ended; \"exact\" gives "+
		"the number of holds checked (all repetitions).\n\n", cfg.hotProcsDuration, cfg.reps, g)
	rows := map[*contender]hotRow{}
	checked := map[*contender]int{}
	for _, c := range locks {
		base := make([]hotResult, len(res[c]))
		for i, x := range res[c] {
			base[i] = x.hotResult
			checked[c] += x.holdsChecked
		}
		rows[c] = aggregateHot(base)
	}
	writeHotTable(&b, locks, rows, func(c *contender, r hotRow) string {
		if r.overlaps != 0 {
			return fmt.Sprintf("**BROKEN**: %d overlapping holds of %s", r.overlaps, thousands(float64(checked[c])))
		}
		return fmt.Sprintf("exact (%s holds)", thousands(float64(checked[c])))
	}, cfg.fig, fmt.Sprintf("3, %d processes × %d goroutines", hotProcs, hotProcGoroutines), hotProcs*hotProcGoroutines)
	return b.String(), ok
}
