package dlock

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
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

	mu      sync.Mutex
	h       leaseHeap     // leases not yet due
	pending []*leaseState // due, waiting for the batch in flight to come back
	flying  []*leaseState // in the batch in flight
	orphans []conn.Call   // releases for acquisitions whose callers gave up mid-call
	later   []lateOrphan  // the same releases, sent once more after orphanRecheck
	busy    bool          // a batch is in flight
	sentAt  int64         // mono ns when the batch in flight was handed to the sender
	ack     bool          // the batch in flight ends with a WAIT
	spans   []int         // leases per renew call of the batch in flight, in order
	stopped bool
	wakeAt  int64 // mono ns the loop's timer is set for, -1 when it sleeps until poked

	kick  chan struct{} // capacity 1: the earliest due time changed, or there is an orphan
	quit  chan struct{}
	reqs  chan batch         // to the sender
	resps chan []conn.Result // from the sender
	ctx   context.Context    // cancelled by stop, to abandon a batch in flight
	halt  context.CancelFunc
}

// orphanRecheck is when an orphan release is sent a second time. The transports spread calls
// over several connections (rueidis pipelines over two or more, go-redis has a pool), so the
// first release can reach the server before the acquisition it undoes; the second catches an
// acquisition that arrived late. One later than this holds the lock until its lease runs out.
const orphanRecheck = time.Second

type lateOrphan struct {
	call conn.Call
	at   int64 // mono ns
}

type batch struct {
	calls []conn.Call
}

func newRenewer(c *Client) *renewer {
	ctx, cancel := context.WithCancel(context.Background())
	return &renewer{
		wakeAt: -1,
		c:      c, kick: make(chan struct{}, 1), quit: make(chan struct{}),
		reqs: make(chan batch, 1), resps: make(chan []conn.Result, 1),
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

// orphan queues a release for an acquisition nobody will use. Once the client is closing, no
// round is left to send it: it is sent at once.
func (r *renewer) orphan(call conn.Call) {
	r.mu.Lock()
	stopped := r.stopped
	if !stopped {
		r.orphans = append(r.orphans, call)
		r.later = append(r.later, lateOrphan{call, mono() + int64(orphanRecheck)})
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
// sends the pending orphan releases.
func (r *renewer) drain() []*leaseState {
	r.mu.Lock()
	held := append(r.pending, r.flying...)
	r.pending, r.flying = nil, nil
	for len(r.h) > 0 {
		held = append(held, heap.Pop(&r.h).(*leaseState))
	}
	orphans := r.orphans
	for _, lo := range r.later {
		orphans = append(orphans, lo.call)
	}
	r.orphans, r.later = nil, nil
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
			return
		case <-r.kick:
		case <-timer.C:
		case res := <-r.resps:
			r.finish(res)
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
	if len(r.orphans) > 0 && !r.busy {
		r.wakeAt = mono()
		return 0
	}
	at := int64(-1)
	earliest := func(t int64) {
		if at < 0 || t < at {
			at = t
		}
	}
	if len(r.h) > 0 {
		earliest(r.h[0].due)
	}
	if len(r.later) > 0 {
		earliest(r.later[0].at)
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
	for len(r.later) > 0 && r.later[0].at <= now {
		r.orphans = append(r.orphans, r.later[0].call)
		r.later = r.later[1:]
	}
	var b batch
	if !r.busy && (len(r.pending) > 0 || len(r.orphans) > 0) {
		r.busy = true
		r.flying, r.pending = r.pending, nil
		b.calls = r.orphans
		r.orphans = nil
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
	r.mu.Unlock()
	if n := len(results) - len(spans); n > 0 {
		results = results[n:] // the orphan releases: nothing to do with their answers
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
