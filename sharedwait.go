package dlock

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/protocol"
)

// Waiting for a read-write lock or a semaphore. Unlike a Mutex's waiters (wait.go), which queue
// once per client and take turns, every caller that waits here has an entry of its own in the
// server's queue (registration, as wait.go's, kept alive by the renewal loop with queue.lua):
// several of them can be served at once (all the readers behind a writer), and each asks for
// its own units. The server serves the entries first-in first-out as units free up
// (shared.lua's walk): a release, or an attempt that finds holders whose lease ran out, grants
// the units to the first entries that fit, stopping at the first that does not, and announces
// the grants in one message on the primitive's channel. The client's one subscription routes
// that message here (a group per name, the channel's sink), and each grant becomes the
// waiter's lease with no round trip, as a Mutex's grant does.
//
// A waiter makes an attempt when it starts, when the lease of the first holder it was told of
// could have run out (a holder that crashed announces nothing), when its entry is gone from
// the server (granted, the announcement missed), and when the subscription is (re)confirmed.
// The first waiter of a name in this client also looks again when units were granted to
// another client and that grant's first lease (its acceptance window) could have run out: a
// grantee that crashed then delays the others by at most its window.

// noticeSink takes the announcements and wake-ups of one channel instead of a Mutex's queue.
type noticeSink interface {
	notice(payload string) // an announcement on the channel
	wake()                 // announcements may have been missed: look again
}

// sharedWaits is a client's waiters for read-write locks and semaphores.
type sharedWaits struct {
	e *engine

	mu     sync.Mutex
	groups map[string]*sharedGroup // by key
}

// sharedGroup is the waiters of one name in this client, in arrival order; its sink is
// registered with the notifier for the name's channel while it has waiters, and for the
// notifier's linger after its last one left.
type sharedGroup struct {
	sw      *sharedWaits
	sink    *queue
	waiters []*sharedWaiter
	idle    int // how many times it emptied (under sharedWaits.mu): reap drops it only if still idle
}

// sharedWaiter is one waiting caller.
type sharedWaiter struct {
	spec  *lockSpec
	ctx   context.Context
	reg   *registration
	q     *queue           // its own: wake (attempt now), rearm and pokeAt (look again by then)
	grant chan *leaseState // capacity 1
	left  bool             // under sharedWaits.mu: gave up; a grant delivered now is released
}

func newSharedWaits(e *engine) *sharedWaits {
	return &sharedWaits{e: e, groups: make(map[string]*sharedGroup)}
}

// waitShared takes a hold of spec for a caller that may wait: it attempts, queued on the
// server under an entry of its own, until it gets the units, ctx ends or the client closes.
func (e *engine) waitShared(ctx context.Context, spec *lockSpec) (*leaseState, error) {
	sw := e.sharedWaits
	w := e.newSharedWaiter(ctx, spec)
	joined, got := false, false
	defer func() {
		sw.leave(w, joined, got)
		if o := e.obs; o != nil && joined {
			o.waiting(ctx, spec, false, sw.localWaiters(spec.key))
		}
	}()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		st, res, err := e.sharedAttempt(ctx, spec, w)
		if err != nil {
			return nil, err
		}
		if st != nil {
			got = true
			return e.confirmed(ctx, st)
		}
		if !joined {
			sw.join(w)
			joined = true
			if o := e.obs; o != nil {
				o.waiting(ctx, spec, true, sw.localWaiters(spec.key))
			}
		}
		at := mono() + int64(spec.ttl)
		if res.Retry >= 0 {
			at = mono() + int64(res.Retry+time.Millisecond) // PTTLs are rounded down to the ms
		}
	wait:
		for {
			timer.Reset(time.Duration(max(at-mono(), 0)))
			select {
			case st := <-w.grant:
				got = true
				return e.confirmed(ctx, st)
			case <-w.q.wake:
				break wait
			case <-w.q.rearm:
				at = min(at, w.q.pokeAt.Load())
			case <-timer.C:
				break wait
			case <-ctx.Done():
				return nil, spec.ctxErr(ctx)
			case <-e.done:
				return nil, ErrClosed
			}
			timer.Stop()
		}
		timer.Stop()
		select {
		case st := <-w.grant:
			got = true
			return e.confirmed(ctx, st)
		default:
		}
	}
}

// newSharedWaiter makes the waiter of a caller of ctx for spec, with its registration (not yet
// on the server).
func (e *engine) newSharedWaiter(ctx context.Context, spec *lockSpec) *sharedWaiter {
	w := &sharedWaiter{spec: spec, ctx: ctx, grant: make(chan *leaseState, 1),
		q: &queue{key: spec.key, wake: make(chan struct{}, 1), rearm: make(chan struct{}, 1)}}
	w.reg = e.newRegistration(spec)
	w.reg.q = w.q // the renewal loop wakes it when the entry is gone (waitQueues.entryGone)
	w.reg.waiter = w
	return w
}

// join adds w to its name's group, making the group (and subscribing to the channel) if it is
// the first.
func (sw *sharedWaits) join(w *sharedWaiter) {
	sw.mu.Lock()
	g := sw.groups[w.spec.key]
	fresh := g == nil
	if fresh {
		g = &sharedGroup{sw: sw}
		g.sink = &queue{key: w.spec.key, channel: w.spec.channel, wake: make(chan struct{}, 1), rearm: make(chan struct{}, 1), sink: g}
		sw.groups[w.spec.key] = g
	}
	g.waiters = append(g.waiters, w)
	sw.mu.Unlock()
	if fresh {
		// The subscription's confirmation wakes every waiter of the group (wake): a grant
		// announced between its attempt and the subscription is claimed then.
		sw.e.notices.add(w.spec.channel, g.sink)
	}
}

// leave takes w out of its group and out of the server's queue: a grant made to its entry in
// the meantime is released (release with the entry id, in the background), as is one that
// reached w as it gave up. got: w has its lease.
func (sw *sharedWaits) leave(w *sharedWaiter, joined, got bool) {
	sw.mu.Lock()
	w.left = true
	var stray *leaseState
	if !got {
		select {
		case stray = <-w.grant:
		default:
		}
	}
	if joined {
		g := sw.groups[w.spec.key]
		if g != nil {
			for i, x := range g.waiters {
				if x == w {
					g.waiters = append(g.waiters[:i], g.waiters[i+1:]...)
					break
				}
			}
			if len(g.waiters) == 0 {
				// The group lingers, subscribed, so that the next waiter of the name (on a busy
				// lock, within milliseconds) finds it with no subscription to make and no
				// announcement missed; it goes once idle for the notifier's linger.
				g.idle++
				idle := g.idle
				time.AfterFunc(linger, func() { sw.reap(w.spec, g, idle) })
			}
		}
	}
	sw.mu.Unlock()
	if stray != nil {
		(&Lease{st: stray}).Unlock(context.WithoutCancel(w.ctx))
	}
	if !got {
		sw.e.unregister(w.reg)
	}
}

// localWaiters returns how many callers of this client wait for the read-write lock or
// semaphore whose key is key.
func (sw *sharedWaits) localWaiters(key string) int {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if g := sw.groups[key]; g != nil {
		return len(g.waiters)
	}
	return 0
}

// reap drops g, the group of spec's name, if it has had no waiter since it emptied for the
// idle-th time.
func (sw *sharedWaits) reap(spec *lockSpec, g *sharedGroup, idle int) {
	sw.mu.Lock()
	gone := sw.groups[spec.key] == g && len(g.waiters) == 0 && g.idle == idle
	if gone {
		delete(sw.groups, spec.key)
	}
	sw.mu.Unlock()
	if gone {
		sw.e.notices.remove(spec.channel, g.sink)
	}
}

// grantTo takes a grant announced for w's entry with token and window (engine.granted found
// w's registration in the client's table of registrations and checked the grant is not
// stale): the lease of w, which the renewal loop renews to its TTL at once. The server started
// the grant's lease (the window) after it ran the request that last made or refreshed the
// entry, so that request's send time bounds it (as for a Mutex's grant). It runs in the
// subscription's goroutine and does no I/O.
func (sw *sharedWaits) grantTo(w *sharedWaiter, token uint64, window time.Duration) {
	e, reg := sw.e, w.reg
	from := reg.sentOn[0].Load()
	if mono() >= from+int64(window-drift(window)) {
		// Its window ran out before this client could act on it (paused): the grant lapsed
		// on the server, and so did the entry it consumed. A lease of it would be lost
		// already; the waiter queues again instead.
		select {
		case w.q.wake <- struct{}{}:
		default:
		}
		return
	}
	if !e.withdrawn(reg) {
		return // claimed by an attempt, or given up
	}
	st := newLeaseState(e, w.spec, w.ctx, reg.owner, token, from)
	st.ttl.Store(int64(window))
	st.deadline.Store(from + int64(window-drift(window)))
	st.confirm.Store(true)
	if !e.renewer.add(st) {
		return // closing: the server's lease runs out within the window
	}
	sw.mu.Lock()
	left := w.left
	if !left {
		w.grant <- st // capacity 1, and one grant per entry
	}
	sw.mu.Unlock()
	if left {
		// Nobody to give it to: give it back, which grants it to the next entries.
		st.end(endReleased, nil)
		e.renewer.background(release{req: st.releaseReq(true), at: mono(), until: mono() + int64(window)})
	}
}

// notice takes an announcement on the group's channel: "G <id> <token> <window ms> ..." for
// grants. A grant to another client makes the group's first waiter look again once that
// grant's first lease could have run out.
func (g *sharedGroup) notice(payload string) {
	grants, ok := protocol.ParseGrants(payload, nil)
	if !ok {
		return
	}
	mine := g.sw.e.clientID + "."
	var others time.Duration
	for _, gr := range grants {
		if strings.HasPrefix(gr.ID, mine) {
			g.sw.e.granted(gr.ID, gr.Token, 0, gr.Window)
		} else {
			others = max(others, gr.Window)
		}
	}
	if others > 0 {
		g.sw.mu.Lock()
		var head *sharedWaiter
		if len(g.waiters) > 0 {
			head = g.waiters[0]
		}
		g.sw.mu.Unlock()
		if head != nil {
			at := mono() + int64(others+time.Millisecond)
			if old := head.q.pokeAt.Load(); old == 0 || old < mono() || at < old {
				head.q.pokeAt.Store(at)
			}
			select {
			case head.q.rearm <- struct{}{}:
			default:
			}
		}
	}
}

// wake makes every waiter of the group attempt: announcements may have been missed (a new or
// renewed subscription).
func (g *sharedGroup) wake() {
	g.sw.mu.Lock()
	defer g.sw.mu.Unlock()
	for _, w := range g.waiters {
		select {
		case w.q.wake <- struct{}{}:
		default:
		}
	}
}
