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

// Scenario 8: the adaptive lease (dlock.WithAdaptiveTTL) beside the fixed leases a user would
// pick instead, on a workload of realistic hold times over many names. Every way has its own
// client and names, each name held in a loop by one goroutine (the same hold times for name i in
// every way of a phase). Two phases:
//
//  1. The adaptive lease, renewed, alone; then its holders are SIGKILLed cfg.reps times (a
//     holder process runs the workload on the same names, starting from what the server learnt,
//     and is killed): its median crash recovery, kill → a waiter holds the name, is T. The
//     watchdog's holders (a fixed 30 s lease renewed every 10 s, Redisson's default) are killed
//     at the same moments, on names of their own per kill, and their waiters wait in the
//     background until the end of the scenario, so that its 20–30 s hold up nothing.
//  2. Side by side: the adaptive lease again (on the names it learnt), a fixed lease of TTL T
//     renewed every T/3 (the adaptive lease's recovery), the watchdog, and without renewal the
//     adaptive lease and a fixed lease of the median hold. Renewals and lost holds are counted;
//     then the holders of the adaptive ways and of the fixed lease of T are SIGKILLed cfg.reps
//     times, at the same moments.

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
	// adaptiveWarm holds of each name are left out of the lost-hold counts without renewal: the
	// adaptive lease starts from its greatest bound and learns the name's holds first.
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
	label    string
	short    string        // in lock names
	adaptive bool          // WithAdaptiveTTL(adaptiveMin, adaptiveMax); otherwise WithTTL(ttl)
	ttl      time.Duration // the fixed lease
	renew    bool
	slow     bool // recovery measured in the background, on names of its own per kill
}

func (w *adaptiveWay) options() []dlock.ClientOption {
	var o []dlock.ClientOption
	if w.adaptive {
		o = append(o, dlock.WithAdaptiveTTL(adaptiveMin, adaptiveMax))
	} else {
		o = append(o, dlock.WithTTL(w.ttl))
	}
	if !w.renew {
		o = append(o, dlock.WithoutRenewal())
	}
	return o
}

// longestLease is the longest lease the way can give a name.
func (w *adaptiveWay) longestLease() time.Duration {
	if w.adaptive {
		return adaptiveMax
	}
	return w.ttl
}

// holderArgs describe w on the holder process's command line: kind, TTL in ms, renewal.
func (w *adaptiveWay) holderArgs() []string {
	kind, renew := "fixed", "renew"
	if w.adaptive {
		kind = "adaptive"
	}
	if !w.renew {
		renew = "norenew"
	}
	return []string{kind, strconv.FormatInt(w.ttl.Milliseconds(), 10), renew}
}

func wayFromArgs(kind, ttlMs, renew string) (*adaptiveWay, error) {
	ms, err := strconv.ParseInt(ttlMs, 10, 64)
	if err != nil || (kind != "adaptive" && kind != "fixed") || (renew != "renew" && renew != "norenew") {
		return nil, fmt.Errorf("bad way %q %q %q", kind, ttlMs, renew)
	}
	return &adaptiveWay{adaptive: kind == "adaptive", ttl: time.Duration(ms) * time.Millisecond, renew: renew == "renew"}, nil
}

// leaseText writes a lease as the tables do: "30 s", "1.52 s", "507 ms".
func leaseText(d time.Duration) string {
	switch {
	case d >= time.Second && d%time.Second == 0:
		return fmt.Sprintf("%d s", d/time.Second)
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	default:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	}
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
	c, err := dlock.New(cc, w.options()...)
	if err != nil {
		cn.Close()
		return nil, nil, err
	}
	return c, cc, nil
}

// closeAll closes what openWay opened.
func closeAll(c *dlock.Client, cc *countingConn) {
	c.Close()
	cc.Conn.Close()
}

// wayStats is what one way's goroutines counted.
type wayStats struct {
	holds, warmHolds   atomic.Int64 // all holds; those after each name's warm-up
	lost, warmLost     atomic.Int64 // holds whose lease ended (or was found gone) before the work did
	errs               atomic.Int64 // Lock or Unlock errors other than a loss
	firstErr           atomic.Value
	renewCalls, leases int64
}

func (st *wayStats) per1000(x int64) float64 {
	return 1000 * float64(x) / float64(max(st.holds.Load(), 1))
}

func (st *wayStats) warmLostPct() float64 {
	return 100 * float64(st.warmLost.Load()) / float64(max(st.warmHolds.Load(), 1))
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

// adaptiveName is name i of a name set (a way's short name, or that and a kill's number).
func adaptiveName(set string, i int) string { return fmt.Sprintf("adaptive:%s:%d", set, i) }

// runAdaptiveHolder is scenario 8's holder process: a way's workload on the first N names of a
// set, until killed (at most a minute). It prints "running" once every name's loop has started.
func runAdaptiveHolder(args []string) int {
	if len(args) != 6 {
		fmt.Println("error: usage: __adaptive-holder KIND TTL_MS RENEW ADDR SET NAMES")
		return 2
	}
	w, err := wayFromArgs(args[0], args[1], args[2])
	n, nerr := strconv.Atoi(args[5])
	if err != nil || nerr != nil {
		fmt.Println("error: bad way or name count")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, _, err := openWay(ctx, args[3], w)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	var st wayStats
	for i := range n {
		go holdLoop(ctx, c, adaptiveName(args[4], i), uint64(3000+i), &st)
	}
	fmt.Println("running")
	<-ctx.Done()
	return 0
}

// runWays holds every way's names in a loop for d, all ways at once, each through its own
// client, and returns what each counted (renewals included).
func runWays(ctx context.Context, srv *server, cfg config, ways []*adaptiveWay, d time.Duration, seed uint64) ([]*wayStats, error) {
	stats := make([]*wayStats, len(ways))
	clients := make([]*dlock.Client, len(ways))
	counters := make([]*countingConn, len(ways))
	for w := range ways {
		c, cc, err := openWay(ctx, srv.Addr, ways[w])
		if err != nil {
			for v := range w {
				closeAll(clients[v], counters[v])
			}
			return nil, err
		}
		clients[w], counters[w], stats[w] = c, cc, &wayStats{}
	}
	rctx, rcancel := context.WithTimeout(ctx, d)
	defer rcancel()
	var wg sync.WaitGroup
	for w := range ways {
		for i := range cfg.adaptiveNames {
			wg.Go(func() { holdLoop(rctx, clients[w], adaptiveName(ways[w].short, i), seed+uint64(i), stats[w]) })
		}
	}
	wg.Wait()
	for w := range ways {
		stats[w].renewCalls, stats[w].leases = counters[w].calls.Load(), counters[w].leases.Load()
		closeAll(clients[w], counters[w])
	}
	return stats, nil
}

// crashSample is what the kills of one way measured: per name held at a kill, the lease it had
// left on the server (PTTL right after the kill) and, with waiters, the time from the kill until
// a waiter held it.
type crashSample struct {
	left, recovery []time.Duration
	kills          int
	err            error
}

func (c *crashSample) add(o crashSample) {
	c.left = append(c.left, o.left...)
	c.recovery = append(c.recovery, o.recovery...)
	c.kills += o.kills
	if c.err == nil {
		c.err = o.err
	}
}

// times are the recoveries measured: the waiters' if there were, else the leases left.
func (c *crashSample) times() []time.Duration {
	if len(c.recovery) > 0 {
		return c.recovery
	}
	return c.left
}

// holderProc is a running holder process.
type holderProc struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// startHolder starts a holder process on set's names and waits until it runs.
func startHolder(exe, addr string, w *adaptiveWay, set string, names int) (*holderProc, error) {
	args := append([]string{adaptiveHolderFlag}, w.holderArgs()...)
	cmd := exec.Command(exe, append(args, addr, set, strconv.Itoa(names))...)
	cmd.SysProcAttr = childAttr()
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		return nil, err
	}
	p := &holderProc{cmd: cmd, exited: make(chan struct{})}
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
		if l == "running" {
			return p, nil
		}
		err = fmt.Errorf("holder: %q", l)
	case <-time.After(15 * time.Second):
		err = errors.New("the holder did not start within 15 s")
	}
	p.cmd.Process.Kill()
	<-p.exited
	return nil, err
}

// crashSet is the name set of way w's holder at kill k: its own names, which the adaptive ones
// learnt, or for a slow way names of their own per kill (the previous kill's waiters may still
// wait on the others).
func crashSet(w *adaptiveWay, k int) string {
	if w.slow {
		return fmt.Sprintf("%s-kill%d", w.short, k)
	}
	return w.short
}

// killRound starts a holder process per way, SIGKILLs them all at once cfg.adaptiveCrashAfter
// after they all run, reads what each held name has left and, with waiters, starts a waiter on
// each. It returns, per way, a function that waits for the waiters and gives the sample; every
// one must be called.
func killRound(ctx context.Context, srv *server, cfg config, ways []*adaptiveWay, k int) []func() crashSample {
	out := make([]crashSample, len(ways))
	waits := make([]func() crashSample, len(ways))
	for i := range ways {
		waits[i] = func() crashSample { return out[i] }
	}
	exe, err := os.Executable()
	if err != nil {
		for i := range out {
			out[i].err = err
		}
		return waits
	}
	procs := make([]*holderProc, len(ways))
	defer func() {
		for _, p := range procs {
			if p != nil {
				p.cmd.Process.Kill()
				<-p.exited
			}
		}
	}()
	for i, w := range ways {
		if procs[i], err = startHolder(exe, srv.Addr, w, crashSet(w, k), cfg.adaptiveNames); err != nil {
			out[i].err = err
		}
	}
	time.Sleep(cfg.adaptiveCrashAfter) // the holders work
	for _, p := range procs {
		if p != nil {
			p.cmd.Process.Kill()
		}
	}
	killed := time.Now()
	for _, p := range procs {
		if p != nil {
			<-p.exited
		}
	}
	// What each name has left, read at once for every way.
	pipe := srv.admin.Pipeline()
	type read struct {
		w    int
		name string
		get  *redis.StringCmd
		pttl *redis.DurationCmd
	}
	var reads []read
	for i, w := range ways {
		if procs[i] == nil {
			continue
		}
		out[i].kills = 1
		for n := range cfg.adaptiveNames {
			name := adaptiveName(crashSet(w, k), n)
			key := dlockKey(name)
			reads = append(reads, read{i, name, pipe.Get(ctx, key), pipe.PTTL(ctx, key)})
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		for i := range out {
			out[i].err = err
		}
		return waits
	}
	held := make([][]string, len(ways))
	for _, r := range reads {
		v, err := r.get.Result()
		if err != nil || strings.HasPrefix(v, "- ") {
			continue // not held at the kill (between two holds)
		}
		out[r.w].left = append(out[r.w].left, max(r.pttl.Val(), 0))
		held[r.w] = append(held[r.w], r.name)
	}
	if !cfg.adaptiveWaiters {
		// No waiter takes the names: free them, so that the next phase does not wait out the dead
		// holder's leases (the hold records stay).
		for i, w := range ways {
			if len(held[i]) == 0 {
				continue
			}
			c, cc, err := openWay(ctx, srv.Addr, w)
			if err != nil {
				out[i].err = err
				continue
			}
			for _, name := range held[i] {
				if _, err := c.ForceUnlock(ctx, name); err != nil && !errors.Is(err, dlock.ErrNotHeld) {
					out[i].err = fmt.Errorf("force-unlock %s: %w", name, err)
				}
			}
			closeAll(c, cc)
		}
		return waits
	}
	for i, w := range ways {
		if len(held[i]) == 0 {
			continue
		}
		c, cc, err := openWay(ctx, srv.Addr, w)
		if err != nil {
			out[i].err = err
			continue
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, name := range held[i] {
			wg.Go(func() {
				wctx, wcancel := context.WithTimeout(ctx, w.longestLease()+5*time.Second)
				defer wcancel()
				l, err := c.Mutex(name).Lock(wctx)
				took := time.Since(killed)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					out[i].err = fmt.Errorf("waiter on %s: %w", name, err)
					return
				}
				out[i].recovery = append(out[i].recovery, took)
				l.Unlock(context.Background())
			})
		}
		waits[i] = func() crashSample {
			wg.Wait()
			closeAll(c, cc)
			return out[i]
		}
	}
	return waits
}

// measureAdaptive is scenario 8.
func measureAdaptive(srv *server, cfg config) (string, bool) {
	srv.flush()
	kills := max(cfg.reps, 1)
	ok := true
	ctx, cancel := context.WithTimeout(context.Background(), 2*cfg.adaptiveRun+time.Duration(kills)*2*time.Minute)
	defer cancel()
	report := func(what string, st *wayStats) {
		cfg.logf("scenario 8, %-58s %6d holds, %d lost (%d of %d after warm-up), %d renew.lua calls for %d leases, %d errors %v",
			what, st.holds.Load(), st.lost.Load(), st.warmLost.Load(), st.warmHolds.Load(), st.renewCalls, st.leases, st.errs.Load(), st.firstErr.Load())
		if st.errs.Load() > 0 {
			ok = false
		}
	}
	crashed := func(what string, cs crashSample) {
		if cs.err != nil {
			cfg.logf("scenario 8, crash, %s: %v", what, cs.err)
			ok = false
		}
	}
	adaptive := &adaptiveWay{label: fmt.Sprintf("adaptive [%s, %s], renewed", leaseText(adaptiveMin), leaseText(adaptiveMax)), short: "adaptive", adaptive: true, renew: true}
	wdLabel := fmt.Sprintf("watchdog: fixed %s, renewed every %s", leaseText(cfg.adaptiveWatchdog), leaseText(cfg.adaptiveWatchdog/3))
	if cfg.adaptiveWatchdog == 30*time.Second {
		wdLabel += " (Redisson's default)"
	}
	wd := &adaptiveWay{label: wdLabel, short: "watchdog", ttl: cfg.adaptiveWatchdog, renew: true, slow: true}
	// The watchdog's waiters wait in the background until the end of the scenario (collected
	// however it ends, so that none outlives it).
	var wdWaits []func() crashSample
	var wdCrash crashSample
	collect := func() {
		stop := watchdog("scenario 8, the watchdog's waiters", cfg.adaptiveWatchdog+time.Minute)
		defer stop()
		for _, wait := range wdWaits {
			wdCrash.add(wait())
		}
		wdWaits = nil
	}
	defer collect()

	// Phase 1: the adaptive lease alone, then its kills (T), with the watchdog's.
	stop := watchdog("scenario 8, phase 1", cfg.adaptiveRun+time.Duration(kills)*time.Minute)
	p1, err := runWays(ctx, srv, cfg, []*adaptiveWay{adaptive}, cfg.adaptiveRun, 1000)
	if err != nil {
		stop()
		return fmt.Sprintf("### 8. Adaptive lease\n\nerror: %v\n", err), false
	}
	report("phase 1, "+adaptive.label, p1[0])
	var c1 crashSample
	for k := range kills {
		waits := killRound(ctx, srv, cfg, []*adaptiveWay{adaptive, wd}, k)
		c1.add(waits[0]())
		wdWaits = append(wdWaits, waits[1])
	}
	stop()
	crashed("phase 1, "+adaptive.label, c1)
	t := time.Duration(percentile(c1.times(), 50) * float64(time.Millisecond)).Round(10 * time.Millisecond)
	if t < adaptiveMin {
		t = adaptiveMin // nothing measured (the error says why), or a recovery below the adaptive lease's least
	}

	// Phase 2: every way at once, then the kills.
	fixedEq := &adaptiveWay{label: fmt.Sprintf("fixed %s (the adaptive's median recovery), renewed every %s", leaseText(t), leaseText(t/3)),
		short: "fixed-eq", ttl: t, renew: true}
	adFixed := &adaptiveWay{label: fmt.Sprintf("adaptive [%s, %s], WithoutRenewal", leaseText(adaptiveMin), leaseText(adaptiveMax)), short: "adaptive-fixed", adaptive: true}
	medFixed := &adaptiveWay{label: fmt.Sprintf("fixed %s = the median hold, WithoutRenewal", leaseText(holdMedian)), short: "median-fixed", ttl: holdMedian}
	ways := []*adaptiveWay{adaptive, fixedEq, wd, adFixed, medFixed}
	stop = watchdog("scenario 8, phase 2", cfg.adaptiveRun+time.Duration(kills)*time.Minute)
	p2, err := runWays(ctx, srv, cfg, ways, cfg.adaptiveRun, 2000)
	if err != nil {
		stop()
		return fmt.Sprintf("### 8. Adaptive lease\n\nerror: %v\n", err), false
	}
	for w, way := range ways {
		report("phase 2, "+way.label, p2[w])
	}
	crashWays := []*adaptiveWay{adaptive, fixedEq, adFixed}
	c2 := make([]crashSample, len(ways)) // by way; none for the median-length lease
	for k := range kills {
		waits := killRound(ctx, srv, cfg, crashWays, k)
		for i, way := range crashWays {
			c2[slices.Index(ways, way)].add(waits[i]())
		}
	}
	stop()
	collect()
	c2[slices.Index(ways, wd)] = wdCrash
	crashed(wd.label, wdCrash)
	for w, way := range ways {
		crashed("phase 2, "+way.label, c2[w])
	}
	return adaptiveReport(cfg, kills, t, c1, ways, p2, c2), ok
}

// adaptiveReport writes scenario 8's tables and records its targets.
func adaptiveReport(cfg config, kills int, t time.Duration, c1 crashSample, ways []*adaptiveWay, p2 []*wayStats, c2 []crashSample) string {
	killsText := fmt.Sprintf("%d kills", kills)
	if kills == 1 {
		killsText = "1 kill"
	}
	measure := fmt.Sprintf("the time from the kill until a waiter started at the kill holds the name (median and p99 over "+
		"every name the holder held, over %s)", killsText)
	if !cfg.adaptiveWaiters {
		measure = fmt.Sprintf("the lease the name had left on the server (`PTTL` right after the kill; no waiters in this mode), "+
			"median and p99 over every name the holder held, over %s", killsText)
	}
	background := ", its waiters waiting in the background"
	if !cfg.adaptiveWaiters {
		background = ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "### 8. Adaptive lease: leases sized by how long locks are held\n\n")
	fmt.Fprintf(&b, "%d names per way, each held in a loop by one goroutine: hold times log-normal with a median of %s "+
		"and a 99th percentile of %s, one hold in %d a %s outlier (the same sequence for name i in every way of a "+
		"phase); each way has its own client (rueidis transport) and names. A hold is lost when its lease context "+
		"ended, or its Unlock found the lock gone, before the work (its full hold time) was done. Renewals are "+
		"counted as the client sends them: the leases renewed (a renewal each; the targets compare these) and the "+
		"renew.lua calls that carry them (each one script call on the server, for every lease then due). Crash recovery: a holder process runs the way's workload on its names "+
		"(the adaptive ones starting from what the server learnt) and is SIGKILLed %s after it started; for each "+
		"name it held, %s.\n\n",
		cfg.adaptiveNames, leaseText(holdMedian), leaseText(holdP99), outlierEvery, leaseText(outlierHold),
		leaseText(cfg.adaptiveCrashAfter), measure)
	fmt.Fprintf(&b, "**Phase 1** (%s): the adaptive lease [%s, %s], renewed, alone, then its kills. Its median "+
		"recovery, **T = %s** (p99 %s, %d names), is the TTL of the fixed lease of phase 2. The watchdog's kills "+
		"come at the same moments, on names of their own per kill (a fixed lease learns nothing)%s.\n\n",
		leaseText(cfg.adaptiveRun), leaseText(adaptiveMin), leaseText(adaptiveMax), leaseText(t), seconds(percentile(c1.times(), 99)), len(c1.times()), background)
	fmt.Fprintf(&b, "**Phase 2** (%s): every way at once, the adaptive lease continuing on the names it learnt; then "+
		"the kills of the adaptive ways and of the fixed lease of T, at the same moments. Renewals and lost holds "+
		"are phase 2's.\n\n", leaseText(cfg.adaptiveRun))
	b.WriteString("| way | holds | renew.lua calls per 1,000 holds | leases renewed per 1,000 holds | holds lost | recovery after SIGKILL: median | p99 | names (kills) |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	med := make([]float64, len(ways))
	for w, way := range ways {
		st := p2[w]
		rec, p99, names := "–", "–", "–"
		if c2[w].kills > 0 {
			ts := c2[w].times()
			med[w] = percentile(ts, 50)
			rec, p99, names = seconds(med[w]), seconds(percentile(ts, 99)), fmt.Sprintf("%d (%d)", len(ts), c2[w].kills)
		}
		fmt.Fprintf(&b, "| %s | %d | %.1f | %.1f | %d | %s | %s | %s |\n", way.label, st.holds.Load(),
			st.per1000(st.renewCalls), st.per1000(st.leases), st.lost.Load(), rec, p99, names)
	}
	b.WriteString("\n| way, without renewal | holds after warm-up | lost | lost % |\n|---|---:|---:|---:|\n")
	for w, way := range ways {
		if way.renew {
			continue
		}
		st := p2[w]
		fmt.Fprintf(&b, "| %s | %d | %d | %.2f %% |\n", way.label, st.warmHolds.Load(), st.warmLost.Load(), st.warmLostPct())
	}
	fmt.Fprintf(&b, "\nThe first %d holds of each name in phase 2 (the warm-up of the adaptive lease without renewal, "+
		"which starts from its greatest bound) are left out of the second table.\n", adaptiveWarm)

	// The targets, here and in the run's summary.
	const ad, eq, wd, af, mf = 0, 1, 2, 3, 4
	calls := func(w int) float64 { return p2[w].per1000(p2[w].renewCalls) }
	var tb strings.Builder
	target := func(scenario, what string, met bool, format string, args ...any) {
		cfg.fig.target(scenario, what, met, format, args...)
		fmt.Fprintf(&tb, "| %s | %s | %s | %s |\n", strings.TrimPrefix(scenario, "8, "), what, fmt.Sprintf(format, args...), metUnmet(met))
	}
	ratio := func(a, b float64) float64 {
		if b <= 0 {
			return math.Inf(1)
		}
		return a / b
	}
	// A renewal is a lease renewed (what the issue of holds costs each lease); the renew.lua
	// calls that carried them (server round trips) are given beside it, since leases renewed at
	// about the same time share one call.
	renewed := func(w int) float64 { return p2[w].per1000(p2[w].leases) }
	perCall := func(w int) float64 { return ratio(float64(p2[w].leases), float64(p2[w].renewCalls)) }
	target("8, adaptive vs fixed lease of equal recovery", "renewals ≤ 0.5× the fixed lease's, at equal recovery",
		renewed(ad) <= 0.5*renewed(eq),
		"%.1f vs %.1f leases renewed per 1,000 holds (%.2f×), in %.1f vs %.1f renew.lua calls (%.2f×; %.1f vs %.1f leases per call); recovery %s vs %s (median; T = %s)",
		renewed(ad), renewed(eq), ratio(renewed(ad), renewed(eq)), calls(ad), calls(eq), ratio(calls(ad), calls(eq)), perCall(ad), perCall(eq),
		seconds(med[ad]), seconds(med[eq]), leaseText(t))
	sooner := ratio(med[wd], med[ad])
	target("8, adaptive vs the watchdog", "at equal renewals or fewer, a SIGKILLed holder's name free ≥ 10× sooner (median)",
		renewed(ad) <= renewed(wd) && sooner >= 10,
		"%.1f vs %.1f leases renewed per 1,000 holds (%s); free %.0f× sooner (%s vs %s)",
		renewed(ad), renewed(wd), fewer(renewed(ad), renewed(wd)), sooner, seconds(med[ad]), seconds(med[wd]))
	soonerF := ratio(med[wd], med[af])
	target("8, adaptive WithoutRenewal vs the watchdog", "at equal renewals or fewer, a SIGKILLed holder's name free ≥ 10× sooner (median)",
		renewed(af) <= renewed(wd) && soonerF >= 10,
		"%.1f vs %.1f leases renewed per 1,000 holds (%s); free %.0f× sooner (%s vs %s); but %.2f %% of holds lost after warm-up (the watchdog: %d holds lost)",
		renewed(af), renewed(wd), fewer(renewed(af), renewed(wd)), soonerF, seconds(med[af]), seconds(med[wd]), p2[af].warmLostPct(), p2[wd].lost.Load())
	target("8, adaptive", "no hold lost that renewal keeps (renewed)", p2[ad].lost.Load() <= min(p2[eq].lost.Load(), p2[wd].lost.Load()),
		"%d lost (the fixed lease of equal recovery: %d, the watchdog: %d)", p2[ad].lost.Load(), p2[eq].lost.Load(), p2[wd].lost.Load())
	target("8, adaptive, WithoutRenewal", "≤ 1 % of holds lost after warm-up", p2[af].warmLostPct() <= 1,
		"%.2f %% (a fixed lease of the median hold: %.1f %%)", p2[af].warmLostPct(), p2[mf].warmLostPct())
	b.WriteString("\n| way | target | measured | |\n|---|---|---|---|\n")
	b.WriteString(tb.String())
	return b.String()
}

// fewer says how a's renewals compare with b's.
func fewer(a, b float64) string {
	switch {
	case a < b:
		return "fewer"
	case a == b:
		return "equal"
	default:
		return "more"
	}
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
