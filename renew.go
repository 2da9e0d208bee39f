package dlock

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/slot"
)

// renewBatch is how many leases one renew script call extends. A round sends all of its calls
// in one pipeline; a call of this size keeps the server busy for well under a millisecond.
const renewBatch = 256

// renewer is the one renewal loop of a Client. Held leases wait in a heap ordered by the moment
// they are due: renewal at a third of their TTL, or, for a fixed lease, the deadline. When the
// earliest is due, the loop renews, in one pipeline of multi-key script calls, every lease due
// by then plus those within a sixth of a TTL of being due, so that leases taken at about the
// same time are renewed together. A lease whose renewal is refused, or whose deadline passes
// without a successful renewal, is lost: its context is cancelled with cause ErrLost.
//
// The pipeline is sent by a second goroutine, so that the loop keeps its deadlines while a
// pipeline is slow to come back, or never does. No goroutine or timer exists per lease.
type renewer struct {
	c *Client

	mu       sync.Mutex
	h        leaseHeap     // leases not yet due
	pending  []*leaseState // due, waiting for the batch in flight to come back
	flying   []*leaseState // in the batch in flight
	releases []release     // releases to send in the background (see release)
	sending  []release     // those in the batch in flight, in the order of its first calls
	busy     bool          // a batch is in flight
	sentAt   int64         // mono ns when the batch in flight was handed to the sender
	ack      bool          // the batch in flight ends with a WAIT
	spans    []int         // leases per renew call of the batch in flight, in order
	stopped  bool
	wakeAt   int64 // mono ns the loop's timer is set for, -1 when it sleeps until poked

	// The eviction check (evict.go) runs every evictionCheckEvery while leases are held, in a
	// goroutine of its own so that a slow server does not hold up renewals; one at a time.
	checkDue int64      // mono ns when the next check is due
	checking bool       // a check is running
	checked  chan error // capacity 1: the check's risk, nil when none

	kick  chan struct{} // capacity 1: the earliest due time changed, or there is an orphan
	quit  chan struct{}
	reqs  chan batch         // to the sender
	resps chan []conn.Result // from the sender
	ctx   context.Context    // cancelled by stop, to abandon a batch in flight
	halt  context.CancelFunc
}

// orphanRecheck is when an orphan release is sent a second time. The transports spread calls
// over several connections (go-redis has a pool), so the first release can reach the server
// before the acquisition it undoes; the second catches an acquisition that arrived late. One
// later than this holds the lock until its lease runs out.
const orphanRecheck = time.Second

// release is a release the renewal loop sends in the background: for an acquisition whose
// caller gave up mid-call (an orphan), or for an Unlock whose own release failed. A transport
// error is retried with backoff until it succeeds, until the lease it ends would have run out
// on the server anyway, or until the client closes.
type release struct {
	call  conn.Call
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

type batch struct {
	calls []conn.Call
}

func newRenewer(c *Client) *renewer {
	ctx, cancel := context.WithCancel(context.Background())
	return &renewer{
		wakeAt: -1,
		c:      c, kick: make(chan struct{}, 1), quit: make(chan struct{}),
		reqs: make(chan batch, 1), resps: make(chan []conn.Result, 1), checked: make(chan error, 1),
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
	if st.idx == 0 && (r.wakeAt < 0 || st.due < r.wakeAt) {
		// The loop sleeps past this lease's due time (or indefinitely): wake it to re-arm its
		// timer. Otherwise it wakes in time anyway, and a lock taken and released at once (the
		// common case) costs the loop nothing.
		r.poke()
	}
	return true
}

// dueAfter returns when st must next be renewed after a successful request sent at sent.
func dueAfter(st *leaseState, sent int64) int64 {
	if !st.renew {
		return st.deadline.Load()
	}
	return sent + st.ttl.Load()/3
}

// slack is how early st may be renewed to join a batch.
func slack(st *leaseState) int64 {
	if !st.renew {
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
		return // in a batch: its answer reschedules it
	}
	st.due = dueAfter(st, sent)
	heap.Fix(&r.h, st.idx)
	if st.idx == 0 {
		r.poke()
	}
}

func (r *renewer) remove(st *leaseState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st.idx >= 0 {
		heap.Remove(&r.h, st.idx)
	}
}

// orphan queues a release for an acquisition with lease ttl that nobody will use: sent at
// once and again after orphanRecheck. Once the client is closing, no round is left to send
// it: it is sent at once.
func (r *renewer) orphan(call conn.Call, ttl time.Duration) {
	now := mono()
	until := now + int64(ttl)
	r.background(call, release{call: call, at: now, until: until}, release{call: call, at: now + int64(orphanRecheck), until: until})
}

// retryRelease queues a release whose first try failed, to be tried again until until (mono
// ns); woken runs once it succeeds.
func (r *renewer) retryRelease(call conn.Call, until int64, woken func()) {
	r.background(call, release{call: call, at: mono() + int64(releaseRetryMin), until: until, wait: int64(releaseRetryMin), woken: woken})
}

func (r *renewer) background(call conn.Call, rs ...release) {
	r.mu.Lock()
	stopped := r.stopped
	if !stopped {
		r.releases = append(r.releases, rs...)
	}
	r.mu.Unlock()
	if stopped {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r.c.conn.EvalMulti(ctx, []conn.Call{call})
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

// stop ends the loop; run returns once a batch in flight has come back (Close's cancellation
// abandons it) or the sender has left without it.
func (r *renewer) stop() {
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
	r.halt()
	close(r.quit)
}

// drain empties the renewer after the loop stopped, returning the leases still held, and
// sends the background releases once.
func (r *renewer) drain() []*leaseState {
	r.mu.Lock()
	held := append(r.pending, r.flying...)
	r.pending, r.flying = nil, nil
	for len(r.h) > 0 {
		held = append(held, heap.Pop(&r.h).(*leaseState))
	}
	var orphans []conn.Call
	for _, rel := range r.releases {
		orphans = append(orphans, rel.call)
	}
	r.releases = nil
	r.mu.Unlock()
	if len(orphans) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r.c.conn.EvalMulti(ctx, orphans)
		cancel()
	}
	live := held[:0]
	for _, st := range held {
		if st.state.Load() == stateHeld {
			live = append(live, st)
		}
	}
	return live
}

func (r *renewer) run() {
	senderDone := make(chan struct{})
	go func() {
		defer close(senderDone)
		r.send()
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if wait := r.nextWake(); wait >= 0 {
			timer.Reset(wait)
		}
		select {
		case <-r.quit:
			r.mu.Lock()
			busy := r.busy
			r.mu.Unlock()
			if busy {
				// The batch is answered (abandoned by halt), or, handed over as the sender
				// left, never sent. Either way its leases go back for Close to release.
				select {
				case res := <-r.resps:
					r.finish(res)
				case <-senderDone:
					r.finish(nil)
				}
			}
			<-senderDone
			r.mu.Lock()
			checking := r.checking
			r.mu.Unlock()
			if checking {
				<-r.checked // r.ctx is cancelled: it returns at once
			}
			return
		case <-r.kick:
		case <-timer.C:
		case res := <-r.resps:
			r.finish(res)
		case risk := <-r.checked:
			r.mu.Lock()
			r.checking = false
			r.mu.Unlock()
			if risk != nil {
				r.loseAll(fmt.Errorf("%w: %w", ErrLost, risk))
			}
		}
		timer.Stop()
		r.round()
	}
}

// send runs the pipelines the loop hands it, one at a time, until the client closes.
func (r *renewer) send() {
	for {
		select {
		case b := <-r.reqs:
			r.resps <- r.sendBatch(b)
		case <-r.quit:
			select {
			case b := <-r.reqs:
				r.resps <- r.sendBatch(b) // r.ctx is cancelled: this returns at once
			default:
			}
			return
		}
	}
}

// sendBatch runs one pipeline. It gives the transport no deadline: the loop keeps the leases'
// deadlines itself, and abandoning a pipeline mid-flight can break a shared connection under
// other callers' commands (rueidis closes a connection whose synchronous call timed out).
// Close cancels it.
func (r *renewer) sendBatch(b batch) []conn.Result {
	return r.c.conn.EvalMulti(r.ctx, b.calls)
}

// nextWake returns how long the loop may sleep (and records until when in wakeAt): until the
// earliest lease is due or, while a batch is in flight, until the earliest deadline among those
// that cannot be renewed before it comes back. -1 means until kicked.
func (r *renewer) nextWake() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	at := int64(-1)
	earliest := func(t int64) {
		if at < 0 || t < at {
			at = t
		}
	}
	if !r.busy {
		for _, rel := range r.releases {
			earliest(rel.at)
		}
	}
	if len(r.h) > 0 {
		earliest(r.h[0].due)
	}
	if r.holding() && !r.checking {
		earliest(r.checkDue)
	}
	if r.busy {
		for _, st := range r.pending {
			earliest(st.deadline.Load())
		}
		for _, st := range r.flying {
			earliest(st.deadline.Load())
		}
	}
	r.wakeAt = at // add compares a new lease's due time with it, under the same lock
	if at < 0 {
		return -1
	}
	return max(time.Duration(at-mono()), 0)
}

// round moves due leases to pending, declares lost every lease past its deadline, and, unless a
// batch is in flight, sends the next one.
func (r *renewer) round() {
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
		case now >= st.deadline.Load() || !st.renew:
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
	if r.holding() && !r.checking && now >= r.checkDue {
		r.checking = true
		r.checkDue = now + int64(evictionCheckEvery)
		go func() {
			risk, _ := r.c.guard.check(r.ctx, r.c.need) // a server that cannot be read: renewals tell
			r.checked <- risk
		}()
	}
	var b batch
	due := false
	for _, rel := range r.releases {
		due = due || rel.at <= now
	}
	if !r.busy && (len(r.pending) > 0 || due) {
		r.busy = true
		r.flying, r.pending = r.pending, nil
		r.sending = r.sending[:0]
		keep := r.releases[:0]
		for _, rel := range r.releases {
			if rel.at <= now {
				r.sending = append(r.sending, rel)
				b.calls = append(b.calls, rel.call)
			} else {
				keep = append(keep, rel)
			}
		}
		clear(r.releases[len(keep):])
		r.releases = keep
		r.spans = r.spans[:0]
		if r.c.cluster {
			// On a Cluster the keys of one script call must share a slot.
			slices.SortStableFunc(r.flying, func(a, b *leaseState) int { return cmp.Compare(slot.Of(a.key), slot.Of(b.key)) })
		}
		for i := 0; i < len(r.flying); {
			j := min(i+renewBatch, len(r.flying))
			if r.c.cluster {
				s := slot.Of(r.flying[i].key)
				j = i + 1
				for j < len(r.flying) && j-i < renewBatch && slot.Of(r.flying[j].key) == s {
					j++
				}
			}
			b.calls = append(b.calls, renewCall(r.flying[i:j]))
			r.spans = append(r.spans, j-i)
			i = j
		}
		// WithReplicaAck: one WAIT after the batch covers every renewal in it.
		ackN, ackWait := 0, time.Duration(0)
		for _, st := range r.flying {
			ackN, ackWait = max(ackN, st.ackN), max(ackWait, st.ackWait)
		}
		if ackN > 0 {
			b.calls = append(b.calls, conn.Call{WaitReplicas: ackN, WaitTimeout: ackWait})
		}
		r.ack = ackN > 0
		r.sentAt = mono()
	}
	r.mu.Unlock()
	for _, st := range lost {
		st.end(ErrLost)
	}
	if b.calls != nil {
		r.reqs <- b // capacity 1 and at most one batch in flight: never blocks
	}
}

// released handles the answers to the background releases of a batch (the first calls of its
// results): a transport error is tried again later, while it is worth it.
func (r *renewer) released(sent []release, results []conn.Result) {
	now := mono()
	var again []release
	for i, rel := range sent {
		var res conn.Result
		if i < len(results) {
			res = results[i]
		} else {
			res.Err = errShortReply
		}
		switch {
		case res.Err == nil:
			if rel.woken != nil {
				rel.woken()
			}
		case now < rel.until && !refused(res.Err):
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

// holding reports whether any lease is held; r.mu is held.
func (r *renewer) holding() bool { return len(r.h) > 0 || len(r.pending) > 0 || len(r.flying) > 0 }

// loseAll ends every held lease with cause: a server may have dropped any of their keys.
func (r *renewer) loseAll(cause error) {
	r.mu.Lock()
	all := append(append(slices.Clone([]*leaseState(r.h)), r.pending...), r.flying...)
	r.mu.Unlock()
	for _, st := range all {
		st.end(cause)
	}
}

// finish applies the answers to the batch in flight.
func (r *renewer) finish(results []conn.Result) {
	r.mu.Lock()
	flying, sent, ack := r.flying, r.sentAt, r.ack
	r.flying, r.busy = nil, false
	r.mu.Unlock()
	acked := int64(-1)
	if ack && len(results) > 0 {
		if w := results[len(results)-1]; w.Err == nil && len(w.Ints) == 1 {
			acked = w.Ints[0]
		}
		results = results[:len(results)-1]
	}
	r.mu.Lock()
	spans := slices.Clone(r.spans)
	sending := slices.Clone(r.sending)
	r.mu.Unlock()
	r.released(sending, results)
	if n := len(results) - len(spans); n > 0 {
		results = results[n:] // the background releases' answers, handled above
	}
	call, k := 0, 0 // flying[i] is the k-th key of renew call number call
	for _, st := range flying {
		for call < len(spans) && k == spans[call] {
			call, k = call+1, 0
		}
		idx := k
		k++
		var res conn.Result
		if call < len(results) {
			res = results[call]
		} else {
			res.Err = errShortReply
		}
		switch {
		case st.state.Load() != stateHeld:
		case res.Err != nil:
			r.retry(st)
		case idx < len(res.Ints) && res.Ints[idx] == 1 && st.ackN > 0 && acked < int64(st.ackN):
			r.retry(st) // renewed on the master, but not acknowledged by enough replicas
		case idx < len(res.Ints) && res.Ints[idx] == 1:
			st.renewed(sent, st.currentTTL())
			st.mu.Lock()
			last := st.lastSent // an Extend may have answered a later request
			st.mu.Unlock()
			r.push(st, dueAfter(st, last))
		default:
			st.end(ErrLost)
		}
	}
}

var errShortReply = errors.New("dlock: transport returned fewer replies than calls")

func renewCall(chunk []*leaseState) conn.Call {
	keys := make([]string, len(chunk))
	args := make([]string, 0, 2*len(chunk))
	for i, st := range chunk {
		keys[i] = st.key
		args = append(args, st.owner, strconv.FormatInt(st.currentTTL().Milliseconds(), 10))
	}
	return conn.Call{Script: scriptRenew, Keys: keys, Args: args}
}

// retry puts st back after a failed renewal: soon, but never past its deadline.
func (r *renewer) retry(st *leaseState) {
	now := mono()
	left := st.deadline.Load() - now
	if left <= 0 {
		st.end(ErrLost)
		return
	}
	r.push(st, now+min(left, max(st.ttl.Load()/10, left/3)))
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

// leaseHeap orders leases by due time; it implements heap.Interface.
type leaseHeap []*leaseState

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx = i
	h[j].idx = j
}
func (h *leaseHeap) Push(x any) {
	st := x.(*leaseState)
	st.idx = len(*h)
	*h = append(*h, st)
}
func (h *leaseHeap) Pop() any {
	old := *h
	st := old[len(old)-1]
	old[len(old)-1] = nil
	st.idx = -1
	*h = old[:len(old)-1]
	return st
}
