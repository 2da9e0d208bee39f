package dlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/backend"
	"github.com/dlock-go/dlock/internal/protocol"
)

// Mutex is a handle on one named lock. It is cheap to make (no I/O) and safe for concurrent
// use; each Lock or TryLock that succeeds returns its own Lease.
type Mutex struct {
	e    *engine
	name string
	spec *lockSpec
	err  error // bad name or option, reported by Lock and TryLock

	own lockSpec // what spec points to: one allocation for the handle and its spec
}

// lockSpec is what a lock handle resolved from its name and options: its key and channel, its
// lease and the holder description it stores. Leases and waiters point to it.
type lockSpec struct {
	name    string
	key     string   // protocol.LockKey: the name is the cluster hash tag
	keys    []string // key and its queue keys, for script calls
	keyArr  [3]string
	channel string // where releases are announced to listeners other than waiting clients
	grants  string // where this client hears grants and wake-ups for this lock
	ttl     time.Duration
	ttlArg  string // ttl in ms, as the scripts take it
	renew   bool
	meta    string
	ack     backend.ReplicaAck
	wait    time.Duration        // WithWait: how long Lock waits; negative: as long as its context allows
	shared  *protocol.SharedSpec // a read-write lock's or semaphore's hold (shared.go); nil for a Mutex
	adapt   *adaptiveLock        // WithAdaptiveTTL (adaptive.go; ttl is then its greatest lease); nil: a fixed lease
	slice   time.Duration        // WithTurnSlice (slice.go); 0: released at every Unlock
}

// Mutex returns a handle on the lock called name. Options override the client's defaults for
// this lock. An invalid name or option is reported by Lock and TryLock.
func (c *Client) Mutex(name string, opts ...Option) *Mutex {
	m := &Mutex{name: name}
	if c == nil {
		m.err = fmt.Errorf("%w: nil client", ErrInvalid)
		return m
	}
	m.e = c.e
	o := c.opts.with(opts)
	m.err = o.err
	if m.err == nil && o.adapt.on() {
		m.err = checkAdaptive(o.adapt, o.renew)
	}
	if m.err == nil {
		m.err = checkTTL(o.ttl, o.renew)
	}
	if m.err == nil && o.ackN > 0 && !c.e.traits.ReplicaAck {
		m.err = fmt.Errorf("%w: WithReplicaAck is not available in quorum mode", ErrInvalid)
	}
	if m.err == nil {
		m.err = checkSlice(o, c.e)
	}
	if err := checkName(name); err != nil {
		m.err = err
	}
	key, qkey, wkey, channel, grants := protocol.LockNames(o.prefix, name, c.e.clientID)
	m.own = lockSpec{
		name: name, key: key, keyArr: [3]string{key, qkey, wkey}, channel: channel, grants: grants,
		ttl: o.ttl, ttlArg: o.ttlArg(), renew: o.renew, meta: c.meta,
		ack: backend.ReplicaAck{N: o.ackN, Wait: o.ackWait}, wait: o.wait, slice: o.slice,
	}
	m.spec = &m.own
	m.spec.keys = m.spec.keyArr[:]
	if o.label != c.opts.label {
		m.spec.meta = holderMeta(o.label)
	}
	if o.adapt.on() {
		m.spec.adaptiveSpec(o.adapt, o.holdKeep)
	}
	return m
}

// Name returns the lock name.
func (m *Mutex) Name() string { return m.name }

// Lock acquires the lock, waiting as long as ctx and WithWait allow; waiting costs no polling
// and no pooled connection, and clients are served in the order they asked (see Waiting in
// the package documentation). If ctx carries a lease on this lock from the same client (a
// lease's Context, or the context inside Do), Lock re-enters it: same token, one more hold.
// A wait that ends while another owner holds the lock returns a *NotAcquiredError (errors.Is
// ErrNotAcquired, and ctx.Err() when ctx ended it) naming the holder. Other failures wrap
// ErrClosed, ErrInvalid or the transport error. On failure it holds nothing.
func (m *Mutex) Lock(ctx context.Context) (*Lease, error) {
	return m.lock(ctx, true)
}

// TryLock makes one attempt to acquire the lock (or re-enter it, as Lock does). When another
// owner holds it, it returns a *NotAcquiredError (errors.Is ErrNotAcquired) naming the holder.
func (m *Mutex) TryLock(ctx context.Context) (*Lease, error) {
	return m.lock(ctx, false)
}

func (m *Mutex) lock(ctx context.Context, wait bool) (*Lease, error) {
	if m == nil {
		return nil, fmt.Errorf("%w: nil mutex", ErrInvalid)
	}
	if m.err != nil {
		return nil, m.err
	}
	if o := m.e.obs; o != nil {
		return o.lock(ctx, m, wait)
	}
	return m.acquire(ctx, wait)
}

// acquire is lock for a valid handle: re-entry, one attempt, or a wait.
func (m *Mutex) acquire(ctx context.Context, wait bool) (*Lease, error) {
	e, spec := m.e, m.spec
	if e.closed.Load() {
		return nil, ErrClosed
	}
	if ctx.Err() != nil {
		return nil, spec.ctxErr(ctx)
	}
	if st := heldIn(ctx, e, spec.key); st != nil {
		if !sameLease(st.spec, spec) {
			return nil, fmt.Errorf("%w: re-enter %q: %s", ErrInvalid, spec.name, leaseDiff(st.spec, spec))
		}
		return e.reenter(ctx, st)
	}
	if spec.slice > 0 {
		if st := e.unpark(ctx, spec); st != nil {
			return leaseOf(st), nil // this client's turn is still on
		}
	}
	attempt := func(ctx context.Context, reg *registration) (*leaseState, holder, error) {
		return e.attempt(ctx, spec, reg)
	}
	var nq *noQuorumSeen
	if wait && spec.wait != 0 && e.traits.Servers > 1 {
		nq = &noQuorumSeen{}
		attempt = nq.watch(attempt)
	}
	return lockOrWait(ctx, spec.wait, wait,
		func() (*Lease, error) {
			st, h, err := attempt(ctx, nil)
			if err != nil || st != nil {
				return leaseOf(st), err
			}
			return nil, e.notAcquired(ctx, spec, h, 0, nil)
		},
		func(wctx context.Context) (*Lease, error) {
			st, err := e.acquireWaiting(wctx, spec, attempt)
			return leaseOf(st), err
		},
		func(_ context.Context, waited time.Duration, cause error) error {
			if qerr := nq.last(); qerr != nil {
				return nq.ended(qerr, waited, cause)
			}
			return e.notAcquired(ctx, spec, holder{pttl: -1}, waited, cause)
		})
}

// lockOrWait is the WithWait wrapper of every kind of lock (bound: its WithWait). Without wait
// (TryLock and its kin) or with WithWait(0), it makes one attempt, once, whose refusal is its
// error. Else it waits with waitFor, for as long as bound when that is positive; a wait that
// ended without the lock (its context wctx done) returns ended's error, given how long it
// waited and the caller's context's error when that ended it (nil when WithWait did).
func lockOrWait(ctx context.Context, bound time.Duration, wait bool, once func() (*Lease, error),
	waitFor func(wctx context.Context) (*Lease, error), ended func(wctx context.Context, waited time.Duration, cause error) error) (*Lease, error) {
	if !wait || bound == 0 {
		return once()
	}
	// start comes before the bound's deadline is set, so that a wait WithWait ended reports
	// at least the bound as waited.
	start := time.Now()
	wctx := ctx
	if bound > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithDeadlineCause(ctx, start.Add(bound), errWaited)
		defer cancel()
	}
	l, err := waitFor(wctx)
	if err != nil && wctx.Err() != nil {
		var cause error
		if ctx.Err() != nil {
			cause = ctxEnded(ctx)
		}
		return nil, ended(wctx, time.Since(start), cause)
	}
	return l, err
}

// noQuorumSeen remembers whether the last attempt of a wait in quorum mode found too few
// servers answering: a wait that ends then says so (the *QuorumError, not ErrNotAcquired:
// nobody was found holding the lock).
type noQuorumSeen struct {
	mu  sync.Mutex
	err error
}

// watch wraps attempt so that each of its outcomes is noted.
func (n *noQuorumSeen) watch(attempt attemptFunc) attemptFunc {
	return func(ctx context.Context, reg *registration) (*leaseState, holder, error) {
		st, h, err := attempt(ctx, reg)
		n.note(err)
		return st, h, err
	}
}

// note records an attempt's error: a no-quorum error is kept, an answer (nil) clears it.
func (n *noQuorumSeen) note(err error) {
	if err != nil && !errors.Is(err, ErrNoQuorum) {
		return // the context ended it, or it ends the wait itself
	}
	n.mu.Lock()
	n.err = err
	n.mu.Unlock()
}

// last returns the no-quorum error of the last attempt, or nil (also for a nil n).
func (n *noQuorumSeen) last() error {
	if n == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.err
}

// ended is the error of a wait that ended while too few servers answered: qerr, how long it
// waited, and the caller's context's error when that ended it.
func (n *noQuorumSeen) ended(qerr error, waited time.Duration, cause error) error {
	if cause != nil {
		return fmt.Errorf("%w (waited %v): %w", qerr, waited.Round(time.Millisecond), cause)
	}
	return fmt.Errorf("%w (waited %v)", qerr, waited.Round(time.Millisecond))
}

// errWaited is the cause of a wait that WithWait ended.
var errWaited = errors.New("dlock: wait ended")

// notAcquired makes the error of an attempt or a wait that ended without the lock: a
// *NotAcquiredError naming the holder, as the server describes it now (one more read, within
// a second), or, when the lock turns out to be free, the context's error.
func (e *engine) notAcquired(ctx context.Context, spec *lockSpec, h holder, waited time.Duration, cause error) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	na := &NotAcquiredError{Name: spec.name, Waited: waited, Cause: cause}
	reply, err := e.b.Inspect(rctx, spec.keys[:1])
	if arr, ok := reply.([]any); err == nil && ok && len(arr) == backend.InspectWidth {
		if info, perr := parseLock(spec.name, arr[0], arr[1]); perr == nil && info.Held {
			na.Holder = info
			if v, ok := arr[0].(string); ok && strings.HasPrefix(v, e.ownerID) {
				na.Mine = true
			}
		} else if perr == nil && cause != nil {
			return fmt.Errorf("dlock: lock %q: %w", spec.name, cause) // free now: the caller's context ended the wait
		}
	}
	if na.Holder.Token == 0 && h.token != 0 {
		na.Holder = Info{Name: spec.name, Held: true, Token: h.token, TTL: max(h.pttl, 0), Waiters: -1, WaitingGoroutines: -1}
	}
	return na
}

// holder describes the holder that refused an attempt, for the waiter that retries.
type holder struct {
	pttl  time.Duration // its remaining lease; negative when unknown
	token uint64        // its token
}

// attempt runs acquire.lua once for spec: with a new owner secret, or, with a registration,
// with its owner, queueing the client on the server under it if the lock is held. It returns
// the lease, or the holder that refused it, or an error.
func (e *engine) attempt(ctx context.Context, spec *lockSpec, reg *registration) (*leaseState, holder, error) {
	if err := e.guard.refusal(ctx); err != nil {
		return nil, holder{}, fmt.Errorf("dlock: lock %q: %w", spec.name, err)
	}
	a := protocol.AcquireArgs{Keys: spec.keys, Owner: "", TTL: spec.ttlArg, Meta: spec.meta, Channel: spec.channel, Client: ""}
	a.AdaptLo, a.AdaptHi = spec.adapt.args()
	var sent int64
	if reg != nil {
		a.Owner, a.Queue, a.Client, a.Window, a.Place = reg.owner, true, reg.id, reg.winArg, reg.place
		if e.traits.Servers > 1 {
			a.QueuedLate = func(server int, token uint64) { e.registeredLate(reg, sent, server, token) }
		}
	} else {
		a.Owner = e.newOwner()
	}
	owner := a.Owner
	sent = mono()
	res, acked, err := e.b.Acquire(ctx, a, spec.ack)
	if err != nil {
		// The script may have run all the same (the reply was lost, or the caller gave up
		// waiting for it): release under this owner secret, so that no lease nobody holds
		// lingers. A registration is withdrawn the same way, with its entry, and a grant to it
		// announced later is ignored.
		if reg == nil {
			e.renewer.orphan(spec.releaseReq(owner), spec.ttl)
		} else {
			e.dropRegistration(reg)
		}
		if ctx.Err() != nil {
			return nil, holder{}, spec.ctxErr(ctx)
		}
		return nil, holder{}, e.redisErr("lock "+strconv.Quote(spec.name), err)
	}
	if !res.OK {
		if reg != nil {
			if res.Dirty {
				e.dropRegistration(reg) // its owner may be released late on some server: never reuse it
			} else {
				mask, tokens := res.QueuedOn, res.TokensOn
				if e.traits.Servers == 1 {
					mask, tokens = 1, []uint64{res.Token}
				}
				if res.TTL > 0 {
					reg.lease.Store(int64(res.TTL)) // what a grant to it is renewed to
				}
				e.registered(reg, sent, mask, tokens)
			}
		}
		return nil, holder{pttl: res.PTTL, token: res.Token}, nil
	}
	if reg != nil && !(reg.fresh && reg.state.CompareAndSwap(regNew, regDone)) && !e.claimed(reg) {
		// Granted to reg, and the announcement got there first: the lease is on its way to
		// the head. Wait for it.
		return nil, holder{pttl: -1, token: res.Token}, nil
	}
	if spec.ack.N > 0 && acked < spec.ack.N {
		return nil, holder{}, e.rollBack(ctx, spec, owner, acked)
	}
	st := newLeaseState(e, spec, ctx, owner, res.Token, sent)
	st.exact = e.traits.Servers == 1
	if res.TTL > 0 {
		st.adaptTo(res.TTL, sent)
	}
	if reg != nil && e.traits.Servers > 1 {
		st.leave = reg.id
	}
	if !e.renewer.add(st) {
		e.renewer.orphan(spec.releaseReq(owner), spec.ttl)
		return nil, holder{}, ErrClosed
	}
	return st, holder{}, nil
}

// rollBack releases the lock just taken under owner, which too few replicas acknowledged (a
// failover now could hand it to a replica that never saw it), and returns the ErrReplicaAck
// error that says so.
func (e *engine) rollBack(ctx context.Context, spec *lockSpec, owner string, acked int) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
	defer cancel()
	if _, rerr := e.b.Release(rctx, spec.releaseReq(owner)); rerr != nil {
		e.renewer.orphan(spec.releaseReq(owner), spec.ttl)
	}
	err := fmt.Errorf("%w: lock %q: %d of %d replicas acknowledged within %v; released again",
		ErrReplicaAck, spec.name, max(acked, 0), spec.ack.N, spec.ack.Wait)
	if short := replicasShort(rctx, e.b, spec.ack.N); short != nil {
		err = fmt.Errorf("%w (%v)", err, short)
	}
	return err
}

// dropRegistration gives back what an attempt under reg may have left on the servers (the lock
// taken under its owner, its queue entry), unless a grant to reg made a lease meanwhile: the
// grant's announcement travels apart from the attempt's reply, and a release under reg's owner
// would then take the lock from under that lease.
func (e *engine) dropRegistration(reg *registration) {
	if reg.state.CompareAndSwap(regNew, regDone) {
		req := reg.spec.releaseReq(reg.owner)
		req.Leave = reg.id
		e.renewer.orphan(req, reg.spec.ttl)
		return
	}
	e.unregister(reg) // nothing when done: granted (its lease holds the lock) or claimed
}

// releaseReq releases every hold of owner on spec's lock.
func (spec *lockSpec) releaseReq(owner string) backend.ReleaseReq {
	return backend.ReleaseReq{Keys: spec.keys, Channel: spec.channel, Owner: owner, All: true, Shared: spec.shared}
}

// reenter adds a hold to st, a lease of this client on this lock found in the caller's context.
func (e *engine) reenter(ctx context.Context, st *leaseState) (*Lease, error) {
	return e.reentry(st, func(ttl time.Duration) (bool, error) {
		res, _, err := e.b.Acquire(ctx, protocol.AcquireArgs{Keys: st.spec.keys, Owner: st.owner, TTL: protocol.Millis(ttl), Meta: st.spec.meta, ReenterOnly: true}, backend.ReplicaAck{})
		return res.OK, err
	})
}

// reentry adds a hold to st, a live lease of this client, for any kind of lock: call renews it
// to ttl on the server as one more hold of its owner, and reports whether the owner still held
// it there (when not, the lease is lost).
func (e *engine) reentry(st *leaseState, call func(ttl time.Duration) (bool, error)) (*Lease, error) {
	if st.expired() || st.state.Load() != stateHeld {
		return nil, st.endedErr()
	}
	ttl := st.currentTTL()
	sent := mono()
	ok, err := call(ttl)
	if err != nil {
		return nil, e.redisErr("re-enter "+strconv.Quote(st.spec.name), err)
	}
	if !ok {
		st.end(endLost, st.lost("re-entry found it no longer held by this lease"))
		return nil, st.endedErr()
	}
	st.mu.Lock()
	st.holds++
	st.mu.Unlock()
	if st.renewed(sent, ttl) {
		e.renewer.reschedule(st)
	}
	return &Lease{st: st}, nil
}

// leaseOf returns the Lease of st's first hold (a lease state just made for its caller).
func leaseOf(st *leaseState) *Lease {
	if st == nil {
		return nil
	}
	st.first.st = st
	return &st.first
}

func (spec *lockSpec) ctxErr(ctx context.Context) error {
	return fmt.Errorf("dlock: lock %q: %w", spec.name, ctx.Err())
}

// Do acquires the lock called name (waiting as Lock does), runs fn with a context that is
// cancelled when ctx is or when the lock is lost (cause ErrLost), and releases the lock when fn
// returns or panics. It returns fn's error, joined with an error wrapping ErrLost when the lock
// was lost before fn returned (naming the lock; with ErrExpired when a fixed lease reached its
// planned end), or with the release error, on one line. A nil result means fn ran to
// completion while the lock was held; the converse does not hold (see "Do and outcomes" in the
// package documentation). ctx bounds both the wait and fn; WithWait(d) bounds the wait alone
// (a wait that ends returns a *NotAcquiredError, and fn does not run). Passing fn's context to Lock,
// TryLock or Do of the same name re-enters the lock.
func (c *Client) Do(ctx context.Context, name string, fn func(ctx context.Context) error, opts ...Option) (err error) {
	return doUnder(ctx, fn, func(ctx context.Context) (*Lease, error) { return c.Mutex(name, opts...).Lock(ctx) })
}

// runUnder runs fn under l, a lease just taken for it, and unlocks l when fn returns or
// panics: what Do does once it holds the lock (and DoRead, DoWrite, DoAcquire).
func runUnder(ctx context.Context, l *Lease, fn func(ctx context.Context) error) (err error) {
	name := l.st.spec.name
	fctx, stop := l.st.doContext(ctx)
	defer func() {
		stop()
		l.st.expired()
		if l.st.state.Load() == stateLost {
			// Say what the caller saw: the lock was lost while fn ran (the Unlock that follows
			// only clears what the server may still hold of it).
			l.Unlock(context.WithoutCancel(ctx))
			ended, what := l.st.endedErr(), "was lost while fn ran"
			if errors.Is(ended, ErrExpired) {
				what = "ran out while fn ran (its planned end, WithoutRenewal)" // not a loss
			}
			err = lostWhileFn(err, name, what, ended)
			return
		}
		err = withUnlockErr(err, l.Unlock(ctx))
	}()
	return fn(fctx)
}
