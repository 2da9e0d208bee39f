package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
)

// The read-write lock's and the semaphore's scenarios: their rows in the table set shared, and
// then the workers' goroutines hold a read-write lock (RLock for three cycles in four, Lock
// for the fourth) or a semaphore (1 or 2 permits of sharedSize), and the analysis checks what
// those promise instead of a mutex's.
//
// A cycle, as a correct user runs it: take the hold → check the lease context → read the
// register → (work, checking the context) → check → a second operation → Unlock. The second
// operation is the writer's write of value+1, a reader's second read, a permit holder's write
// (the semaphore's holders are not exclusive, so their writes are not a read-modify-write:
// lost updates are not counted). The resource's fence works for the read-write lock as for a
// mutex: a reader's token is the last writer's, so a read whose token is below the newest
// writer's is refused. A semaphore's holders hold at once with distinct tokens, so a register
// fence means nothing there: its scenarios run unfenced only.
//
// The claimed guarantee, checked on the workers' own timeline (CLOCK_MONOTONIC): a hold is
// believed held from the return of its acquisition to the last check of its lease context that
// said "held". Among the holds believed held at any one instant there is never a writer with
// anyone else, and never more than sharedSize permits. dlock promises it because a lease's
// context says "held" only while the server still counts the hold (the drift allowance), and
// the server never grants past those limits. On the resource's timeline (a cycle from its first
// operation to its last, as the resource applied them) an operation that a paused holder sent
// before its pause may land after it: such sections are counted (overlaps), not failed, as for
// a mutex: that is what fencing tokens are for.

// sharedLoad says which primitive a row's workers hold: "" (a Mutex), "rw" or "sem".
type sharedLoad string

const (
	rwLoad  sharedLoad = "rw"
	semLoad sharedLoad = "sem"
)

// sharedSize is the semaphore's size in the "sem" scenarios.
const sharedSize = 3

// rwUnits stands for a writer's hold in the analysis: more than every reader together.
const rwUnits = 1 << 20

// unitsOf is how many units the hold of cycle seq of goroutine g takes: -1 for the writer of a
// read-write lock, 1 for a reader, 1 or 2 permits of a semaphore in turn (permits, when > 0:
// always that many).
func (l sharedLoad) unitsOf(seq int64, g, permits int) int {
	switch l {
	case rwLoad:
		if (seq+int64(g))%4 == 0 {
			return -1
		}
		return 1
	case semLoad:
		if permits > 0 {
			return permits
		}
		return 1 + int((seq+int64(g))%2)
	}
	return 0
}

// runShared is run for a row with shared set: cycles on the read-write lock or semaphore.
func (w *worker) runShared(ctx context.Context, c *dlock.Client) error {
	rw := c.RWMutex(w.conf.Lock)
	sem := c.Semaphore(w.conf.Lock, sharedSize)
	return retryCycles(ctx, func() (bool, error) { return w.sharedCycle(ctx, rw, sem) }, nil)
}

// sharedCycle runs one cycle (see above). ok is false when the hold could not be taken;
// err is returned only for failures of the resource connection.
func (w *worker) sharedCycle(ctx context.Context, rw *dlock.RWMutex, sem *dlock.Semaphore) (ok bool, err error) {
	load := sharedLoad(w.conf.Shared)
	w.seq++
	seq := w.seq
	units := load.unitsOf(seq, w.g, w.conf.Permits)
	lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
	s := mono()
	var l *dlock.Lease
	var lerr error
	switch {
	case load == semLoad:
		l, lerr = sem.Acquire(lctx, units)
	case units < 0:
		l, lerr = rw.Lock(lctx)
	default:
		l, lerr = rw.RLock(lctx)
	}
	r := mono()
	lcancel()
	if lerr != nil {
		if ctx.Err() == nil {
			w.add(event{K: "acq", S: s, R: r, Seq: seq, Units: units, Res: "err: " + lerr.Error(), Is: kindsOf(lerr)})
		}
		return false, nil
	}
	tok := l.Token()
	w.add(event{K: "acq", S: s, R: r, Tok: tok, Seq: seq, Units: units, Res: "ok"})
	lease := l.Context()
	var signalled atomic.Bool
	signal := func(at int64, how string) {
		if signalled.CompareAndSwap(false, true) {
			w.add(event{K: "sig", S: at, Tok: tok, Seq: seq, Cause: how, Is: kindsOf(context.Cause(lease))})
		}
	}
	stopAfter := context.AfterFunc(lease, func() {
		at := mono()
		if errors.Is(context.Cause(lease), dlock.ErrLost) {
			signal(at, "done")
		}
	})
	defer stopAfter()
	check := func() bool {
		at := mono()
		err := lease.Err()
		live := err == nil
		w.add(event{K: "chk", S: at, Tok: tok, Seq: seq, Live: live})
		if !live && errors.Is(context.Cause(lease), dlock.ErrLost) {
			signal(at, "err")
		}
		return live
	}
	defer func() {
		uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		us := mono()
		uerr := l.Unlock(uctx)
		ucancel()
		w.add(event{K: "unl", S: us, R: mono(), Tok: tok, Seq: seq, Res: errString(uerr), Is: kindsOf(uerr)})
	}()

	if !check() {
		return true, nil
	}
	rs := mono()
	st, val, work, err := w.res.call(fmt.Sprintf("R %d %d %d %d %d\n", w.conf.Slot, w.conf.Inc, w.g, seq, tok))
	if err != nil {
		return true, fmt.Errorf("resource read: %w", err)
	}
	w.add(event{K: "rd", S: rs, R: mono(), Tok: tok, Seq: seq, Val: val, Res: st})
	if st != "ok" {
		return true, nil
	}
	end := mono() + int64(max(work, 2*time.Millisecond)) // a reader holds a moment, so that readers meet
	for mono() < end {
		if !check() {
			return true, nil
		}
		time.Sleep(min(5*time.Millisecond, time.Duration(end-mono())))
	}
	if !check() {
		return true, nil
	}
	if load == rwLoad && units > 0 {
		rs := mono()
		st, val, _, err := w.res.call(fmt.Sprintf("R %d %d %d %d %d\n", w.conf.Slot, w.conf.Inc, w.g, seq, tok))
		if err != nil {
			return true, fmt.Errorf("resource read: %w", err)
		}
		w.add(event{K: "rd", S: rs, R: mono(), Tok: tok, Seq: seq, Val: val, Res: st})
		return true, nil
	}
	ws := mono()
	st, _, _, err = w.res.call(fmt.Sprintf("W %d %d %d %d %d %d\n", w.conf.Slot, w.conf.Inc, w.g, seq, tok, val+1))
	if err != nil {
		return true, fmt.Errorf("resource write: %w", err)
	}
	w.add(event{K: "wr", S: ws, R: mono(), Tok: tok, Seq: seq, Val: val + 1, Res: st})
	return true, nil
}

// hold is one successful acquisition of a shared scenario, as its worker logged it.
type hold struct {
	k        cycleKey
	tok      uint64
	units    int   // -1: a writer
	s, r     int64 // the acquisition call
	lastLive int64 // the last context check that said "held" (0: none)
	end      int64 // the Unlock's return (0: none logged: killed)
	told     bool  // a lost-lock signal
}

// weight is the hold's units as the limits count them.
func (h hold) weight() int {
	if h.units < 0 {
		return rwUnits
	}
	return h.units
}

// limit is how many units may be held at once.
func (l sharedLoad) limit() int {
	if l == semLoad {
		return sharedSize
	}
	return rwUnits
}

// analyzeShared is analyze for a row with shared set.
func (a *analysis) analyzeShared(linTimeout time.Duration) *findings {
	load := a.sc.shared
	a.checkDials()
	a.countRegisterOps()
	holds := a.collectHolds()
	a.measureSharedSections(load)
	a.checkBelievedHeld(load, holds)
	a.checkSharedSignals(holds)
	a.checkRecovery()
	a.checkFrozenWaiters(holds)
	if load == rwLoad {
		a.checkRegister(linTimeout)
	} else {
		a.f.LostUpdates, a.f.StaleLanded = 0, 0
		a.note("a semaphore's holders write at once: lost updates and stale operations are not counted, and the register's history is not checked")
	}
	return a.f
}

// collectHolds gathers the successful acquisitions (also as a.acqs, by return time, for
// checkRecovery) and what their workers logged about each.
func (a *analysis) collectHolds() map[cycleKey]*hold {
	f := a.f
	holds := map[cycleKey]*hold{}
	var lat []time.Duration
	for _, e := range a.d.events {
		if e.K != "acq" {
			continue
		}
		if e.Res != "ok" {
			f.AcquireErrors++
			continue
		}
		k := cycleKey{e.who(), e.Seq}
		holds[k] = &hold{k: k, tok: e.Tok, units: e.Units, s: e.S, r: e.R}
		a.acqs = append(a.acqs, acq{w: e.who(), tok: e.Tok, s: e.S, r: e.R, lo: e.S, hi: e.R})
		lat = append(lat, time.Duration(e.R-e.S))
	}
	for _, e := range a.d.events {
		h := holds[cycleKey{e.who(), e.Seq}]
		if h == nil {
			continue
		}
		switch {
		case e.K == "chk" && e.Live:
			h.lastLive = max(h.lastLive, e.S)
		case e.K == "sig":
			h.told = true
		case e.K == "unl":
			h.end = e.R
		}
	}
	sort.Slice(a.acqs, func(i, j int) bool { return a.acqs[i].r < a.acqs[j].r })
	f.Cycles = len(a.acqs)
	f.AcquireP50, f.AcquireP99 = pct(lat, 50), pct(lat, 99)
	return holds
}

// measureSharedSections counts, on the resource's timeline, the sections (a cycle's first
// operation to its last) that were open while the units open together exceeded the limit: a
// writer with anyone, or more than sharedSize permits. Measured, not failed (see above).
func (a *analysis) measureSharedSections(load sharedLoad) {
	units := map[cycleKey]int{}
	for _, e := range a.d.events {
		if e.K == "acq" && e.Res == "ok" {
			units[cycleKey{e.who(), e.Seq}] = e.Units
		}
	}
	spans := map[cycleKey]span{}
	for _, op := range a.d.ops {
		k := cycleKey{op.who(), op.Seq}
		sp, ok := spans[k]
		if !ok {
			sp = span{k: k, tok: op.Token, s: op.T, e: op.T}
		}
		sp.s, sp.e = min(sp.s, op.T), max(sp.e, op.T)
		spans[k] = sp
	}
	var iv []interval
	for k, sp := range spans {
		u := units[k]
		w := u
		if u < 0 {
			w = rwUnits
		}
		iv = append(iv, interval{k: k, s: sp.s, e: sp.e, w: w})
	}
	_, _, _, culprits := sweep(iv, load.limit())
	a.f.Overlaps = len(culprits)
	for _, n := range culprits {
		a.f.OverlapMax = max(a.f.OverlapMax, n)
	}
	if len(culprits) > 0 {
		a.note("on the resource's timeline, %d sections were still open when the limit was exceeded (a late operation of a paused holder, or of a hold the server forgot: fencing tokens are for it), with up to %d others", len(culprits), a.f.OverlapMax)
	}
}

// interval is a hold's span on one timeline, with its weight.
type interval struct {
	k    cycleKey
	s, e int64
	w    int
}

// sweep returns the intervals open at some instant at which the weights open together
// exceeded limit, one example of such an instant's intervals, and the most weight open at once.
// culprits maps each interval that was the oldest open at such an instant to how many others
// were open with it then: on the resource's timeline, the section that should have ended.
func sweep(iv []interval, limit int) (over map[cycleKey]bool, example []interval, most int, culprits map[cycleKey]int) {
	type edge struct {
		t    int64
		open bool
		i    int
	}
	var edges []edge
	for i, x := range iv {
		edges = append(edges, edge{x.s, true, i}, edge{x.e, false, i})
	}
	// At one instant, opens before closes: intervals that touch count as overlapping.
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].t != edges[j].t {
			return edges[i].t < edges[j].t
		}
		return edges[i].open && !edges[j].open
	})
	over, culprits = map[cycleKey]bool{}, map[cycleKey]int{}
	open := map[int]bool{}
	sum := 0
	for _, e := range edges {
		if !e.open {
			delete(open, e.i)
			sum -= iv[e.i].w
			continue
		}
		open[e.i] = true
		sum += iv[e.i].w
		most = max(most, sum)
		if sum <= limit {
			continue
		}
		oldest := -1
		for i := range open {
			over[iv[i].k] = true
			if len(example) < len(open) {
				example = append(example, iv[i])
			}
			if oldest < 0 || iv[i].s < iv[oldest].s {
				oldest = i
			}
		}
		culprits[iv[oldest].k] = max(culprits[iv[oldest].k], len(open)-1)
	}
	return over, example, most, culprits
}

// checkBelievedHeld checks the claimed guarantee (see above): among the holds believed held at
// any one instant, no writer with another hold, and no more than sharedSize permits. Where the
// deployment forgets locks (forgetsLocks) a break is noted, not failed, and counted as
// LiveAfterNext (the holds believed held at such an instant).
func (a *analysis) checkBelievedHeld(load sharedLoad, holds map[cycleKey]*hold) {
	var iv, readers []interval
	for _, h := range holds {
		if h.lastLive == 0 || h.lastLive < h.r {
			continue // never said "held" after it was granted
		}
		x := interval{k: h.k, s: h.r, e: h.lastLive, w: h.weight()}
		iv = append(iv, x)
		if h.units > 0 {
			readers = append(readers, x)
		}
	}
	over, ex, most, _ := sweep(iv, load.limit())
	if load == semLoad {
		a.note("at most %d of %d permits believed held at once", most, sharedSize)
	} else {
		_, _, most, _ := sweep(readers, rwUnits)
		a.note("at most %d readers believed held at once", most)
	}
	if len(over) == 0 {
		return
	}
	slices.SortFunc(ex, func(x, y interval) int { return int(x.s - y.s) })
	var b []string
	for _, x := range ex {
		h := holds[x.k]
		role := fmt.Sprintf("%d permit(s)", h.units)
		if load == rwLoad {
			role = map[bool]string{true: "writer", false: "reader"}[h.units < 0]
		}
		b = append(b, fmt.Sprintf("%s cycle %d (%s, token %d) held %s to %s", x.k.w, x.k.seq, role, h.tok, ts(x.s, a.d.start), ts(x.e, a.d.start)))
	}
	limit := "a writer with another holder"
	if load == semLoad {
		limit = fmt.Sprintf("more than %d permits", sharedSize)
	}
	msg := fmt.Sprintf("%d holds were believed held (context said \"held\") while %s was: %s", len(over), limit, joinN(b, 5))
	a.f.LiveAfterNext = len(over)
	if a.sc.forgetsLocks {
		// The server lost the holds (a restart without persistence, a failover to a replica they
		// had not reached): their holders learn it at their next renewal, and meanwhile the
		// server grants the units again. doc.go documents it; fenced, the register must still
		// lose nothing (checkRegister).
		a.note("expected (the server lost the holds): %s", msg)
		return
	}
	a.fail("%s", msg)
}

// checkSharedSignals counts the lost-lock signals and checks, where the row says so
// (mustSignal), that the hold a fault hit was told it was lost. A fault hits the cycle of the
// goroutine that sprang it whose acquisition came before the fault and whose Unlock did not.
func (a *analysis) checkSharedSignals(holds map[cycleKey]*hold) {
	for _, h := range holds {
		if h.told {
			a.f.Signals++
		}
	}
	a.note("lost-lock signals of shared holds are not placed against a next grant (several hold at once): the believed-held check stands for them")
	if !a.sc.mustSignal {
		return
	}
	for _, flt := range a.d.faults {
		var hit *hold
		for _, h := range holds {
			if h.k.w == flt.who() && h.tok == flt.Token && h.r <= flt.Start && (h.end == 0 || h.end >= flt.Start) {
				hit = h
			}
		}
		switch {
		case hit == nil:
			a.note("%s at %s: the hit hold of %s (token %d) is not in the logs", flt.Kind, ts(flt.Start, a.d.start), flt.who(), flt.Token)
		case !hit.told:
			a.fail("%s at %s: %s cycle %d (token %d) never got a lost-lock signal", flt.Kind, ts(flt.Start, a.d.start), flt.who(), hit.k.seq, flt.Token)
		}
	}
}
