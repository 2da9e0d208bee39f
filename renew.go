package dlock

import (
	"container/heap"
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/backend"
	"github.com/dlock-go/dlock/internal/protocol"
)

// renewer is the one renewal loop of a Client. Held leases wait in a heap ordered by the moment
// they are due: renewal at a third of their TTL (an adaptive lease later: renewAfter), or, for a
// lease without renewal, the deadline. When the
// earliest is due, the loop renews, in one round (one pipeline on one server), every lease due
// by then plus those within a sixth of a TTL of being due, so that leases taken at about the
// same time are renewed together. A lease whose renewal is refused, or whose deadline passes
// without a successful renewal, is lost: its context is cancelled with cause ErrLost.
//
// The round is sent by a second goroutine, so that the loop keeps its deadlines while a round
// is slow to come back, or never does. No goroutine or timer exists per lease. The same rounds
// carry the background releases (an acquisition whose caller gave up mid-call, an Unlock whose
// release failed) and, every evictionCheckEvery while leases are held, the eviction check.
type renewer struct {
	b         backend.Backend
	check     func(context.Context) (risk, err error) // the eviction check (evict.go)
	entryGone func(*registration)                     // a queue entry the server no longer has (wait.go)
	lockEnds  func(*registration, int64)              // a queue entry's lock may be free from then (mono ns; wait.go)
	waiting   func(*registration) int                 // goroutines waiting behind a queue entry (wait.go)
	ev        *observer                               // reports rounds (observe.go)

	mu       sync.Mutex
	h        leaseHeap       // leases not yet due
	pending  []*leaseState   // due, waiting for the round in flight to come back
	flying   []*leaseState   // in the round in flight
	entries  entryHeap       // queue registrations, by when their entry is next refreshed
	refresh  []*registration // those in the round in flight
	releases []release       // background releases not yet sent
	sending  []release       // those in the round in flight
	sentAt   int64           // mono ns when the round in flight was handed to the sender
	inFlight bool            // a round is in flight
	stopped  bool
	wakeAt   int64       // mono ns the loop's timer is set for, -1 when it sleeps until poked
	timer    *time.Timer // the loop's; reset only under mu (nextWake, wakeBy)
	checkDue int64       // mono ns when the next eviction check is due

	kick   chan struct{} // capacity 1: the earliest due time changed, or there is a release
	quit   chan struct{}
	rounds chan sendReq    // to the sender
	done   chan sendRes    // from the sender
	ctx    context.Context // cancelled by stop, to abandon a round in flight
	halt   context.CancelFunc
}

// sendReq is what the loop hands the sender: a round, and whether to run the eviction check.
type sendReq struct {
	backend.Round
	check bool
}

// sendRes is the sender's answer.
type sendRes struct {
	backend.RoundResult
	risk error         // the check found a server that may evict lock keys
	took time.Duration // how long the round took to come back (0: nothing sent)
}

// orphanRecheck is when an orphan release is sent a second time. The transports spread calls
// over several connections (go-redis has a pool), so the first release can reach the server
// before the acquisition it undoes; the second catches an acquisition that arrived late. One
// later than this holds the lock until its lease runs out.
const orphanRecheck = time.Second

// release is a release the renewal loop sends in the background. A transport error is retried
// with backoff until it succeeds, until the lease it ends would have run out on the server
// anyway, or until the client closes.
type release struct {
	req   backend.ReleaseReq
	at    int64  // mono ns when to send it
	until int64  // mono ns after which a failure is not retried
	wait  int64  // ns before the next try after a failure (doubles up to releaseRetryMax)
	woken func() // after a retried release succeeded: wakes this client's waiters (may be nil)
}

// releaseRetryMin and releaseRetryMax bound the pause between two tries of a failed release.
const (
	releaseRetryMin = 20 * time.Millisecond
	releaseRetryMax = time.Second
)

func newRenewer(b backend.Backend, check func(context.Context) (error, error)) *renewer {
	ctx, cancel := context.WithCancel(context.Background())
	return &renewer{
		b: b, check: check,
		wakeAt: -1, checkDue: mono() + int64(evictionCheckEvery),
		kick: make(chan struct{}, 1), quit: make(chan struct{}),
		rounds: make(chan sendReq, 1), done: make(chan sendRes, 1),
		ctx: ctx, halt: cancel,
	}
}

// add registers a newly acquired lease; it returns false once the client is closing.
func (r *renewer) add(st *leaseState) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return false
	}
	st.due = dueAfter(st, st.lastSent)
	heap.Push(&r.h, st)
	if st.idx == 0 {
		r.wakeBy(st.due)
	}
	return true
}

// wakeBy makes sure the loop wakes by at (mono ns); r.mu is held. When its timer is set for
// later, or not at all (it sleeps until poked), the timer is set for at here, on the caller's
// goroutine, instead of waking the loop to set it: a lease or queue entry that ends before it is
// due (a lock taken and released at once, a wait that is granted at once: the common cases)
// then costs the loop nothing, not one wake-up each. A loop that is awake sets its timer from
// every due time when it next sleeps (nextWake), so nothing is missed either way.
func (r *renewer) wakeBy(at int64) {
	if r.timer == nil || (r.wakeAt >= 0 && r.wakeAt <= at) {
		if r.timer == nil {
			r.poke() // the loop has not started: its first nextWake sees at
		}
		return
	}
	r.wakeAt = at
	r.timer.Reset(max(time.Duration(at-mono()), 0))
}

// dueAfter returns when st must next be renewed after a successful request sent at sent.
func dueAfter(st *leaseState, sent int64) int64 {
	if st.confirm.Load() && !st.spec.renew {
		return mono() // a fixed lease granted for the acceptance window: extend it to its TTL at once
	}
	if !st.spec.renew {
		return st.deadline.Load()
	}
	return sent + renewAfter(st)
}

// adaptiveMargin is what an adaptive lease keeps, at least, between its renewal and the end of
// the lease, when the lease is long enough to keep more than a third.
const adaptiveMargin = int64(300 * time.Millisecond)

// renewAfter is how long after a successful renewal (or the acquisition) st is next due. A fixed
// lease is renewed every third of its TTL, whatever it protects. An adaptive lease (WithAdaptiveTTL)
// is three times the longest recent hold of its name, so most holds end before a third of it has
// passed, and nearly all before two thirds: it is renewed when the greater of a third of it and
// adaptiveMargin is left, and never sooner than a fixed lease of its length would be. A lease
// of 900 ms or more is then renewed after two thirds of it (600 ms into a 900 ms lease instead
// of 300 ms), one of 450 to 900 ms when 300 ms are left, and a shorter one after a third, like
// a fixed lease: the round always has the least of 300 ms and a fixed lease's two thirds to
// come back. A grant's acceptance window is renewed to the full lease as a fixed lease's is.
func renewAfter(st *leaseState) int64 {
	ttl := st.ttl.Load()
	if st.adaptMS == 0 || st.confirm.Load() {
		return ttl / 3
	}
	return max(ttl/3, min(2*ttl/3, ttl-adaptiveMargin))
}

// slack is how early st may be renewed to join a round.
func slack(st *leaseState) int64 {
	if !st.spec.renew {
		return 0
	}
	return st.ttl.Load() / 6
}

// reschedule moves st after an Extend or re-entry refreshed it outside the loop.
func (r *renewer) reschedule(st *leaseState) {
	st.mu.Lock()
	sent := st.lastSent
	st.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if st.idx < 0 || st.state.Load() != stateHeld {
		return // in a round: its answer reschedules it
	}
	st.due = dueAfter(st, sent)
	heap.Fix(&r.h, st.idx)
	if st.idx == 0 {
		r.wakeBy(st.due)
	}
}

func (r *renewer) remove(st *leaseState) { removeDue(r, &r.h, st) }

// orphan queues the release of an acquisition with lease ttl that nobody will use: sent at
// once and again after orphanRecheck.
func (r *renewer) orphan(req backend.ReleaseReq, ttl time.Duration) {
	now := mono()
	until := now + int64(ttl)
	r.background(release{req: req, at: now, until: until}, release{req: req, at: now + int64(orphanRecheck), until: until})
}

// retryRelease queues a release whose first try failed, to be tried again until until (mono
// ns); woken runs once it succeeds.
func (r *renewer) retryRelease(req backend.ReleaseReq, until int64, woken func()) {
	r.background(release{req: req, at: mono() + int64(releaseRetryMin), until: until, wait: int64(releaseRetryMin), woken: woken})
}

// background queues releases. Once the client is closing no round is left to send them:
// they are sent at once.
func (r *renewer) background(rs ...release) {
	r.mu.Lock()
	stopped := r.stopped
	if !stopped {
		r.releases = append(r.releases, rs...)
	}
	r.mu.Unlock()
	if stopped {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r.b.Renew(ctx, backend.Round{Releases: []backend.ReleaseReq{rs[0].req}})
		return
	}
	r.poke()
}

func (r *renewer) poke() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// stop ends the loop; run returns once a round in flight has come back (Close's cancellation
// abandons it) or the sender has left without it.
func (r *renewer) stop() {
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
	r.halt()
	close(r.quit)
}

// drain empties the renewer after the loop stopped: the leases still held, and the background
// releases not yet sent (Close sends them with the leases' releases).
func (r *renewer) drain() ([]*leaseState, []backend.ReleaseReq) {
	r.mu.Lock()
	held := append(r.pending, r.flying...)
	r.pending, r.flying = nil, nil
	for len(r.h) > 0 {
		held = append(held, heap.Pop(&r.h).(*leaseState))
	}
	var releases []backend.ReleaseReq
	for _, rel := range r.releases {
		releases = append(releases, rel.req)
	}
	r.releases = nil
	r.mu.Unlock()
	live := held[:0]
	for _, st := range held {
		if st.state.Load() == stateHeld {
			live = append(live, st)
		}
	}
	return live, releases
}

func (r *renewer) run() {
	senderDone := make(chan struct{})
	go func() {
		defer close(senderDone)
		r.send()
	}()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	r.mu.Lock()
	r.timer = timer
	r.mu.Unlock()
	defer timer.Stop()
	for {
		r.nextWake()
		select {
		case <-r.quit:
			r.mu.Lock()
			inFlight := r.inFlight
			r.mu.Unlock()
			if inFlight {
				// The round is answered (abandoned by halt), or, handed over as the sender
				// left, never sent. Either way its leases go back for Close to release.
				select {
				case res := <-r.done:
					r.apply(res)
				case <-senderDone:
					r.apply(sendRes{})
				}
			}
			<-senderDone
			return
		case <-r.kick:
		case <-timer.C:
		case res := <-r.done:
			r.apply(res)
		}
		r.next()
	}
}

// send runs the rounds the loop hands it, one at a time, until the client closes.
func (r *renewer) send() {
	for {
		select {
		case rd := <-r.rounds:
			r.done <- r.sendRound(rd)
		case <-r.quit:
			select {
			case rd := <-r.rounds:
				r.done <- r.sendRound(rd) // r.ctx is cancelled: this returns at once
			default:
			}
			return
		}
	}
}

// sendRound runs one round. It gives the transport no deadline: the loop keeps the leases'
// deadlines itself, and abandoning a pipeline mid-flight can break a shared connection under
// other callers' commands (rueidis closes a connection whose synchronous call timed out).
// Close cancels it.
func (r *renewer) sendRound(rd sendReq) sendRes {
	var res sendRes
	if rd.check {
		// Bounded: a frozen server must not hold up the renewals that follow. A server that
		// cannot be read in time is left to its renewals to tell.
		ctx, cancel := context.WithTimeout(r.ctx, evictionCheckEvery)
		res.risk, _ = r.check(ctx)
		cancel()
	}
	if len(rd.Releases) > 0 || len(rd.Leases) > 0 || len(rd.Entries) > 0 {
		start := mono()
		res.RoundResult = r.b.Renew(r.ctx, rd.Round)
		res.took = max(time.Duration(mono()-start), 1)
	}
	return res
}

// nextWake sets the loop's timer (and records until when in wakeAt) for how long the loop may
// sleep: until the earliest lease or background release is due or, while a round is in
// flight, until the earliest deadline among the leases that cannot be renewed before it comes
// back; with none, it stops the timer (the loop sleeps until kicked, or until wakeBy sets it).
func (r *renewer) nextWake() {
	r.mu.Lock()
	defer r.mu.Unlock()
	at := int64(-1)
	earliest := func(t int64) {
		if at < 0 || t < at {
			at = t
		}
	}
	if len(r.h) > 0 {
		earliest(r.h[0].due)
	}
	if len(r.entries) > 0 && !r.inFlight {
		earliest(r.entries[0].due)
	}
	if r.inFlight {
		for _, st := range r.pending {
			earliest(st.deadline.Load())
		}
		for _, st := range r.flying {
			earliest(st.deadline.Load())
		}
	} else {
		for _, rel := range r.releases {
			earliest(rel.at)
		}
		if r.holding() {
			earliest(r.checkDue)
		}
	}
	r.wakeAt = at // wakeBy compares a new due time with it, under the same lock
	if at < 0 {
		r.timer.Stop()
		return
	}
	r.timer.Reset(max(time.Duration(at-mono()), 0))
}

// holding reports whether any lease is held; r.mu is held.
func (r *renewer) holding() bool { return len(r.h) > 0 || len(r.pending) > 0 || len(r.flying) > 0 }

// next moves due leases to pending, declares lost every lease past its deadline, and, unless a
// round is in flight, sends the next one.
func (r *renewer) next() {
	now := mono()
	var lost []*leaseState
	r.mu.Lock()
	for len(r.h) > 0 && r.h[0].due-slack(r.h[0]) <= now {
		r.pending = append(r.pending, heap.Pop(&r.h).(*leaseState))
	}
	keep := r.pending[:0]
	for _, st := range r.pending {
		switch {
		case st.state.Load() != stateHeld:
		case now >= st.deadline.Load() || (!st.spec.renew && !st.confirm.Load()):
			lost = append(lost, st)
		default:
			keep = append(keep, st)
		}
	}
	clear(r.pending[len(keep):])
	r.pending = keep
	for _, st := range r.flying {
		if st.state.Load() == stateHeld && now >= st.deadline.Load() {
			lost = append(lost, st)
		}
	}
	var rd sendReq
	var regs []*registration // of rd.entries
	send := false
	if !r.inFlight {
		rd, regs = r.roundLocked(now)
		send = r.inFlight
	}
	r.mu.Unlock()
	for _, st := range lost {
		st.end(endLost, st.runOut())
	}
	if r.waiting != nil {
		for i, reg := range regs {
			rd.Entries[i].Waiting = strconv.Itoa(r.waiting(reg))
		}
	}
	if send {
		r.rounds <- rd // capacity 1 and at most one round in flight: never blocks
	}
}

// roundLocked gathers the next round at now, with r.mu held: the queue entries due for a
// refresh (and their registrations), the background releases due, the eviction check when due,
// and, when any of that or a renewal is due, the pending leases' renewals, marking the round in
// flight.
func (r *renewer) roundLocked(now int64) (rd sendReq, regs []*registration) {
	for len(r.entries) > 0 && r.entries[0].due-int64(r.entries[0].window/6) <= now {
		reg := heap.Pop(&r.entries).(*registration)
		if reg.state.Load() == regQueued {
			r.refresh = append(r.refresh, reg)
			regs = append(regs, reg)
			rd.Entries = append(rd.Entries, backend.Queued{Key: reg.spec.key, ID: reg.id, Window: reg.winArg, Watch: reg.spec.shared == nil})
		}
	}
	keep := r.releases[:0]
	for _, rel := range r.releases {
		if rel.at <= now {
			r.sending = append(r.sending, rel)
			rd.Releases = append(rd.Releases, rel.req)
		} else {
			keep = append(keep, rel)
		}
	}
	clear(r.releases[len(keep):])
	r.releases = keep
	// The check goes in a round of its own, so that its reply never delays a renewal's:
	// a renewal answered late can count as lost.
	rd.check = r.holding() && now >= r.checkDue && len(r.pending) == 0
	if rd.check {
		r.checkDue = now + int64(evictionCheckEvery)
	}
	if len(r.pending) > 0 || len(rd.Releases) > 0 || len(rd.Entries) > 0 || rd.check {
		r.inFlight = true
		r.flying, r.pending = r.pending, nil
		rd.Leases = make([]backend.Renewal, len(r.flying))
		for i, st := range r.flying {
			ttl := st.currentTTL()
			if st.confirm.Load() {
				ttl = st.fullTTL()
			}
			rd.Leases[i] = st.renewal(ttl)
		}
		r.sentAt = mono()
	}
	return rd, regs
}

// apply takes in the answers to the round in flight.
func (r *renewer) apply(res sendRes) {
	r.mu.Lock()
	flying, sending, refresh, sentAt := r.flying, r.sending, r.refresh, r.sentAt
	r.flying, r.sending, r.refresh, r.inFlight = nil, nil, nil, false
	r.mu.Unlock()
	r.released(sending, res.RelErrs)
	r.refreshed(refresh, res.Entries, sentAt)
	ev := RenewalEvent{Leases: len(flying), Entries: len(refresh), Releases: len(sending), Latency: res.took}
	for i, st := range flying {
		out := backend.Renewed{Err: backend.ErrShortReply}
		if i < len(res.Leases) {
			out = res.Leases[i]
		}
		switch {
		case out.Err != nil:
			ev.Failed++
			if ev.Err == nil {
				ev.Err = out.Err
			}
		case out.OK:
			ev.Renewed++
		default:
			ev.Refused++
		}
		switch {
		case st.state.Load() != stateHeld:
			if out.OK {
				r.renewedAfterLoss(st, max(st.currentTTL(), st.fullTTL()))
			}
		case !out.OK && out.Err == nil && st.releasing.Load():
			// Refused because its own Unlock released it meanwhile: the Unlock ends it.
		case out.Err != nil:
			r.retry(st)
		case out.OK:
			ttl := st.currentTTL()
			if st.confirm.Load() {
				ttl = st.fullTTL()
				st.confirm.Store(false)
			}
			st.renewed(sentAt, ttl)
			st.mu.Lock()
			last := st.lastSent // an Extend may have answered a later request
			st.mu.Unlock()
			r.push(st, dueAfter(st, last))
		case out.Released:
			st.end(endLost, st.lostAs(LostForceUnlocked, "a renewal found it released by someone else (force-unlocked)"))
		default:
			st.end(endLost, st.lost("a renewal found it no longer held by this lease (expired, force-unlocked, or taken over)"))
		}
	}
	if res.took > 0 && r.ev != nil {
		r.ev.renewal(ev)
	}
	if res.risk != nil {
		// A server may have dropped any lease's key: none of them is safe any more.
		r.endAll(fmt.Errorf("%w: %w", ErrLost, res.risk))
	}
}

// renewedAfterLoss is told that a renewal of st to ttl succeeded on the server after st had
// ended. When st was declared lost (its deadline passed while the renewal was on its way,
// for instance), nobody holds the lock any more, yet the server now keeps it under st's owner
// for up to ttl: it is released at once, as an orphan is, so that the next holder is not kept
// waiting. A lease that ended otherwise needs nothing: released by its Unlock (a renewal that
// succeeded came before the release), passed on (its owner is the next lease's), or closed
// (Close releases it).
func (r *renewer) renewedAfterLoss(st *leaseState, ttl time.Duration) {
	if st.state.Load() != stateLost {
		return
	}
	now := mono()
	r.background(release{req: st.releaseReq(true), at: now, until: now + int64(ttl)})
}

// released handles the answers to the background releases of a round: a transport error is
// tried again later, while it is worth it.
func (r *renewer) released(sent []release, errs []error) {
	now := mono()
	var again []release
	for i, rel := range sent {
		err := backend.ErrShortReply
		if i < len(errs) {
			err = errs[i]
		}
		switch {
		case err == nil:
			if rel.woken != nil {
				rel.woken()
			}
		case now < rel.until && !refused(err):
			rel.wait = min(max(2*rel.wait, int64(releaseRetryMin)), int64(releaseRetryMax))
			rel.at = min(now+rel.wait, rel.until)
			again = append(again, rel)
		}
	}
	if len(again) > 0 {
		r.mu.Lock()
		r.releases = append(r.releases, again...)
		r.mu.Unlock()
	}
}

// addEntry keeps reg's queue entry alive from now on, a third of its window after its last
// refresh.
func (r *renewer) addEntry(reg *registration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped || reg.idx >= 0 {
		return
	}
	from, _ := reg.validFrom(1<<len(reg.sentOn) - 1) // the least recently refreshed server
	reg.due = max(from, mono()-int64(reg.window)) + int64(reg.window/3)
	heap.Push(&r.entries, reg)
	if reg.idx == 0 {
		r.wakeBy(reg.due)
	}
}

func (r *renewer) removeEntry(reg *registration) { removeDue(r, &r.entries, reg) }

// removeDue takes it out of h, r's heap of leases or of registrations, if it is there.
func removeDue[T dueItem](r *renewer, h *dueHeap[T], it T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i := it.index(); i >= 0 {
		heap.Remove(h, i)
	}
}

// refreshed takes in the answers to a round's queue entry refreshes. An entry the server no
// longer has was granted or has expired: its queue's head is woken (see entryGone). An entry
// refreshed tells when its lock may next be free: its head attempts then if its timer was set
// for later (see lockEnds).
func (r *renewer) refreshed(regs []*registration, outs []backend.Renewed, sentAt int64) {
	for i, reg := range regs {
		out := backend.Renewed{Err: backend.ErrShortReply}
		if i < len(outs) {
			out = outs[i]
		}
		switch {
		case reg.state.Load() != regQueued:
		case out.Err != nil:
			r.mu.Lock()
			if reg.idx < 0 {
				reg.due = mono() + int64(reg.window/10)
				heap.Push(&r.entries, reg)
			}
			r.mu.Unlock()
		case out.OK:
			mask := out.On
			if len(reg.sentOn) == 1 {
				mask = 1
			}
			reg.refreshedOn(mask, sentAt)
			if out.LockLeft != protocol.LockLeftUnknown && r.lockEnds != nil {
				// Counted from the send time: never later than the server's end of it.
				r.lockEnds(reg, sentAt+int64(out.LockLeft))
			}
			r.mu.Lock()
			if reg.idx < 0 && reg.state.Load() == regQueued {
				reg.due = sentAt + int64(reg.window/3)
				heap.Push(&r.entries, reg)
			}
			r.mu.Unlock()
		default:
			if r.entryGone != nil {
				r.entryGone(reg)
			}
		}
	}
}

// endAll ends every held lease with cause.
func (r *renewer) endAll(cause error) {
	r.mu.Lock()
	all := append(append(slices.Clone([]*leaseState(r.h)), r.pending...), r.flying...)
	r.mu.Unlock()
	for _, st := range all {
		st.end(endLost, cause)
	}
}

// retry puts st back after a failed renewal: soon, but never past its deadline. The loop takes
// a lease up to its slack before it is due; the retry is due that much later, so that it is
// taken at the chosen time, not at once (which made a round per answer, hundreds a second, for
// as long as the server refused connections).
func (r *renewer) retry(st *leaseState) {
	now := mono()
	left := st.deadline.Load() - now
	if left <= 0 {
		st.end(endLost, st.runOut())
		return
	}
	r.push(st, now+min(left, max(st.ttl.Load()/10, left/3))+slack(st))
}

func (r *renewer) push(st *leaseState, due int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st.state.Load() != stateHeld || st.idx >= 0 {
		return
	}
	st.due = due
	heap.Push(&r.h, st)
}

// dueHeap orders the renewer's leases or queue registrations by due time (when a lease is
// next renewed, or a registration's queue entry refreshed); it implements heap.Interface, and
// keeps each item's index in it (-1 once out).
type dueHeap[T dueItem] []T

// dueItem is what a dueHeap holds: its due time, and its index in the heap (-1: not in it).
type dueItem interface {
	dueAt() int64
	index() int
	setIdx(int)
}

type (
	leaseHeap = dueHeap[*leaseState]
	entryHeap = dueHeap[*registration]
)

func (st *leaseState) dueAt() int64    { return st.due }
func (st *leaseState) index() int      { return st.idx }
func (st *leaseState) setIdx(i int)    { st.idx = i }
func (reg *registration) dueAt() int64 { return reg.due }
func (reg *registration) index() int   { return reg.idx }
func (reg *registration) setIdx(i int) { reg.idx = i }

func (h dueHeap[T]) Len() int           { return len(h) }
func (h dueHeap[T]) Less(i, j int) bool { return h[i].dueAt() < h[j].dueAt() }
func (h dueHeap[T]) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].setIdx(i)
	h[j].setIdx(j)
}
func (h *dueHeap[T]) Push(x any) {
	it := x.(T)
	it.setIdx(len(*h))
	*h = append(*h, it)
}
func (h *dueHeap[T]) Pop() any {
	old := *h
	n := len(old) - 1
	it := old[n]
	var zero T
	old[n] = zero
	it.setIdx(-1)
	*h = old[:n]
	return it
}
