package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/rueidisconn"
)

// Scenario 8: the adaptive lease (dlock.WithAdaptiveTTL) beside fixed leases, on a workload of
// realistic hold times over many names. Five ways run side by side, each with its own client
// and names, each name held in a loop by one goroutine (the same hold times for name i in every
// way):
//
//   - renewed: a fixed 30 s lease (Redisson's watchdog default), a fixed 10 s lease (dlock's
//     default) and the adaptive lease, each renewed every third of its lease;
//   - fixed (WithoutRenewal): the adaptive lease, and a fixed lease set to the median hold.
//
// Then a holder process per renewed way runs the same workload on the same names (so that the
// adaptive one starts from what the server learnt) and is SIGKILLed: how long each name it
// held stays blocked is the lease it had left on the server (PTTL, read right after the kill);
// for the adaptive way, waiters also measure it: kill → they hold the name.

// adaptiveHolderFlag re-executes this binary as scenario 8's holder process.
const adaptiveHolderFlag = "__adaptive-holder"

// The workload: log-normal holds with a median of 50 ms and a 99th percentile of 500 ms, and
// one hold in 500 a 3 s outlier.
const (
	holdMedian   = 50 * time.Millisecond
	holdP99      = 500 * time.Millisecond
	outlierEvery = 500
	outlierHold  = 3 * time.Second
	z99          = 2.3263478740408408 // the standard normal's 99th percentile
	// adaptiveMin, adaptiveMax are the adaptive ways' bounds: the greatest is dlock's default.
	adaptiveMin = 100 * time.Millisecond
	adaptiveMax = 10 * time.Second
	// adaptiveWarm holds of each name are left out of the lost-hold counts: the adaptive lease
	// starts from its greatest bound and learns the name's holds first.
	adaptiveWarm = 20
)

// drawHold returns the next hold time of the workload.
func drawHold(r *rand.Rand) time.Duration {
	if r.IntN(outlierEvery) == 0 {
		return outlierHold
	}
	sigma := math.Log(float64(holdP99)/float64(holdMedian)) / z99
	return time.Duration(float64(holdMedian) * math.Exp(sigma*r.NormFloat64()))
}

// adaptiveWay is one way of leasing the workload's locks.
type adaptiveWay struct {
	label string
	short string // in lock names and on the holder's command line
	opts  []dlock.Option
	renew bool
}

var adaptiveWays = []adaptiveWay{
	{"fixed 30 s, renewed (Redisson's watchdog default)", "fixed30", []dlock.Option{dlock.WithTTL(30 * time.Second)}, true},
	{"fixed 10 s, renewed (dlock's default)", "fixed10", []dlock.Option{dlock.WithTTL(10 * time.Second)}, true},
	{"adaptive [100 ms, 10 s], renewed", "adaptive", []dlock.Option{dlock.WithAdaptiveTTL(adaptiveMin, adaptiveMax)}, true},
	{"adaptive [100 ms, 10 s], fixed (WithoutRenewal)", "adaptive-fixed", []dlock.Option{dlock.WithAdaptiveTTL(adaptiveMin, adaptiveMax), dlock.WithoutRenewal()}, false},
	{"fixed 50 ms = the median hold, fixed (WithoutRenewal)", "median-fixed", []dlock.Option{dlock.WithTTL(holdMedian), dlock.WithoutRenewal()}, false},
}

func wayNamed(short string) *adaptiveWay {
	for i := range adaptiveWays {
		if adaptiveWays[i].short == short {
			return &adaptiveWays[i]
		}
	}
	return nil
}

// countingConn counts the renewals a client sends (renew.lua calls, and the leases in them).
type countingConn struct {
	conn.Conn
	calls, leases atomic.Int64
}

func (c *countingConn) count(s *conn.Script, keys []string) {
	if s != nil && s.Name == "renew.lua" {
		c.calls.Add(1)
		c.leases.Add(int64(len(keys)))
	}
}

func (c *countingConn) Eval(ctx context.Context, s *conn.Script, keys, args []string) ([]int64, error) {
	c.count(s, keys)
	return c.Conn.Eval(ctx, s, keys, args)
}

func (c *countingConn) EvalMulti(ctx context.Context, calls []conn.Call) []conn.Result {
	for _, call := range calls {
		c.count(call.Script, call.Keys)
	}
	return c.Conn.EvalMulti(ctx, calls)
}

// openWay dials a client for w through a renewal counter.
func openWay(ctx context.Context, addr string, w *adaptiveWay) (*dlock.Client, *countingConn, error) {
	cn, err := rueidisconn.Dial(ctx, "redis://"+addr+"/0")
	if err != nil {
		return nil, nil, err
	}
	cc := &countingConn{Conn: cn}
	opts := make([]dlock.ClientOption, len(w.opts))
	for i, o := range w.opts {
		opts[i] = o
	}
	c, err := dlock.New(cc, opts...)
	if err != nil {
		cn.Close()
		return nil, nil, err
	}
	return c, cc, nil
}

// wayStats is what one way's goroutines counted.
type wayStats struct {
	holds, warmHolds   atomic.Int64 // all holds; those after each name's warm-up
	lost, warmLost     atomic.Int64 // holds whose lease ended (or was found gone) before the work did
	errs               atomic.Int64 // Lock or Unlock errors other than a loss
	firstErr           atomic.Value
	renewCalls, leases int64
}

// holdLoop holds name again and again with the workload's hold times until ctx ends: Lock, the
// work (its full hold time, whatever the lease does), Unlock. A hold is lost when the lease
// context ended before the work did, or the Unlock says the lock was lost.
func holdLoop(ctx context.Context, c *dlock.Client, name string, seed uint64, st *wayStats) {
	rng := rand.New(rand.NewPCG(seed, 8))
	m := c.Mutex(name)
	for i := 0; ctx.Err() == nil; i++ {
		hold := drawHold(rng)
		l, err := m.Lock(ctx)
		if err != nil {
			if ctx.Err() == nil {
				st.errs.Add(1)
				st.firstErr.CompareAndSwap(nil, err.Error())
			}
			return
		}
		t := time.NewTimer(hold)
		<-t.C // the work takes its time, lease or no lease (it might be stopped; here it is not)
		lost := l.Context().Err() != nil
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = l.Unlock(uctx)
		cancel()
		if errors.Is(err, dlock.ErrLost) {
			lost, err = true, nil
		}
		if err != nil {
			st.errs.Add(1)
			st.firstErr.CompareAndSwap(nil, err.Error())
		}
		st.holds.Add(1)
		if lost {
			st.lost.Add(1)
		}
		if i >= adaptiveWarm {
			st.warmHolds.Add(1)
			if lost {
				st.warmLost.Add(1)
			}
		}
	}
}

// adaptiveName is the lock name of way w's name i.
func adaptiveName(w, i int) string { return fmt.Sprintf("adaptive:%s:%d", adaptiveWays[w].short, i) }

// runAdaptiveHolder is scenario 8's holder process: way WAY's workload on its first N names, until
// killed (at most a minute). It prints "running" once every name's loop has started.
func runAdaptiveHolder(args []string) int {
	if len(args) != 3 {
		fmt.Println("error: usage: __adaptive-holder WAY ADDR NAMES")
		return 2
	}
	w := wayNamed(args[0])
	n, err := strconv.Atoi(args[2])
	if w == nil || err != nil {
		fmt.Println("error: bad way or name count")
		return 2
	}
	wi := slices.IndexFunc(adaptiveWays, func(x adaptiveWay) bool { return x.short == w.short })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, _, err := openWay(ctx, args[1], w)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	var st wayStats
	for i := range n {
		go holdLoop(ctx, c, adaptiveName(wi, i), uint64(1000+i), &st)
	}
	fmt.Println("running")
	<-ctx.Done()
	return 0
}

// crashSample is what one killed holder left: per name it held at the kill, the lease left on
// the server; for the adaptive way also the time until a waiter held the name.
type crashSample struct {
	blocked  []time.Duration
	measured []time.Duration
	err      error
}

// measureAdaptive is scenario 8.
func measureAdaptive(srv *server, cfg config) (string, bool) {
	waiters := "; for the adaptive way, waiters started at the kill also measure it (kill → they hold the name)"
	if !cfg.adaptiveWaiters {
		waiters = ""
	}
	srv.flush()
	ctx, cancel := context.WithTimeout(context.Background(), cfg.adaptiveRun+2*time.Minute)
	defer cancel()
	stats := make([]*wayStats, len(adaptiveWays))
	clients := make([]*dlock.Client, len(adaptiveWays))
	counters := make([]*countingConn, len(adaptiveWays))
	for w := range adaptiveWays {
		c, cc, err := openWay(ctx, srv.Addr, &adaptiveWays[w])
		if err != nil {
			return fmt.Sprintf("### 8. Adaptive lease\n\nerror: %v\n", err), false
		}
		clients[w], counters[w], stats[w] = c, cc, &wayStats{}
	}
	// Main phase: every way at once, for cfg.adaptiveRun.
	stop := watchdog("scenario 8", cfg.adaptiveRun+time.Minute)
	rctx, rcancel := context.WithTimeout(ctx, cfg.adaptiveRun)
	var wg sync.WaitGroup
	for w := range adaptiveWays {
		for i := range cfg.adaptiveNames {
			wg.Go(func() { holdLoop(rctx, clients[w], adaptiveName(w, i), uint64(1000+i), stats[w]) })
		}
	}
	wg.Wait()
	rcancel()
	for w, c := range clients {
		stats[w].renewCalls, stats[w].leases = counters[w].calls.Load(), counters[w].leases.Load()
		c.Close()
		counters[w].Conn.Close()
	}
	stop()
	ok := true
	for w, st := range stats {
		cfg.logf("scenario 8, %-52s %6d holds, %d lost (%d of %d after warm-up), %d renew.lua calls for %d leases, %d errors %v",
			adaptiveWays[w].label, st.holds.Load(), st.lost.Load(), st.warmLost.Load(), st.warmHolds.Load(), st.renewCalls, st.leases, st.errs.Load(), st.firstErr.Load())
		if st.errs.Load() > 0 {
			ok = false
		}
	}

	// Crash phase: a holder process per renewed way, killed at once.
	stop = watchdog("scenario 8, crash phase", 2*time.Minute)
	crash := killHolders(srv, cfg)
	stop()
	for w, cs := range crash {
		if cs.err != nil {
			cfg.logf("scenario 8, crash, %s: %v", adaptiveWays[w].label, cs.err)
			ok = false
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "### 8. Adaptive lease: leases sized by how long locks are held\n\n")
	fmt.Fprintf(&b, "%d names per way, each held in a loop by one goroutine for %v: hold times log-normal "+
		"with a median of %v and a 99th percentile of %v, one hold in %d a %v outlier (the same "+
		"sequence for name i in every way). The five ways run at once, each with its own client "+
		"(rueidis transport); a hold is lost when its lease context ended, or its Unlock found "+
		"the lock gone, before the work (its full hold time) was done. Renewals are counted as "+
		"the client sends them (renew.lua calls, each one round trip for every lease due, and "+
		"the leases in them). Then a holder process per renewed way runs the same workload on "+
		"the same names and is SIGKILLed %v later: a name it held stays blocked for the lease "+
		"it had left on the server (`PTTL` right after the kill)%s. The adaptive bounds "+
		"are [%v, %v]; its first %d holds of each name (warm-up) are left out of the lost-hold "+
		"counts of every way.\n\n",
		cfg.adaptiveNames, cfg.adaptiveRun, holdMedian, holdP99, outlierEvery, outlierHold, cfg.adaptiveCrashAfter,
		waiters, adaptiveMin, adaptiveMax, adaptiveWarm)
	b.WriteString("| way | holds | renew.lua calls per 1,000 holds | leases renewed per 1,000 holds | leases lost | blocked after SIGKILL: median | p99 | names |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	per1000 := func(x, holds int64) float64 { return 1000 * float64(x) / float64(max(holds, 1)) }
	medians := map[string]float64{}
	for w, way := range adaptiveWays {
		if !way.renew {
			continue
		}
		st := stats[w]
		cs := crash[w]
		med, p99 := percentile(cs.blocked, 50), percentile(cs.blocked, 99)
		medians[way.short] = med
		fmt.Fprintf(&b, "| %s | %d | %.1f | %.1f | %d | %s | %s | %d |\n", way.label, st.holds.Load(),
			per1000(st.renewCalls, st.holds.Load()), per1000(st.leases, st.holds.Load()), st.lost.Load(),
			seconds(med), seconds(p99), len(cs.blocked))
	}
	if a := crash[wayIndex("adaptive")]; len(a.measured) > 0 {
		fmt.Fprintf(&b, "\nAdaptive, measured by waiters: kill → the waiter holds the name, median %s, p99 %s (%d names).\n",
			seconds(percentile(a.measured, 50)), seconds(percentile(a.measured, 99)), len(a.measured))
	}
	b.WriteString("\n| way, without renewal | holds after warm-up | lost | lost % |\n|---|---:|---:|---:|\n")
	for w, way := range adaptiveWays {
		if way.renew {
			continue
		}
		st := stats[w]
		fmt.Fprintf(&b, "| %s | %d | %d | %.2f %% |\n", way.label, st.warmHolds.Load(), st.warmLost.Load(),
			100*float64(st.warmLost.Load())/float64(max(st.warmHolds.Load(), 1)))
	}

	ad, f10, f30 := stats[wayIndex("adaptive")], stats[wayIndex("fixed10")], stats[wayIndex("fixed30")]
	adCalls, f10Calls := per1000(ad.renewCalls, ad.holds.Load()), per1000(f10.renewCalls, f10.holds.Load())
	cfg.fig.target("8, adaptive", "renewal commands ≤ 10 % of the fixed 10 s lease's", adCalls <= 0.1*f10Calls,
		"%.1f vs %.1f renew.lua calls per 1,000 holds", adCalls, f10Calls)
	cfg.fig.target("8, adaptive", "no lease lost that renewal keeps (renewed)", ad.lost.Load() <= min(f10.lost.Load(), f30.lost.Load()),
		"%d lost (fixed 10 s: %d, fixed 30 s: %d)", ad.lost.Load(), f10.lost.Load(), f30.lost.Load())
	if medians["adaptive"] > 0 {
		ratio := medians["fixed30"] / medians["adaptive"]
		cfg.fig.target("8, adaptive", "a SIGKILLed holder's name free ≥ 5× sooner than with the 30 s watchdog (median)", ratio >= 5,
			"%s vs %s: %.0f×", seconds(medians["adaptive"]), seconds(medians["fixed30"]), ratio)
	}
	af, mf := stats[wayIndex("adaptive-fixed")], stats[wayIndex("median-fixed")]
	afPct := 100 * float64(af.warmLost.Load()) / float64(max(af.warmHolds.Load(), 1))
	cfg.fig.target("8, adaptive, WithoutRenewal", "≤ 1 % of holds lost after warm-up", afPct <= 1,
		"%.2f %% (a fixed lease of the median hold: %.1f %%)", afPct, 100*float64(mf.warmLost.Load())/float64(max(mf.warmHolds.Load(), 1)))
	return b.String(), ok
}

func wayIndex(short string) int {
	return slices.IndexFunc(adaptiveWays, func(w adaptiveWay) bool { return w.short == short })
}

// killHolders starts a holder process per renewed way on that way's names, SIGKILLs them all at
// once cfg.adaptiveCrashAfter after they all run, and reads what each held name has left.
func killHolders(srv *server, cfg config) []crashSample {
	out := make([]crashSample, len(adaptiveWays))
	exe, err := os.Executable()
	if err != nil {
		for w := range out {
			out[w].err = err
		}
		return out
	}
	type proc struct {
		cmd    *exec.Cmd
		exited chan struct{}
	}
	procs := map[int]*proc{}
	defer func() {
		for _, p := range procs {
			p.cmd.Process.Kill()
			<-p.exited
		}
	}()
	for w, way := range adaptiveWays {
		if !way.renew {
			continue
		}
		cmd := exec.Command(exe, adaptiveHolderFlag, way.short, srv.Addr, strconv.Itoa(cfg.adaptiveNames))
		cmd.SysProcAttr = childAttr()
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		if err == nil {
			err = cmd.Start()
		}
		if err != nil {
			out[w].err = err
			continue
		}
		p := &proc{cmd: cmd, exited: make(chan struct{})}
		procs[w] = p
		lines := make(chan string, 1)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				select {
				case lines <- sc.Text():
				default:
				}
			}
			cmd.Wait()
			close(p.exited)
		}()
		select {
		case l := <-lines:
			if l != "running" {
				out[w].err = fmt.Errorf("holder: %q", l)
			}
		case <-time.After(15 * time.Second):
			out[w].err = errors.New("the holder did not start within 15 s")
		}
	}
	time.Sleep(cfg.adaptiveCrashAfter) // the holders work
	for _, p := range procs {
		p.cmd.Process.Kill()
	}
	killed := time.Now()
	for _, p := range procs {
		<-p.exited
	}
	// What each name has left, read at once for every way.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pipe := srv.admin.Pipeline()
	type read struct {
		w    int
		name string
		get  *redis.StringCmd
		pttl *redis.DurationCmd
	}
	var reads []read
	for w := range procs {
		for i := range cfg.adaptiveNames {
			name := adaptiveName(w, i)
			key := dlock.DefaultPrefix + "{" + name + "}"
			reads = append(reads, read{w, name, pipe.Get(ctx, key), pipe.PTTL(ctx, key)})
		}
	}
	pipe.Exec(ctx)
	var heldAdaptive []string
	for _, r := range reads {
		v, err := r.get.Result()
		if err != nil || strings.HasPrefix(v, "- ") {
			continue // not held at the kill (between two holds)
		}
		out[r.w].blocked = append(out[r.w].blocked, max(r.pttl.Val(), 0))
		if adaptiveWays[r.w].short == "adaptive" {
			heldAdaptive = append(heldAdaptive, r.name)
		}
	}
	// The adaptive way: waiters measure when each name frees (up to the greatest lease).
	if w := wayIndex("adaptive"); len(heldAdaptive) > 0 && cfg.adaptiveWaiters {
		c, _, err := openWay(ctx, srv.Addr, &adaptiveWays[w])
		if err != nil {
			out[w].err = err
			return out
		}
		defer c.Close()
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, name := range heldAdaptive {
			wg.Go(func() {
				wctx, wcancel := context.WithTimeout(ctx, adaptiveMax+5*time.Second)
				defer wcancel()
				l, err := c.Mutex(name).Lock(wctx)
				took := time.Since(killed)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					out[w].err = fmt.Errorf("waiter on %s: %w", name, err)
					return
				}
				out[w].measured = append(out[w].measured, took)
				l.Unlock(context.Background())
			})
		}
		wg.Wait()
	}
	return out
}

// percentile returns the p-th percentile of ds in milliseconds (nearest rank); 0 when empty.
func percentile(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return ms(s[max(0, min(i, len(s)-1))])
}
