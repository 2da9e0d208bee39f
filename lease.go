package dlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/conn"
)

// epoch anchors the monotonic clock readings kept as int64 nanoseconds in leases.
var epoch = time.Now()

// mono is the monotonic clock, in nanoseconds since epoch; wall-clock jumps do not move it.
func mono() int64 { return int64(time.Since(epoch)) }

// Lease is one hold of an acquired lock. Unlock it exactly once. A Lease is safe for
// concurrent use.
type Lease struct {
	st       *leaseState
	unlocked atomic.Bool
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
	c       *Client
	name    string
	key     string
	channel string
	owner   string
	token   uint64
	renew   bool
	meta    string        // the holder description stored with the lock
	local   bool          // token issued by a local handoff: above the token stored on the server
	base    uint64        // the token stored on the server for this hold (token, unless local)
	ackN    int           // WithReplicaAck: replicas that must acknowledge each renewal
	ackWait time.Duration // and how long to wait for them

	keys []string // {key}, shared with the Mutex

	state    atomic.Int32
	deadline atomic.Int64 // mono ns at which the lease counts as lost unless renewed first

	ttl atomic.Int64 // lease length in ns; Extend changes it

	mu       sync.Mutex      // guards lastSent, holds, parent, ctx, cause
	lastSent int64           // mono ns when the newest successful acquire/renew was sent
	holds    int             // holds not yet unlocked
	parent   context.Context // the context given to Lock, for the values of ctx
	ctx      *leaseCtx       // made on first use: most callers never ask for it
	cause    error           // why the lease ended (nil: released), set once with state

	// owned by the renewer, under renewer.mu
	idx int   // index in the renewer's heap, -1 when not in it
	due int64 // mono ns of the next renewal (or, without renewal, of the deadline)
}

func newLeaseState(m *Mutex, parent context.Context, owner string, token uint64, sent int64) *leaseState {
	st := &leaseState{
		c: m.c, name: m.name, key: m.key, keys: m.keys, channel: m.channel,
		owner: owner, token: token, renew: m.o.renew, meta: m.meta, ackN: m.o.ackN, ackWait: m.o.ackWait,
		lastSent: sent, holds: 1, parent: parent, idx: -1,
	}
	st.base = token
	st.ttl.Store(int64(m.o.ttl))
	st.deadline.Store(sent + int64(m.o.ttl-drift(m.o.ttl)))
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
	st.end(ErrLost)
	return true
}

// end moves the lease out of the held state once: cause nil for a release, ErrLost or
// ErrClosed otherwise. It cancels the lease context, leaves the renewal loop and wakes a
// local waiter for the name.
func (st *leaseState) end(cause error) bool { return st.endAlone(cause, false) }

// endAlone is end, for a release that no other client heard when alone is set: the local head
// then tries at once instead of holding back for the others (see fairnessYield).
func (st *leaseState) endAlone(cause error, alone bool) bool {
	if !st.finish(cause) {
		return false
	}
	st.c.queues.notice(st.key, st.token, alone)
	return true
}

// endQuiet ends a lease that was handed over to a local waiter: no release notice, the waiter
// already holds the lock.
func (st *leaseState) endQuiet() { st.finish(nil) }

// finish moves the lease out of the held state once, cancels its context and leaves the
// renewal loop.
func (st *leaseState) finish(cause error) bool {
	next := stateReleased
	switch {
	case errors.Is(cause, ErrLost):
		next = stateLost
	case errors.Is(cause, ErrClosed):
		next = stateClosed
	}
	st.mu.Lock()
	if !st.state.CompareAndSwap(stateHeld, next) {
		st.mu.Unlock()
		return false
	}
	st.cause = cause
	ctx := st.ctx
	st.mu.Unlock()
	if ctx != nil {
		ctx.cancel(cause)
	}
	st.c.renewer.remove(st)
	return true
}

// context returns the lease context, making it on first use.
func (st *leaseState) context() *leaseCtx {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ctx == nil {
		inner, cancel := context.WithCancelCause(context.WithoutCancel(st.parent))
		st.ctx = &leaseCtx{Context: inner, st: st, cancel: cancel}
		st.parent = nil
		if st.state.Load() != stateHeld {
			cancel(st.cause) // ended before anyone asked; end saw no context to cancel
		}
	}
	return st.ctx
}

// endedErr is the error for using a lease that is no longer held.
func (st *leaseState) endedErr() error {
	switch st.state.Load() {
	case stateLost:
		st.mu.Lock()
		cause := st.cause
		st.mu.Unlock()
		if cause != nil && cause != ErrLost {
			return fmt.Errorf("%q: %w", st.name, cause)
		}
		return fmt.Errorf("%w: %q", ErrLost, st.name)
	case stateClosed:
		return ErrClosed
	}
	return fmt.Errorf("%w: %q was released", ErrNotHeld, st.name)
}

func (st *leaseState) lostAtUnlock() error {
	return fmt.Errorf("%w: %q was lost before Unlock (%w)", ErrLost, st.name, ErrNotHeld)
}

func (st *leaseState) releaseCall(all, count bool) conn.Call {
	var floor uint64
	if st.c.quorum || st.local {
		floor = st.token // the server's token may be smaller: keep this one
	}
	return conn.Call{Script: scriptRelease, Keys: st.keys, Args: st.c.releaseArgs(st.owner, st.channel, all, floor, count)}
}

// leaseCtx is the context of a lease: cancelled when the lease ends. Err and Value check the
// lease deadline themselves, so a holder that looks at its context after a pause learns of the
// loss at once, before the renewal loop gets to run.
type leaseCtx struct {
	context.Context
	st     *leaseState
	cancel context.CancelCauseFunc // cancels the embedded Context
}

// leaseKey finds a client's lease on one lock key in a context, for re-entry.
type leaseKey struct {
	c   *Client
	key string
}

func (x *leaseCtx) Err() error {
	x.sync()
	return x.Context.Err()
}

func (x *leaseCtx) Value(k any) any {
	switch k := k.(type) {
	case leaseKey:
		if k.c == x.st.c && k.key == x.st.key {
			return x.st
		}
	case tokenKey:
		return x.st.token
	}
	x.sync() // context.Cause and context.WithCancel look up the parent's state through Value
	return x.Context.Value(k)
}

// sync cancels the context at once if the lease has ended or its deadline has passed.
func (x *leaseCtx) sync() {
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

// heldIn returns the lease on key of client c carried by ctx, or nil.
func heldIn(ctx context.Context, c *Client, key string) *leaseState {
	st, _ := ctx.Value(leaseKey{c, key}).(*leaseState)
	return st
}

// Token returns the fencing token: larger than the token of every earlier acquisition of this
// lock name (see the package documentation for the exact guarantee). Pass it to the protected
// resource and have it refuse requests carrying a smaller token than it has seen. Re-entering
// holds share the token. A nil lease returns 0.
func (l *Lease) Token() uint64 {
	if l == nil {
		return 0
	}
	return l.st.token
}

// Name returns the lock name.
func (l *Lease) Name() string {
	if l == nil {
		return ""
	}
	return l.st.name
}

var endedCtx = func() context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(ErrNotHeld)
	return ctx
}()

// Context returns a context that is cancelled when the lease ends: with cause ErrLost when the
// lock was (or may have been) lost, before the server could have given it to anyone else;
// with cause context.Canceled after the last Unlock; with cause ErrClosed when the client
// closed. Do the protected work under this context, and check it before each step that must
// not happen without the lock. It carries the values of the context passed to Lock but not
// its cancellation: the lease outlives the call that took it. Passing it (or a context derived
// from it) to Lock, TryLock or Do of the same name re-enters the lock. Its Err method checks
// the lease deadline itself, so check Err before each protected step: Done is closed by the
// renewal loop, which after a pause of the process runs a moment later than the holder's own
// code. A nil lease returns an already cancelled context.
func (l *Lease) Context() context.Context {
	if l == nil {
		return endedCtx
	}
	return l.st.context()
}

// Extend sets the lease to ttl from now, as the server counts, if this lease still holds the
// lock; later automatic renewals use ttl too. If the lock was lost it returns an error wrapping
// ErrLost and cancels the lease context. On a transport error the lease is unchanged.
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	if l == nil {
		return fmt.Errorf("%w: nil lease", ErrNotHeld)
	}
	if ttl < MinTTL {
		return fmt.Errorf("%w: ttl %v is below the minimum %v", ErrInvalid, ttl, MinTTL)
	}
	st := l.st
	if l.unlocked.Load() || st.expired() || st.state.Load() != stateHeld {
		return st.endedErr()
	}
	sent := mono()
	calls := []conn.Call{{Script: scriptRenew, Keys: st.keys, Args: []string{st.owner, strconv.FormatInt(ttl.Milliseconds(), 10)}}}
	if st.ackN > 0 {
		calls = append(calls, conn.Call{WaitReplicas: st.ackN, WaitTimeout: st.ackWait})
	}
	rs := st.c.conn.EvalMulti(ctx, calls)
	res, err := rs[0].Ints, rs[0].Err
	if err != nil {
		return st.c.redisErr("extend", err)
	}
	if st.ackN > 0 && len(res) == 1 && res[0] == 1 {
		if a := rs[1]; a.Err != nil || len(a.Ints) != 1 || a.Ints[0] < int64(st.ackN) {
			return fmt.Errorf("%w: extend %q: the new lease is on the master only", ErrReplicaAck, st.name)
		}
	}
	if len(res) != 1 || res[0] != 1 {
		st.end(ErrLost)
		return st.endedErr()
	}
	if st.renewed(sent, ttl) {
		st.c.renewer.reschedule(st)
	}
	return nil
}

// TTL returns the remaining lease as the server sees it. It returns an error wrapping ErrLost
// (and cancels the lease context) when the lease no longer holds the lock.
func (l *Lease) TTL(ctx context.Context) (time.Duration, error) {
	if l == nil {
		return 0, fmt.Errorf("%w: nil lease", ErrNotHeld)
	}
	st := l.st
	if l.unlocked.Load() || st.expired() || st.state.Load() != stateHeld {
		return 0, st.endedErr()
	}
	res, err := st.c.conn.Eval(ctx, scriptPTTL, []string{st.key}, []string{st.owner})
	if err != nil {
		return 0, st.c.redisErr("ttl", err)
	}
	if len(res) != 1 || res[0] < 0 {
		st.end(ErrLost)
		return 0, st.endedErr()
	}
	return time.Duration(res[0]) * time.Millisecond, nil
}

// unlockTimeout bounds an Unlock whose context is already done: it still runs, so that a
// deferred Unlock after a cancelled request frees the lock.
const unlockTimeout = 5 * time.Second

// Unlock gives up this hold. When it is the last hold of the lock, the lock is released on the
// server (only if this lease still owns it), waiters are woken, and the lease context is
// cancelled. Whatever the outcome, the hold is over when Unlock returns: the lease is no longer
// renewed by this hold. It returns an error wrapping ErrNotHeld when this hold was already
// unlocked (or l is nil), wrapping ErrLost when the lock was lost before the Unlock, and a
// transport error when the server could not be told (the lock then expires after its TTL).
// A ctx that is already done does not stop Unlock: it still asks the server, within 5 s, so
// that a deferred Unlock after a cancelled request frees the lock. When another goroutine of
// the same client waits for the lock, Unlock usually passes the lock to it without asking the
// server (see the package documentation, Waiting): it then returns nil without learning
// whether the server still had the lock, and the waiter's lease reports a loss instead.
func (l *Lease) Unlock(ctx context.Context) error {
	if l == nil {
		return fmt.Errorf("%w: nil lease", ErrNotHeld)
	}
	if !l.unlocked.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: %q already unlocked", ErrNotHeld, l.st.name)
	}
	st := l.st
	st.mu.Lock()
	st.holds--
	last := st.holds == 0
	st.mu.Unlock()
	st.expired()
	state := st.state.Load()
	if state == stateClosed {
		return ErrClosed
	}
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
		defer cancel()
	}
	if last && state == stateHeld {
		if done, err := st.handOver(ctx); done {
			return err
		}
	}
	// With waiters of this client queued for the lock, the release reports how many subscribers
	// heard it: when no other client's did, nobody else waits, and the local head need not hold
	// back its attempt for them (see fairnessYield). Without the count this client would pause
	// every handoff among its own waiters that goes through the server (quorum mode, replica
	// acknowledgement, a waiter that asks for another lease).
	count, own := false, int64(0)
	if last && state == stateHeld && st.c.queues.waiting(st.key) {
		count = true
		if st.c.notifier.isLive(st.channel) {
			own = 1 // this client's own subscription hears it too
		}
	}
	call := st.releaseCall(last, count)
	res, err := st.c.conn.Eval(ctx, call.Script, call.Keys, call.Args)
	switch {
	case state == stateLost:
		return st.lostAtUnlock() // whatever the server said: the loss is what the caller must know
	case err != nil && last && !refused(err):
		// The lock stays held on the server until a release gets through: retry it in the
		// background until then, or until the lease would have run out anyway.
		st.mu.Lock()
		until := st.lastSent + st.ttl.Load()
		st.mu.Unlock()
		c, key, token := st.c, st.key, st.token
		st.c.renewer.retryRelease(call, until, func() { c.queues.notice(key, token, false) })
		st.end(nil)
		return fmt.Errorf("%w (retrying in the background until the lease would run out)", st.c.redisErr("unlock "+strconv.Quote(st.name), err))
	case err != nil:
		if last {
			st.end(nil)
		}
		return st.c.redisErr("unlock "+strconv.Quote(st.name), err)
	case (len(res) != 1 && len(res) != 2) || res[0] < 0:
		st.end(ErrLost)
		return st.lostAtUnlock()
	case last:
		st.endAlone(nil, count && len(res) == 2 && res[1] <= own)
	}
	return nil
}

// localHandoffs is how many times in a row a lock passes among one client's waiters without
// asking the server (see handOver); the next handoff asks, by handover.lua, and the server
// refuses it when other clients wait. So while other clients wait, a client holds a lock at most
// localHandoffs+1 times in a row. acquire.lua keeps the tokens it issues at least
// localHandoffs+1 (16) apart, so that the tokens T+1 … T+localHandoffs given out locally after a
// server token T stay below every later server token.
const localHandoffs = 15

// fairnessYield and fairnessWindow: a client's head woken by a release notice (or by its timer)
// holds back its attempt by up to fairnessYield, the more the more recently its own client's last
// lease on the lock ended: fairnessYield right after that, nothing once fairnessWindow has
// passed (holdBack). The client that just released (woken locally at once) would otherwise win
// nearly every race against the other clients' heads, which learn of the release over the
// network; and among those, the clients that held the lock least recently now tend to go
// first. In the 4-process hot-lock benchmark (bench/, scenario 3) a 4 ms window against 1 ms
// (which only held back the releasing client) gave Jain 0.97-0.99 vs 0.89-0.96 and wait p99
// 18-27 ms vs 30-41 ms, at the same handoff rate. Widening it to 8 ms (2 ms at most, the same
// slope) orders by recency the clients that missed a turn too: wait p99 2.5-2.8 times the
// fair-share wait against 3.0-3.8 with 4 ms (9 runs each way, alternated, both transports),
// for 7-20 % fewer handoffs/s (BenchmarkHotName/4procs: 14,400-14,900 against 18,100-18,800).
const (
	fairnessYield  = 2 * time.Millisecond
	fairnessWindow = 8 * time.Millisecond
)

// holdBack is how long a head holds back its attempt when its client's last lease on the
// lock ended since ago.
func holdBack(since time.Duration) time.Duration {
	if since >= fairnessWindow {
		return 0
	}
	return fairnessYield * (fairnessWindow - since) / fairnessWindow
}

// handOver passes the lock, at its last Unlock, straight to the first waiter of this client for
// the same name. It reports done = false when there is no such waiter or the server refused
// (other clients wait and the client had its turn): the caller then releases as usual. Not in
// quorum mode, nor with replica acknowledgement.
//
// Most handoffs cost no round trip: the lock stays with this client under the same owner secret
// in Redis, and the waiter gets a lease with the next token (token+1, below every later token
// from the server: see localHandoffs) and the same deadline, renewed by the loop as any other. Every
// localHandoffs+1-th handoff, and any handoff to a waiter whose lease differs (TTL, renewal,
// label), goes through handover.lua: one round trip, a new owner secret and a server token, and
// the server's check that no other client waits too long.
// After a refusal for fairness, the release lets every client compete (see fairnessYield).
func (st *leaseState) handOver(ctx context.Context) (done bool, err error) {
	c := st.c
	if c.quorum || st.ackN > 0 {
		return false, nil
	}
	q, w, streak := c.queues.reserveHead(st.key)
	if w == nil {
		return false, nil
	}
	m := w.m
	if m.o.ackN > 0 {
		c.queues.settle(q, w, nil, false)
		return false, nil
	}
	if streak < localHandoffs && st.renew && m.o.renew && m.meta == st.meta && m.o.ttl == st.currentTTL() {
		next := st.passOn(m, w.ctx)
		if !c.renewer.add(next) {
			c.queues.settle(q, w, nil, false)
			return false, nil // the client is closing: the caller's release reports it
		}
		given := c.queues.settle(q, w, next, false)
		st.endQuiet()
		if !given {
			(&Lease{st: next}).Unlock(context.WithoutCancel(ctx)) // the waiter left meanwhile
		}
		return true, nil
	}
	mine := "0"
	if c.notifier.isLive(st.channel) { // counted by the server: as for a counted release, below
		mine = "1"
	}
	shard := ""
	if c.cluster {
		shard = "s"
	}
	owner := c.newOwner()
	sent := mono()
	res, err := c.conn.Eval(ctx, scriptHandover, st.keys, []string{
		st.owner, owner, m.ttlArg, m.meta, strconv.Itoa(streak), strconv.Itoa(localHandoffs), st.channel, mine, shard,
		strconv.FormatUint(st.token, 10),
	})
	switch {
	case err != nil:
		// Either side of the handover may have happened: release both owners' holds.
		c.queues.settle(q, w, nil, false)
		c.renewer.orphan(m.releaseCall(owner), m.o.ttl)
		return false, nil // the caller's release reports the transport error, or succeeds
	case len(res) == 2 && res[0] == 1:
	case len(res) == 2 && res[0] == 0:
		c.queues.settle(q, w, nil, false) // the release that follows sets q.lastEnd: see fairnessYield
		return false, nil
	default:
		c.queues.settle(q, w, nil, false)
		st.end(ErrLost)
		return true, st.lostAtUnlock()
	}
	next := newLeaseState(m, w.ctx, owner, uint64(res[1]), sent)
	if !c.renewer.add(next) {
		c.queues.settle(q, w, nil, false)
		c.renewer.orphan(m.releaseCall(owner), m.o.ttl)
		st.end(nil)
		return true, nil
	}
	// The server checked for other clients' waiters (and found none) once the streak reached
	// localHandoffs: the next localHandoffs handoffs go without asking again.
	given := c.queues.settle(q, w, next, streak >= localHandoffs)
	st.endQuiet()
	if !given {
		(&Lease{st: next}).Unlock(context.WithoutCancel(ctx)) // the waiter left meanwhile
	}
	return true, nil
}

// passOn makes the lease of a local waiter (Mutex m, Lock's context parent) that takes over
// this lease's hold on the server: same owner secret, the next token, and the deadline and
// renewal time this lease has reached.
func (st *leaseState) passOn(m *Mutex, parent context.Context) *leaseState {
	st.mu.Lock()
	sent := st.lastSent
	st.mu.Unlock()
	next := newLeaseState(m, parent, st.owner, st.token+1, sent)
	next.local = true
	next.base = st.base
	next.ttl.Store(st.ttl.Load())
	next.deadline.Store(st.deadline.Load())
	return next
}
