package dlock

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The wait/handoff protocol, both ends. Words used for one idea each:
//
//   - queue: this client's callers waiting for one lock, first-in first-out. Only its head
//     talks to Redis; the others wait their turn.
//   - woken: the head is told to try again (a release notice, a subscription confirmation, a
//     lease of this client ending).
//   - hold back: a woken head pauses before its attempt so that other clients get their turn
//     (fairnessYield).
//   - local handoff: at Unlock the lock passes to this client's head without any command.
//   - server handover: the same through handover.lua, with a new owner and token, which the
//     server refuses while other clients wait and this client had its turn.
//   - pass on: either of the two handoffs (endPassedOn).
//
// The acquiring end is acquireWaiting (a caller that may wait), the releasing end letGo (the
// last Unlock of a lease).

// waitQueues holds, per lock key, the callers of one client that wait for that lock.
type waitQueues struct {
	notices *notifier
	seed    maphash.Seed
	shards  [64]qshard
}

type qshard struct {
	mu sync.Mutex
	m  map[string]*queue // guarded by mu; a queue is removed when its last waiter leaves
}

type queue struct {
	key     string
	channel string

	// guarded by the shard's mu
	waiters    []*waiter // waiters[0] is the head
	subscribed bool      // the notifier routes release notices for channel to this queue
	streak     int       // passed on in a row within this client (see handOff)

	wake      chan struct{} // capacity 1: the head is woken
	blockedOn atomic.Uint64 // token of the holder the head waits for; older release notices are ignored
	lastEnd   atomic.Int64  // mono ns when this client's last lease on the lock ended (0: none, or no other client heard its release)
	unheard   atomic.Bool   // no other client heard this client's last release: the head tries at once
}

type waiter struct {
	turn   chan struct{} // capacity 1: receives when this waiter becomes the head
	holder *holder       // set before turn when the previous head acquired: wait for its release

	// A handoff makes the lease from the waiter's spec and context and sends it on grant.
	// Under the shard's mu: reserved while an Unlock passes the lock to this waiter,
	// abandoned when it left meanwhile.
	spec      *lockSpec
	ctx       context.Context
	grant     chan *leaseState // capacity 1
	reserved  bool
	abandoned bool
}

func newWaitQueues(n *notifier) *waitQueues {
	qs := &waitQueues{notices: n, seed: maphash.MakeSeed()}
	for i := range qs.shards {
		qs.shards[i].m = make(map[string]*queue)
	}
	return qs
}

func (qs *waitQueues) shard(key string) *qshard {
	return &qs.shards[maphash.String(qs.seed, key)%uint64(len(qs.shards))]
}

// queued reports whether callers of this client wait for key.
func (qs *waitQueues) queued(key string) bool {
	s := qs.shard(key)
	s.mu.Lock()
	_, ok := s.m[key]
	s.mu.Unlock()
	return ok
}

// ---- The acquiring end ----

// attemptFunc makes one attempt to take a lock: the lease, or the holder that refused it.
type attemptFunc func(ctx context.Context) (*leaseState, holder, error)

// acquireWaiting takes spec's lock for a caller that may wait. With callers of this client
// already queued for it, it joins the queue at once (its attempt could only fail); else it
// tries, and queues if the lock is held.
func (e *engine) acquireWaiting(ctx context.Context, spec *lockSpec, attempt attemptFunc) (*leaseState, error) {
	if e.waits.queued(spec.key) {
		return e.waitInQueue(ctx, spec, nil, attempt)
	}
	st, h, err := attempt(ctx)
	if err != nil || st != nil {
		return st, err
	}
	return e.waitInQueue(ctx, spec, &h, attempt)
}

// waitInQueue queues behind this client's other waiters for the lock, then, as the head,
// alternates attempts with waiting to be woken or for the holder's lease to run out. known,
// when set, is the answer of an attempt made just before.
func (e *engine) waitInQueue(ctx context.Context, spec *lockSpec, known *holder, attempt attemptFunc) (*leaseState, error) {
	qs := e.waits
	q, w, head := qs.join(spec, ctx)
	var got *leaseState // when set, the next head waits for this lease to end
	defer func() {
		if stray := qs.leave(q, w, got); stray != nil {
			(&Lease{st: stray}).Unlock(context.WithoutCancel(ctx))
		}
	}()
	if !head {
		select {
		case <-w.turn:
		case got = <-w.grant:
			return got, nil
		case <-ctx.Done():
			return nil, spec.ctxErr(ctx)
		case <-e.done:
			return nil, ErrClosed
		}
		known = w.holder // the previous head just took the lock: wait for its release
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	first := true // the first attempt of a new head goes at once
	for {
		select {
		case got = <-w.grant: // the holder passed the lock on
			return got, nil
		default:
		}
		unheard := q.unheard.Swap(false) // this client's last release reached no other client
		if j := e.traits.retryJitter; j > 0 && known == nil && !first && !unheard {
			// Every contender heard the same release at once: spread their attempts.
			if st, err := e.pause(ctx, w, timer, nil, time.Duration(rand.Int64N(int64(j)))); st != nil || err != nil {
				got = st
				return st, err
			}
		}
		first = false
		if d := holdBack(q.lastEnd.Load()); known == nil && d > 0 {
			// This client held the lock a moment ago: give the other clients' heads a head start.
			if st, err := e.pause(ctx, w, timer, nil, d); st != nil || err != nil {
				got = st
				return st, err
			}
		}
		var h holder
		if known != nil {
			h, known = *known, nil
		} else {
			q.drain()
			st, hh, err := attempt(ctx)
			if err != nil || st != nil {
				got = st
				return st, err
			}
			h = hh
		}
		qs.block(q, h.token)
		// Retry when the holder's lease runs out (a crashed holder sends no notice). PTTL is
		// rounded down to the millisecond; a negative one means the server did not say.
		d := h.pttl + time.Millisecond
		if h.pttl < 0 {
			d = spec.ttl
		}
		if st, err := e.pause(ctx, w, timer, q.wake, d); st != nil || err != nil {
			got = st
			return st, err
		}
	}
}

// pause waits, as the head of a queue, for d to pass, to be woken (when wake is not nil), or
// for a lease passed on to w. It returns that lease, or an error when ctx ends or the client
// closes.
func (e *engine) pause(ctx context.Context, w *waiter, timer *time.Timer, wake <-chan struct{}, d time.Duration) (*leaseState, error) {
	timer.Reset(d)
	defer timer.Stop()
	select {
	case <-wake:
	case st := <-w.grant:
		return st, nil
	case <-timer.C:
	case <-ctx.Done():
		return nil, w.spec.ctxErr(ctx)
	case <-e.done:
		return nil, ErrClosed
	}
	return nil, nil
}

// fairnessYield and fairnessWindow: a client's head woken by a release notice (or by its
// timer) holds back its attempt by up to fairnessYield, the more the more recently its own
// client's last lease on the lock ended: fairnessYield right after that, nothing once
// fairnessWindow has passed. The client that just released (woken locally at once) would
// otherwise win nearly every race against the other clients' heads, which learn of the
// release over the network; and among those, the clients that held the lock least recently
// tend to go first. The window is wide enough to order by recency the clients that missed a
// turn too; docs/BENCHMARKS.md gives the fairness and throughput this buys.
const (
	fairnessYield  = 2 * time.Millisecond
	fairnessWindow = 8 * time.Millisecond
)

// holdBack is how long a head holds back its attempt when its client's last lease on the
// lock ended at lastEnd (mono ns; 0: no hold-back).
func holdBack(lastEnd int64) time.Duration {
	if lastEnd == 0 {
		return 0
	}
	since := time.Duration(mono() - lastEnd)
	if since >= fairnessWindow {
		return 0
	}
	return fairnessYield * (fairnessWindow - since) / fairnessWindow
}

// join appends a waiter to key's queue, making the queue if needed, and reports whether the
// waiter is the head.
func (qs *waitQueues) join(spec *lockSpec, ctx context.Context) (*queue, *waiter, bool) {
	s := qs.shard(spec.key)
	w := &waiter{turn: make(chan struct{}, 1), spec: spec, ctx: ctx, grant: make(chan *leaseState, 1)}
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.m[spec.key]
	if q == nil {
		q = &queue{key: spec.key, channel: spec.channel, wake: make(chan struct{}, 1)}
		s.m[spec.key] = q
	}
	q.waiters = append(q.waiters, w)
	return q, w, len(q.waiters) == 1
}

// leave removes w from q. If w was the head, the next waiter becomes the head; when w leaves
// because it acquired the lock (acquired != nil), the next head is told so and waits for that
// lease to end instead of making an attempt that must fail. It returns a lease passed on to w
// just as it gave up, for the caller to release.
func (qs *waitQueues) leave(q *queue, w *waiter, acquired *leaseState) (stray *leaseState) {
	s := qs.shard(q.key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if acquired == nil {
		select {
		case stray = <-w.grant:
		default:
		}
	}
	i := 0
	for i < len(q.waiters) && q.waiters[i] != w {
		i++
	}
	if i == len(q.waiters) {
		return stray
	}
	if w.reserved {
		w.abandoned = true // the Unlock passing the lock to w releases it instead
	}
	q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
	if len(q.waiters) == 0 {
		delete(s.m, q.key)
		if q.subscribed {
			qs.notices.remove(q.channel, q)
		}
		return stray
	}
	if i != 0 {
		return stray
	}
	next := q.waiters[0]
	if acquired != nil {
		q.blockedOn.Store(acquired.token)
		q.drain()
		next.holder = &holder{pttl: acquired.currentTTL(), token: acquired.token}
	}
	next.turn <- struct{}{}
	return stray
}

// block records the holder the head now waits for and makes sure release notices for the
// lock reach the queue. The first subscription's confirmation wakes the head, which then
// tries again: a release between its attempt and the subscription is not missed.
func (qs *waitQueues) block(q *queue, token uint64) {
	q.blockedOn.Store(token)
	s := qs.shard(q.key)
	s.mu.Lock()
	if !q.subscribed {
		q.subscribed = true
		qs.notices.add(q.channel, q)
	}
	s.mu.Unlock()
}

// anyToken wakes a head whatever holder it waits for.
const anyToken = math.MaxUint64

// wakeHead wakes the head if token (of the release that woke it) is not older than the
// holder it waits for.
func (q *queue) wakeHead(token uint64) {
	if token < q.blockedOn.Load() {
		return
	}
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *queue) drain() {
	select {
	case <-q.wake:
	default:
	}
}

// ---- The releasing end ----

// leaseEnded wakes the head waiting for key when a lease of this client on it ended (released,
// lost or closed). unheard says that no other client heard the release.
func (qs *waitQueues) leaseEnded(key string, token uint64, unheard bool) {
	s := qs.shard(key)
	s.mu.Lock()
	q := s.m[key]
	s.mu.Unlock()
	if q == nil {
		return
	}
	if unheard {
		q.lastEnd.Store(0)
	} else {
		q.lastEnd.Store(mono())
	}
	q.unheard.Store(unheard)
	q.wakeHead(token)
}

// letGo ends the last hold of st: it passes the lock to this client's first waiter for it
// (handOff), or releases it on the server, which wakes every client's waiters. A release that
// fails on the network is retried in the background until it succeeds or the lease would have
// run out anyway.
func (e *engine) letGo(ctx context.Context, st *leaseState) error {
	if done, err := e.handOff(ctx, st); done {
		return err
	}
	// With waiters of this client queued, the release reports how many subscribers heard it:
	// when no other client's did, nobody else waits, and the local head need not hold back.
	// Without the count, every handoff among this client's waiters that goes through the
	// server (quorum mode, replica acknowledgement, a waiter asking for another lease) would
	// idle the lock for the hold-back.
	count, own := false, 0
	if e.waits.queued(st.spec.key) {
		count = true
		if e.notices.isLive(st.spec.channel) {
			own = 1 // this client's own subscription hears it too
		}
	}
	res, err := e.b.release(ctx, st.releaseReq(true, count))
	switch {
	case err != nil && !refused(err):
		st.mu.Lock()
		until := st.lastSent + st.ttl.Load()
		st.mu.Unlock()
		waits, key, token := e.waits, st.spec.key, st.token
		e.renewer.retryRelease(st.releaseReq(true, false), until, func() { waits.leaseEnded(key, token, false) })
		st.end(endReleased, nil)
		return fmt.Errorf("%w (retrying in the background until the lease would run out)", e.redisErr("unlock "+strconv.Quote(st.spec.name), err))
	case err != nil:
		st.end(endReleased, nil)
		return e.redisErr("unlock "+strconv.Quote(st.spec.name), err)
	case !res.owned:
		st.end(endLost, ErrLost)
		return st.lostAtUnlock()
	}
	how := endReleased
	if res.counted && res.heard <= own {
		how = endReleasedUnheard
	}
	st.end(how, nil)
	return nil
}

// localHandoffs is how many times in a row a lock passes among one client's waiters without
// asking the server (see handOff); the next handoff asks, by handover.lua, and the server
// refuses it when other clients wait. So while other clients wait, a client holds a lock at most
// localHandoffs+1 times in a row. acquire.lua keeps the tokens it issues at least
// localHandoffs+1 (16) apart, so that the tokens T+1 … T+localHandoffs given out locally after a
// server token T stay below every later server token.
const localHandoffs = 15

// handOff passes the lock, at its last Unlock, straight to the first waiter of this client for
// the same name. It reports done = false when there is no such waiter, the deployment allows
// no handoff, or the server refused (other clients wait and this client had its turn): the
// caller then releases as usual.
//
// Most handoffs cost no round trip (a local handoff): the lock stays with this client under
// the same owner secret in Redis, and the waiter gets a lease with the next token (below every
// later token from the server: see localHandoffs) and the same deadline, renewed by the loop as
// any other. Every localHandoffs+1-th handoff, and any to a waiter whose lease differs (TTL,
// renewal, label), is a server handover: one round trip, a new owner secret and a server token,
// and the server's check that no other client waits too long.
func (e *engine) handOff(ctx context.Context, st *leaseState) (done bool, err error) {
	if !e.traits.handover || st.spec.ack.n > 0 {
		return false, nil
	}
	qs := e.waits
	q, w, streak := qs.reserveHead(st.spec.key)
	if w == nil {
		return false, nil
	}
	next := w.spec
	if next.ack.n > 0 {
		qs.settle(q, w, nil, false)
		return false, nil
	}
	if streak < localHandoffs && st.spec.renew && next.renew && next.meta == st.spec.meta && next.ttl == st.currentTTL() {
		nst := st.passOn(next, w.ctx)
		if !e.renewer.add(nst) {
			qs.settle(q, w, nil, false)
			return false, nil // the client is closing: the caller's release reports it
		}
		given := qs.settle(q, w, nst, false)
		st.end(endPassedOn, nil)
		if !given {
			(&Lease{st: nst}).Unlock(context.WithoutCancel(ctx)) // the waiter left meanwhile
		}
		return true, nil
	}
	owner := e.newOwner()
	sent := mono()
	res, err := e.b.handover(ctx, handoverArgs{
		keys: st.spec.keys, holder: st.owner, owner: owner, ttl: next.ttlArg, meta: next.meta,
		streak: streak, checkAt: localHandoffs, channel: st.spec.channel,
		mine:     e.notices.isLive(st.spec.channel), // counted by the server, as for a counted release
		holderTk: st.token,
	})
	switch {
	case err != nil:
		// Either side of the handover may have happened: release both owners' holds.
		qs.settle(q, w, nil, false)
		e.renewer.orphan(next.releaseReq(owner), next.ttl)
		return false, nil // the caller's release reports the transport error, or succeeds
	case res.refused:
		qs.settle(q, w, nil, false) // the release that follows sets q.lastEnd: see fairnessYield
		return false, nil
	case !res.ok:
		qs.settle(q, w, nil, false)
		st.end(endLost, ErrLost)
		return true, st.lostAtUnlock()
	}
	nst := newLeaseState(e, next, w.ctx, owner, res.token, sent)
	if !e.renewer.add(nst) {
		qs.settle(q, w, nil, false)
		e.renewer.orphan(next.releaseReq(owner), next.ttl)
		st.end(endReleased, nil)
		return true, nil
	}
	// The server checked for other clients' waiters (and found none) once the streak reached
	// localHandoffs: the next localHandoffs handoffs go without asking again.
	given := qs.settle(q, w, nst, streak >= localHandoffs)
	st.end(endPassedOn, nil)
	if !given {
		(&Lease{st: nst}).Unlock(context.WithoutCancel(ctx)) // the waiter left meanwhile
	}
	return true, nil
}

// passOn makes the lease of a waiter of this client (spec, Lock's context parent) that takes
// over this lease's hold on the server: same owner secret, the next token, and the deadline
// and renewal time this lease has reached.
func (st *leaseState) passOn(spec *lockSpec, parent context.Context) *leaseState {
	st.mu.Lock()
	sent := st.lastSent
	st.mu.Unlock()
	next := newLeaseState(st.e, spec, parent, st.owner, st.token+1, sent)
	next.ttl.Store(st.ttl.Load())
	next.deadline.Store(st.deadline.Load())
	return next
}

// reserveHead picks the head waiting for key, if any, as the target of a handoff, and returns
// it with its queue and the number of handoffs in a row so far.
func (qs *waitQueues) reserveHead(key string) (*queue, *waiter, int) {
	s := qs.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.m[key]
	if q == nil || len(q.waiters) == 0 {
		return nil, nil, 0
	}
	w := q.waiters[0]
	if w.reserved || w.abandoned || w.ctx.Err() != nil {
		return nil, nil, 0
	}
	w.reserved = true
	return q, w, q.streak
}

// settle ends a handoff to w: when it succeeded (st != nil), st goes to w unless w left
// meanwhile, in which case settle returns false and the caller releases st. The streak of
// handoffs in a row grows on success and restarts otherwise, or when restart is set (the
// server just checked that no other client waits).
func (qs *waitQueues) settle(q *queue, w *waiter, st *leaseState, restart bool) bool {
	s := qs.shard(q.key)
	s.mu.Lock()
	defer s.mu.Unlock()
	w.reserved = false
	if st == nil || restart {
		q.streak = 0
	} else {
		q.streak++
	}
	if st == nil {
		return true
	}
	if w.abandoned {
		return false
	}
	w.grant <- st
	return true
}
