package main

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// The analysis of one run: the figures of the report, and the guarantees a run can break,
// from the resource's record, the workers' event logs and the faults injected. analyze runs
// one small step per figure or guarantee; which guarantees a scenario claims comes from its
// row of the scenario table (scenario.go).

// findings are the figures of one run, and the guarantees it broke.
type findings struct {
	Scenario string
	Mode     string
	Seed     uint64
	Duration time.Duration

	Ops           int // register operations that reached the resource (reads + writes)
	Writes        int // writes applied
	Cycles        int // acquisitions that completed Lock
	LocalHandoffs int // ...that took the lock from another goroutine of the same process without the server (turn rows: or took back a parked lock)
	Faults        int
	// Turn rows (turns.go): the between-holds faults by where they found the lock, and the
	// longest the other processes waited for it after one that found it parked.
	TurnParked, TurnHeld, TurnReleased int
	TurnParkedWaitMax                  time.Duration
	// ...and the local handoffs in which a goroutine took back the lock its own Unlock had
	// parked (the next token, the same goroutine): a lower bound of the parked turns taken back.
	TakenBack      int
	Overlaps       int // critical sections still open on the resource when a newer lease's section began
	OverlapMax     int // the most newer sections one of them straddled
	LostUpdates    int64
	StaleRejected  int // refused by the fence
	StaleLanded    int // unfenced: applied although a newer token had been seen
	AcquireP50     time.Duration
	AcquireP99     time.Duration
	AcquireErrors  int
	Recovery       []time.Duration // per fault: fault start → next successful acquisition
	Signals        int             // lost-lock signals (lease context cancelled with ErrLost)
	SignalsBefore  int             // ...observed before the server granted the lock to the next holder
	SignalsLate    int             // ...observed later, but no check of that lease said "held" after the grant (paused or descheduled)
	SignalsAfter   int             // ...and a check of that lease said "held" after the grant
	SignalMargins  []time.Duration // for signals before: how long before the next grant
	LiveAfterNext  int             // context checks that said "held" after the next holder was granted the lock
	UnsureLive     int             // ...during the next holder's Lock call, grant instant unknown
	Linearizable   porcupine.CheckResult
	TokenOrderBugs int

	// Memory pressure, in the scenarios with a memory limit.
	Dials              int   // workers' Dials
	DialsRefused       int   // ...refused with the error the scenario expects (dialRefused)
	EvictedKeys        int64 // the server's evicted_keys at the end of the run
	LockEvictions      int   // evictions of the lock's key
	LockEvictionsHeld  int   // ...while a lease on it was held
	Warnings           int   // warnings the clients logged (WithLogger)
	OOMRefused         int   // acquisitions refused with an error wrapping ErrOutOfMemory
	OOMGrants          int   // acquisitions the server granted while out of memory
	OOMGrantsOnRelease int   // ...of them by a release (grant on release): inside another holder's Unlock
	OOMLostBefore      int   // Unlocks that overlapped an out-of-memory period and returned ErrLost for a lease already reported lost
	OOMReleases        int   // Unlocks that overlapped an out-of-memory period and returned nil
	OOMReleased        int   // ...after which the key read as released (or was gone)
	OOMPassedOn        int   // ...as held still, by the sibling the lock was passed to locally
	OOMPassedBack      int   // ...of them to a sibling whose Lock failed at that moment, and released it again
	OOMTakenAgain      int   // ...as held by a later grant

	// Waiter faults (waiterFaults): the stall each one caused is its Recovery figure.
	WaiterGranted int // faults whose hit waiter the server granted the lock to while it was frozen or dead
	// (frozenWaiters: granted units that lapsed before it ran again)

	// Frozen waiters of a read-write lock or semaphore (frozenWaiters, frozen.go).
	StaleGrants     int // a resumed waiter's acquisition returned with the token of a grant that lapsed while it was frozen
	StaleGrantsLive int // ...and its context's first check said "held"

	// Election rows (election.go): terms whose leader still acted (a check said "leading")
	// after the next term was granted, and those whose last such check fell inside the next
	// term's Campaign call (grant instant unknown); whether the row counts them as its
	// deployment's hazard rather than a failure; and, per fault that deposes the leader, the
	// time from the fault to the first term of another process.
	LeaderOverlaps       int
	LeaderOverlapsUnsure int
	LeaderOverlapsHazard bool
	NewLeader            []time.Duration

	Failures []string // claimed guarantees broken, each naming the operations involved
	Notes    []string
}

// acq is one successful acquisition. s and r bound the Lock call; lo and hi bound the
// instant the lock was granted. A token from the server is its TIME in microseconds at that
// instant (unless it had to be bumped past the previous token), so when it maps inside [s, r]
// lo = hi = that instant; otherwise lo = s, hi = r. A local handoff (see localHandoff) is
// granted inside the previous holder's Unlock call: lo and hi are the intersection of the two
// calls.
type acq struct {
	w      who
	tok    uint64
	s, r   int64
	lo, hi int64
	local  bool
}

type cycleKey struct {
	w   who
	seq int64
}

// analyze computes the findings of one run and checks the guarantees its scenario claims.
// Each step below measures one thing or checks one guarantee; the order fixes the order of
// the failures and notes in the report.
func analyze(d *runData, linTimeout time.Duration) *findings {
	if d.transfers != nil {
		return analyzeTransfers(d)
	}
	a := newAnalysis(d)
	if a.sc.shared != "" {
		return a.analyzeShared(linTimeout) // a read-write lock or semaphore (shared.go)
	}
	a.checkDials()
	a.countRegisterOps()
	a.measureOverlaps()
	a.collectAcquisitions()
	a.checkTokens()
	signalled := a.measureSignals()
	a.checkHitHoldersTold(signalled)
	a.checkLeaseContexts()
	a.checkLeadership()
	a.checkRecovery()
	a.checkTurnFaults()
	a.checkWaiterStalls()
	a.checkEvictions()
	a.checkOutOfMemory()
	a.checkRegister(linTimeout)
	a.noteScriptErrors()
	return a.f
}

// analysis is one run being analyzed: its data, its scenario's row of the table and the
// findings so far.
type analysis struct {
	d    *runData
	sc   *scenario
	f    *findings
	acqs []acq // successful acquisitions, sorted by token (collectAcquisitions)
}

// newAnalysis starts the findings of d. Problems of the harness itself fail the run first: its
// figures cannot be trusted.
func newAnalysis(d *runData) *analysis {
	c := d.conf
	a := &analysis{d: d, f: &findings{Scenario: c.Scenario, Mode: c.mode(), Seed: c.Seed, Duration: time.Duration(d.end - d.start)}}
	a.f.Faults = len(d.faults)
	for _, msg := range d.infra {
		a.fail("harness: %s", msg)
	}
	sc, ok := scenarioNamed(c.Scenario)
	if !ok {
		a.fail("harness: unknown scenario %q", c.Scenario)
		sc = &scenario{name: c.Scenario} // held to every guarantee
	}
	a.sc = sc
	return a
}

// fail records a broken guarantee.
func (a *analysis) fail(format string, args ...any) {
	a.f.Failures = append(a.f.Failures, fmt.Sprintf(format, args...))
}

// note records a finding that is no failure.
func (a *analysis) note(format string, args ...any) {
	a.f.Notes = append(a.f.Notes, fmt.Sprintf(format, args...))
}

// failIfClaimed fails the run with msg when the scenario claims the guarantee, and notes it
// otherwise.
func (a *analysis) failIfClaimed(claimed bool, msg string) {
	if claimed {
		a.fail("%s", msg)
	} else {
		a.note("not a claimed guarantee here: %s", msg)
	}
}

// checkDials counts the workers' Dials and, where the scenario expects them refused
// (dialRefused), checks that every worker process's Dial was, with an error wrapping the
// expected one, and that no operation ran. Elsewhere a refused Dial is noted (and fails the
// run where the workers opted in to the server's setting: checkEvictions).
func (a *analysis) checkDials() {
	f := a.f
	want := a.sc.dialRefused
	procs, dialled := map[who]bool{}, map[who]bool{}
	var wrong, failed []string
	for _, e := range a.d.events {
		switch e.K {
		case "start":
			procs[e.who()] = true
		case "dial":
			f.Dials++
			dialled[e.who()] = true
			switch {
			case want != "" && e.is(want):
				f.DialsRefused++
			case want != "":
				wrong = append(wrong, fmt.Sprintf("worker %d.%d: Dial %s", e.Slot, e.Inc, dialOutcome(e)))
			case e.Res != "ok":
				failed = append(failed, fmt.Sprintf("worker %d.%d: %s", e.Slot, e.Inc, e.Res))
			}
		}
	}
	if len(failed) > 0 {
		a.note("Dial failed: %s", joinN(failed, 3))
	}
	if want == "" {
		return
	}
	if len(wrong) > 0 {
		a.fail("%d of %d Dials not refused with an error wrapping %s: %s", len(wrong), f.Dials, errName(want), joinN(wrong, 3))
	}
	if n := len(procs) - len(dialled); n > 0 || len(procs) < a.d.conf.Workers {
		a.fail("%d worker processes started, %d logged a Dial; want %d, all refused", len(procs), len(dialled), a.d.conf.Workers)
	}
	acqs := 0
	for _, e := range a.d.events {
		if e.K == "acq" {
			acqs++
		}
	}
	if acqs > 0 || len(a.d.ops) > 0 {
		a.fail("the Dial was to be refused, yet %d acquisitions were attempted and %d register operations ran", acqs, len(a.d.ops))
	}
}

// dialOutcome says how a Dial ended, for a failure message.
func dialOutcome(e event) string {
	if e.Res == "ok" {
		return "succeeded"
	}
	return "failed otherwise: " + e.Res
}

// countRegisterOps reads the resource's own record: operations, stale ones (refused by the
// fence, or applied unfenced although a newer token had been seen), writes applied, and lost
// updates (writes applied minus the final value of the register, which every applied write
// should have incremented by one).
func (a *analysis) countRegisterOps() {
	f := a.f
	f.Ops = len(a.d.ops)
	for _, op := range a.d.ops {
		switch {
		case !op.Accepted:
			f.StaleRejected++
		case op.Stale:
			f.StaleLanded++
		}
		if op.Op == 'W' && op.Accepted {
			f.Writes++
		}
	}
	f.LostUpdates = int64(f.Writes) - a.d.final
}

// measureOverlaps counts overlapping critical sections on the resource's timeline: a cycle
// spans its read to its write (or just its read) as the resource applied or refused them. A
// section overlaps when a section of a newer lease (larger token) began before it ended: it
// was still open when the lock had already moved on. Each such section counts once, however
// many newer ones it straddled. Measured, not a failure: unfenced it is the cost of leases
// without fencing, and fenced the register's own checks judge the outcome.
func (a *analysis) measureOverlaps() {
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
	var ex []string
	a.f.Overlaps, a.f.OverlapMax, ex = countOverlaps(spans)
	if len(ex) > 0 {
		a.note("overlapping sections, e.g.: %s", joinN(ex, 3))
	}
}

// collectAcquisitions gathers the successful acquisitions, sorted by token, places each grant
// on the monotonic timeline (placeGrants), and measures acquire latency and local handoffs.
func (a *analysis) collectAcquisitions() {
	f := a.f
	var lat []time.Duration
	clocks := newClockMap(a.d.clocks)
	for _, e := range a.d.events {
		if e.K != "acq" {
			continue
		}
		if e.Res != "ok" {
			f.AcquireErrors++
			continue
		}
		a.acqs = append(a.acqs, acq{w: e.who(), tok: e.Tok, s: e.S, r: e.R, lo: e.S, hi: e.R})
		lat = append(lat, time.Duration(e.R-e.S))
	}
	f.Cycles = len(a.acqs)
	granted := placeGrants(a.acqs, a.d.events, clocks) // and sorts acqs by token
	for i, q := range a.acqs {
		if q.local {
			f.LocalHandoffs++
			if q.w == a.acqs[i-1].w {
				f.TakenBack++ // only a parked turn gives one goroutine the next token (turns.go)
			}
		}
	}
	if !clocks.ok {
		a.note("the wall clock stepped during the run: grant instants are bounded by the Lock calls only")
	} else if n := len(a.acqs) - f.LocalHandoffs - granted; n > 0 {
		a.note("%d of %d grant instants from the server bounded by the Lock call only (token bumped past the previous one)", n, len(a.acqs)-f.LocalHandoffs)
	}
	f.AcquireP50, f.AcquireP99 = pct(lat, 50), pct(lat, 99)
}

// checkTokens checks that fencing tokens are unique and increase with the order of the
// grants: a fence is only as good as that order. Where the scenario does not claim it
// (tokensUnclaimed) breaks are noted. Where the deployment forgets locks (forgetsLocks) the
// holder's client can pass a lost hold to its other goroutines (local handoffs, token + 1)
// after the server granted a larger token to someone else: doc.go documents it (Fencing
// tokens), so such handoffs are excused and counted in a note, with how many of those leases
// were told ErrLost (one unlocked, and passed on, before the loss is found never is).
func (a *analysis) checkTokens() {
	told := map[uint64]bool{}
	for _, e := range a.d.events {
		if e.K == "sig" {
			told[e.Tok] = true
		}
	}
	fail := func(format string, args ...any) {
		a.failIfClaimed(!a.sc.tokensUnclaimed, fmt.Sprintf(format, args...))
	}
	var lostHandoffs, lostTold int
	a.f.TokenOrderBugs = checkTokenOrder(a.acqs, fail, func(q acq) bool {
		if a.sc.forgetsLocks && q.local {
			lostHandoffs++
			if told[q.tok] {
				lostTold++
			}
			return true
		}
		return false
	})
	if lostHandoffs > 0 {
		a.note("%d local handoffs of a hold the server had lost, granted after a larger token (%d of them told ErrLost; see doc.go, Fencing tokens)", lostHandoffs, lostTold)
	}
}

// nextGrant returns the acquisition with the smallest token above tok: the holder that the
// lease of tok gave way to.
func (a *analysis) nextGrant(tok uint64) (acq, bool) {
	i := sort.Search(len(a.acqs), func(i int) bool { return a.acqs[i].tok > tok })
	if i == len(a.acqs) {
		return acq{}, false
	}
	return a.acqs[i], true
}

// measureSignals places every lost-lock signal against the next holder's grant, on one clock:
// before it (the promise: the holder is told before anyone else can hold the lock, and how
// much before), later but never acted on (no check of that lease said "held" after the grant:
// the holder was frozen or not scheduled), or later and acted on (also counted, and judged,
// by checkLeaseContexts). It returns the tokens of the leases that were told.
func (a *analysis) measureSignals() (signalled map[uint64]bool) {
	f := a.f
	lastLive := map[uint64]int64{}
	for _, e := range a.d.events {
		if e.K == "chk" && e.Live {
			lastLive[e.Tok] = max(lastLive[e.Tok], e.S)
		}
	}
	signalled = map[uint64]bool{}
	for _, e := range a.d.events {
		if e.K != "sig" {
			continue
		}
		f.Signals++
		signalled[e.Tok] = true
		n, ok := a.nextGrant(e.Tok)
		switch {
		case !ok || e.S < n.lo:
			f.SignalsBefore++
			if ok {
				f.SignalMargins = append(f.SignalMargins, time.Duration(n.lo-e.S))
			}
		case lastLive[e.Tok] > n.hi:
			f.SignalsAfter++
		default:
			f.SignalsLate++
		}
	}
	return signalled
}

// checkHitHoldersTold checks, where the scenario says so (mustSignal), that every holder a
// fault hit got a lost-lock signal: frozen or cut off past its TTL while the server keeps the
// lock's state, its lease is lost, and dlock must say so.
func (a *analysis) checkHitHoldersTold(signalled map[uint64]bool) {
	if !a.sc.mustSignal {
		return
	}
	for _, flt := range a.d.faults {
		if isBetweenHolds(flt.Variant) {
			continue // it hit the process after that lease's Unlock (turns.go): no holder to tell
		}
		if !signalled[flt.Token] {
			a.fail("%s at %s: %s (token %d) never got a lost-lock signal", flt.Kind, ts(flt.Start, a.d.start), flt.who(), flt.Token)
		}
	}
}

// checkLeaseContexts checks that no lease context said "held" after the server had granted
// the lock to the next holder: that is the promise a holder relies on before it acts. A check
// inside the next holder's Lock call, whose grant instant is unknown, is counted as "during",
// not judged. Where the deployment forgets locks (forgetsLocks) the server can hand the lock to
// a second holder before the first learns: a documented limitation, noted, not failed.
func (a *analysis) checkLeaseContexts() {
	f := a.f
	var ex []string
	for _, e := range a.d.events {
		if e.K != "chk" || !e.Live {
			continue
		}
		n, ok := a.nextGrant(e.Tok)
		switch {
		case !ok || e.S < n.lo:
		case e.S > n.hi:
			f.LiveAfterNext++
			if len(ex) < 5 {
				ex = append(ex, fmt.Sprintf("%s token %d context live at %s, %s after %s was granted token %d",
					e.who(), e.Tok, ts(e.S, a.d.start), time.Duration(e.S-n.hi), n.w, n.tok))
			}
		default:
			f.UnsureLive++
		}
	}
	if f.LiveAfterNext == 0 || a.sc.election {
		return // an election's terms are judged by checkLeadership
	}
	msg := fmt.Sprintf("%d lease-context checks said the lock was held after another holder had acquired it: %s",
		f.LiveAfterNext, joinN(ex, 5))
	if a.sc.forgetsLocks {
		a.note("expected (the server lost the lock): %s", msg)
	} else {
		a.fail("%s", msg)
	}
}

// checkRecovery measures, for every fault, the time from its start to the next successful
// acquisition by anyone, and checks that there was one: a fault must not leave the lock out
// of reach for good. Where the scenario bounds it (boundedRecovery: the holder died and its
// lease just runs out), it must come within TTL + killRecoverySlack. Where the fault puts the
// server out of memory (outOfMemory), the lock can pass between goroutines of one process all
// through it, without the server: there recovery runs from the fault's end (memory back) to
// the next grant by the server. Where the fault hits a waiter (waiterFaults, frozenWaiters),
// the holder is unharmed and recovery is the stall the waiter caused: checkWaiterStalls and
// checkFrozenWaiters measure it.
func (a *analysis) checkRecovery() {
	if a.sc.hitsWaiters() {
		return
	}
	var byR []acq
	for _, q := range a.acqs {
		if !a.sc.outOfMemory || !q.local {
			byR = append(byR, q)
		}
	}
	sort.Slice(byR, func(i, j int) bool { return byR[i].r < byR[j].r })
	bound := a.d.conf.TTL + killRecoverySlack
	for _, flt := range a.d.faults {
		from, what := flt.Start, "no acquisition followed it"
		if a.sc.outOfMemory {
			from, what = flt.End, "the server granted the lock to no one after memory was back"
		}
		i := sort.Search(len(byR), func(i int) bool { return byR[i].r > from })
		if i == len(byR) {
			a.fail("%s fault at %s (%s): %s", flt.Kind, ts(flt.Start, a.d.start), flt.who(), what)
			continue
		}
		rec := time.Duration(byR[i].r - from)
		a.f.Recovery = append(a.f.Recovery, rec)
		if a.sc.boundedRecovery && rec > bound {
			a.fail("%s: %s (token %d) killed at %s; next acquisition (%s, token %d) %v later, over TTL + %d ms = %v",
				flt.Kind, flt.who(), flt.Token, ts(flt.Start, a.d.start), byR[i].w, byR[i].tok, rec.Round(time.Millisecond), killRecoverySlack.Milliseconds(), bound)
		}
	}
}

// checkEvictions measures, where a filler loads the server as a cache (memory.filler), how
// many keys the server evicted, how often the lock's key among them, and how often while a
// lease on it was held (from the acquisition's return to the Unlock's call). Where the
// scenario needs the lock's key evicted under a holder (evictsLocks), a run without one proves
// nothing and fails. Where the workers opted in (unsafeEviction), the client must have used
// the server, warned about it, and done no more than warn: a refused Dial, a lease ended or an
// acquisition refused for the eviction policy fail the run.
func (a *analysis) checkEvictions() {
	f := a.f
	if !a.sc.memory.filler {
		return
	}
	f.EvictedKeys = a.d.mem.EvictedKeys
	var evictions []int64 // the lock's key, until the workers stopped (the filler writes on a little longer)
	for _, t := range a.d.mem.LockEvictions {
		if t <= a.d.end {
			evictions = append(evictions, t)
		}
	}
	f.LockEvictions = len(evictions)
	warned := map[who]bool{}
	type lease struct {
		w   who
		tok uint64
	}
	released := map[lease]int64{}
	for _, e := range a.d.events {
		switch e.K {
		case "log":
			if strings.Contains(e.Res, "level=WARN") {
				f.Warnings++
				warned[e.who()] = true
			}
		case "unl":
			released[lease{e.who(), e.Tok}] = e.S
		}
	}
	for _, t := range evictions {
		for _, q := range a.acqs {
			end, ok := released[lease{q.w, q.tok}]
			if !ok {
				end = a.d.end // never unlocked: its process was stopped or killed
			}
			if q.r <= t && t <= end {
				f.LockEvictionsHeld++
				break
			}
		}
	}
	a.note("the server evicted %d keys (INFO evicted_keys; the filler wrote %d): the lock's key %d times, %d of them while a lease on it was held; the clients logged %d warnings",
		f.EvictedKeys, a.d.mem.FillerKeys, f.LockEvictions, f.LockEvictionsHeld, f.Warnings)
	if a.sc.unsafeEviction && f.LockEvictionsHeld > 0 && f.Warnings <= f.Dials {
		// Noted, not failed: a log line guards nothing, but an operator who opted in may
		// expect to hear of the evictions that cost locks.
		a.note("the clients warned when they dialled and never again, although the server evicted the lock's key %d times while a lease on it was held", f.LockEvictionsHeld)
	}
	if a.sc.evictsLocks && f.LockEvictionsHeld == 0 {
		a.fail("the lock's key was never evicted while a lease on it was held (evicted_keys %d, the lock's key %d times): the run proves nothing", f.EvictedKeys, f.LockEvictions)
	}
	if !a.sc.unsafeEviction {
		return
	}
	var refused, ended []string
	for _, e := range a.d.events {
		switch {
		case e.K == "dial" && e.Res != "ok":
			a.fail("WithUnsafeEviction: worker %d.%d: Dial failed: %s", e.Slot, e.Inc, e.Res)
		case e.K == "dial" && !warned[e.who()]:
			a.fail("WithUnsafeEviction: worker %d.%d's client logged no warning, though its server may evict lock keys", e.Slot, e.Inc)
		case e.K == "acq" && e.is(errKindEvictionPolicy):
			refused = append(refused, fmt.Sprintf("%s at %s: %s", e.who(), ts(e.R, a.d.start), e.Res))
		case e.K == "sig" && e.is(errKindEvictionPolicy):
			ended = append(ended, fmt.Sprintf("%s token %d at %s", e.who(), e.Tok, ts(e.S, a.d.start)))
		}
	}
	if len(refused) > 0 {
		a.fail("WithUnsafeEviction: %d acquisitions refused for the eviction policy (the client should only warn): %s", len(refused), joinN(refused, 3))
	}
	if len(ended) > 0 {
		a.fail("WithUnsafeEviction: %d leases ended for the eviction policy (the client should only warn): %s", len(ended), joinN(ended, 3))
	}
}

// checkOutOfMemory checks, where the fault puts the server out of memory (outOfMemory), what
// dlock promises there. Every Unlock that overlapped an out-of-memory period must return nil
// (but for an ErrLost from a lease whose context had already said it was lost: such an Unlock
// has nothing to release, and is noted), and every Unlock that returned nil must leave the
// lock released: the key its worker read
// right after (worker.readBack) is gone, or released ("- <token> 0"), or held by a later grant
// (a larger token), or held still under this lease's token because the Unlock passed the lock
// to a sibling goroutine (the next token is that local handoff). Acquisitions refused for
// memory must wrap ErrOutOfMemory, and the server must grant none during the fault (the
// acquisition scripts' first write needs memory; the fault's record lies inside the time the
// server was out of memory) but by a release: grant on release gives the lock to the first
// client queued inside the releasing holder's Unlock, and Redis lets a script that has written
// (the release) write on, so those grants are counted and not failed. A run in which no
// acquisition was refused for memory, or no Unlock released the lock on the server while it
// was out of memory (the key then read released, or taken again: granted on by the release),
// proves nothing and fails.
func (a *analysis) checkOutOfMemory() {
	f := a.f
	if !a.sc.outOfMemory {
		return
	}
	during := func(s, r int64) bool {
		for _, flt := range a.d.faults {
			if s <= flt.End && r >= flt.Start {
				return true
			}
		}
		return false
	}
	type lease struct {
		w   who
		tok uint64
	}
	read := map[lease]event{}
	told := map[lease]int64{} // when the lease's context reported it lost
	for _, e := range a.d.events {
		switch e.K {
		case "key":
			read[lease{e.who(), e.Tok}] = e
		case "sig":
			told[lease{e.who(), e.Tok}] = e.S
		}
	}
	var unmarked, failed, held, lostBefore []string
	unread := 0
	for _, e := range a.d.events {
		switch {
		case e.K == "acq" && e.Res != "ok" && e.is(errKindOutOfMemory):
			f.OOMRefused++
		case e.K == "acq" && e.Res != "ok" && strings.Contains(e.Res, "OOM"):
			unmarked = append(unmarked, fmt.Sprintf("%s at %s: %s", e.who(), ts(e.R, a.d.start), e.Res))
		case e.K == "unl" && e.Res != "":
			at, wasTold := told[lease{e.who(), e.Tok}]
			switch {
			case !during(e.S, e.R):
			case e.is(errKindLost) && wasTold && at <= e.S:
				// The lease was lost before its Unlock, which had nothing to release.
				f.OOMLostBefore++
				lostBefore = append(lostBefore, fmt.Sprintf("%s token %d, Lock returned at %s", e.who(), e.Tok, ts(a.lockReturn(e.who(), e.Tok), a.d.start)))
			default:
				failed = append(failed, fmt.Sprintf("%s token %d at %s: %s", e.who(), e.Tok, ts(e.S, a.d.start), e.Res))
			}
		case e.K == "unl":
			kb, ok := read[lease{e.who(), e.Tok}]
			if !ok || strings.HasPrefix(kb.Res, "err: ") {
				unread++
				continue
			}
			state := a.releaseState(e, kb)
			if state == "held" {
				held = append(held, fmt.Sprintf("%s token %d, Unlock returned at %s, then the key read %q", e.who(), e.Tok, ts(e.R, a.d.start), kb.Res))
			}
			if !during(e.S, e.R) {
				continue
			}
			f.OOMReleases++
			switch state {
			case "released":
				f.OOMReleased++
			case "passed on":
				f.OOMPassedOn++
			case "passed back":
				f.OOMPassedOn++
				f.OOMPassedBack++
			case "taken again":
				f.OOMTakenAgain++
			}
		}
	}
	var unlocks []event
	for _, e := range a.d.events {
		if e.K == "unl" {
			unlocks = append(unlocks, e)
		}
	}
	var granted []string
	for _, q := range a.acqs {
		for _, flt := range a.d.faults {
			if q.local || q.lo < flt.Start || q.hi > flt.End {
				continue
			}
			f.OOMGrants++
			if slices.ContainsFunc(unlocks, func(u event) bool { return u.who() != q.w && u.S <= q.lo && q.hi <= u.R }) {
				f.OOMGrantsOnRelease++ // the release made it: grant on release
				continue
			}
			granted = append(granted, fmt.Sprintf("%s token %d at %s", q.w, q.tok, ts(q.lo, a.d.start)))
		}
	}
	if len(failed) > 0 {
		a.fail("%d Unlocks failed while the server was out of memory: %s", len(failed), joinN(failed, 3))
	}
	if len(held) > 0 {
		a.fail("%d Unlocks returned nil but left the lock held: %s", len(held), joinN(held, 3))
	}
	if len(granted) > 0 {
		a.fail("the server granted the lock %d times while out of memory, not by a release: %s", len(granted), joinN(granted, 3))
	}
	if len(unmarked) > 0 {
		a.fail("%d acquisitions refused for memory with an error that does not wrap ErrOutOfMemory: %s", len(unmarked), joinN(unmarked, 3))
	}
	if f.OOMRefused == 0 && len(a.d.faults) > 0 {
		a.fail("no acquisition was refused with ErrOutOfMemory: the run proves nothing")
	}
	if f.OOMReleased+f.OOMTakenAgain == 0 && len(a.d.faults) > 0 { // taken again: the release ran, and granted it on
		a.fail("no Unlock released the lock on the server while it was out of memory: the run proves nothing")
	}
	a.note("out of memory: %d acquisitions refused with ErrOutOfMemory, %d granted by the server (%d of them by a release, inside another holder's Unlock); %d Unlocks returned nil (the key then read released %d times, passed on locally %d (%d of them to a sibling whose Lock failed at that moment and released it again), taken again %d)",
		f.OOMRefused, f.OOMGrants, f.OOMGrantsOnRelease, f.OOMReleases, f.OOMReleased, f.OOMPassedOn, f.OOMPassedBack, f.OOMTakenAgain)
	if unread > 0 {
		a.note("%d Unlocks without a read of the key after them (the worker stopped, or the read failed)", unread)
	}
	if len(lostBefore) > 0 {
		a.note("%d leases were lost before their Unlock while the server was out of memory (their context said lost at its first check, and Unlock returned ErrLost): %s", len(lostBefore), joinN(lostBefore, 3))
	}
}

// lockReturn is when the Lock call that got w the lease of tok returned (0 when unknown).
func (a *analysis) lockReturn(w who, tok uint64) int64 {
	for _, q := range a.acqs {
		if q.tok == tok && q.w == w {
			return q.r
		}
	}
	return 0
}

// passBackWithin bounds how long after an Unlock a sibling's failing Lock may end for the lock
// to count as passed back (releaseState).
const passBackWithin = 50 * time.Millisecond

// releaseState judges what the key read right after a successful Unlock (unl) says: "released"
// (gone, or "- <token> 0"), "taken again" (held under a larger token: a later grant by the
// server), "passed on" (held under this lease's token or below, and the lease of the next
// token is a local handoff from this holder: the lock passed to a sibling inside the Unlock,
// and the server's record of it did not change), "passed back" (the same, to a sibling whose
// Lock call failed at that moment and released the lease it was handed), or "held": the
// Unlock left the lock held.
func (a *analysis) releaseState(unl, key event) string {
	if !key.Live || strings.HasPrefix(key.Res, "- ") {
		return "released"
	}
	// "<owner> <token> <holds> <description>"
	if f := strings.Fields(key.Res); len(f) >= 2 {
		if t, err := strconv.ParseUint(f[1], 10, 64); err == nil && t > unl.Tok {
			return "taken again"
		}
	}
	i := sort.Search(len(a.acqs), func(i int) bool { return a.acqs[i].tok > unl.Tok })
	if i < len(a.acqs) && a.acqs[i].tok == unl.Tok+1 && a.acqs[i].local && a.acqs[i].w.sameProcess(unl.who()) {
		return "passed on"
	}
	// The Unlock passed the lock to a sibling goroutine whose Lock call was failing at that very
	// moment (its own attempt refused, for memory): that Lock returned its error and released
	// the lease it had just been handed, which no Lock call returned, so the key still names
	// this process's hold when the read comes. That sibling's attempt was in flight when the
	// lock came: its Lock fails within passBackWithin of the Unlock's return.
	for _, e := range a.d.events {
		if e.K == "acq" && e.Res != "ok" && e.who().sameProcess(unl.who()) && e.G != unl.G && e.S <= unl.S && e.R >= unl.R && e.R <= unl.R+int64(passBackWithin) {
			return "passed back"
		}
	}
	return "held"
}

// checkRegister checks what mutual exclusion promises the user, on the lock-guarded
// read-modify-write of the register: every cycle's history must be consistent with the
// resource's record, and, fenced, no update may be lost and porcupine must find the history
// linearizable (incModel). Unfenced both are measured only: they are the cost of leases
// without fencing. Where the scenario does not claim increasing tokens (tokensUnclaimed) the
// fence cannot be claimed either: noted, not failed.
func (a *analysis) checkRegister(linTimeout time.Duration) {
	f := a.f
	hist, herr := history(a.d)
	for _, e := range herr {
		a.fail("history: %s", e)
	}
	f.Linearizable = porcupine.CheckOperationsTimeout(incModel, hist, linTimeout)
	if !a.d.conf.Fenced {
		return
	}
	if n := len(a.d.fenceMismatches); n > 0 {
		a.failIfClaimed(!a.sc.tokensUnclaimed, fmt.Sprintf("fenced: the register's store (%s) decided %d requests otherwise than a fence of the largest token accepted: %s", a.sc.store, n, joinN(a.d.fenceMismatches, 3)))
	}
	if f.LostUpdates != 0 {
		a.failIfClaimed(!a.sc.tokensUnclaimed, fmt.Sprintf("fenced: %d lost updates (%d writes applied, register ends at %d)", f.LostUpdates, f.Writes, a.d.final))
	}
	if f.Linearizable != porcupine.Ok {
		a.failIfClaimed(!a.sc.tokensUnclaimed, fmt.Sprintf("fenced: history of %d lock-guarded operations is %s, not linearizable", len(hist), f.Linearizable))
	}
}

// localHandoff reports whether a was a local handoff from p, the acquisition with the token
// just below: the lock passed, inside p's Unlock, to another goroutine of p's process, which got
// a token a little above p's (p's + 1, or more when a lease made in between was never held)
// without asking the server (dlock's Lease.handOver); or, where the workers take turns
// (turns.go), p's Unlock parked it and a Lock of that process (p's goroutine's own included)
// took it back, inside that Lock call. A token the process made in between and nobody held
// leaves a gap: a lock parked at the Unlock (p's + 1) and handed, at the turn's end, to a waiter
// of the process (p's + 2); a lease handed to a waiter that had run out before it took it. So a
// local handoff is any token of the same process within the 15 after p's. A token from the
// server is not that in practice: acquire.lua keeps new tokens at least 16 past the stored one,
// and handover.lua (run inside an Unlock too, so its grant lies there as well) gives the
// server's TIME in µs unless the previous token is ahead of it, which 15 local handoffs in a
// row, each a whole cycle long, never make it.
func localHandoff(p, a acq) bool {
	return a.tok > p.tok && a.tok-p.tok < 16 && a.w.sameProcess(p.w)
}

// placeGrants sorts acqs by token and bounds each one's grant instant (lo, hi): a local
// handoff inside the previous holder's Unlock call and its own Lock call; a token from the
// server at its TIME when that maps inside the Lock call. It marks local handoffs and returns
// how many server grants were placed exactly.
func placeGrants(acqs []acq, events []event, clocks clockMap) (exact int) {
	sort.Slice(acqs, func(i, j int) bool { return acqs[i].tok < acqs[j].tok })
	unlocks := map[uint64]event{}
	for _, e := range events {
		if e.K == "unl" {
			unlocks[e.Tok] = e
		}
	}
	for i := range acqs {
		a := &acqs[i]
		if i > 0 && localHandoff(acqs[i-1], *a) {
			a.local = true
			// A local token is its first holder's server token plus a few: mapped to a
			// wall-clock instant it would land at that holder's grant, too early.
			if u, ok := unlocks[acqs[i-1].tok]; ok && u.who() == acqs[i-1].w {
				if lo, hi := max(a.s, u.S), min(a.r, u.R); lo <= hi {
					a.lo, a.hi = lo, hi
				}
			}
			continue
		}
		if t, ok := clocks.toMono(int64(a.tok) * 1000); ok && t >= a.s-int64(time.Millisecond) && t <= a.r+int64(time.Millisecond) {
			a.lo, a.hi = t, t
			exact++
		}
	}
	return exact
}

// checkTokenOrder reports acquisitions whose token is not larger than that of an acquisition
// that completed before they started, but those that excused accepts. acqs is sorted by token.
func checkTokenOrder(acqs []acq, fail func(string, ...any), excused func(acq) bool) int {
	bugs := 0
	for i := 1; i < len(acqs); i++ {
		if acqs[i].tok == acqs[i-1].tok {
			bugs++
			if bugs <= 3 {
				fail("token %d handed out twice (%s and %s)", acqs[i].tok, acqs[i-1].w, acqs[i].w)
			}
		}
	}
	// For i < j (tok_i < tok_j), acquisition j must not have returned before i was sent.
	minR, at := int64(math.MaxInt64), -1
	for i := len(acqs) - 1; i >= 0; i-- {
		if minR < acqs[i].s && !excused(acqs[i]) {
			bugs++
			if bugs <= 3 {
				j := acqs[at]
				fail("token order: %s got token %d after %s had already got the larger token %d",
					acqs[i].w, acqs[i].tok, j.w, j.tok)
			}
		}
		if acqs[i].r < minR {
			minR, at = acqs[i].r, i
		}
	}
	return bugs
}

// span is one critical section on the resource's timeline.
type span struct {
	k    cycleKey
	tok  uint64
	s, e int64
}

// countOverlaps counts the sections that a newer lease's section began inside, and the most
// newer sections any one of them straddled.
func countOverlaps(spans map[cycleKey]span) (n, most int, ex []string) {
	all := make([]span, 0, len(spans))
	for _, sp := range spans {
		all = append(all, sp)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].s < all[j].s })
	straddled := map[cycleKey]int{}
	first := map[cycleKey]span{}
	var active []span
	for _, sp := range all {
		kept := active[:0]
		for _, a := range active {
			if a.e >= sp.s {
				kept = append(kept, a)
			}
		}
		active = kept
		for _, a := range active {
			if a.k.w == sp.k.w {
				continue // one goroutine's cycles follow one another
			}
			older, newer := a, sp
			if sp.tok < a.tok {
				older, newer = sp, a
			}
			if straddled[older.k] == 0 {
				first[older.k] = newer
			}
			straddled[older.k]++
		}
		active = append(active, sp)
	}
	for k, c := range straddled {
		n++
		most = max(most, c)
		if len(ex) < 3 {
			nw := first[k]
			ex = append(ex, fmt.Sprintf("%s cycle %d (token %d) still open when %s cycle %d (token %d) began; %d newer sections in all",
				k.w, k.seq, spans[k].tok, nw.k.w, nw.k.seq, nw.tok, c))
		}
	}
	return n, most, ex
}

// The porcupine model: the lock-guarded read-modify-write as one object. A cycle whose write
// was applied is inc(v): legal when the register holds v, and it then holds v+1. A cycle whose
// write was refused or never sent is read(v): legal when the register holds v. Linearizable
// means every cycle can be placed at one instant inside its own interval (the worker's read
// call to its write's return, on CLOCK_MONOTONIC) with each seeing the one before it: exactly
// what mutual exclusion promises the user. Two holders interleaving a read and a write, or a
// late write from a paused holder, make the history illegal.
type incInput struct {
	inc bool
}

var incModel = porcupine.Model{
	Init: func() any { return int64(0) },
	Step: func(state, input, output any) (bool, any) {
		v := state.(int64)
		if output.(int64) != v {
			return false, v
		}
		if input.(incInput).inc {
			return true, v + 1
		}
		return true, v
	},
	DescribeOperation: func(input, output any) string {
		if input.(incInput).inc {
			return fmt.Sprintf("inc from %d", output)
		}
		return fmt.Sprintf("read %d", output)
	},
}

// history joins each worker's read and write events (its own times) with the resource's
// record (whether the write was applied).
func history(d *runData) ([]porcupine.Operation, []string) {
	type cyc struct {
		rd, wr *event
	}
	cycles := map[cycleKey]*cyc{}
	for i := range d.events {
		e := &d.events[i]
		if e.K != "rd" && e.K != "wr" {
			continue
		}
		k := cycleKey{e.who(), e.Seq}
		cy := cycles[k]
		if cy == nil {
			cy = &cyc{}
			cycles[k] = cy
		}
		if e.K == "rd" {
			cy.rd = e
		} else {
			cy.wr = e
		}
	}
	applied := map[cycleKey]opRecord{}
	for _, op := range d.ops {
		if op.Op == 'W' && op.Accepted {
			applied[cycleKey{op.who(), op.Seq}] = op
		}
	}
	var errs []string
	var ops []porcupine.Operation
	clients := map[who]int{} // porcupine's client ids: one per goroutine
	for k, cy := range cycles {
		if cy.rd == nil || cy.rd.Res != "ok" {
			continue // a refused read has no effect and returned nothing
		}
		id, ok := clients[k.w]
		if !ok {
			id = len(clients)
			clients[k.w] = id
		}
		op := porcupine.Operation{ClientId: id, Call: cy.rd.S, Output: cy.rd.Val}
		w, ok := applied[k]
		switch {
		case ok && cy.wr != nil:
			op.Input, op.Return = incInput{inc: true}, cy.wr.R
			if w.Value != cy.rd.Val+1 {
				errs = append(errs, fmt.Sprintf("%s cycle %d read %d but wrote %d", k.w, k.seq, cy.rd.Val, w.Value))
			}
		case ok:
			// Applied, but the worker never saw the answer: it took effect some time after
			// the call.
			op.Input, op.Return = incInput{inc: true}, math.MaxInt64
		default:
			op.Input, op.Return = incInput{}, cy.rd.R
		}
		ops = append(ops, op)
	}
	for k := range applied {
		if cy := cycles[k]; cy == nil || cy.rd == nil {
			errs = append(errs, fmt.Sprintf("%s cycle %d: a write was applied but the worker logged no read", k.w, k.seq))
		}
	}
	sort.Slice(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	return ops, errs
}

// pct is the p-th percentile of ds (nearest rank).
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[min(max(i-1, 0), len(s)-1)]
}

// ts formats a CLOCK_MONOTONIC instant relative to the start of traffic.
func ts(t, start int64) string {
	return fmt.Sprintf("t+%.3fs", float64(t-start)/1e9)
}

// joinN joins the first n of xs with "; " and says how many more there were.
func joinN(xs []string, n int) string {
	out := ""
	for i, x := range xs {
		if i == n {
			out += fmt.Sprintf("; … (%d more)", len(xs)-n)
			break
		}
		if i > 0 {
			out += "; "
		}
		out += x
	}
	return out
}

// scriptError matches a Lua runtime error of a dlock script as Redis reports it
// ("user_script:<line>: <what went wrong>"), not a command the server refused inside a script
// (such as OOM, which names "@user_script:<line>." at the end).
var scriptError = regexp.MustCompile(`(^|[^@])user_script:\d+: `)

// noteScriptErrors notes the Lock and Unlock calls that failed because a dlock script broke on
// the server: a library bug, whatever the fault. Noted, not failed: the guarantees the run
// claims are judged on their own, and the report names the script and line.
func (a *analysis) noteScriptErrors() {
	var ex []string
	n := map[string]int{}
	for _, e := range a.d.events {
		if (e.K == "acq" || e.K == "unl") && scriptError.MatchString(e.Res) {
			n[e.K]++
			ex = append(ex, fmt.Sprintf("%s at %s: %s", e.who(), ts(e.R, a.d.start), strings.TrimPrefix(e.Res, "err: ")))
		}
	}
	if len(ex) > 0 {
		a.note("a dlock script broke on the server (a library bug): %d Lock calls and %d Unlocks failed with a Lua error, e.g. %s", n["acq"], n["unl"], joinN(ex, 2))
	}
}
