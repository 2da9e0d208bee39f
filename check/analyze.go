package main

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// findings are the figures of one run, and the guarantees it broke.
type findings struct {
	Scenario string
	Mode     string
	Seed     uint64
	Duration time.Duration

	Ops            int // register operations that reached the resource (reads + writes)
	Writes         int // writes applied
	Cycles         int // acquisitions that completed Lock
	LocalHandoffs  int // ...that took the lock from another goroutine of the same process without the server
	Faults         int
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

// analyze computes the findings of one run and checks the guarantees for its scenario.
func analyze(d *runData, linTimeout time.Duration) *findings {
	c := d.conf
	f := &findings{Scenario: c.Scenario, Mode: c.mode(), Seed: c.Seed, Duration: time.Duration(d.end - d.start)}
	f.Faults = len(d.faults)
	fail := func(format string, args ...any) {
		f.Failures = append(f.Failures, fmt.Sprintf(format, args...))
	}
	for _, msg := range d.infra {
		fail("harness: %s", msg)
	}
	sc, ok := scenarioNamed(c.Scenario)
	if !ok {
		fail("harness: unknown scenario %q", c.Scenario)
		sc = &scenario{name: c.Scenario}
	}

	// The resource's own record.
	f.Ops = len(d.ops)
	for _, op := range d.ops {
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
	f.LostUpdates = int64(f.Writes) - d.final

	// Overlapping critical sections on the resource's timeline: a cycle spans its read to its
	// write (or just its read) as the resource applied or refused them. A section overlaps when
	// a section of a newer lease (larger token) began before it ended: it was still open when
	// the lock had already moved on. Each such section counts once, however many newer ones it
	// straddled.
	spans := map[cycleKey]span{}
	for _, op := range d.ops {
		k := cycleKey{op.who(), op.Seq}
		sp, ok := spans[k]
		if !ok {
			sp = span{k: k, tok: op.Token, s: op.T, e: op.T}
		}
		sp.s, sp.e = min(sp.s, op.T), max(sp.e, op.T)
		spans[k] = sp
	}
	var overlapEx []string
	f.Overlaps, f.OverlapMax, overlapEx = countOverlaps(spans)
	if len(overlapEx) > 0 {
		f.Notes = append(f.Notes, "overlapping sections, e.g.: "+joinN(overlapEx, 3))
	}

	// Acquisitions, by token.
	var acqs []acq
	var lat []time.Duration
	clocks := newClockMap(d.clocks)
	for _, e := range d.events {
		if e.K != "acq" {
			continue
		}
		if e.Res != "ok" {
			f.AcquireErrors++
			continue
		}
		acqs = append(acqs, acq{w: e.who(), tok: e.Tok, s: e.S, r: e.R, lo: e.S, hi: e.R})
		lat = append(lat, time.Duration(e.R-e.S))
	}
	f.Cycles = len(acqs)
	granted := placeGrants(acqs, d.events, clocks) // and sorts acqs by token
	for _, a := range acqs {
		if a.local {
			f.LocalHandoffs++
		}
	}
	if !clocks.ok {
		f.Notes = append(f.Notes, "the wall clock stepped during the run: grant instants are bounded by the Lock calls only")
	} else if n := len(acqs) - f.LocalHandoffs - granted; n > 0 {
		f.Notes = append(f.Notes, fmt.Sprintf("%d of %d grant instants from the server bounded by the Lock call only (token bumped past the previous one)", n, len(acqs)-f.LocalHandoffs))
	}
	f.AcquireP50, f.AcquireP99 = pct(lat, 50), pct(lat, 99)
	tokenFail := fail
	if sc.tokensUnclaimed {
		tokenFail = func(format string, args ...any) {
			f.Notes = append(f.Notes, "not a claimed guarantee here: "+fmt.Sprintf(format, args...))
		}
	}
	// A deployment that forgets the lock (sc.forgetsLocks) lets the holder's client pass a
	// lost hold to its other goroutines (local handoffs, token + 1), possibly after the server
	// granted a larger token to someone else: measured and noted, not a failure. How many of
	// those leases were told (ErrLost) is noted too: one that is unlocked (and passed on)
	// before the loss is found never is.
	told := map[uint64]bool{}
	for _, e := range d.events {
		if e.K == "sig" {
			told[e.Tok] = true
		}
	}
	var lostHandoffs, lostTold int
	f.TokenOrderBugs = checkTokenOrder(acqs, tokenFail, func(a acq) bool {
		if sc.forgetsLocks && a.local {
			lostHandoffs++
			if told[a.tok] {
				lostTold++
			}
			return true
		}
		return false
	})
	if lostHandoffs > 0 {
		f.Notes = append(f.Notes, fmt.Sprintf("%d local handoffs of a hold the server had lost, granted after a larger token (%d of them told ErrLost; see doc.go, Fencing tokens)", lostHandoffs, lostTold))
	}
	next := func(tok uint64) (acq, bool) {
		i := sort.Search(len(acqs), func(i int) bool { return acqs[i].tok > tok })
		if i == len(acqs) {
			return acq{}, false
		}
		return acqs[i], true
	}

	// Lease context checks and lost-lock signals against the next acquisition, on one clock.
	// A deployment that forgets the lock (sc.forgetsLocks) can hand it to a second holder
	// before the first learns: a documented limitation, measured, not a failure.
	var liveEx []string
	lastLive := map[uint64]int64{}
	for _, e := range d.events {
		if e.K == "chk" && e.Live {
			lastLive[e.Tok] = max(lastLive[e.Tok], e.S)
		}
	}
	signalled := map[uint64]bool{}
	for _, e := range d.events {
		switch e.K {
		case "chk":
			if !e.Live {
				continue
			}
			n, ok := next(e.Tok)
			switch {
			case !ok || e.S < n.lo:
			case e.S > n.hi:
				f.LiveAfterNext++
				if len(liveEx) < 5 {
					liveEx = append(liveEx, fmt.Sprintf("%s token %d context live at %s, %s after %s was granted token %d",
						e.who(), e.Tok, ts(e.S, d.start), time.Duration(e.S-n.hi), n.w, n.tok))
				}
			default:
				f.UnsureLive++
			}
		case "sig":
			f.Signals++
			signalled[e.Tok] = true
			n, ok := next(e.Tok)
			switch {
			case !ok || e.S < n.lo:
				f.SignalsBefore++
				if ok {
					f.SignalMargins = append(f.SignalMargins, time.Duration(n.lo-e.S))
				}
			case lastLive[e.Tok] > n.hi:
				f.SignalsAfter++ // also counted, and failed, as a live check after the grant
			default:
				f.SignalsLate++
			}
		}
	}
	// A paused or partitioned holder must be told.
	for _, flt := range d.faults {
		if sc.mustSignal && !signalled[flt.Token] {
			fail("%s at %s: %s (token %d) never got a lost-lock signal", flt.Kind, ts(flt.Start, d.start), flt.who(), flt.Token)
		}
	}
	if f.LiveAfterNext > 0 {
		msg := fmt.Sprintf("%d lease-context checks said the lock was held after another holder had acquired it: %s",
			f.LiveAfterNext, joinN(liveEx, 5))
		if sc.forgetsLocks {
			f.Notes = append(f.Notes, "expected (the server lost the lock): "+msg)
		} else {
			fail("%s", msg)
		}
	}

	// Recovery: fault start → the next successful acquisition by anyone.
	byR := slices.Clone(acqs)
	sort.Slice(byR, func(i, j int) bool { return byR[i].r < byR[j].r })
	for _, flt := range d.faults {
		i := sort.Search(len(byR), func(i int) bool { return byR[i].r > flt.Start })
		if i == len(byR) {
			fail("%s fault at %s (%s): no acquisition followed it", flt.Kind, ts(flt.Start, d.start), flt.who())
			continue
		}
		rec := time.Duration(byR[i].r - flt.Start)
		f.Recovery = append(f.Recovery, rec)
		if sc.boundedRecovery && rec > c.TTL+killRecoverySlack {
			fail("kill: %s (token %d) killed at %s; next acquisition (%s, token %d) %v later, over TTL + 250 ms = %v",
				flt.who(), flt.Token, ts(flt.Start, d.start), byR[i].w, byR[i].tok, rec.Round(time.Millisecond), c.TTL+250*time.Millisecond)
		}
	}

	// Lost updates and linearizability of the lock-guarded read-modify-write.
	hist, herr := history(d)
	for _, e := range herr {
		fail("history: %s", e)
	}
	f.Linearizable = porcupine.CheckOperationsTimeout(incModel, hist, linTimeout)
	if c.Fenced {
		var msgs []string
		if f.LostUpdates != 0 {
			msgs = append(msgs, fmt.Sprintf("fenced: %d lost updates (%d writes applied, register ends at %d)", f.LostUpdates, f.Writes, d.final))
		}
		if f.Linearizable != porcupine.Ok {
			msgs = append(msgs, fmt.Sprintf("fenced: history of %d lock-guarded operations is %s, not linearizable", len(hist), f.Linearizable))
		}
		for _, m := range msgs {
			if !sc.tokensUnclaimed {
				fail("%s", m)
			} else {
				f.Notes = append(f.Notes, "not a claimed guarantee here: "+m)
			}
		}
	}
	return f
}

// localHandoff reports whether a was a local handoff from p, the acquisition with the token
// just below: the lock passed, inside p's Unlock, to another goroutine of p's process, which got
// p's token + 1 without asking the server (dlock's Lease.handOver). A token from the server is
// not that in practice: acquire.lua keeps new tokens at least 16 past the stored one, and
// handover.lua (run inside an Unlock too, so its grant lies there as well) gives the server's
// TIME in µs unless the previous token is ahead of it, which 15 local handoffs in a row, each
// a whole cycle long, never make it.
func localHandoff(p, a acq) bool {
	return a.tok == p.tok+1 && a.w.sameProcess(p.w) && a.w.G != p.w.G
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
