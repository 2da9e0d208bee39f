package dlock

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/protocol"
)

// DefaultLatchTTL is a latch's life when no WithTTL option is given to Client.Latch.
const DefaultLatchTTL = time.Hour

// MaxLatchID is the longest id CountDownAs accepts, in bytes.
const MaxLatchID = 256

// Latch is a handle on a countdown latch: a count stored on the server that CountDown lowers
// and Wait waits to see at zero. The first CountDown, Wait or Count on a name creates the latch
// with the handle's count, for its TTL (WithTTL, DefaultLatchTTL by default), counted from that
// moment and never extended. A latch that reached zero stays open (Wait returns at once) until
// its TTL; counting down past zero changes nothing. A latch whose TTL ran out before it reached
// zero is expired: for one token retention more (WithTokenRetention, a minute by default)
// Wait, CountDown and Count say so (an error wrapping ErrExpired), then the name is free for a
// new latch. A Latch is cheap to make (no I/O) and safe for concurrent use.
//
// Latches need one server (standalone, Sentinel or Cluster); in quorum mode every call returns
// an error wrapping ErrInvalid.
type Latch struct {
	e       *engine
	name    string
	key     string
	channel string
	count   int
	ttl     time.Duration
	err     error
}

// Latch returns a handle on the countdown latch called name, with count for its initial count
// when this handle creates it. Count 0 makes a handle that never creates the latch: it uses the
// stored count, and its calls fail with ErrNotFound while there is no latch. A handle whose
// count differs from that of the latch on the server gets ErrInvalid. The only option with a
// meaning for a latch is WithTTL (its life, up to MaxFixedTTL); the others are ErrInvalid.
// Latch names live apart from lock names: a latch and a lock may share a name.
func (c *Client) Latch(name string, count int, opts ...Option) *Latch {
	l := &Latch{name: name, count: count}
	if c == nil {
		l.err = fmt.Errorf("%w: nil client", ErrInvalid)
		return l
	}
	l.e = c.e
	o := options{renew: true, wait: -1}.with(opts)
	switch {
	case o.err != nil:
		l.err = o.err
	case !o.renew:
		l.err = fmt.Errorf("%w: latch %q: WithoutRenewal has no meaning for a latch (its TTL is never renewed)", ErrInvalid, name)
	case o.label != "":
		l.err = fmt.Errorf("%w: latch %q: WithLabel has no meaning for a latch", ErrInvalid, name)
	case o.ackN > 0:
		l.err = fmt.Errorf("%w: latch %q: WithReplicaAck has no meaning for a latch", ErrInvalid, name)
	case o.adapt.on():
		l.err = fmt.Errorf("%w: latch %q: WithAdaptiveTTL has no meaning for a latch (give it WithTTL)", ErrInvalid, name)
	case o.wait >= 0:
		l.err = fmt.Errorf("%w: latch %q: WithWait has no meaning for a latch (bound Wait with its context)", ErrInvalid, name)
	case count < 0:
		l.err = fmt.Errorf("%w: latch %q: negative count %d", ErrInvalid, name, count)
	case o.ttl > MaxFixedTTL:
		l.err = fmt.Errorf("%w: latch %q: TTL %v is above MaxFixedTTL (%v)", ErrInvalid, name, o.ttl, MaxFixedTTL)
	}
	if err := checkName(name); err != nil {
		l.err = err
	}
	if c.e.traits.Multi == nil && l.err == nil {
		l.err = fmt.Errorf("%w: latch %q: latches are not available in quorum mode", ErrInvalid, name)
	}
	l.ttl = o.ttl
	if l.ttl == 0 {
		l.ttl = DefaultLatchTTL
	}
	l.key = latchKey(c.opts.prefix, name)
	l.channel = protocol.ReleaseChannel(l.key)
	return l
}

// latchKey returns the key of the latch called name under prefix: the lock key's form (the
// name is the Cluster hash tag) with ":latch" after it, so that it is never a lock's key.
func latchKey(prefix, name string) string { return protocol.LockKey(prefix, name) + ":latch" }

// Name returns the latch name.
func (l *Latch) Name() string {
	if l == nil {
		return ""
	}
	return l.name
}

// CountDown lowers the count by one. The call counts at most once: it carries an id of its own,
// and a try that failed on the network is made again with the same id (within ctx), which the
// server does not count twice. A CountDown that returns a transport error may or may not have
// counted; CountDownAs, with an id of the caller's (a worker's, a task's), can be repeated
// safely. Counting down a latch already at zero changes nothing and returns nil; counting down
// an expired latch returns an error wrapping ErrExpired.
func (l *Latch) CountDown(ctx context.Context) error {
	if err := l.usable(ctx); err != nil {
		return err
	}
	return l.countDown(ctx, "."+l.e.clientID+"."+strconv.FormatUint(l.e.seq.Add(1), 10))
}

// CountDownAs lowers the count by one unless a count-down with the same id already did: the id
// makes the call idempotent, so that a worker that retries, or runs again after a crash, counts
// once. id is 1 to MaxLatchID bytes. Otherwise it is CountDown.
func (l *Latch) CountDownAs(ctx context.Context, id string) error {
	if err := l.usable(ctx); err != nil {
		return err
	}
	if id == "" || len(id) > MaxLatchID {
		return fmt.Errorf("%w: latch %q: count-down id of %d bytes (1 to %d)", ErrInvalid, l.name, len(id), MaxLatchID)
	}
	return l.countDown(ctx, "="+id)
}

// latchRetries is how many times a count-down that failed on the network is tried again.
const latchRetries = 3

func (l *Latch) countDown(ctx context.Context, id string) error {
	wait := 20 * time.Millisecond
	for try := 0; ; try++ {
		st, err := l.call(ctx, 'd', id)
		if err == nil {
			return l.stateErr(st)
		}
		if try == latchRetries || refused(err) || ctx.Err() != nil || classify(err) == ErrDenied {
			return l.callErr(ctx, "count down", err)
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return l.callErr(ctx, "count down", err)
		}
		wait *= 2
	}
}

// Count returns the count left: 0 once the latch is open.
func (l *Latch) Count(ctx context.Context) (int, error) {
	if err := l.usable(ctx); err != nil {
		return 0, err
	}
	st, err := l.call(ctx, 'c', "")
	if err != nil {
		return 0, l.callErr(ctx, "count", err)
	}
	if err := l.stateErr(st); err != nil {
		return st.Left, err
	}
	return st.Left, nil
}

// Wait returns nil once the count is zero, at once if it is. It is woken by the count-down
// that reaches zero (no polling; waiting costs no connection: the client's one subscription
// carries the notice), and returns an error wrapping ErrExpired if the latch expires first,
// or the context's error (with the count left) when ctx ends.
func (l *Latch) Wait(ctx context.Context) error {
	if err := l.usable(ctx); err != nil {
		return err
	}
	e := l.e
	h := e.latches.watch(e, l.key, l.channel)
	defer e.latches.unwatch(e, h)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		sig := h.signal() // taken before the read: a notice after it is not missed
		st, err := l.call(ctx, 'c', "")
		if err != nil {
			return l.callErr(ctx, "wait", err)
		}
		if err := l.stateErr(st); err != nil {
			return err
		}
		if st.Left <= 0 {
			return nil
		}
		if err := e.notices.deniedErr(); err != nil {
			return err
		}
		// Wake at the deadline, to say the latch expired: nothing announces that.
		timer.Reset(st.Rest + time.Millisecond)
		select {
		case <-sig:
		case <-h.q.wake:
			h.broadcast()
		case <-timer.C:
		case <-ctx.Done():
			return fmt.Errorf("dlock: latch %q: %d of %d left: %w", l.name, st.Left, st.Initial, ctx.Err())
		case <-e.done:
			return ErrClosed
		}
		timer.Stop()
	}
}

// LatchInfo is a latch as Latch.Inspect reads it.
type LatchInfo struct {
	Name    string
	Exists  bool          // false: there is no latch of that name (then the rest is zero)
	Left    int           // the count left; 0 once the latch is open
	Count   int           // its initial count
	TTL     time.Duration // until its deadline; 0 once past it
	Expired bool          // its TTL ran out before it reached zero
}

// Inspect reads the latch without creating it or checking the handle's count, for inspection
// tools (dlock latch status).
func (l *Latch) Inspect(ctx context.Context) (LatchInfo, error) {
	info := LatchInfo{Name: l.Name()}
	if err := l.usable(ctx); err != nil {
		return info, err
	}
	mb := l.e.traits.Multi
	st, err := mb.Latch(ctx, protocol.LatchArgs{Key: l.key, Op: 's', TTL: protocol.Millis(l.ttl), Channel: l.channel})
	if err != nil {
		return info, l.callErr(ctx, "inspect", err)
	}
	if st.Status == protocol.LatchNone {
		return info, nil
	}
	info.Exists, info.Left, info.Count, info.TTL = true, st.Left, st.Initial, max(st.Rest, 0)
	info.Expired = st.Rest <= 0 && st.Left > 0
	return info, nil
}

func (l *Latch) usable(ctx context.Context) error {
	switch {
	case l == nil:
		return fmt.Errorf("%w: nil latch", ErrInvalid)
	case l.err != nil:
		return l.err
	case l.e.closed.Load():
		return ErrClosed
	case ctx.Err() != nil:
		return fmt.Errorf("dlock: latch %q: %w", l.name, ctx.Err())
	}
	return nil
}

func (l *Latch) call(ctx context.Context, op byte, id string) (protocol.LatchState, error) {
	mb := l.e.traits.Multi // Latch checked it
	return mb.Latch(ctx, protocol.LatchArgs{Key: l.key, Op: op, Count: l.count, TTL: protocol.Millis(l.ttl), Channel: l.channel, ID: id})
}

func (l *Latch) callErr(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("dlock: latch %q: %w", l.name, ctx.Err())
	}
	return l.e.redisErr(op+" latch "+strconv.Quote(l.name), err)
}

// stateErr is the error a latch's state makes for its callers: expired before zero, created
// with another count, or missing (a handle of count 0).
func (l *Latch) stateErr(st protocol.LatchState) error {
	switch {
	case st.Status == protocol.LatchNone:
		return fmt.Errorf("%w: latch %q does not exist (a handle of count 0 does not create it)", ErrNotFound, l.name)
	case st.Status == protocol.LatchOtherCount:
		return fmt.Errorf("%w: latch %q exists with count %d, not %d", ErrInvalid, l.name, st.Initial, l.count)
	case st.Rest <= 0 && st.Left > 0:
		return fmt.Errorf("dlock: latch %q expired before reaching zero, %d of %d left (%w)", l.name, st.Left, st.Initial, ErrExpired)
	}
	return nil
}

// latchHubs are a client's watches on latch channels: one per latch its callers wait for,
// registered with the client's one subscription; the zero value is ready.
type latchHubs struct {
	mu sync.Mutex
	m  map[string]*latchHub
}

// latchHub is the watch of one latch channel, shared by every Wait of the client on it. The
// subscription wakes its queue (capacity 1); whichever waiter takes that wake broadcasts it to
// the others by closing sig.
type latchHub struct {
	q    *queue
	refs int // guarded by latchHubs.mu

	mu  sync.Mutex
	sig chan struct{}
}

func (hs *latchHubs) watch(e *engine, key, channel string) *latchHub {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.m == nil {
		hs.m = make(map[string]*latchHub)
	}
	h := hs.m[channel]
	if h == nil {
		h = &latchHub{
			q:   &queue{key: key, channel: channel, wake: make(chan struct{}, 1), rearm: make(chan struct{}, 1)},
			sig: make(chan struct{}),
		}
		hs.m[channel] = h
		e.notices.add(channel, h.q)
	}
	h.refs++
	return h
}

func (hs *latchHubs) unwatch(e *engine, h *latchHub) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	h.refs--
	if h.refs == 0 {
		delete(hs.m, h.q.channel)
		e.notices.remove(h.q.channel, h.q)
	}
}

// signal returns the channel that the next wake closes.
func (h *latchHub) signal() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sig
}

// broadcast wakes every waiter of the hub.
func (h *latchHub) broadcast() {
	h.mu.Lock()
	defer h.mu.Unlock()
	close(h.sig)
	h.sig = make(chan struct{})
}
