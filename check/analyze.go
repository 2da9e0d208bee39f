package main

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
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
// instant the server granted the lock: the token is the server's TIME in microseconds at
// that instant (unless it had to be bumped past the previous token), so when it maps inside
// [s, r] lo = hi = that instant; otherwise lo = s, hi = r.
type acq struct {
	slot, inc int
	tok       uint64
	s, r      int64
	lo, hi    int64
}

type cycleKey struct {
	slot, inc int
	seq       int64
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
		k := cycleKey{op.Slot, op.Inc, op.Seq}
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
	granted := 0
	for _, e := range d.events {
		if e.K != "acq" {
			continue
		}
		if e.Res != "ok" {
			f.AcquireErrors++
			continue
		}
		a := acq{slot: e.Slot, inc: e.Inc, tok: e.Tok, s: e.S, r: e.R, lo: e.S, hi: e.R}
		if t, ok := clocks.toMono(int64(e.Tok) * 1000); ok && t >= e.S-int64(time.Millisecond) && t <= e.R+int64(time.Millisecond) {
			a.lo, a.hi = t, t
			granted++
		}
		acqs = append(acqs, a)
		lat = append(lat, time.Duration(e.R-e.S))
	}
	f.Cycles = len(acqs)
	if !clocks.ok {
		f.Notes = append(f.Notes, "the wall clock stepped during the run: grant instants are bounded by the Lock calls only")
	} else if granted < len(acqs) {
		f.Notes = append(f.Notes, fmt.Sprintf("%d of %d grant instants bounded by the Lock call only (token bumped past the previous one)", len(acqs)-granted, len(acqs)))
	}
	f.AcquireP50, f.AcquireP99 = pct(lat, 50), pct(lat, 99)
	sort.Slice(acqs, func(i, j int) bool { return acqs[i].tok < acqs[j].tok })
	tokenFail := fail
	if c.Scenario == "redlock-restart" {
		tokenFail = func(format string, args ...any) {
			f.Notes = append(f.Notes, "not a claimed guarantee here: "+fmt.Sprintf(format, args...))
		}
	}
	f.TokenOrderBugs = checkTokenOrder(acqs, tokenFail)
	next := func(tok uint64) (acq, bool) {
		i := sort.Search(len(acqs), func(i int) bool { return acqs[i].tok > tok })
		if i == len(acqs) {
			return acq{}, false
		}
		return acqs[i], true
	}

	// Lease context checks and lost-lock signals against the next acquisition, on one clock.
	// A server that forgets the lock (restart without persistence; a quorum member restarted
	// empty at once) can hand it to a second holder before the first learns: a documented
	// limitation, measured, not a failure.
	// With replica acknowledgement too: Sentinel may promote the replica that did not
	// acknowledge (doc.go).
	serverLoses := c.Scenario == "restart" || c.Scenario == "redlock-restart" || strings.HasPrefix(c.Scenario, "sentinel-")
	// In quorum mode tokens are promised to increase only if no server loses its data while
	// it holds a lock (doc.go, "Quorum mode"): the immediate restart breaks that premise.
	fenceClaimed := c.Scenario != "redlock-restart"
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
					liveEx = append(liveEx, fmt.Sprintf("worker %d.%d token %d context live at %s, %s after worker %d.%d was granted token %d",
						e.Slot, e.Inc, e.Tok, ts(e.S, d.start), time.Duration(e.S-n.hi), n.slot, n.inc, n.tok))
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
		if (flt.Kind == "pause" || flt.Kind == "partition") && !signalled[flt.Token] {
			fail("%s at %s: worker %d.%d (token %d) never got a lost-lock signal", flt.Kind, ts(flt.Start, d.start), flt.Slot, flt.Inc, flt.Token)
		}
	}
	if f.LiveAfterNext > 0 {
		msg := fmt.Sprintf("%d lease-context checks said the lock was held after another holder had acquired it: %s",
			f.LiveAfterNext, joinN(liveEx, 5))
		if serverLoses {
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
			fail("%s fault at %s (worker %d.%d): no acquisition followed it", flt.Kind, ts(flt.Start, d.start), flt.Slot, flt.Inc)
			continue
		}
		rec := time.Duration(byR[i].r - flt.Start)
		f.Recovery = append(f.Recovery, rec)
		if flt.Kind == "kill" && rec > c.TTL+250*time.Millisecond {
			fail("kill: worker %d.%d (token %d) killed at %s; next acquisition (worker %d.%d, token %d) %v later, over TTL + 250 ms = %v",
				flt.Slot, flt.Inc, flt.Token, ts(flt.Start, d.start), byR[i].slot, byR[i].inc, byR[i].tok, rec.Round(time.Millisecond), c.TTL+250*time.Millisecond)
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
			if fenceClaimed {
				fail("%s", m)
			} else {
				f.Notes = append(f.Notes, "not a claimed guarantee here: "+m)
			}
		}
	}
	return f
}

// checkTokenOrder reports acquisitions whose token is not larger than that of an acquisition
// that completed before they started. acqs is sorted by token.
func checkTokenOrder(acqs []acq, fail func(string, ...any)) int {
	bugs := 0
	for i := 1; i < len(acqs); i++ {
		if acqs[i].tok == acqs[i-1].tok {
			bugs++
			if bugs <= 3 {
				fail("token %d handed out twice (workers %d.%d and %d.%d)", acqs[i].tok, acqs[i-1].slot, acqs[i-1].inc, acqs[i].slot, acqs[i].inc)
			}
		}
	}
	// For i < j (tok_i < tok_j), acquisition j must not have returned before i was sent.
	minR, at := int64(math.MaxInt64), -1
	for i := len(acqs) - 1; i >= 0; i-- {
		if minR < acqs[i].s {
			bugs++
			if bugs <= 3 {
				j := acqs[at]
				fail("token order: worker %d.%d got token %d after worker %d.%d had already got the larger token %d",
					acqs[i].slot, acqs[i].inc, acqs[i].tok, j.slot, j.inc, j.tok)
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
			if a.k.slot == sp.k.slot && a.k.inc == sp.k.inc {
				continue
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
			ex = append(ex, fmt.Sprintf("worker %d.%d cycle %d (token %d) still open when worker %d.%d cycle %d (token %d) began; %d newer sections in all",
				k.slot, k.inc, k.seq, spans[k].tok, nw.k.slot, nw.k.inc, nw.k.seq, nw.tok, c))
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
		k := cycleKey{e.Slot, e.Inc, e.Seq}
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
			applied[cycleKey{op.Slot, op.Inc, op.Seq}] = op
		}
	}
	var errs []string
	var ops []porcupine.Operation
	for k, cy := range cycles {
		if cy.rd == nil || cy.rd.Res != "ok" {
			continue // a refused read has no effect and returned nothing
		}
		op := porcupine.Operation{ClientId: k.slot, Call: cy.rd.S, Output: cy.rd.Val}
		w, ok := applied[k]
		switch {
		case ok && cy.wr != nil:
			op.Input, op.Return = incInput{inc: true}, cy.wr.R
			if w.Value != cy.rd.Val+1 {
				errs = append(errs, fmt.Sprintf("worker %d.%d cycle %d read %d but wrote %d", k.slot, k.inc, k.seq, cy.rd.Val, w.Value))
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
			errs = append(errs, fmt.Sprintf("worker %d.%d cycle %d: a write was applied but the worker logged no read", k.slot, k.inc, k.seq))
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
