package dlock

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/internal/backend"
	"github.com/dlock-go/dlock/internal/protocol"
)

// The wait/handoff protocol, both ends. Words used for one idea each:
//
//   - queue: this client's callers waiting for one lock, first-in first-out. Only its head
//     talks to Redis; the others wait their turn.
//   - registration: the queue's entry in the lock's queue on the server (acquire.lua "q"), made
//     by the head's attempt when the lock is held, kept alive by the renewal loop. Clients are
//     served in the order they registered.
//   - grant: a release (or an acquisition that finds the lock free) gives the lock to the first
//     live registration on the server, under the owner secret it registered, and announces it;
//     the registration's client makes the lease from the announcement, with no round trip.
//   - woken: the head is told to try again (a release announced with no grant, a subscription
//     confirmation, a lease of this client ending, its registration gone).
//   - local handoff: at Unlock the lock passes to this client's head without any command.
//   - server handover: the same through handover.lua, with a new owner and token, which the
//     server refuses while other clients are registered and this client had its turn.
//   - pass on: either of the two handoffs (endPassedOn).
//
// The acquiring end is acquireWaiting (a caller that may wait) and granted (a grant
// announced); the releasing end is letGo (the last Unlock of a lease).

// waitQueues holds, per lock key, the callers of one client that wait for that lock, and the
// client's registrations by id.
type waitQueues struct {
	notices *notifier
	seed    maphash.Seed
	shards  [64]qshard

	regMu sync.Mutex
	regs  map[string]*registration // live registrations by id, for grants
	early map[string]earlyGrant    // grants announced for a registration not yet known to be on the server
}

// earlyGrant is a grant announced before the reply to the attempt that registered: the
// announcement and the reply travel on different connections. In quorum mode each server
// announces its own.
type earlyGrant struct {
	tokens []uint64      // by server; 0: none announced
	window time.Duration // the announced window (a shared lock's grant says it; a Mutex's is its registration's)
	at     int64         // mono ns of the first
}

type qshard struct {
	mu     sync.Mutex
	m      map[string]*queue   // guarded by mu; a queue is removed when its last waiter leaves
	parked map[string]*parking // guarded by mu: locks kept for a turn slice (slice.go), by key
}

type queue struct {
	key     string
	channel string

	// guarded by the shard's mu
	waiters    []*waiter     // waiters[0] is the head
	subscribed bool          // the notifier routes release notices for channel to this queue
	streak     int           // passed on in a row within this client (see handOff)
	reg        *registration // the queue's registration on the server, if any

	wake      chan struct{} // capacity 1: the head is woken
	blockedOn atomic.Uint64 // token of the holder the head waits for; older release notices are ignored
	rearm     chan struct{} // capacity 1: the lock was granted to another client until pokeAt
	pokeAt    atomic.Int64  // mono ns: when that grant's first lease runs out unless renewed
	due       atomic.Int64  // mono ns: when the head's timer fires for its next attempt (0: not set)

	// sink, when set, takes the channel's announcements and wake-ups instead: the waiters of a
	// read-write lock or semaphore (sharedwait.go).
	sink noticeSink
}

type waiter struct {
	turn   chan struct{} // capacity 1: receives when this waiter becomes the head
	holder *holder       // set before turn when the previous head acquired: wait for its release

	// A handoff or a grant makes the lease from the waiter's spec and context and sends it on
	// grant. Under the shard's mu: reserved while it is being given one, abandoned when it left
	// meanwhile.
	spec      *lockSpec
	ctx       context.Context
	grant     chan *leaseState // capacity 1
	reserved  bool
	abandoned bool
}

// registration is one entry of this client in a lock's queue on the server.
type registration struct {
	id     string // public: announced with a grant
	owner  string // secret: the holder a grant installs
	spec   *lockSpec
	window time.Duration // acceptance window: the entry's life unless refreshed, a grant's first lease
	winArg string
	place  string // the entry's place in the queue on every server (quorum mode); "" for one server

	// sentOn[i]: mono ns, the send time of the newest request that made or refreshed the entry
	// on server i and succeeded there (0: none yet). One server: sentOn[0].
	sentOn []atomic.Int64
	// seenOn[i]: the largest token of another holder that an attempt under the registration saw
	// on server i. A grant announced with a token not above it is stale: it was made before
	// that attempt and has lapsed (the attempt found someone else holding the lock), and the
	// attempt queued the entry again under the same id.
	seenOn    []atomic.Uint64
	lease     atomic.Int64  // adaptive lease: what its last attempt was told a grant is renewed to (ns)
	state     atomic.Int32  // regNew, regQueued, regDone
	grantedOn atomic.Uint64 // the servers that announced a grant to it
	token     atomic.Uint64 // the largest token they announced

	// guarded by the queue's shard mu
	q       *queue
	pending *leaseState // granted before the registration had a queue to go to

	// owned by the renewer, under renewer.mu
	idx int
	due int64

	// waiter: the one caller a read-write lock's or semaphore's registration is for
	// (sharedwait.go), to whom a grant goes; nil for a Mutex's, whose grant goes to the head of
	// its client's queue.
	waiter *sharedWaiter

	// fresh: made for a waiting caller's first attempt (firstRegistration), and known to
	// nobody else until the server queues it.
	fresh bool
	// sentOn1, seenOn1: sentOn and seenOn with one server, without allocations of their own.
	sentOn1 [1]atomic.Int64
	seenOn1 [1]atomic.Uint64
}

const (
	regNew    int32 = iota // made for an attempt, not yet on the server
	regQueued              // on the server (as far as this client knows)
	regDone                // granted, claimed or left: nothing more to do for it
)

// acceptWindow is the acceptance window of a registration for a lease of ttl: a client that
// crashed while queued delays the others by at most this much, and a grant's lease lasts this
// long before its client renews it to ttl. Its entry is refreshed every third of it.
func acceptWindow(ttl time.Duration) time.Duration { return min(ttl, time.Second) }

func newWaitQueues(n *notifier) *waitQueues {
	qs := &waitQueues{notices: n, seed: maphash.MakeSeed(), regs: make(map[string]*registration), early: make(map[string]earlyGrant)}
	for i := range qs.shards {
		qs.shards[i].m = make(map[string]*queue)
	}
	return qs
}

func (qs *waitQueues) shard(key string) *qshard {
	return &qs.shards[maphash.String(qs.seed, key)%uint64(len(qs.shards))]
}

// localWaiters returns how many callers of this client wait for key.
func (qs *waitQueues) localWaiters(key string) int {
	s := qs.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.m[key]; q != nil {
		return len(q.waiters)
	}
	return 0
}

// entryWaiters returns how many callers of this client wait behind reg (its queue's): the
// count its queue entry carries (docs/PROTOCOL.md, "The queue"). At least 1: an entry is
// refreshed only while someone waits.
func (qs *waitQueues) entryWaiters(reg *registration) int {
	s := qs.shard(reg.spec.key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := reg.q; q != nil {
		return max(len(q.waiters), 1)
	}
	return 1
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

// attemptFunc makes one attempt to take a lock: the lease, or the holder that refused it. With
// a registration it queues the client on the server under it when the lock is held.
type attemptFunc func(ctx context.Context, reg *registration) (*leaseState, holder, error)

// newRegistration makes a registration for the lock of spec, not yet on the server.
func (e *engine) newRegistration(spec *lockSpec) *registration {
	reg := &registration{}
	e.initRegistration(reg, e.clientID+"."+strconv.FormatUint(e.seq.Add(1), 10), spec)
	return reg
}

// initRegistration makes *reg a registration with entry id for the lock of spec, with a new
// owner secret, not yet on the server.
func (e *engine) initRegistration(reg *registration, id string, spec *lockSpec) {
	w := acceptWindow(spec.leastTTL())
	*reg = registration{id: id, owner: e.newOwner(), spec: spec, window: w, winArg: spec.winArg(w), idx: -1}
	if n := e.traits.Servers; n == 1 {
		reg.sentOn, reg.seenOn = reg.sentOn1[:], reg.seenOn1[:]
	} else {
		reg.sentOn, reg.seenOn = make([]atomic.Int64, n), make([]atomic.Uint64, n)
	}
	if e.traits.Majority > 1 {
		// The same place on every server: clients registered on them all are ordered the same
		// way everywhere, so that the servers grant the lock to the same one.
		reg.place = strconv.FormatInt(time.Now().UnixMicro(), 10)
	}
}

// acquireWaiting takes spec's lock for a caller that may wait. With callers of this client
// already queued for it, it joins the queue at once (its attempt could only fail); else it
// tries, registering on the server if the lock is held, and queues.
func (e *engine) acquireWaiting(ctx context.Context, spec *lockSpec, attempt attemptFunc) (*leaseState, error) {
	if e.waits.queued(spec.key) {
		return e.waitInQueue(ctx, spec, nil, nil, attempt)
	}
	var reg *registration
	if e.traits.Queue {
		reg = e.firstRegistration(spec)
	}
	st, h, err := attempt(ctx, reg)
	if st != nil && reg != nil && reg.fresh && reg.state.Load() == regDone {
		e.spareRegs.Put(reg) // taken at once: the entry was never queued
	}
	if h, err = waitThrough(h, err); err != nil || st != nil {
		return st, err
	}
	if reg != nil {
		reg.fresh = false // the waiters' queue adopts it: others may use it from now on
	}
	return e.waitInQueue(ctx, spec, &h, reg, attempt)
}

// winArg is the acceptance window w in ms, as the scripts take it: without formatting the usual
// one (a second) again for every registration.
func (spec *lockSpec) winArg(w time.Duration) string {
	if w == time.Second {
		return "1000"
	}
	return protocol.Millis(w)
}

// firstRegistration is the registration of a waiting caller's first attempt, which nobody else
// knows of until the server queues it. With one server, one that an earlier first attempt used
// without being queued (it took the lock) serves again, with a new owner secret: its id never
// reached a queue, so no grant or entry can name it. Most Locks find the lock free, and an
// uncontended Lock then builds no registration.
func (e *engine) firstRegistration(spec *lockSpec) *registration {
	if e.traits.Servers != 1 {
		return e.newRegistration(spec)
	}
	reg, _ := e.spareRegs.Get().(*registration)
	if reg == nil {
		reg = e.newRegistration(spec)
	} else {
		e.initRegistration(reg, reg.id, spec)
	}
	reg.fresh = true
	return reg
}

// noQuorumRetry is how long a waiting Lock in quorum mode waits before trying again when too
// few servers answered.
const noQuorumRetry = 100 * time.Millisecond

// waitThrough turns an attempt's failure that a waiting Lock waits through (too few servers of
// a quorum answered) into a pause.
func waitThrough(h holder, err error) (holder, error) {
	if errors.Is(err, ErrNoQuorum) {
		return holder{pttl: noQuorumRetry}, nil
	}
	return h, err
}

// refreshedOn records that the servers in mask (bit i: server i) made or refreshed reg's
// entry at sent or later.
func (reg *registration) refreshedOn(mask uint64, sent int64) {
	for i := range reg.sentOn {
		if mask&(1<<i) == 0 {
			continue
		}
		for {
			old := reg.sentOn[i].Load()
			if sent <= old || reg.sentOn[i].CompareAndSwap(old, sent) {
				break
			}
		}
	}
}

// validFrom returns the earliest of the send times on the servers in mask: the lease a grant
// from each of them started is valid from then (false: one of them has none).
func (reg *registration) validFrom(mask uint64) (int64, bool) {
	from := int64(-1)
	for i := range reg.sentOn {
		if mask&(1<<i) == 0 {
			continue
		}
		t := reg.sentOn[i].Load()
		if t == 0 {
			return 0, false
		}
		if from < 0 || t < from {
			from = t
		}
	}
	return from, from >= 0
}

// registered records that the servers in mask have reg (its attempt, sent at sent, was refused
// and queued the client; tokens[i]: the holder's token on server i), so that a grant to it is
// recognised and the renewal loop keeps it alive.
func (e *engine) registered(reg *registration, sent int64, mask uint64, tokens []uint64) {
	for i, t := range tokens {
		if i < len(reg.seenOn) {
			atomicMax(&reg.seenOn[i], t)
		}
	}
	reg.refreshedOn(mask, sent)
	if !reg.state.CompareAndSwap(regNew, regQueued) {
		return
	}
	e.waits.regMu.Lock()
	e.waits.regs[reg.id] = reg
	g, early := e.waits.early[reg.id]
	delete(e.waits.early, reg.id)
	e.waits.regMu.Unlock()
	e.renewer.addEntry(reg)
	if early {
		for server, token := range g.tokens {
			if token != 0 {
				e.granted(reg.id, token, server, g.window)
			}
		}
	}
}

// registeredLate records that server queued reg (holder's token there: token) in answer to an
// attempt sent at sent, after that attempt was decided (quorum mode): a grant from that server
// then counts without a claim.
func (e *engine) registeredLate(reg *registration, sent int64, server int, token uint64) {
	if server >= len(reg.sentOn) || reg.state.Load() != regQueued {
		return
	}
	atomicMax(&reg.seenOn[server], token)
	reg.refreshedOn(1<<server, sent)
}

// waitInQueue queues behind this client's other waiters for the lock, then, as the head,
// alternates attempts with waiting for a grant, to be woken, or for the holder's lease to run
// out. known, when set, is the answer of an attempt made just before, with reg the
// registration it used.
func (e *engine) waitInQueue(ctx context.Context, spec *lockSpec, known *holder, reg *registration, attempt attemptFunc) (*leaseState, error) {
	qs := e.waits
	q, w, n := qs.join(spec, ctx)
	head := n == 1
	if o := e.obs; o != nil {
		o.waiting(ctx, spec, true, n) // as it joined: later joiners report their own count
	}
	var got *leaseState // when set, the next head waits for this lease to end
	defer func() { e.leaveQueue(ctx, spec, q, w, got) }()
	if reg != nil {
		if st := e.adopt(q, reg, ctx); st != nil && e.takeable(st) {
			got = st
			return e.confirmed(ctx, st)
		}
	}
	if !head {
		st, err := e.awaitTurn(ctx, spec, w)
		if st != nil || err != nil {
			got = st
			return e.confirmedOrErr(ctx, st, err)
		}
		known = w.holder // the previous head just took the lock: wait for its release
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case st := <-w.grant: // passed on by this client's holder, or granted by the server
			if e.takeable(st) {
				got = st
				return e.confirmed(ctx, got)
			}
			known = nil // attempt again at once
		default:
		}
		var h holder
		if known != nil {
			h, known = *known, nil
		} else {
			q.drain()
			st, hh, err := attempt(ctx, e.headRegistration(q, spec))
			if hh, err = waitThrough(hh, err); err != nil || st != nil {
				got = st
				return e.confirmedOrErr(ctx, st, err)
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
		for {
			q.due.Store(mono() + int64(d))
			st, rearmed, err := e.pauseHead(ctx, w, q, timer, d)
			if err == nil && st == nil {
				err = e.notices.deniedErr()
			}
			if err != nil || (st != nil && e.takeable(st)) {
				got = st
				return e.confirmedOrErr(ctx, st, err)
			}
			if st != nil || !rearmed {
				break // woken, the timer fired, or a lease came that had run out: attempt
			}
			// Granted to another client: try again only if its first lease runs out (a
			// grantee that crashed renews nothing), or when woken.
			d = time.Duration(q.pokeAt.Load()-mono()) + time.Millisecond
		}
	}
}

// leaveQueue takes waiter w out of this client's queue q for spec's lock when its wait ends,
// with got the lease it got (nil: none). A lease handed to it meanwhile is given back; when it
// was the last waiter, its client no longer wants the lock once this lease ends, and its entry
// on the server goes with the lease's release (before the release grants the lock), or now when
// it did not get the lock.
func (e *engine) leaveQueue(ctx context.Context, spec *lockSpec, q *queue, w *waiter, got *leaseState) {
	qs := e.waits
	stray, left := qs.leave(q, w, got)
	if o := e.obs; o != nil {
		o.waiting(ctx, spec, false, qs.localWaiters(spec.key))
	}
	if stray != nil {
		(&Lease{st: stray}).Unlock(context.WithoutCancel(ctx))
	}
	if left != nil && (got == nil || !got.keepQueued(left)) {
		e.unregister(left)
	}
}

// awaitTurn waits until waiter w, queued behind other callers of this client, becomes the head
// (nil, nil), or is handed a live lease, or its wait ends (the error).
func (e *engine) awaitTurn(ctx context.Context, spec *lockSpec, w *waiter) (*leaseState, error) {
	for {
		select {
		case <-w.turn:
			return nil, nil
		case st := <-w.grant:
			if e.takeable(st) {
				return st, nil
			}
			// It ran out before it reached this waiter, which is the head now (its turn is on
			// its way).
		case <-ctx.Done():
			return nil, spec.ctxErr(ctx)
		case <-e.done:
			return nil, ErrClosed
		}
	}
}

// takeable reports whether st, a lease given to a waiter (a grant from the server, or a
// handoff within this client), is still live, and so may be returned by Lock. A lease that
// ran out before the waiter took it (its process was paused past the grant's acceptance
// window: the grant lapsed on the server, which may have granted the lock to the next client
// since) is discarded instead: ended here, left to run out on the server. The waiter then
// attempts again.
func (e *engine) takeable(st *leaseState) bool {
	if st.state.Load() == stateHeld && mono() < st.deadline.Load() {
		return true
	}
	// Never returned to anyone: no loss to report. Nothing is released on the server: the
	// grant's lease there ends by itself about when this deadline passed, and a release by its
	// owner could instead end a newer lease of the same owner (an attempt under the same
	// registration that was on its way when the stale grant's announcement was read).
	st.end(endReleased, nil)
	return false
}

func (e *engine) confirmedOrErr(ctx context.Context, st *leaseState, err error) (*leaseState, error) {
	if err != nil {
		return nil, err
	}
	return e.confirmed(ctx, st)
}

// confirmed returns st, a lease just taken, once it counts: a lease granted by the server for a
// lock with WithReplicaAck is renewed at once and counts only once enough replicas have it
// (else it is released again, as an acquisition is). Every other lease counts as it is.
func (e *engine) confirmed(ctx context.Context, st *leaseState) (*leaseState, error) {
	if st == nil || st.spec.ack.N == 0 || !st.confirm.Load() {
		return st, nil
	}
	sent := mono()
	res := e.b.Renew(ctx, backend.Round{Leases: []backend.Renewal{st.renewalTo(st.fullTTLArg())}})
	out := res.Leases[0]
	if out.OK && st.state.Load() == stateHeld && st.renewed(sent, st.fullTTL()) {
		st.confirm.Store(false)
		e.renewer.reschedule(st)
		return st, nil
	}
	(&Lease{st: st}).Unlock(context.WithoutCancel(ctx))
	if out.Err == nil {
		return nil, fmt.Errorf("%w: lock %q: granted, but the grant had lapsed on the server before it could be confirmed",
			ErrLost, st.spec.name)
	}
	if out.Err == backend.ErrNotAcked {
		return nil, fmt.Errorf("%w: lock %q: granted, but fewer than %d replicas acknowledged it within %v; released again",
			ErrReplicaAck, st.spec.name, st.spec.ack.N, st.spec.ack.Wait)
	}
	return nil, e.redisErr("lock "+strconv.Quote(st.spec.name), out.Err)
}

// pause waits, as the head of a queue, for d to pass, to be woken (when wake is not nil), or
// for a lease given to w. It returns that lease, or an error when ctx ends or the client
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

// pauseHead waits, as the head of q, for d to pass, to be woken, or for a lease given to w. It
// reports rearmed when the lock was granted to another client meanwhile (q.pokeAt says until
// when), and returns the lease, or an error when ctx ends or the client closes.
func (e *engine) pauseHead(ctx context.Context, w *waiter, q *queue, timer *time.Timer, d time.Duration) (*leaseState, bool, error) {
	timer.Reset(d)
	defer timer.Stop()
	select {
	case <-q.wake:
	case <-q.rearm:
		return nil, true, nil
	case st := <-w.grant:
		return st, false, nil
	case <-timer.C:
	case <-ctx.Done():
		return nil, false, w.spec.ctxErr(ctx)
	case <-e.done:
		return nil, false, ErrClosed
	}
	return nil, false, nil
}

// join appends a waiter to key's queue, making the queue if needed, and reports how many wait
// in it now (1: the waiter is the head).
func (qs *waitQueues) join(spec *lockSpec, ctx context.Context) (*queue, *waiter, int) {
	s := qs.shard(spec.key)
	w := &waiter{turn: make(chan struct{}, 1), spec: spec, ctx: ctx, grant: make(chan *leaseState, 1)}
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.m[spec.key]
	if q == nil {
		q = &queue{key: spec.key, channel: spec.grants, wake: make(chan struct{}, 1), rearm: make(chan struct{}, 1)}
		s.m[spec.key] = q
	}
	q.waiters = append(q.waiters, w)
	return q, w, len(q.waiters)
}

// adopt makes reg, registered by an attempt made before its caller (context ctx) queued, the
// registration of q, unless q has one already (reg is then withdrawn). It returns the lease of
// a grant to reg that came meanwhile.
func (e *engine) adopt(q *queue, reg *registration, ctx context.Context) *leaseState {
	s := e.waits.shard(q.key)
	s.mu.Lock()
	reg.q = q // from now on a grant goes to q's head
	if st := reg.pending; st != nil {
		reg.pending = nil
		s.mu.Unlock()
		st.mu.Lock()
		if st.ctx == nil {
			st.parent = ctx
		}
		st.mu.Unlock()
		return st
	}
	redundant := false
	switch {
	case reg.state.Load() != regQueued:
	case q.reg == nil:
		q.reg = reg
	default:
		redundant = true
	}
	s.mu.Unlock()
	if redundant {
		e.unregister(reg)
	}
	return nil
}

// headRegistration returns the registration the head of q attempts with: q's, or a new one. A
// registration made for a lease other than spec asks (TTL, label, renewal) is dropped for a
// new one.
func (e *engine) headRegistration(q *queue, spec *lockSpec) *registration {
	if !e.traits.Queue {
		return nil
	}
	s := e.waits.shard(q.key)
	s.mu.Lock()
	reg := q.reg
	place := ""
	if reg != nil && (reg.state.Load() == regDone || !sameLease(reg.spec, spec)) {
		q.reg = nil
		if reg.state.Load() != regDone {
			defer e.unregister(reg)
		}
		place = reg.place // a registration retired after a split keeps the client's place
		reg = nil
	}
	if reg == nil {
		reg = e.newRegistration(spec)
		if place != "" {
			reg.place = place
		}
		reg.q = q
		q.reg = reg
	}
	s.mu.Unlock()
	return reg
}

// sameLease reports whether a lock taken for a asks for the same lease as one for b: a lease
// made for one can serve the other.
func sameLease(a, b *lockSpec) bool {
	return a.ttl == b.ttl && a.renew == b.renew && a.meta == b.meta && a.ack == b.ack && a.adapt.same(b.adapt)
}

// leaseDiff says how a lock taken for b asks for another lease than one taken for a.
func leaseDiff(a, b *lockSpec) string {
	switch {
	case a.ttl != b.ttl:
		return fmt.Sprintf("WithTTL %v differs from the held lease's %v", b.ttl, a.ttl)
	case a.renew != b.renew:
		return fmt.Sprintf("renewal %v differs from the held lease's %v (WithoutRenewal)", b.renew, a.renew)
	case a.meta != b.meta:
		return "WithLabel differs from the held lease's"
	case a.ack != b.ack:
		return "WithReplicaAck differs from the held lease's"
	case !a.adapt.same(b.adapt):
		return "WithAdaptiveTTL differs from the held lease's"
	}
	return "same lease"
}

// leave removes w from q. If w was the head, the next waiter becomes the head; when w leaves
// because it acquired the lock (acquired != nil), the next head is told so and waits for that
// lease to end instead of making an attempt that must fail. It returns a lease given to w
// just as it gave up, for the caller to release, and the queue's registration when the queue
// ended with it, for the caller to withdraw.
func (qs *waitQueues) leave(q *queue, w *waiter, acquired *leaseState) (stray *leaseState, reg *registration) {
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
		return stray, nil
	}
	if w.reserved {
		w.abandoned = true // the Unlock (or grant) giving w the lock releases it instead
	}
	q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
	if len(q.waiters) == 0 {
		delete(s.m, q.key)
		if q.subscribed {
			qs.notices.remove(q.channel, q)
		}
		reg, q.reg = q.reg, nil
		return stray, reg
	}
	if i != 0 {
		return stray, nil
	}
	next := q.waiters[0]
	if acquired != nil {
		q.blockedOn.Store(acquired.token)
		q.drain()
		next.holder = &holder{pttl: acquired.currentTTL(), token: acquired.token}
	}
	next.turn <- struct{}{}
	return stray, nil
}

// keepQueued gives st the registration of the queue its waiter left last, to withdraw with the
// lease's release; false when st has ended already.
func (st *leaseState) keepQueued(reg *registration) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.state.Load() != stateHeld || st.queued != nil {
		return false
	}
	st.queued = reg
	return true
}

// takeQueued returns and forgets the registration st keeps, if any.
func (st *leaseState) takeQueued() *registration {
	st.mu.Lock()
	defer st.mu.Unlock()
	reg := st.queued
	st.queued = nil
	return reg
}

// withdrawn marks reg withdrawn by the caller's release (release.lua's leave argument); false
// when it was not on the server or is done with already.
func (e *engine) withdrawn(reg *registration) bool {
	if !reg.state.CompareAndSwap(regQueued, regDone) {
		reg.state.CompareAndSwap(regNew, regDone)
		return false
	}
	e.waits.regMu.Lock()
	delete(e.waits.regs, reg.id)
	e.waits.regMu.Unlock()
	e.renewer.removeEntry(reg)
	return true
}

// unregister withdraws reg from the servers, in the background: release.lua under its owner
// drops the entry, releases the owner's hold and gives back a grant made to it that nobody
// took. A registration not yet known to be queued (its attempt failed, or its reply was lost)
// is withdrawn all the same: the attempt's script may have queued it on some server, which
// would later grant the lock to an owner nobody holds. It reports false when reg was done with
// already (granted, claimed or withdrawn).
func (e *engine) unregister(reg *registration) bool {
	if !reg.state.CompareAndSwap(regQueued, regDone) {
		if !reg.state.CompareAndSwap(regNew, regDone) {
			return false
		}
	} else {
		e.waits.regMu.Lock()
		delete(e.waits.regs, reg.id)
		e.waits.regMu.Unlock()
		e.renewer.removeEntry(reg)
	}
	req := reg.spec.releaseReq(reg.owner)
	req.Leave = reg.id
	e.renewer.background(release{req: req, at: mono(), until: mono() + 2*int64(reg.window)})
	return true
}

// block records the holder the head now waits for and makes sure release notices for the
// lock reach the queue. The first subscription's confirmation wakes the head, which then
// tries again: a release (or grant) between its attempt and the subscription is not missed.
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
	if q.sink != nil {
		q.sink.wake()
		return
	}
	if token < q.blockedOn.Load() {
		return
	}
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// heldBy records that the lock was granted with token for window: release notices older than
// it are stale, and the head, which keeps waiting for its own grant, re-arms its timer to the
// end of the grant's first lease.
func (q *queue) heldBy(token uint64, window time.Duration) {
	for {
		old := q.blockedOn.Load()
		if token <= old || q.blockedOn.CompareAndSwap(old, token) {
			break
		}
	}
	q.pokeAt.Store(mono() + int64(window))
	select {
	case q.rearm <- struct{}{}:
	default:
	}
}

func (q *queue) drain() {
	select {
	case <-q.wake:
	default:
	}
}

// granted takes a grant announced for registration id with token by server (0 on one server),
// whose first lease is window (a Mutex's grant: its registration's window). It is the one
// entry point of grants of every kind: this client's registrations are in one table
// (waitQueues.regs), a grant not above the newest token an attempt under the registration saw
// is stale for every kind, and a read-write lock's or semaphore's grant then goes to its one
// waiter (sharedWaits.grantTo). A Mutex's, once a majority of servers granted it (the one server, or in quorum mode a majority), it makes
// the lease, which the renewal loop renews to its TTL, and gives it to the queue's head, with no
// round trip: each granting server started its lease (the window) after it executed the request
// that last refreshed the entry there, so the earliest of their send times bounds them all. A
// grant nobody waits for any more is released again. It runs in the subscription's goroutine
// and does no I/O.
func (e *engine) granted(id string, token uint64, server int, window time.Duration) {
	qs := e.waits
	reg := e.grantee(id, token, server, window)
	if reg == nil || server >= len(reg.sentOn) {
		return // not this client's, or done with already
	}
	if token <= reg.seenOn[server].Load() {
		// Made before an attempt that found another holder: the grant lapsed while this client
		// could not act on it (paused past its window), and the attempt queued the same entry
		// again. Dating a lease from that attempt would make one holder too many.
		return
	}
	if reg.waiter != nil {
		e.sharedWaits.grantTo(reg.waiter, token, window)
		return
	}
	atomicMax(&reg.token, token)
	mask := reg.grantedOn.Or(1<<server) | 1<<server
	if n := bits.OnesCount64(mask); n < e.traits.Majority {
		if n == 1 {
			// In case the other servers' grants never come: the head then claims what it has
			// with an attempt, and gives it back if that is not a majority.
			qs.pokeSoon(reg, backend.QuorumTimeout(reg.spec.ttl))
		}
		return
	}
	from, known := reg.validFrom(mask)
	if !known {
		qs.entryGone(reg) // a server granted before this client knew it queued there: claim
		return
	}
	if !reg.state.CompareAndSwap(regQueued, regDone) {
		return // claimed by an attempt already, or made already
	}
	qs.regMu.Lock()
	delete(qs.regs, id)
	qs.regMu.Unlock()
	e.renewer.removeEntry(reg)
	st := e.grantLease(reg, from)
	s := qs.shard(reg.spec.key)
	s.mu.Lock()
	q := reg.q
	var w *waiter
	if q != nil {
		if q.reg == reg {
			q.reg = nil
		}
		if len(q.waiters) > 0 && !q.waiters[0].reserved && !q.waiters[0].abandoned {
			w = q.waiters[0]
			w.reserved = true
		}
	} else {
		reg.pending = st // the attempt that registered it has not queued yet: adopt hands it over
	}
	s.mu.Unlock()
	if w != nil {
		st.parent = w.ctx
	}
	if !e.renewer.add(st) {
		if w != nil {
			qs.settle(q, w, nil, false)
		}
		return // closing: the servers' leases run out within the window
	}
	if q == nil {
		return
	}
	if w == nil || !qs.settle(q, w, st, true) {
		// Nobody to give it to: give it back, which grants it to the next client.
		st.end(endReleased, nil)
		e.renewer.background(release{req: st.releaseReq(true), at: mono(), until: mono() + int64(reg.window)})
	}
}

// grantee returns this client's registration that the grant announced to entry id (by server,
// with token) is for, or nil. A grant to an entry of this client not known yet (the reply to
// the attempt that registered it is still on its way) is kept for registered to take from
// there; kept grants older than a few windows are stale.
func (e *engine) grantee(id string, token uint64, server int, window time.Duration) *registration {
	qs := e.waits
	qs.regMu.Lock()
	defer qs.regMu.Unlock()
	reg := qs.regs[id]
	if reg != nil || server >= e.traits.Servers || !strings.HasPrefix(id, e.clientID+".") {
		return reg
	}
	now := mono()
	if len(qs.early) >= 64 {
		for k, g := range qs.early {
			if now-g.at > int64(10*time.Second) {
				delete(qs.early, k)
			}
		}
	}
	g, ok := qs.early[id]
	if !ok {
		g = earlyGrant{tokens: make([]uint64, e.traits.Servers), at: now}
	}
	g.tokens[server] = max(g.tokens[server], token)
	g.window = max(g.window, window)
	qs.early[id] = g
	return nil
}

// grantLease makes the lease a grant to reg gives, valid from from: for the acceptance window,
// which the renewal loop renews to the lease's TTL before a third of it has passed (at once for
// a fixed lease, which is not renewed later).
func (e *engine) grantLease(reg *registration, from int64) *leaseState {
	st := newLeaseState(e, reg.spec, context.Background(), reg.owner, reg.token.Load(), from)
	if l := reg.lease.Load(); l > 0 {
		st.adaptMS = int32(time.Duration(l) / time.Millisecond)
	}
	if e.traits.Servers > 1 {
		// The servers that did not grant it (yet) still queue the entry: its release drops it.
		st.leave = reg.id
	}
	st.ttl.Store(int64(reg.window))
	st.deadline.Store(from + int64(reg.window-drift(reg.window)))
	st.confirm.Store(true)
	return st
}

// atomicMax raises v to t if t is larger.
func atomicMax(v *atomic.Uint64, t uint64) {
	for {
		old := v.Load()
		if t <= old || v.CompareAndSwap(old, t) {
			return
		}
	}
}

// claimed records that an attempt under reg found the lock granted to it (the announcement
// was missed, or has not arrived): it reports false when the announcement came first and the
// lease is already on its way to the head.
func (e *engine) claimed(reg *registration) bool {
	if !reg.state.CompareAndSwap(regQueued, regDone) && !reg.state.CompareAndSwap(regNew, regDone) {
		return false
	}
	e.waits.regMu.Lock()
	delete(e.waits.regs, reg.id)
	e.waits.regMu.Unlock()
	e.renewer.removeEntry(reg)
	s := e.waits.shard(reg.spec.key)
	s.mu.Lock()
	if q := reg.q; q != nil && q.reg == reg {
		q.reg = nil
	}
	s.mu.Unlock()
	return true
}

// entryGone is told by the renewal loop that reg's entry is no longer on the server: granted
// (the announcement is on its way, or was missed) or expired. The head tries again: it claims
// the grant, or registers anew.
func (qs *waitQueues) entryGone(reg *registration) {
	s := qs.shard(reg.spec.key)
	s.mu.Lock()
	q := reg.q
	s.mu.Unlock()
	if q != nil {
		q.wakeHead(anyToken)
	}
}

// lockEnds is told by the renewal loop that the lock reg's entry waits for may be free at
// mono time at (its holder's lease, or a grant to another entry, runs out then; at or before
// now: it is free). When the head's timer is set for later, the head attempts at at instead:
// the lock may have been granted to a client that died waiting, which renews nothing, and
// whose grant only an attempt passes on (docs/PROTOCOL.md, "The queue"). A client that heard
// no announcement of that grant (it is not queued right behind the grantee) would otherwise
// wait for the last holder's lease it saw, up to the TTL.
func (qs *waitQueues) lockEnds(reg *registration, at int64) {
	s := qs.shard(reg.spec.key)
	s.mu.Lock()
	q := reg.q
	s.mu.Unlock()
	if q == nil || q.sink != nil {
		return
	}
	if due := q.due.Load(); due == 0 || at+int64(time.Millisecond) >= due {
		return
	}
	q.pokeAt.Store(at)
	select {
	case q.rearm <- struct{}{}:
	default:
	}
}

// pokeSoon makes the head of reg's queue try again after d, unless woken before.
func (qs *waitQueues) pokeSoon(reg *registration, d time.Duration) {
	s := qs.shard(reg.spec.key)
	s.mu.Lock()
	q := reg.q
	s.mu.Unlock()
	if q == nil {
		return
	}
	q.pokeAt.Store(mono() + int64(d))
	select {
	case q.rearm <- struct{}{}:
	default:
	}
}

// ---- The releasing end ----

// leaseEnded wakes the head waiting for key when a lease of this client on it ended (released,
// lost or closed).
func (qs *waitQueues) leaseEnded(key string, token uint64) {
	s := qs.shard(key)
	s.mu.Lock()
	q := s.m[key]
	s.mu.Unlock()
	if q != nil {
		q.wakeHead(token)
	}
}

// letGo ends the last hold of st: it passes the lock to this client's first waiter for it
// (handOff), or releases it on the server, which grants it to the first client registered
// for it or announces it free. A release that fails on the network is retried in the
// background until it succeeds or the lease would have run out anyway.
func (e *engine) letGo(ctx context.Context, st *leaseState) error {
	if done, err := e.handOff(ctx, st); done {
		return err
	}
	req := e.leavingQueue(st, st.recordHold(st.releaseReq(true)))
	res, err := e.b.Release(ctx, req)
	return e.afterRelease(st, req, res, err)
}

// localHandoffs is how many times in a row a lock passes among one client's waiters without
// asking the server (see handOff); the next handoff asks, by handover.lua, and the server
// refuses it while other clients are registered for the lock. So while other clients wait, a
// client holds a lock at most localHandoffs+1 times in a row. acquire.lua keeps the tokens it
// issues at least localHandoffs+1 (16) apart, so that the tokens T+1 … T+localHandoffs given
// out locally after a server token T stay below every later server token.
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
	if !e.traits.LocalHandoffs || st.spec.ack.N > 0 || st.spec.adapt.on() || st.spec.shared != nil {
		return false, nil // an adaptive lock: every hold goes through the server, which measures it; a read-write lock or semaphore: no local handoffs
	}
	qs := e.waits
	q, w, streak := qs.reserveHead(st.spec.key)
	if w == nil {
		return e.park(st), nil // kept for the rest of the turn (WithTurnSlice), or released
	}
	next := w.spec
	if next.ack.N > 0 || next.adapt.on() {
		qs.settle(q, w, nil, false)
		return false, nil
	}
	if streak < localHandoffs && st.local < localHandoffs && st.spec.renew && next.renew && next.meta == st.spec.meta && next.ttl == st.currentTTL() {
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
	if !e.traits.Handover {
		qs.settle(q, w, nil, false) // the release that follows lets every client compete
		return false, nil
	}
	owner := e.newOwner()
	sent := mono()
	res, err := e.b.Handover(ctx, protocol.HandoverArgs{
		Keys: st.spec.keys, Holder: st.owner, Owner: owner, TTL: next.ttlArg, Meta: next.meta,
		Streak: streak, CheckAt: localHandoffs, Client: e.clientID, HolderToken: st.token,
	})
	switch {
	case err != nil:
		// Either side of the handover may have happened: release both owners' holds.
		qs.settle(q, w, nil, false)
		e.renewer.orphan(next.releaseReq(owner), next.ttl)
		return false, nil // the caller's release reports the transport error, or succeeds
	case res.Refused:
		qs.settle(q, w, nil, false) // the release that follows grants it to the first client queued
		return false, nil
	case !res.OK:
		qs.settle(q, w, nil, false)
		st.end(endLost, st.lost("the server no longer had it for this lease at Unlock"))
		return true, st.lostAtUnlock()
	}
	nst := newLeaseState(e, next, w.ctx, owner, res.Token, sent)
	if !e.renewer.add(nst) {
		qs.settle(q, w, nil, false)
		e.renewer.orphan(next.releaseReq(owner), next.ttl)
		st.end(endReleased, nil)
		return true, nil
	}
	// The server checked for other clients (and found none) once the streak reached
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
	next.local, next.turn = st.local+1, st.turn
	if next.rec != nil {
		next.rec.local = true
	}
	next.leave = st.leave
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

// settle ends giving the lock to w: when it succeeded (st != nil), st goes to w unless w left
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
