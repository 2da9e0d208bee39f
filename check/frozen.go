package main

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// The frozen-waiters scenarios (sem-frozen-waiters, rw-frozen-waiters): the waiter faults of a
// read-write lock and a semaphore. Every caller that waits for one of them has an entry of its
// own in the server's queue (B:q and B:w beside the hash B of the holders), and a release
// grants the freed units to the first entries that fit, for their acceptance window, announcing
// "G <entry id> <token> <window ms> ..." on the primitive's channel. A process frozen while it
// waits cannot act on such a grant: the grant lapses once its window runs out, and the units go
// on to others. What the scenario asks of dlock is what happens when the process runs again,
// under load: its waiters find the announcements in their buffers and make new attempts under
// the same entries, which queue them again; a waiter that made a lease of the lapsed grant
// would believe it holds beside the units' next holders (more permits than the size, a reader
// beside a writer), and the believed-held check (shared.go) fails the run.
//
// How the harness picks a waiter, without touching the library: the trap springs on a
// holder's read, reads the primitive's keys on the server (directly, not through a proxy), and
// freezes the process first in the queue among those that hold nothing there (a holder's field
// and a queue entry name their process's pid in their description). The fault's start is
// recorded once the process is frozen, so the analysis can tell from the workers' logs whether
// its goroutines were all waiting then. The harness also hears every announcement on the
// channel, and so knows which grants went to the frozen process and when.

// frozenVariants are how long a frozen-waiter fault freezes its process, in turn: past the
// acceptance window but within the TTL, or past the TTL (as the waiter-faults scenario's).
var frozenVariants = []string{"stop-past-window", "stop-past-ttl"}

var freezeWaiter = fault{plan: planFrozenWaiter, inject: (*runner).freezeWaiter}

func planFrozenWaiter(p *plannedFault, rng *rand.Rand, n int, ttl time.Duration) {
	p.variant = frozenVariants[n%len(frozenVariants)]
	p.dur = waiterPause(p.variant, rng, ttl)
}

// lockKey is the key under which the workers of s hold the lock called name: a read-write
// lock's or a semaphore's hash (its queue is the key + ":q" and ":w", its channel the key +
// ":rel"), or a Mutex's key.
func (s *scenario) lockKey(name string) string {
	switch s.shared {
	case rwLoad:
		return dlockKey(name) + ":rw"
	case semLoad:
		return dlockKey(name) + ":sem"
	}
	return dlockKey(name)
}

// sharedState is what the server holds for a read-write lock or semaphore, as the harness
// reads it: its live queue entries in order, and the pids of its live holders.
type sharedState struct {
	entries []queueEntry
	holders map[int]int // pid → units held
}

// readShared reads the primitive whose hash is key. A holder's field is "<lease end ms>
// <units> <holds> <token> <description>", a queue entry's "<expiry ms> <window ms> <owner>
// <units> <description>" (internal/protocol/scripts/shared.lua in the root module); fields past
// their lease end or expiry are left out (the server drops them at its next call).
func readShared(ctx context.Context, rdb *redis.Client, key string) (sharedState, error) {
	pipe := rdb.Pipeline()
	now := pipe.Time(ctx)
	b := pipe.HGetAll(ctx, key)
	ids := pipe.ZRange(ctx, key+":q", 0, -1)
	w := pipe.HGetAll(ctx, key+":w")
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return sharedState{}, err
	}
	ms := now.Val().UnixMilli()
	st := sharedState{holders: map[int]int{}}
	for owner, v := range b.Val() {
		f := strings.SplitN(v, " ", 5)
		if strings.HasPrefix(owner, "=") || len(f) < 5 {
			continue
		}
		end, _ := strconv.ParseInt(f[0], 10, 64)
		units, _ := strconv.Atoi(f[1])
		if m := pidField.FindStringSubmatch(f[4]); m != nil && end > ms {
			pid, _ := strconv.Atoi(m[1])
			st.holders[pid] += units
		}
	}
	descs := w.Val()
	for _, id := range ids.Val() {
		f := strings.SplitN(descs[id], " ", 5)
		if len(f) < 5 {
			continue
		}
		if exp, _ := strconv.ParseInt(f[0], 10, 64); exp <= ms {
			continue
		}
		e := queueEntry{id: id}
		if m := pidField.FindStringSubmatch(f[4]); m != nil {
			e.pid, _ = strconv.Atoi(m[1])
		}
		st.entries = append(st.entries, e)
	}
	return st, nil
}

// freezeWaiter freezes the process first in the primitive's server-side queue among those
// that hold none of its units, for p.dur, then lets it go on. A holder's read springs it; a
// read that finds no such process re-arms the trap for the next read, for at most
// waiterSearch.
func (r *runner) freezeWaiter(p plannedFault, in *injection) *trap {
	var t *trap
	var first int64 // mono ns of the first read that found no waiter
	key := r.sc.lockKey(r.lock)
	t = &trap{op: 'R', fire: func(w who, tok uint64) (time.Duration, bool) {
		_, holderPID := r.process(w)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := readShared(ctx, r.keys, key)
		cancel()
		if err != nil {
			r.infraf("read the %s's keys: %v", r.sc.shared, err)
		}
		var hit *waiterHit
		for i, e := range st.entries {
			if e.pid == 0 || e.pid == holderPID || st.holders[e.pid] > 0 {
				continue
			}
			if s := r.slotOf(e.pid); s != nil {
				inc, _, _ := s.current()
				hit = &waiterHit{Slot: s.i, Inc: inc, PID: e.pid, Entry: e.id, Pos: i, Queue: len(st.entries)}
				break
			}
		}
		if hit == nil {
			r.waiterMisses.Add(1)
			if first == 0 {
				first = mono()
			}
			if mono()-first < int64(waiterSearch) {
				r.res.arm(t) // no process waits holding nothing: try at the next read
				return 0, false
			}
			in.spring()
			in.record(w, tok, p.variant)
			r.infraf("no worker process queued on the server holding nothing at any holder read in %v", waiterSearch)
			in.end()
			in.settle()
			return 0, false
		}
		in.spring()
		r.stop(hit.PID)
		in.recordWaiter(w, tok, p.variant, *hit) // its start: the process is frozen
		go func() {
			defer in.settle()
			time.Sleep(p.dur)
			_ = syscall.Kill(hit.PID, syscall.SIGCONT)
			in.end()
		}()
		return 0, false
	}}
	return t
}

// sharedGrant is one grant of a read-write lock's or semaphore's units to a queue entry, as
// announced.
type sharedGrant struct {
	at     int64 // mono ns when the harness heard it
	entry  string
	token  uint64
	window time.Duration
}

// sharedGrants parses the grants among the announcements ("G <entry id> <token> <window ms>
// ...", one message per walk of the queue).
func sharedGrants(ans []announcement) []sharedGrant {
	var gs []sharedGrant
	for _, a := range ans {
		rest, ok := strings.CutPrefix(a.Payload, "G ")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		for i := 0; i+2 < len(f); i += 3 {
			tok, err1 := strconv.ParseUint(f[i+1], 10, 64)
			win, err2 := strconv.ParseInt(f[i+2], 10, 64)
			if err1 == nil && err2 == nil {
				gs = append(gs, sharedGrant{at: a.T, entry: f[i], token: tok, window: time.Duration(win) * time.Millisecond})
			}
		}
	}
	return gs
}

// checkFrozenWaiters measures, where the fault freezes a waiting process (frozenWaiters), what
// each fault did: how many of the hit process's goroutines were waiting when it froze (and
// whether any held units: then the fault hit a holder as well), the grants announced to its
// entries while it was frozen, and how many of those lapsed before it ran again (announced
// more than their window before the SIGCONT); how often, once let go, one of its goroutines
// returned from its acquisition with the token of such a lapsed grant (and its context's first
// check said "held": the hazard the believed-held check fails), and the stall: the longest
// time, from the freeze until the window + 250 ms after the SIGCONT, between two acquisitions
// by the other processes (its recovery figure). A stall over the acceptance window + TTL fails
// the run (the queue stalled), as does a fault no acquisition by another process followed and a
// run in which no hit process was granted units that lapsed while it was frozen (it proves
// nothing). A read-write lock's readers share the last writer's token, so a resumed reader
// granted anew may match a lapsed grant's token: the count is by token, a measure only.
func (a *analysis) checkFrozenWaiters(holds map[cycleKey]*hold) {
	if !a.sc.frozenWaiters {
		return
	}
	f := a.f
	ttl := a.d.conf.TTL
	win := acceptWindow(ttl)
	bound := win + ttl
	gs := sharedGrants(a.d.announcements)
	firstCheck := map[cycleKey]event{}
	for _, e := range a.d.events {
		k := cycleKey{e.who(), e.Seq}
		if c, ok := firstCheck[k]; e.K == "chk" && (!ok || e.S < c.S) {
			firstCheck[k] = e
		}
	}
	var waitingHit, heldHit, grantsHit, lapsedHit []int
	held := 0
	for _, flt := range a.d.faults {
		h := flt.Waiter
		if h == nil {
			a.fail("harness: %s fault at %s recorded no waiter", flt.Kind, ts(flt.Start, a.d.start))
			continue
		}
		hit := h.process()
		waiting, holding := 0, 0
		for _, e := range a.d.events {
			if e.K == "acq" && e.who().sameProcess(hit) && e.S <= flt.Start && e.R >= flt.Start {
				waiting++
			}
		}
		for _, x := range holds {
			if x.k.w.sameProcess(hit) && x.r < flt.Start && (x.end == 0 || x.end > flt.Start) {
				holding++
			}
		}
		if holding > 0 {
			held++
		}
		granted, lapsed := 0, 0
		var lapsedToks []uint64
		for _, g := range gs {
			if g.at < flt.Start || g.at > flt.End || !strings.HasPrefix(g.entry, h.client()+".") {
				continue
			}
			granted++
			if g.at+int64(g.window) < flt.End {
				lapsed++
				lapsedToks = append(lapsedToks, g.token)
			}
		}
		waitingHit, heldHit = append(waitingHit, waiting), append(heldHit, holding)
		grantsHit, lapsedHit = append(grantsHit, granted), append(lapsedHit, lapsed)
		if lapsed > 0 {
			f.WaiterGranted++
		}
		for _, x := range holds {
			if x.k.w.sameProcess(hit) && x.r > flt.End && x.s < flt.End && slices.Contains(lapsedToks, x.tok) {
				f.StaleGrants++
				if c, ok := firstCheck[x.k]; ok && c.Live {
					f.StaleGrantsLive++
				}
			}
		}
		// The stall: the longest gap between the other processes' acquisitions over the
		// fault and the window after it.
		until := flt.End + int64(win+killRecoverySlack)
		prev, stall := flt.Start, time.Duration(0)
		var next *acq
		for i := range a.acqs { // by return time (collectHolds)
			q := &a.acqs[i]
			if q.r <= flt.Start || q.w.sameProcess(hit) {
				continue
			}
			stall = max(stall, time.Duration(q.r-prev))
			prev, next = q.r, q
			if q.r > until {
				break
			}
		}
		if next == nil {
			a.fail("%s fault (%s) at %s on waiting %s: no acquisition by another process followed it", flt.Kind, flt.Variant, ts(flt.Start, a.d.start), h)
			continue
		}
		f.Recovery = append(f.Recovery, stall)
		if stall > bound {
			a.fail("%s fault (%s) at %s on waiting %s (entry %d of %d; %d grants to it while frozen, %d lapsed): the other processes went %v without an acquisition, over the acceptance window + TTL = %v: the queue stalled",
				flt.Kind, flt.Variant, ts(flt.Start, a.d.start), h, h.Pos+1, h.Queue, granted, lapsed, stall.Round(time.Millisecond), bound)
		}
	}
	if len(a.d.faults) > 0 && f.WaiterGranted == 0 {
		a.fail("no frozen waiter was granted units that lapsed before it ran again: the run proves nothing")
	}
	over := 0
	for _, d := range f.Recovery {
		if d > win+killRecoverySlack {
			over++
		}
	}
	a.note("frozen waiters: %d faults; goroutines of the hit process waiting at the freeze %v, holding %v (%d faults hit a process that held units too); grants to it while frozen %v, lapsed before it ran again %v; stall (longest time the others went without an acquisition, freeze to window + %d ms after the SIGCONT) median %s / max %s ms, over the window %v + %d ms after %d faults; the run fails over window + TTL = %v; %d holder reads found no process waiting that held nothing",
		len(a.d.faults), waitingHit, heldHit, held, grantsHit, lapsedHit, killRecoverySlack.Milliseconds(), ms(median(f.Recovery)), ms(maxOf(f.Recovery)), win, killRecoverySlack.Milliseconds(), over, bound, a.d.waiterMisses)
	a.note("%d times a resumed waiter's acquisition returned with the token of a grant that had lapsed while it was frozen (by token); its context's first check said \"held\" %d times", f.StaleGrants, f.StaleGrantsLive)
}
