package dlock

import (
	"context"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
)

// queues holds, per lock key, the callers of one client that wait for that lock. Only the
// head of a queue talks to Redis; the others wait their turn, so waiters of one process are
// served first-in first-out and a hot lock costs one attempt per release per process.
type queues struct {
	c      *Client
	seed   maphash.Seed
	shards [64]qshard
}

type qshard struct {
	mu sync.Mutex
	m  map[string]*queue // guarded by mu; a queue is removed when its last waiter leaves
}

type queue struct {
	c       *Client
	key     string
	channel string

	// guarded by the shard's mu
	waiters    []*waiter // waiters[0] is the head
	subscribed bool      // the notifier routes release notices for channel to this queue

	wake      chan struct{} // capacity 1: a release notice, a subscription confirmation, or a local release
	blockedOn atomic.Uint64 // token of the holder the head waits for; older release notices are ignored
	streak    int           // guarded by the shard's mu: handovers in a row within this client (see handOver)
	lastEnd   atomic.Int64  // mono ns when this client's last lease on the lock ended (0: none, or no other client heard its release)
	alone     atomic.Bool   // no other client heard this client's last release: the head tries at once
}

type waiter struct {
	turn    chan struct{} // capacity 1: receives when this waiter becomes the head
	handoff *busy         // set before turn when the previous head acquired the lock

	// Handover (Lease.Unlock passing the lock straight to the head): the head's Mutex and
	// context make its lease; grant receives it. Under the shard's mu: reserved while an
	// Unlock hands the lock over to this waiter, abandoned when it left meanwhile.
	m         *Mutex
	ctx       context.Context
	grant     chan *leaseState // capacity 1
	reserved  bool
	abandoned bool
}

func (qs *queues) init(c *Client) {
	qs.c = c
	qs.seed = maphash.MakeSeed()
	for i := range qs.shards {
		qs.shards[i].m = make(map[string]*queue)
	}
}

func (qs *queues) shard(key string) *qshard {
	return &qs.shards[maphash.String(qs.seed, key)%uint64(len(qs.shards))]
}

// waiting reports whether callers of this client wait for key.
func (qs *queues) waiting(key string) bool {
	s := qs.shard(key)
	s.mu.Lock()
	_, ok := s.m[key]
	s.mu.Unlock()
	return ok
}

// join appends a waiter to key's queue, making the queue if needed, and reports whether the
// waiter is the head.
func (qs *queues) join(m *Mutex, ctx context.Context) (*queue, *waiter, bool) {
	key, channel := m.key, m.channel
	s := qs.shard(key)
	w := &waiter{turn: make(chan struct{}, 1), m: m, ctx: ctx, grant: make(chan *leaseState, 1)}
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.m[key]
	if q == nil {
		q = &queue{c: qs.c, key: key, channel: channel, wake: make(chan struct{}, 1)}
		s.m[key] = q
	}
	q.waiters = append(q.waiters, w)
	return q, w, len(q.waiters) == 1
}

// leave removes w from q. If w was the head, the next waiter becomes the head; when w leaves
// because it acquired the lock (acquired != nil), the next head is told so and waits for that
// lease to end instead of making an attempt that must fail.
func (qs *queues) leave(q *queue, w *waiter, acquired *leaseState) (stray *leaseState) {
	s := qs.shard(q.key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if acquired == nil {
		select {
		case stray = <-w.grant: // handed over just as w gave up: the caller releases it
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
		w.abandoned = true // the Unlock handing the lock to w releases it instead
	}
	q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
	if len(q.waiters) == 0 {
		delete(s.m, q.key)
		if q.subscribed {
			q.c.notifier.remove(q.channel, q)
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
		next.handoff = &busy{pttl: acquired.currentTTL(), token: acquired.token}
	}
	next.turn <- struct{}{}
	return stray
}

// reserveHead picks the head waiting for key, if any, as the target of a handover, and returns
// it with its queue and the number of handovers in a row so far.
func (qs *queues) reserveHead(key string) (*queue, *waiter, int) {
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

// settle ends a handover to w: when it succeeded (st != nil), st goes to w unless w left
// meanwhile, in which case settle returns false and the caller releases st. The streak of
// handovers in a row grows on success and restarts otherwise, or when restart is set (the
// server just checked that no other client waits).
func (qs *queues) settle(q *queue, w *waiter, st *leaseState, restart bool) bool {
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

// notice wakes the head waiting for key if token is not older than the holder it waits for.
// alone says that no other client heard the release that ended this client's lease.
func (qs *queues) notice(key string, token uint64, alone bool) {
	s := qs.shard(key)
	s.mu.Lock()
	q := s.m[key]
	s.mu.Unlock()
	if q != nil {
		if alone {
			q.lastEnd.Store(0)
		} else {
			q.lastEnd.Store(mono())
		}
		q.alone.Store(alone)
		q.notify(token)
	}
}

// wakeAll is the token that wakes a head whatever holder it waits for.
const wakeAll = math.MaxUint64

func (q *queue) notify(token uint64) {
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

// block records the holder the head now waits for and makes sure release notices for the
// lock reach this queue. The first subscription's confirmation wakes the head, which then
// tries again: a release between its attempt and the subscription is not missed.
func (q *queue) block(token uint64) {
	q.blockedOn.Store(token)
	s := q.c.queues.shard(q.key)
	s.mu.Lock()
	if !q.subscribed {
		q.subscribed = true
		q.c.notifier.add(q.channel, q)
	}
	s.mu.Unlock()
}
