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
	"time"
)

// Scenario 7's floor table: the minimal FIFO handoff (floor_fifo.go) beside dlock and redsync in
// scenario 7's one-server cases (10 clients × 1 goroutine, one name, empty and 1 ms sections),
// measured in their own interleaved loop with what each hold costs: the workers' CPU and context
// switches (getrusage of each worker over its measured window) and the server's CPU (INFO).

// floorWorkerFlag re-executes this binary as one client of the floor table: it opens a client,
// says "ready", waits for "go" on stdin, locks, holds and unlocks in a loop on one goroutine,
// then prints its usage over the loop and its holds.
const floorWorkerFlag = "__floor-worker"

// floorLocks are the floor table's contenders.
var floorLocks = []string{"dlock (rueidis)", "redsync", fifoName}

// openFloor opens a contender of the floor table.
func openFloor(ctx context.Context, name, addr string, ttl time.Duration) (client, error) {
	if name == fifoName {
		return fifoContender.open(ctx, addr, ttl)
	}
	if c := contenderByName(name); c != nil {
		return c.open(ctx, addr, ttl)
	}
	return nil, fmt.Errorf("no contender %q", name)
}

// tokenLock is a lock function that also reports the fencing token (0: the lock has none).
type tokenLock func(context.Context) (uint64, func(context.Context) error, error)

func tokenLockOf(cl client, name string) tokenLock {
	switch c := cl.(type) {
	case *dlockClient:
		m := c.mutexOf(name)
		return func(ctx context.Context) (uint64, func(context.Context) error, error) {
			l, err := m.Lock(ctx)
			if err != nil {
				return 0, nil, err
			}
			return l.Token(), l.Unlock, nil
		}
	case *fifoClient:
		return c.tokenMutex(name)
	}
	lf := cl.mutex(name)
	return func(ctx context.Context) (uint64, func(context.Context) error, error) {
		u, err := lf(ctx)
		return 0, u, err
	}
}

// runFloorWorker is the body of a floor worker. Args: CONTENDER ADDR NAME DURATION PROC HOLD.
func runFloorWorker(args []string) int {
	time.AfterFunc(2*time.Minute, func() { os.Exit(4) })
	out := bufio.NewWriterSize(os.Stdout, 1<<16)
	defer out.Flush()
	fail := func(err error) int {
		fmt.Fprintln(out, "error:", oneLine(err))
		return 1
	}
	if len(args) != 6 {
		return fail(errors.New("usage: __floor-worker CONTENDER ADDR NAME DURATION PROC HOLD"))
	}
	d, err1 := time.ParseDuration(args[3])
	proc, err2 := strconv.Atoi(args[4])
	cs, err3 := time.ParseDuration(args[5])
	if err1 != nil || err2 != nil || err3 != nil {
		return fail(errors.New("bad arguments"))
	}
	octx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	cl, err := openFloor(octx, args[0], args[1], 10*time.Second)
	cancel()
	if err != nil {
		return fail(err)
	}
	defer cl.close()
	lock := tokenLockOf(cl, args[2])
	fmt.Fprintln(out, "ready")
	out.Flush()
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "go" {
		return fail(fmt.Errorf("no go signal: %q %v", line, err))
	}
	u0 := selfUsage()
	end := time.Now().Add(d)
	runCtx, cancelRun := context.WithDeadline(context.Background(), end)
	defer cancelRun()
	var first error
	holds := make([]hold, 0, 4096)
	for n := 0; n < maxHoldsPerGoroutine && runCtx.Err() == nil; n++ {
		t0 := time.Now()
		tok, unlock, err := lock(runCtx)
		if err != nil {
			if runCtx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
				first = fmt.Errorf("lock: %w", err)
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
		holds = append(holds, hold{proc: proc, token: tok, acquired: held.UnixNano(), released: rel.UnixNano(),
			wait: int64(held.Sub(t0)), counted: held.Before(end)})
		if err != nil {
			first = fmt.Errorf("unlock: %w", err)
			break
		}
	}
	fmt.Fprintln(out, usageLine(selfUsage().sub(u0)))
	for _, h := range holds {
		c := 0
		if h.counted {
			c = 1
		}
		fmt.Fprintf(out, "h 0 %d %d %d %d %d\n", h.token, h.acquired, h.released, h.wait, c)
	}
	if first != nil {
		fmt.Fprintln(out, "error:", oneLine(first))
	}
	fmt.Fprintln(out, "done")
	return 0
}

// floorResult is one measurement of the floor table.
type floorResult struct {
	hotProcsResult
	client   usage         // summed over the workers
	redisCPU time.Duration // the server's, from "go" to the last worker's report
}

// floorChild is a child process of a floor measurement, read line by line.
type floorChild struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
	done  chan struct{}
}

// startFloorChildren starts one child per argument list and waits until each says "ready".
// The caller stops them with stopFloorChildren.
func startFloorChildren(argss [][]string) ([]*floorChild, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var ws []*floorChild
	for _, args := range argss {
		cmd := exec.Command(exe, args...)
		cmd.SysProcAttr = childAttr()
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return ws, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return ws, err
		}
		if err := cmd.Start(); err != nil {
			return ws, err
		}
		w := &floorChild{cmd: cmd, in: in, lines: make(chan string, 1024), done: make(chan struct{})}
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
				return ws, fmt.Errorf("worker %d: %q", p, l)
			}
		case <-time.After(20 * time.Second):
			return ws, fmt.Errorf("worker %d not ready within 20s", p)
		}
	}
	return ws, nil
}

func stopFloorChildren(ws []*floorChild) {
	for _, w := range ws {
		w.in.Close()
		w.cmd.Process.Kill()
		<-w.done
	}
}

// runFloorClients runs clientsN floor workers of contender on one name of srv for d.
func runFloorClients(srv *server, contender string, d, holdFor time.Duration, name string) floorResult {
	fail := func(err error) floorResult {
		return floorResult{hotProcsResult: hotProcsResult{hotResult: hotResult{err: err}}}
	}
	var argss [][]string
	for p := 0; p < clientsN; p++ {
		argss = append(argss, []string{floorWorkerFlag, contender, srv.Addr, name, d.String(), strconv.Itoa(p), holdFor.String()})
	}
	ws, err := startFloorChildren(argss)
	defer stopFloorChildren(ws)
	if err != nil {
		return fail(err)
	}
	cpu0 := srv.cpu()
	for _, w := range ws {
		io.WriteString(w.in, "go\n")
	}
	var all []hold
	var first error
	var total usage
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
				case strings.HasPrefix(l, "ru "):
					u, ok := parseUsageLine(l)
					if !ok {
						return fail(fmt.Errorf("worker %d: bad line %q", p, l))
					}
					total = total.add(u)
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
	cpu1 := srv.cpu()
	r := floorResult{hotProcsResult: hotProcsResult{hotResult: hotResult{err: first, elapsed: d}, holdsChecked: len(all)},
		client: total, redisCPU: cpu1 - cpu0}
	r.overlaps = overlaps(all, contender != "redsync")
	slices.SortFunc(all, func(a, b hold) int { return compareInt(a.acquired, b.acquired) })
	counts := make([]int64, clientsN)
	var waits []time.Duration
	prev := -1
	for _, h := range all {
		if h.counted {
			counts[h.proc]++
			waits = append(waits, time.Duration(h.wait))
			r.handoffs++
			if h.proc != prev {
				r.changes++
			}
		}
		prev = h.proc
	}
	if len(waits) == 0 {
		r.err = cmp(r.err, errors.New("no acquisition"))
		return r
	}
	slices.Sort(waits)
	r.waitP50 = waits[len(waits)/2]
	r.waitP99 = waits[len(waits)*99/100]
	r.jain, r.minShare = jain(counts)
	return r
}

// floorClientsSection measures and writes scenario 7's floor table; ok is false when dlock or
// the minimal FIFO handoff failed or broke mutual exclusion.
func floorClientsSection(srv *server, cfg config) (string, bool) {
	type fcase struct {
		name string
		hold time.Duration
	}
	cases := []fcase{
		{fmt.Sprintf("1 server, %d clients × 1, empty", clientsN), 0},
		{fmt.Sprintf("1 server, %d clients × 1, %s held", clientsN, msText(clientsHold)), clientsHold},
	}
	res := make([]map[string][]floorResult, len(cases))
	for ci := range cases {
		res[ci] = map[string][]floorResult{}
	}
	ok := true
	d := cfg.floor.duration
	for rep := 0; rep < cfg.reps; rep++ {
		for ci, cs := range cases {
			for i := range floorLocks {
				name := floorLocks[(i+rep)%len(floorLocks)]
				srv.flush()
				stop := watchdog(fmt.Sprintf("scenario 7 floor, %s, %s", cs.name, name), d+90*time.Second)
				r := runFloorClients(srv, name, d, cs.hold, fmt.Sprintf("s7floor:%d:%d:%d", ci, rep, i))
				stop()
				mine := name != "redsync" // dlock and the bench's own lock must be right
				if r.err != nil {
					ok = ok && !mine
					cfg.logf("scenario 7 floor, %s, rep %d, %s: %v", cs.name, rep+1, name, r.err)
				}
				if r.overlaps != 0 {
					ok = ok && !mine
					cfg.logf("scenario 7 floor, %s, %s: MUTUAL EXCLUSION BROKEN: %d overlapping holds of %d", cs.name, name, r.overlaps, r.holdsChecked)
				}
				per := max(r.handoffs, 1)
				cfg.logf("scenario 7 floor, %s, rep %d, %-22s %7.0f holds/s, least served %.2f, wait p99 %v, client CPU %.0f µs/hold, Redis CPU %.0f µs/hold, %.1f switches/hold",
					cs.name, rep+1, name, r.rate(), r.minShare, r.waitP99.Round(time.Microsecond),
					float64(r.client.cpu.Microseconds())/float64(per), float64(r.redisCPU.Microseconds())/float64(per), float64(r.client.switches())/float64(per))
				res[ci][name] = append(res[ci][name], r)
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n**The floor of the one-server cases: a minimal FIFO handoff beside dlock and redsync.** "+
		"%d clients × 1 goroutine on one name as above, in their own loop: %v per measurement, median of %d repetitions, "+
		"the three contenders interleaved. The minimal FIFO handoff is the least a strictly first-in first-out lock with "+
		"handoff between processes needs (one script to take or queue, one to release and grant, one message to the next "+
		"client, which acts on it alone): the yardstick for dlock's handoff. Client CPU and context switches (voluntary + "+
		"involuntary) per hold: `getrusage(RUSAGE_SELF)` of each worker from \"go\" to the end of its loop, summed over the "+
		"%d workers, ÷ the holds; Redis CPU per hold: the server's user+system time (INFO cpu) over the same span ÷ the "+
		"holds. Mutual exclusion as in scenario 3, by fencing token (strictly increasing) for dlock and the minimal FIFO "+
		"handoff, by acquisition time for redsync.\n\n", clientsN, d, cfg.reps, clientsN)
	b.WriteString("| case | contender | holds/s (median) | × dlock | least served | wait p99 | client CPU µs/hold | Redis CPU µs/hold | context switches/hold | mutual exclusion |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for ci, cs := range cases {
		type row struct {
			rate, share, p99, cpu, rcpu, sw float64
			n, checked                      int
			overlaps                        int64
			err                             error
		}
		rows := map[string]row{}
		for _, name := range floorLocks {
			var rates, shares, p99, cpu, rcpu, sw []float64
			var r row
			for _, x := range res[ci][name] {
				r.overlaps += x.overlaps
				r.checked += x.holdsChecked
				if x.err != nil {
					r.err = x.err
				}
				if x.handoffs == 0 {
					continue
				}
				h := float64(x.handoffs)
				rates = append(rates, x.rate())
				shares = append(shares, x.minShare)
				p99 = append(p99, ms(x.waitP99))
				cpu = append(cpu, float64(x.client.cpu.Nanoseconds())/1000/h)
				rcpu = append(rcpu, float64(x.redisCPU.Nanoseconds())/1000/h)
				sw = append(sw, float64(x.client.switches())/h)
			}
			r.n = len(rates)
			if r.n > 0 {
				r.rate, r.share, r.p99, r.cpu, r.rcpu, r.sw = median(rates), median(shares), median(p99), median(cpu), median(rcpu), median(sw)
			}
			rows[name] = r
		}
		for _, name := range floorLocks {
			r := rows[name]
			mx := fmt.Sprintf("exact (%s holds)", thousands(float64(r.checked)))
			if r.overlaps != 0 {
				mx = fmt.Sprintf("**BROKEN**: %d overlapping holds of %s", r.overlaps, thousands(float64(r.checked)))
			}
			if r.n == 0 {
				fmt.Fprintf(&b, "| %s | %s | error: %s | | | | | | | %s |\n", cs.name, name, oneLine(r.err), mx)
				continue
			}
			if r.err != nil {
				mx += " (error in a repetition: " + oneLine(r.err) + ")"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %.2f | %.2f ms | %.0f | %.0f | %.1f | %s |\n", cs.name, name, thousands(r.rate),
				ratio(r.rate, rows[floorLocks[0]].rate), r.share, r.p99, r.cpu, r.rcpu, r.sw, mx)
		}
		if f, dl := rows[fifoName], rows[floorLocks[0]]; cfg.fig != nil && f.rate > 0 && dl.rate > 0 {
			cfg.fig.info("7, "+cs.name, "holds/s vs the minimal FIFO handoff", "%s (%s vs %s)", ratio(dl.rate, f.rate), thousands(dl.rate), thousands(f.rate))
		}
	}
	fmt.Fprintf(&b, "\n- **%s**: %s.\n", fifoName, fifoContender.config)
	return b.String(), ok
}
