package dlock

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/dlock-go/dlock/internal/backend"
	"github.com/dlock-go/dlock/internal/protocol"
)

// What RWMutex (rwmutex.go) and Semaphore (semaphore.go) share: a hold of either is a lease
// like a Mutex's (Lease, leaseState: renewed by the client's one renewal loop, lost on the
// same signal), on a hash of holders each with a lease of its own (shared.lua). A crashed
// reader or permit holder frees its units when its own lease runs out, whoever else holds.

// sharedHandle is the part of an RWMutex or Semaphore handle made from its name and options.
type sharedHandle struct {
	e    *engine
	name string
	base lockSpec // every field but shared, which each kind of hold sets
	err  error    // bad name or option, or a deployment without them: reported by every call
}

// newSharedHandle resolves name and opts into the keys (the name's key with suffix: ":rw" or
// ":sem") and lease of a read-write lock or semaphore of c. what names the primitive in errors.
func (c *Client) newSharedHandle(name, suffix, what string, opts []Option) sharedHandle {
	h := sharedHandle{name: name}
	if c == nil {
		h.err = fmt.Errorf("%w: nil client", ErrInvalid)
		return h
	}
	h.e = c.e
	o := c.opts.with(opts)
	h.err = o.err
	if h.err == nil {
		h.err = checkTTL(o.ttl, o.renew)
	}
	if err := checkName(name); err != nil {
		h.err = err
	}
	if h.err == nil && o.adapt.on() {
		h.err = fmt.Errorf("%w: %s %q: WithAdaptiveTTL is for a Mutex: every hold of a read-write lock or semaphore has the lease WithTTL gives", ErrInvalid, what, name)
	}
	if h.err == nil && turnAsked(opts) {
		h.err = fmt.Errorf("%w: %s %q: WithTurnSlice is for a Mutex: a read-write lock's or semaphore's holds are granted by the server one by one", ErrInvalid, what, name)
	}
	if h.err == nil && !c.e.traits.Shared {
		h.err = fmt.Errorf("%w: %s %q: not available in quorum mode (docs/PROTOCOL.md, \"Read-write locks and semaphores\")", ErrInvalid, what, name)
	}
	o.slice = 0 // a client default for Mutexes
	key := protocol.LockKey(o.prefix, name) + suffix
	h.base = lockSpec{
		name: name, key: key, keys: protocol.SharedKeys(key), channel: protocol.ReleaseChannel(key),
		ttl: o.ttl, ttlArg: protocol.Millis(o.ttl), renew: o.renew, meta: c.meta,
		ack: backend.ReplicaAck{N: o.ackN, Wait: o.ackWait}, wait: o.wait,
	}
	if o.label != c.opts.label {
		h.base.meta = holderMeta(o.label)
	}
	return h
}

// spec returns the lockSpec of a hold of kind and units (size: the semaphore's declared size,
// which the server stores only when it has none).
func (h *sharedHandle) spec(kind protocol.SharedKind, units, size int) *lockSpec {
	s := h.base
	s.shared = &protocol.SharedSpec{Kind: kind, Units: units, Size: size}
	return &s
}

// check reports what makes any call on the handle fail at once.
func (h *sharedHandle) check(ctx context.Context) error {
	if h.err != nil {
		return h.err
	}
	if h.e.closed.Load() {
		return ErrClosed
	}
	if ctx.Err() != nil {
		return h.base.ctxErr(ctx)
	}
	return nil
}

// acquireShared takes a hold of spec: one attempt, or, with wait (and WithWait other than 0),
// waiting as the context and WithWait allow (sharedwait.go).
func (e *engine) acquireShared(ctx context.Context, spec *lockSpec, wait bool) (*Lease, error) {
	return lockOrWait(ctx, spec.wait, wait,
		func() (*Lease, error) {
			st, res, err := e.sharedAttempt(ctx, spec, nil)
			if err != nil || st != nil {
				return leaseOf(st), err
			}
			return nil, e.sharedNotAcquired(ctx, spec, res.Token, 0, nil)
		},
		func(wctx context.Context) (*Lease, error) {
			st, err := e.waitShared(wctx, spec)
			return leaseOf(st), err
		},
		func(_ context.Context, waited time.Duration, cause error) error {
			return e.sharedNotAcquired(ctx, spec, 0, waited, cause)
		})
}

// sharedArgs is shared.lua's acquire operation for a hold of this read-write lock or
// semaphore, with lease (ms), announcing with SPUBLISH when sharded; the caller sets the
// owner and the mode.
func (s *lockSpec) sharedArgs(lease string, sharded bool) protocol.SharedAcquireArgs {
	return protocol.SharedAcquireArgs{Keys: s.keys, Meta: s.meta, Channel: s.channel, Shared: s.shared, Lease: lease, Sharded: sharded}
}

// sharedAttempt runs shared.lua's acquire once for spec: with a new owner secret, or, with
// w, with its registration (queueing the caller when its units do not fit). It returns the
// lease, or the refusal (when to look again), or an error. A refusal with pending set means
// the caller's entry was granted and the announcement got there first: the lease is on its
// way to w.
func (e *engine) sharedAttempt(ctx context.Context, spec *lockSpec, w *sharedWaiter) (*leaseState, protocol.SharedAcquired, error) {
	if err := e.guard.refusal(ctx); err != nil {
		return nil, protocol.SharedAcquired{}, fmt.Errorf("dlock: lock %q: %w", spec.name, err)
	}
	a := spec.sharedArgs(spec.ttlArg, e.traits.Sharded)
	var reg *registration
	if w != nil {
		reg = w.reg
		a.Owner, a.Mode, a.Entry, a.Window, a.Place = reg.owner, 'q', reg.id, reg.winArg, reg.place
	} else {
		a.Owner = e.newOwner()
	}
	sent := mono()
	r, acked, err := e.b.Run(ctx, a.Call(), spec.ack)
	var res protocol.SharedAcquired
	if err == nil {
		res, err = protocol.ReadSharedAcquire(r)
	}
	if err != nil {
		// The script may have run all the same: release under this owner, as Mutex does.
		if reg == nil || !e.unregister(reg) {
			e.renewer.orphan(spec.releaseReq(a.Owner), spec.ttl)
		}
		if ctx.Err() != nil {
			return nil, protocol.SharedAcquired{}, spec.ctxErr(ctx)
		}
		return nil, protocol.SharedAcquired{}, e.redisErr("lock "+strconv.Quote(spec.name), err)
	}
	if res.Size > 0 {
		return nil, res, fmt.Errorf("%w: semaphore %q: %d permits asked for, of a size of %d on the server: ask for fewer, or resize the semaphore",
			ErrInvalid, spec.name, spec.shared.Units, res.Size)
	}
	if !res.OK {
		if w != nil {
			e.registered(w.reg, sent, 1, []uint64{res.Stale})
		}
		return nil, res, nil
	}
	if reg != nil && !e.claimed(reg) {
		return nil, protocol.SharedAcquired{Pending: true, Retry: -1}, nil
	}
	if spec.ack.N > 0 && acked < spec.ack.N {
		return nil, protocol.SharedAcquired{}, e.rollBack(ctx, spec, a.Owner, acked)
	}
	st := newLeaseState(e, spec, ctx, a.Owner, res.Token, sent)
	if !e.renewer.add(st) {
		e.renewer.orphan(spec.releaseReq(a.Owner), spec.ttl)
		return nil, protocol.SharedAcquired{}, ErrClosed
	}
	return st, res, nil
}

// reenterShared adds a hold to st, a lease of this client on the same read-write lock found in
// the caller's context: same token, one more hold, as Mutex re-entry.
func (e *engine) reenterShared(ctx context.Context, st *leaseState) (*Lease, error) {
	return e.reentry(st, func(ttl time.Duration) (bool, error) {
		a := st.spec.sharedArgs(protocol.Millis(ttl), e.traits.Sharded)
		a.Owner, a.Mode = st.owner, 'r'
		r, _, err := e.b.Run(ctx, a.Call(), backend.ReplicaAck{})
		if err != nil {
			return false, err
		}
		res, err := protocol.ReadSharedAcquire(r)
		return res.OK, err
	})
}

// downgrade takes a read hold (spec) under w, a write lease of this client on the same lock:
// it is admitted at once, whoever waits, with the writer's token, and outlives the write hold.
func (e *engine) downgrade(ctx context.Context, spec *lockSpec, w *leaseState) (*Lease, error) {
	if w.expired() || w.state.Load() != stateHeld {
		return nil, w.endedErr()
	}
	owner := e.newOwner()
	sent := mono()
	a := spec.sharedArgs(spec.ttlArg, e.traits.Sharded)
	a.Owner, a.Mode, a.Parent = owner, 'd', w.owner
	r, acked, err := e.b.Run(ctx, a.Call(), spec.ack)
	var res protocol.SharedAcquired
	if err == nil {
		res, err = protocol.ReadSharedAcquire(r)
	}
	if err != nil {
		e.renewer.orphan(spec.releaseReq(owner), spec.ttl)
		return nil, e.redisErr("read-lock "+strconv.Quote(spec.name)+" under its write lock", err)
	}
	if !res.OK {
		w.end(endLost, w.lost("a read lock under it found the write lock no longer held by this lease"))
		return nil, w.endedErr()
	}
	if spec.ack.N > 0 && acked < spec.ack.N {
		e.renewer.orphan(spec.releaseReq(owner), spec.ttl)
		return nil, fmt.Errorf("%w: read-lock %q: %d of %d replicas acknowledged within %v; released again",
			ErrReplicaAck, spec.name, max(acked, 0), spec.ack.N, spec.ack.Wait)
	}
	st := newLeaseState(e, spec, ctx, owner, res.Token, sent)
	if !e.renewer.add(st) {
		e.renewer.orphan(spec.releaseReq(owner), spec.ttl)
		return nil, ErrClosed
	}
	return &Lease{st: st}, nil
}

// sharedNotAcquired makes the error of an attempt or a wait that ended without the hold: a
// *NotAcquiredError naming a holder, as the server describes the lock now (one more read,
// within a second), or, when it turns out to be free, the context's error.
func (e *engine) sharedNotAcquired(ctx context.Context, spec *lockSpec, token uint64, waited time.Duration, cause error) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	na := &NotAcquiredError{Name: spec.name, Waited: waited, Cause: cause}
	reply, err := e.b.EvalAny(rctx, protocol.ScriptShared, spec.keys, protocol.SharedInspectArgs...)
	if err == nil {
		if s, err := protocol.ReadSharedState(reply); err == nil {
			na.Holder = sharedInfo(spec.name, spec.shared.Kind, s)
			if !na.Holder.Held && na.Holder.Shared.Queued == 0 && cause != nil {
				return fmt.Errorf("dlock: lock %q: %w", spec.name, cause) // free now: the caller's context ended the wait
			}
		}
	}
	if na.Holder.Token == 0 {
		na.Holder.Token = token
	}
	return na
}
