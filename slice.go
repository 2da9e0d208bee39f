package dlock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Turns per process (WithTurnSlice). A Mutex's lock passes among one client's waiters without a
// round trip (local handoffs, wait.go); a turn slice extends that to the caller that unlocks
// it itself: at the last Unlock, with no waiter of this client to pass it to, the client keeps
// the lock on the server, parked, until its turn's slice has run out, and a Lock (or TryLock)
// of the same name by this client meanwhile takes it back at once, locally, with the next
// token. When the slice runs out the parked lock is released as an Unlock would have released
// it, and the server grants it to the first client queued. A turn begins when the client gets
// the lock from the server and lasts at most the slice and at most localHandoffs local passes
// (the tokens a server token leaves room for), so clients are served first-in first-out, each
// for a turn of at most the slice.

// MaxTurnSlice is the longest turn slice WithTurnSlice accepts: a slice is how long the other
// clients may wait behind a turn, and a holder that crashes during it holds them for a TTL.
const MaxTurnSlice = time.Second

// WithTurnSlice gives a Mutex turns per process: after its last Unlock, the lock stays with
// this client until d has passed since the client got it from the server, and a Lock or TryLock
// of the same name by this client within that time takes it back with no round trip (a token
// between the server's, larger than the last). When the slice ends, the lock goes to the next
// client queued on the server, first-in first-out. A turn holds the lock for at most d and at
// most 16 holds in a row; the other clients wait at most a turn per client ahead of them.
//
// It trades the others' latency (up to d per turn) for throughput when one process locks the
// same name again and again. Between holds the lock is held on the server: Inspect and dlock
// list show this client as its holder, and a process that crashes (or pauses past its lease)
// during a slice holds the others for the lease's TTL, as a crashed holder does. 0 (the
// default) releases at every Unlock. It applies to a Mutex with a renewed lease, without
// WithReplicaAck or WithAdaptiveTTL (each of whose holds goes through the server); d may be at
// most MaxTurnSlice.
func WithTurnSlice(d time.Duration) Option {
	return func(o *options) {
		if d < 0 || d > MaxTurnSlice {
			o.fail(fmt.Errorf("%w: WithTurnSlice(%v): not within 0 and MaxTurnSlice (%v)", ErrInvalid, d, MaxTurnSlice))
			return
		}
		o.slice = d
	}
}

// checkSlice reports a turn slice that a Mutex with these options cannot honour.
func checkSlice(o options, e *engine) error {
	switch {
	case o.slice == 0:
		return nil
	case !e.traits.LocalHandoffs:
		return fmt.Errorf("%w: WithTurnSlice: this deployment passes no lock within a client", ErrInvalid)
	case !o.renew:
		return fmt.Errorf("%w: WithTurnSlice with WithoutRenewal: a parked lock must stay renewed", ErrInvalid)
	case o.ackN > 0:
		return fmt.Errorf("%w: WithTurnSlice with WithReplicaAck: every hold must then go through the server", ErrInvalid)
	case o.adapt.on():
		return fmt.Errorf("%w: WithTurnSlice with WithAdaptiveTTL: every hold must then go through the server, which measures it", ErrInvalid)
	}
	return nil
}

// turnAsked reports whether opts, a lock's own options (not its client's defaults), ask for a
// turn slice: a lock of a kind that takes no turns refuses that (a client default of it
// applies to Mutexes only).
func turnAsked(opts []Option) bool {
	return options{}.with(opts).slice > 0
}

// parking is a Mutex's lock kept by this client after its last Unlock: st, a lease nobody holds
// yet (the next token), renewed as any other, until the turn's end, when the timer releases it.
type parking struct {
	st    *leaseState
	timer *time.Timer
}

// park keeps st's lock for this client, if st's turn slice allows, instead of releasing it:
// it reports whether it did (st has then ended, passed on to the parked lease).
func (e *engine) park(st *leaseState) bool {
	spec := st.spec
	if spec.slice == 0 || st.local >= localHandoffs || st.state.Load() != stateHeld {
		return false
	}
	now := mono()
	until := min(st.turn+int64(spec.slice), st.deadline.Load())
	if now >= until {
		return false
	}
	nst := st.passOn(spec, context.Background())
	if !e.renewer.add(nst) {
		return false // closing: the caller's release reports it
	}
	p := &parking{st: nst}
	s := e.waits.shard(spec.key)
	s.mu.Lock()
	if s.parked == nil {
		s.parked = make(map[string]*parking)
	}
	old := s.parked[spec.key]
	s.parked[spec.key] = p
	p.timer = time.AfterFunc(time.Duration(until-now), func() { e.unparkAtEnd(spec.key, p) })
	s.mu.Unlock()
	st.end(endPassedOn, nil)
	if old != nil {
		e.releaseParked(old) // cannot happen: one lease per name and client holds the lock
	}
	return true
}

// unpark returns the lock this client keeps parked for spec's name, as the lease of a caller
// of ctx, or nil when there is none, it is not for a lease like spec's, or it ran out.
func (e *engine) unpark(ctx context.Context, spec *lockSpec) *leaseState {
	s := e.waits.shard(spec.key)
	s.mu.Lock()
	p := s.parked[spec.key]
	if p == nil || !sameLease(p.st.spec, spec) {
		s.mu.Unlock()
		return nil
	}
	delete(s.parked, spec.key)
	s.mu.Unlock()
	p.timer.Stop()
	st := p.st
	if !e.takeable(st) {
		return nil // it ran out (the process paused): ended, left to run out on the server
	}
	st.mu.Lock()
	st.parent = ctx
	st.mu.Unlock()
	return st
}

// unparkAtEnd releases p, the lock parked for key, at the end of its turn, unless a Lock took
// it back first.
func (e *engine) unparkAtEnd(key string, p *parking) {
	s := e.waits.shard(key)
	s.mu.Lock()
	mine := s.parked[key] == p
	if mine {
		delete(s.parked, key)
	}
	s.mu.Unlock()
	if mine {
		e.releaseParked(p)
	}
}

// releaseParked releases a parked lock as its last Unlock would have: to a waiter of this
// client if one came meanwhile, else on the server, which grants it to the next client.
func (e *engine) releaseParked(p *parking) {
	ctx, cancel := context.WithTimeout(context.Background(), unlockTimeout)
	defer cancel()
	l := leaseOf(p.st)
	// Its turn is over, so the release cannot park it again (park).
	if err := l.Unlock(ctx); err != nil && !errors.Is(err, ErrClosed) {
		e.ev.log.Warn("dlock: releasing a parked lock at the end of its turn", "name", p.st.spec.name, "error", err)
	}
}

// forgetParked stops every parked lock's timer (the client closes: releaseAll releases the
// parked leases with the others it holds).
func (e *engine) forgetParked() {
	for i := range e.waits.shards {
		s := &e.waits.shards[i]
		s.mu.Lock()
		for _, p := range s.parked {
			p.timer.Stop()
		}
		s.parked = nil
		s.mu.Unlock()
	}
}
