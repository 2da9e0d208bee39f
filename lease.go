package dlock

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/internal/backend"
	"github.com/dlock-go/dlock/internal/protocol"
	"github.com/dlock-go/dlock/internal/timing"
)

// epoch anchors the monotonic clock readings kept as int64 nanoseconds in leases.
var epoch = timing.Epoch

// mono is the monotonic clock, in nanoseconds since epoch; wall-clock jumps do not move it.
func mono() int64 { return timing.Mono() }

// Lease is one hold of an acquired lock. Unlock it exactly once. A Lease is safe for
// concurrent use.
type Lease struct {
	st       *leaseState
	unlocked atomic.Bool
	multi    *multiLease // a MultiMutex's lease (multilease.go); st is nil then
}

// lease states
const (
	stateHeld int32 = iota
	stateReleased
	stateLost
	stateClosed
)

// leaseState is shared by every hold (re-entry) of one acquisition.
type leaseState struct {
	e     *engine
	spec  *lockSpec
	owner string // the secret the server knows the holder by
	token uint64 // the fencing token; after a local handoff, above the one stored on the server

	state atomic.Int32
	// adaptMS: the adaptive lease the server chose for this acquisition, in ms (adaptive.go;
	// at most MaxFixedTTL); 0 for a fixed lease. Set before the lease is shared. See fullTTL.
	adaptMS  int32
	deadline atomic.Int64 // mono ns at which the lease counts as lost unless renewed first
	ttl      atomic.Int64 // lease length in ns; Extend changes it
	confirm  atomic.Bool  // granted by the server for the acceptance window: renew to fullTTL at once

	mu       sync.Mutex      // guards lastSent, holds, parent, ctx, cause
	lastSent int64           // mono ns when the newest successful acquire/renew was sent
	holds    int             // holds not yet unlocked
	parent   context.Context // the context given to Lock, for the values of ctx
	ctx      *leaseCtx       // made on first use: most callers never ask for it
	cause    error           // why the lease ended (nil: released), set once with state
	// queued: the registration of the queue this lease's waiter left last; its entry is
	// withdrawn with the lease's release (one script), or when the lease ends otherwise.
	queued *registration
	// leave (quorum mode): the id of the registration this lease was taken under (by an attempt
	// or a majority's grants); the other servers may still queue it, so its release drops the
	// entry there too (else a server would later grant the lock to an owner nobody holds).
	leave string

	// owned by the renewer, under renewer.mu
	idx int   // index in the renewer's heap, -1 when not in it
	due int64 // mono ns of the next renewal (or, without renewal, of the deadline)

	rec *leaseRecord // for the client's observer (observe.go); nil without one

	// releasing: its last Unlock is under way; a renewal's refusal is then not a loss.
	releasing atomic.Bool

	// first is the Lease of the hold that made this state (leaseOf): one allocation less per
	// acquisition. Re-entries get Leases of their own.
	first Lease
	// local: how many times the lock passed within this client (local handoffs, parked turns)
	// since the server gave it a token; turn (WithTurnSlice): mono ns when this client got it
	// from the server (the reply, or the grant, arrived): its turn began.
	local int
	turn  int64
	// exact: token is the one the server stored (one server, taken by an attempt): its release
	// needs no token floor (releaseReq).
	exact bool
}

func newLeaseState(e *engine, spec *lockSpec, parent context.Context, owner string, token uint64, sent int64) *leaseState {
	st := &leaseState{e: e, spec: spec, owner: owner, token: token, lastSent: sent, holds: 1, parent: parent, idx: -1}
	if spec.slice > 0 {
		// The turn begins now, as the client gets the lock: sent dates the lease's validity
		// (before the wait, for a grant), not the turn.
		st.turn = mono()
	}
	st.ttl.Store(int64(spec.ttl))
	st.deadline.Store(sent + int64(spec.ttl-drift(spec.ttl)))
	if e.obs != nil {
		st.rec = &leaseRecord{}
	}
	return st
}

// renewed records a successful renewal (or extension) of the lease to ttl, sent at sent.
// It reports false when an answer to a later request was already recorded.
func (st *leaseState) renewed(sent int64, ttl time.Duration) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if sent < st.lastSent {
		return false
	}
	st.lastSent = sent
	st.ttl.Store(int64(ttl))
	st.deadline.Store(sent + int64(ttl-drift(ttl)))
	return true
}

func (st *leaseState) currentTTL() time.Duration {
	return time.Duration(st.ttl.Load())
}

// expired reports, and acts on, a deadline that passed without a renewal: this check makes a
// lease context report the loss exactly on time even when the renewal loop has not run yet
// (for instance right after the process was paused).
func (st *leaseState) expired() bool {
	if st.state.Load() != stateHeld {
		return false
	}
	if mono() < st.deadline.Load() {
		return false
	}
	st.end(endLost, st.runOut())
	return true
}

// lost is the cause of a loss of st's lock for reason: it names the lock (nested locks tell
// which was lost) and wraps ErrLost.
func (st *leaseState) lost(reason string) error {
	return fmt.Errorf("%w: %q: %s", ErrLost, st.spec.name, reason)
}

// runOut is the cause when st's deadline passed without a renewal: for a fixed lease, its
// planned end (ErrExpired, also ErrLost); for a renewed one, a loss.
func (st *leaseState) runOut() error {
	if !st.spec.renew && !st.confirm.Load() {
		return &lossError{kind: LostExpired, err: fmt.Errorf("%w: %q: its fixed lease (WithoutRenewal) ran out (%w)", ErrExpired, st.spec.name, ErrLost)}
	}
	return st.lostAs(LostDeadline, "no renewal succeeded before the lease could run out on the server")
}

// ending says how a lease ended.
type ending uint8

const (
	// endReleased: Unlock released the lock on the server; this client's waiters are woken.
	endReleased ending = iota
	// endPassedOn: the lock went to a waiter of this client, who holds it now; nobody to wake.
	endPassedOn
	// endLost: the lock is, or may be, someone else's now (cause wraps ErrLost).
	endLost
	// endClosed: the client closed.
	endClosed
)

// end moves the lease out of the held state, once: it records why, cancels the lease context
// (with cause, for a loss), leaves the renewal loop and, unless the lock was passed on, wakes
// this client's first waiter for the lock. It reports false when the lease had already ended.
func (st *leaseState) end(how ending, cause error) bool {
	next := stateReleased
	switch how {
	case endLost:
		next = stateLost
	case endClosed:
		next, cause = stateClosed, ErrClosed
	default:
		cause = nil
	}
	st.mu.Lock()
	if !st.state.CompareAndSwap(stateHeld, next) {
		st.mu.Unlock()
		return false
	}
	st.cause = cause
	ctx := st.ctx
	queued := st.queued
	st.queued = nil
	st.mu.Unlock()
	if ctx != nil {
		ctx.cancel(cause)
	}
	if queued != nil {
		st.e.unregister(queued)
	}
	st.e.renewer.remove(st)
	if how != endPassedOn {
		st.e.waits.leaseEnded(st.spec.key, st.token)
	}
	if how == endLost || st.rec != nil {
		st.e.ev.ended(st, how, cause) // log a loss; report the end to the observer
	}
	return true
}

// doUnder is the Do of every kind of lock: it takes a lease with lock (a nil fn is refused
// first) and runs fn under it (runUnder).
func doUnder(ctx context.Context, fn func(ctx context.Context) error, lock func(context.Context) (*Lease, error)) error {
	if fn == nil {
		return fmt.Errorf("%w: nil function", ErrInvalid)
	}
	l, err := lock(ctx)
	if err != nil {
		return err
	}
	return runUnder(ctx, l, fn)
}

// context returns the lease context, making it on first use.
func (st *leaseState) context() *leaseCtx {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ctx == nil {
		inner, cancel := detach(&st.parent)
		st.ctx = &leaseCtx{Context: inner, st: st, cancel: cancel}
		if st.state.Load() != stateHeld {
			cancel(st.cause) // ended before anyone asked; end saw no context to cancel
		}
	}
	return st.ctx
}

// leavingQueue is req, the release of st's last hold, made to withdraw the queue entry the
// hold was taken under when no waiter of this client needs it any more (else the entry that
// st.leave names, if any).
func (e *engine) leavingQueue(st *leaseState, req backend.ReleaseReq) backend.ReleaseReq {
	if reg := st.takeQueued(); reg != nil && e.withdrawn(reg) {
		req.Leave = reg.id
	}
	if req.Leave == "" {
		req.Leave = st.leave
	}
	return req
}

// afterRelease ends st once the release of its last hold, req, answered res or err, and returns
// the error for its Unlock. A release that failed on the network is retried in the background
// until it succeeds or the lease would have run out anyway.
func (e *engine) afterRelease(st *leaseState, req backend.ReleaseReq, res protocol.Released, err error) error {
	switch {
	case err != nil && !refused(err):
		st.mu.Lock()
		until := st.lastSent + st.ttl.Load()
		st.mu.Unlock()
		waits, key, token := e.waits, st.spec.key, st.token
		req.Record = "" // the failed try may have recorded the hold: never twice
		e.renewer.retryRelease(req, until, func() { waits.leaseEnded(key, token) })
		st.end(endReleased, nil)
		return fmt.Errorf("%w (retrying in the background until the lease would run out)", e.redisErr("unlock "+strconv.Quote(st.spec.name), err))
	case err != nil:
		st.end(endReleased, nil)
		return e.redisErr("unlock "+strconv.Quote(st.spec.name), err)
	case !res.Owned:
		st.end(endLost, st.lost("the server no longer had it for this lease at Unlock"))
		return st.lostAtUnlock()
	}
	st.end(endReleased, nil)
	return nil
}

// detach makes the context of a lease (or multi-lease) taken under *parent: with parent's
// values but not its cancellation (the lease outlives the call that took it), cancelled with
// the cause its lease ends with. *parent is let go: the new context holds what it needs of it.
func detach(parent *context.Context) (context.Context, context.CancelCauseFunc) {
	inner, cancel := context.WithCancelCause(context.WithoutCancel(*parent))
	*parent = nil
	return inner, cancel
}

// endedErr is the error for using a lease that is no longer held.
func (st *leaseState) endedErr() error {
	switch st.state.Load() {
	case stateLost:
		st.mu.Lock()
		cause := st.cause
		st.mu.Unlock()
		if cause != nil && cause != ErrLost {
			return cause
		}
		return st.lost("lost")
	case stateClosed:
		return ErrClosed
	}
	return fmt.Errorf("%w: %q was released", ErrNotHeld, st.spec.name)
}

// lostAtUnlock is Unlock's error for a lease lost before it: the loss's cause, which matches
// ErrNotHeld too (there was nothing left to release) without saying it twice.
func (st *leaseState) lostAtUnlock() error {
	st.mu.Lock()
	cause := st.cause
	st.mu.Unlock()
	if cause == nil || cause == ErrLost {
		cause = st.lost("lost before Unlock")
	}
	return &notHeldError{cause}
}

// releaseReq releases one hold of this lease, or all. The floor is the lease's token: after
// local handoffs it is above the stored one, and in quorum mode each server's may be below it.
func (st *leaseState) releaseReq(all bool) backend.ReleaseReq {
	floor := st.token
	if st.exact && st.spec.adapt == nil && st.spec.shared == nil {
		floor = 0 // the stored token is this one (an adaptive lease's record still needs it)
	}
	return backend.ReleaseReq{Keys: st.spec.keys, Channel: st.spec.channel, Owner: st.owner, All: all, Floor: floor, Shared: st.spec.shared}
}

// renewal is st's renewal to ttl in a round.
func (st *leaseState) renewal(ttl time.Duration) backend.Renewal {
	return st.renewalTo(protocol.Millis(ttl))
}

// renewalTo is st's renewal to ttl ms (as the scripts take it) in a round.
func (st *leaseState) renewalTo(ttl string) backend.Renewal {
	return backend.Renewal{Key: st.spec.key, Owner: st.owner, TTL: ttl, Ack: st.spec.ack, Shared: st.spec.shared != nil}
}

// pttl reads the lease left to st as the server sees it, and false when st no longer holds.
func (st *leaseState) pttl(ctx context.Context) (time.Duration, bool, error) {
	if st.spec.shared == nil {
		return st.e.b.PTTL(ctx, st.spec.keys, st.owner)
	}
	r, _, err := st.e.b.Run(ctx, protocol.SharedPTTLCall(st.spec.keys, st.owner), backend.ReplicaAck{})
	if err != nil {
		return 0, false, err
	}
	return protocol.ReadPTTL(r)
}

// leaseCtx is the context of a lease: cancelled when the lease ends. Err and Value check the
// lease deadline themselves, so a holder that looks at its context after a pause learns of the
// loss at once, before the renewal loop gets to run.
type leaseCtx struct {
	context.Context
	st     *leaseState
	cancel context.CancelCauseFunc // cancels the embedded Context
}

// A lease's context answers Value(e), e its client's engine (a pointer: looking it up costs no
// allocation), with itself, a leaseFinder: heldIn then asks it for the lease on one lock key,
// and it looks in its own lease(s), then further out.
type leaseFinder interface {
	leaseOn(e *engine, key string) *leaseState
}

func (x *leaseCtx) leaseOn(e *engine, key string) *leaseState {
	if x.st.spec.key == key {
		return x.st
	}
	return heldIn(x.Context, e, key)
}

func (x *leaseCtx) Err() error {
	x.cancelIfEnded()
	return x.Context.Err()
}

func (x *leaseCtx) Value(k any) any {
	switch k := k.(type) {
	case *engine:
		if k == x.st.e {
			return x
		}
	case tokenKey:
		return x.st.token
	case tokensKey:
		return map[string]uint64{x.st.spec.name: x.st.token}
	}
	x.cancelIfEnded() // context.Cause and context.WithCancel look up the parent's state through Value
	return x.Context.Value(k)
}

// cancelIfEnded cancels the context at once if the lease has ended or its deadline passed.
func (x *leaseCtx) cancelIfEnded() {
	x.st.expired()
	if x.st.state.Load() != stateHeld {
		x.st.mu.Lock()
		cause := x.st.cause
		x.st.mu.Unlock()
		x.cancel(cause)
	}
}

// doContext returns the context for the function run by Do: cancelled when parent is, or when
// the lease ends (with the lease's cause); it carries the lease for re-entry.
func (st *leaseState) doContext(parent context.Context) (context.Context, func()) {
	inner, cancel := context.WithCancelCause(parent)
	lctx := st.context()
	stop := context.AfterFunc(lctx, func() { cancel(context.Cause(lctx)) })
	return &leaseCtx{Context: inner, st: st, cancel: cancel}, func() {
		stop()
		cancel(nil)
	}
}

// tokenKey finds the token of the innermost lease in a context.
type tokenKey struct{}

// TokenFromContext returns the fencing token of the lease whose context ctx is (or derives
// from): a Lease's Context, or the context Do passes to its function. With nested locks it is
// the innermost one's. ok is false when ctx carries no lease.
func TokenFromContext(ctx context.Context) (token uint64, ok bool) {
	token, ok = ctx.Value(tokenKey{}).(uint64)
	return token, ok
}

// heldIn returns the lease on key of engine e carried by ctx, or nil.
func heldIn(ctx context.Context, e *engine, key string) *leaseState {
	f, _ := ctx.Value(e).(leaseFinder)
	if f == nil {
		return nil
	}
	return f.leaseOn(e, key)
}

// Token returns the fencing token: larger than the token of every earlier acquisition of this
// lock name (see the package documentation for the exact guarantee). Pass it to the protected
// resource and have it refuse requests carrying a smaller token than it has seen. Re-entering
// holds share the token. For a MultiMutex's lease it is the largest of Tokens: give each
// resource its own name's token instead. A nil lease returns 0.
func (l *Lease) Token() uint64 {
	if l == nil {
		return 0
	}
	if l.multi != nil {
		return l.multi.token
	}
	return l.st.token
}

// Name returns the lock name; for a MultiMutex's lease, its names as given, separated by ", "
// (for messages: Names returns them one by one).
func (l *Lease) Name() string {
	if l == nil {
		return ""
	}
	if l.multi != nil {
		return l.multi.name()
	}
	return l.st.spec.name
}

var endedCtx = func() context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(ErrNotHeld)
	return ctx
}()

// Context returns a context that is cancelled when the lease ends, with cause ErrLost (the lock
// was or may be lost, before the server could give it to anyone else), context.Canceled (the
// last Unlock) or ErrClosed. It carries the values of the context passed to Lock, not its
// cancellation. Its Err checks the lease deadline itself: check Err before each protected step
// (after a pause of the process, Done closes a moment later). Passing it to Lock, TryLock or Do
// of the same name re-enters the lock. A MultiMutex's lease's context is cancelled as soon as
// the lease of one of its names ends, with that lease's cause, and re-enters each of its names.
// A nil lease returns an already cancelled context.
func (l *Lease) Context() context.Context {
	if l == nil {
		return endedCtx
	}
	if l.multi != nil {
		return l.multi.context()
	}
	return l.st.context()
}

// Extend sets the lease to ttl from now, as the server counts, if this lease still holds the
// lock; later automatic renewals use ttl too. If the lock was lost it returns an error wrapping
// ErrLost and cancels the lease context. On a transport error the lease is unchanged. A
// MultiMutex's lease extends every name in one round.
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	if l == nil {
		return fmt.Errorf("%w: nil lease", ErrNotHeld)
	}
	if l.multi != nil {
		return l.multi.extend(ctx, l, ttl)
	}
	if ttl < MinTTL {
		return fmt.Errorf("%w: ttl %v is below the minimum %v", ErrInvalid, ttl, MinTTL)
	}
	if err := checkTTL(ttl, l.st.spec.renew); err != nil {
		return err
	}
	st := l.st
	if l.unlocked.Load() || st.expired() || st.state.Load() != stateHeld {
		return st.endedErr()
	}
	sent := mono()
	outs := st.e.b.Renew(ctx, backend.Round{Leases: []backend.Renewal{st.renewal(ttl)}}).Leases
	switch {
	case outs[0].Err == backend.ErrNotAcked:
		return fmt.Errorf("%w: extend %q: the new lease is on the master only", ErrReplicaAck, st.spec.name)
	case outs[0].Err != nil:
		return st.e.redisErr("extend", outs[0].Err)
	case outs[0].Released:
		st.end(endLost, st.lostAs(LostForceUnlocked, "Extend found it released by someone else (force-unlocked)"))
		return st.endedErr()
	case !outs[0].OK:
		st.end(endLost, st.lost("Extend found it no longer held by this lease"))
		return st.endedErr()
	}
	if st.state.Load() != stateHeld {
		// Declared lost while the extension was on its way: the server now keeps what nobody
		// holds.
		st.e.renewer.renewedAfterLoss(st, ttl)
		return st.endedErr()
	}
	if st.renewed(sent, ttl) {
		st.e.renewer.reschedule(st)
	}
	return nil
}

// TTL returns the remaining lease as the server sees it (for a MultiMutex's lease, the shortest
// of its names'). It returns an error wrapping ErrLost (and cancels the lease context) when the
// lease no longer holds the lock.
func (l *Lease) TTL(ctx context.Context) (time.Duration, error) {
	if l == nil {
		return 0, fmt.Errorf("%w: nil lease", ErrNotHeld)
	}
	if l.multi != nil {
		return l.multi.ttl(ctx, l)
	}
	st := l.st
	if l.unlocked.Load() || st.expired() || st.state.Load() != stateHeld {
		return 0, st.endedErr()
	}
	left, held, err := st.pttl(ctx)
	if err != nil {
		return 0, st.e.redisErr("ttl", err)
	}
	if !held {
		st.end(endLost, st.lost("the server no longer has it for this lease"))
		return 0, st.endedErr()
	}
	return left, nil
}

// unlockTimeout bounds an Unlock whose context is already done: it still runs, so that a
// deferred Unlock after a cancelled request frees the lock.
const unlockTimeout = 5 * time.Second

// Unlock gives up this hold; the hold is over when it returns, whatever the outcome. The last
// hold releases the lock (if this lease still owns it) or passes it to a waiter of the same
// client (see Waiting in the package documentation), and cancels the lease context. It returns
// an error wrapping ErrNotHeld when this hold was already unlocked (or l is nil), wrapping
// ErrLost when the lock was lost before, or a transport error when the server could not be told
// (the release is then retried in the background until it succeeds or the lease runs out). A
// done ctx still gets up to 5 s, so that a deferred Unlock after a cancelled request frees the
// lock. A MultiMutex's lease's Unlock gives up the hold on every name (one round trip on one
// server) and reports each failure.
func (l *Lease) Unlock(ctx context.Context) error {
	if l == nil {
		return fmt.Errorf("%w: nil lease", ErrNotHeld)
	}
	if l.multi != nil {
		return l.multi.unlock(ctx, l)
	}
	if !l.unlocked.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: %q already unlocked", ErrNotHeld, l.st.spec.name)
	}
	st := l.st
	last, state := st.dropHold()
	if state == stateClosed {
		return ErrClosed
	}
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
		defer cancel()
	}
	if last && state == stateHeld {
		// A renewal already on its way may reach the server after this release (the go-redis
		// transport sends on several connections): what it finds there is this Unlock's doing,
		// not a loss, and the Unlock reports the outcome.
		st.releasing.Store(true)
		return st.e.letGo(ctx, st) // wait.go: to this client's next waiter, or released for all
	}
	// An inner hold: drop it on the server. Or a lease already lost: clear what the server may
	// still hold of it, and tell the caller (an adaptive lock's server records the hold).
	req := st.releaseReq(last)
	if last && state == stateLost {
		req = st.recordHold(req)
	}
	res, err := st.e.b.Release(ctx, req)
	return st.afterInnerRelease(state, res, err)
}

// dropHold gives up one hold of st: it reports whether that was the last one, and the lease's
// state once its deadline is checked.
func (st *leaseState) dropHold() (last bool, state int32) {
	st.mu.Lock()
	st.holds--
	last = st.holds == 0
	st.mu.Unlock()
	st.expired()
	return last, st.state.Load()
}

// afterInnerRelease returns the error for the Unlock of an inner hold, or of a lease already
// lost (state), once its release answered res or err.
func (st *leaseState) afterInnerRelease(state int32, res protocol.Released, err error) error {
	switch {
	case state == stateLost:
		return st.lostAtUnlock() // whatever the server said: the loss is what the caller must know
	case err != nil:
		return st.e.redisErr("unlock "+strconv.Quote(st.spec.name), err)
	case !res.Owned:
		st.end(endLost, st.lost("the server no longer had it for this lease at Unlock"))
		return st.lostAtUnlock()
	}
	return nil
}
