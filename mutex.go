package dlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/dlock-go/dlock/conn"
)

// Mutex is a handle on one named lock. It is cheap to make (no I/O) and safe for concurrent
// use; each Lock or TryLock that succeeds returns its own Lease.
type Mutex struct {
	c       *Client
	name    string
	key     string   // <prefix>{<name>}: the name is the cluster hash tag
	keys    []string // {key}, for script calls
	channel string   // <prefix>{<name>}:rel, where releases are announced
	ttlArg  string   // lease in ms
	meta    string
	o       options
	err     error // bad name or option, reported by Lock and TryLock
}

// Mutex returns a handle on the lock called name. Options override the client's defaults for
// this lock. An invalid name or option is reported by Lock and TryLock.
func (c *Client) Mutex(name string, opts ...Option) *Mutex {
	m := &Mutex{c: c, name: name}
	if c == nil {
		m.err = fmt.Errorf("%w: nil client", ErrInvalid)
		return m
	}
	m.o = c.opts.with(opts)
	m.err = m.o.err
	if m.err == nil && c.quorum && m.o.ackN > 0 {
		m.err = fmt.Errorf("%w: WithReplicaAck is not available in quorum mode", ErrInvalid)
	}
	if err := checkName(name); err != nil {
		m.err = err
	}
	m.key = lockKey(m.o.prefix, name)
	m.keys = []string{m.key}
	m.channel = releaseChannel(m.key)
	m.ttlArg = strconv.FormatInt(m.o.ttl.Milliseconds(), 10)
	m.meta = c.meta
	if m.o.label != c.opts.label {
		m.meta = holderMeta(m.o.label)
	}
	return m
}

// Name returns the lock name.
func (m *Mutex) Name() string { return m.name }

// Lock acquires the lock, waiting as long as ctx allows. Waiting costs no polling and no
// pooled connection: a release anywhere wakes the waiters (a crashed holder's lease is waited
// out); waiters of one client queue first-in first-out. If ctx carries a lease on this lock
// from the same client (a lease's Context, or the context inside Do), Lock re-enters it: same
// token, one more hold. On failure it returns an error that wraps ctx.Err(), ErrClosed,
// ErrInvalid or the transport error, and holds nothing.
func (m *Mutex) Lock(ctx context.Context) (*Lease, error) {
	return m.lock(ctx, true)
}

// TryLock makes one attempt to acquire the lock (or re-enter it, as Lock does). When another
// owner holds it, it returns an error wrapping ErrNotAcquired.
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
	if err := m.c.checkOpen(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, m.ctxErr(ctx)
	}
	if st := heldIn(ctx, m.c, m.key); st != nil {
		return m.reenter(ctx, st)
	}
	if !wait {
		l, b, err := m.attempt(ctx)
		if err != nil || l != nil {
			return l, err
		}
		return nil, fmt.Errorf("%w: %q (its lease has %v left)", ErrNotAcquired, m.name, b.pttl)
	}
	if m.c.queues.waiting(m.key) {
		return m.wait(ctx, nil) // join the local queue: only its head talks to Redis
	}
	l, b, err := m.attempt(ctx)
	if err != nil || l != nil {
		return l, err
	}
	return m.wait(ctx, &b)
}

// busy describes the holder that refused an attempt.
type busy struct {
	pttl  time.Duration // its remaining lease; <= 0 when unknown
	token uint64        // its token
}

// attempt runs the acquire script once with a new owner secret.
func (m *Mutex) attempt(ctx context.Context) (*Lease, busy, error) {
	if err := m.c.guard.refusal(ctx, m.c.need); err != nil {
		return nil, busy{}, fmt.Errorf("dlock: lock %q: %w", m.name, err)
	}
	owner := m.c.newOwner()
	sent := mono()
	var res []int64
	var err error
	acked := int64(-1)
	if m.o.ackN > 0 {
		rs := m.c.conn.EvalMulti(ctx, []conn.Call{
			{Script: scriptAcquire, Keys: m.keys, Args: []string{owner, m.ttlArg, m.meta}},
			{WaitReplicas: m.o.ackN, WaitTimeout: m.o.ackWait},
		})
		res, err = rs[0].Ints, rs[0].Err
		if len(rs) == 2 && rs[1].Err == nil && len(rs[1].Ints) == 1 {
			acked = rs[1].Ints[0]
		}
	} else {
		res, err = m.c.conn.Eval(ctx, scriptAcquire, m.keys, []string{owner, m.ttlArg, m.meta})
	}
	if err != nil {
		// The script may have run all the same (the reply was lost, or the caller gave up
		// waiting for it): release under this owner secret, so that no lease nobody holds lingers.
		m.c.renewer.orphan(m.releaseCall(owner), m.o.ttl)
		if ctx.Err() != nil {
			return nil, busy{}, m.ctxErr(ctx)
		}
		return nil, busy{}, m.c.redisErr("lock "+strconv.Quote(m.name), err)
	}
	if len(res) != 3 {
		return nil, busy{}, fmt.Errorf("dlock: lock %q: unexpected reply %v from %s", m.name, res, m.c.conn.Addr())
	}
	if res[0] != 1 {
		return nil, busy{pttl: time.Duration(res[1]) * time.Millisecond, token: uint64(res[2])}, nil
	}
	if m.o.ackN > 0 && acked < int64(m.o.ackN) {
		// Roll back: a failover now could hand the lock to a replica that never saw it.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
		call := m.releaseCall(owner)
		_, rerr := m.c.conn.Eval(rctx, call.Script, call.Keys, call.Args)
		cancel()
		if rerr != nil {
			m.c.renewer.orphan(call, m.o.ttl)
		}
		return nil, busy{}, fmt.Errorf("%w: lock %q: %d of %d replicas acknowledged within %v; released again",
			ErrReplicaAck, m.name, max(acked, 0), m.o.ackN, m.o.ackWait)
	}
	st := newLeaseState(m, ctx, owner, uint64(res[1]), sent)
	if m.c.quorum && mono() >= st.deadline.Load() {
		// Redlock: the majority took longer than the validity time (TTL − drift) to answer,
		// so the lease has no time left. Give it back and count the attempt as failed. (On one
		// server such a lease is returned, already lost: its context tells the holder.)
		m.c.renewer.orphan(m.releaseCall(owner), m.o.ttl)
		return nil, busy{}, nil
	}
	if !m.c.renewer.add(st) {
		m.c.renewer.orphan(m.releaseCall(owner), m.o.ttl)
		return nil, busy{}, ErrClosed
	}
	return &Lease{st: st}, busy{}, nil
}

func (m *Mutex) releaseCall(owner string) conn.Call {
	return conn.Call{Script: scriptRelease, Keys: m.keys, Args: m.c.releaseArgs(owner, m.channel, true, 0, false)}
}

// reenter adds a hold to st, a lease of this client on this lock found in the caller's context.
func (m *Mutex) reenter(ctx context.Context, st *leaseState) (*Lease, error) {
	if st.expired() || st.state.Load() != stateHeld {
		return nil, st.endedErr()
	}
	ttl := st.currentTTL()
	sent := mono()
	res, err := m.c.conn.Eval(ctx, scriptAcquire, m.keys,
		[]string{st.owner, strconv.FormatInt(ttl.Milliseconds(), 10), m.meta, "r"})
	if err != nil {
		return nil, m.c.redisErr("re-enter "+strconv.Quote(m.name), err)
	}
	// In quorum mode each server has its own token; the lease's is the largest of a majority.
	if len(res) != 3 || res[0] != 1 || (!m.c.quorum && uint64(res[1]) != st.base) {
		st.end(ErrLost)
		return nil, st.endedErr()
	}
	st.mu.Lock()
	st.holds++
	st.mu.Unlock()
	if st.renewed(sent, ttl) {
		m.c.renewer.reschedule(st)
	}
	return &Lease{st: st}, nil
}

// wait queues behind this client's other waiters for the lock, then, as the head of that queue,
// alternates attempts with waiting for a release notice or the holder's lease to run out.
// known, when set, is the answer of an attempt made just before.
func (m *Mutex) wait(ctx context.Context, known *busy) (*Lease, error) {
	q, w, head := m.c.queues.join(m, ctx)
	var got *leaseState // when set, the next head waits for this lease to end
	defer func() {
		if stray := m.c.queues.leave(q, w, got); stray != nil {
			(&Lease{st: stray}).Unlock(context.WithoutCancel(ctx))
		}
	}()
	if !head {
		select {
		case <-w.turn:
		case got = <-w.grant:
			return &Lease{st: got}, nil
		case <-ctx.Done():
			return nil, m.ctxErr(ctx)
		case <-m.c.done:
			return nil, ErrClosed
		}
		known = w.handoff // the previous head just took the lock: wait for its release
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	first := true // the first attempt of a new head goes at once
	for {
		var b busy
		select {
		case got = <-w.grant: // the holder handed the lock over
			return &Lease{st: got}, nil
		default:
		}
		alone := q.alone.Swap(false) // this client's last release reached no other client
		if m.c.quorum && known == nil && !first && !alone {
			// Quorum mode: every contender hears the same release (from each server) at once;
			// a random pause before the attempt spreads them, so fewer votes split.
			if st, err := m.pause(ctx, w, timer, nil, time.Duration(rand.Int64N(int64(2*time.Millisecond)))); st != nil || err != nil {
				got = st
				return leaseOf(st), err
			}
		}
		first = false
		if last := q.lastEnd.Load(); known == nil && last != 0 && holdBack(time.Duration(mono()-last)) > 0 {
			// This client held the lock a moment ago: give the other clients' heads a head start
			// (the more recently it held it, the longer it waits; see fairnessYield).
			if st, err := m.pause(ctx, w, timer, nil, holdBack(time.Duration(mono()-last))); st != nil || err != nil {
				got = st
				return leaseOf(st), err
			}
		}
		if known != nil {
			b, known = *known, nil
		} else {
			q.drain()
			l, bb, err := m.attempt(ctx)
			if err != nil {
				return nil, err
			}
			if l != nil {
				got = l.st
				return l, nil
			}
			b = bb
		}
		q.block(b.token)
		// Retry when the holder's lease runs out (a crashed holder sends no notice). PTTL is
		// rounded down to the millisecond; a negative one means the server did not say.
		d := b.pttl + time.Millisecond
		if b.pttl < 0 {
			d = m.o.ttl
		}
		if st, err := m.pause(ctx, w, timer, q.wake, d); st != nil || err != nil {
			got = st
			return leaseOf(st), err
		}
	}
}

// pause waits, as the head of a queue, for d to pass, for wake (when not nil), or for a lease
// handed over to w. It returns that lease, or an error when ctx ends or the client closes.
func (m *Mutex) pause(ctx context.Context, w *waiter, timer *time.Timer, wake <-chan struct{}, d time.Duration) (*leaseState, error) {
	timer.Reset(d)
	defer timer.Stop()
	select {
	case <-wake:
	case st := <-w.grant:
		return st, nil
	case <-timer.C:
	case <-ctx.Done():
		return nil, m.ctxErr(ctx)
	case <-m.c.done:
		return nil, ErrClosed
	}
	return nil, nil
}

func leaseOf(st *leaseState) *Lease {
	if st == nil {
		return nil
	}
	return &Lease{st: st}
}

func (m *Mutex) ctxErr(ctx context.Context) error {
	return fmt.Errorf("dlock: lock %q: %w", m.name, ctx.Err())
}

// Do acquires the lock called name (waiting as Lock does), runs fn with a context that is
// cancelled when ctx is or when the lock is lost (context.Cause then returns ErrLost), and
// releases the lock when fn returns or panics. Passing fn's context to Lock, TryLock or Do of
// the same name re-enters the lock. Do returns fn's error, joined with an error wrapping
// ErrLost when the lock was lost before fn returned, or with the release error: a nil result
// means fn ran to completion while the lock was held. The converse does not hold: an error
// wrapping ErrLost or a release error can come after fn did all its work, so record the
// outcome of the work itself (a committed transaction, say) rather than inferring it from Do.
// ctx bounds both the wait for the lock and fn; to bound only the wait, take the lock with
// Mutex.Lock and a context of its own.
func (c *Client) Do(ctx context.Context, name string, fn func(ctx context.Context) error, opts ...Option) (err error) {
	if fn == nil {
		return fmt.Errorf("%w: nil function", ErrInvalid)
	}
	l, err := c.Mutex(name, opts...).Lock(ctx)
	if err != nil {
		return err
	}
	fctx, stop := l.st.doContext(ctx)
	defer func() {
		stop()
		if uerr := l.Unlock(ctx); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}()
	return fn(fctx)
}
