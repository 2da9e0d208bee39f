package dlock

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/backend"
	"github.com/dlock-go/dlock/internal/protocol"
)

// multiLease is the state of a Lease that holds several locks (MultiMutex): one hold per name,
// each an ordinary lease of its lock, renewed by the client's renewal loop like any other (the
// names of one acquisition fall due together, so they share a round). The Lease is lost as
// soon as one of them is.
type multiLease struct {
	e       *engine
	names   []string // as given to MultiMutex
	members []*Lease // one hold per name, in the global order
	token   uint64   // the largest of the members' tokens

	mu     sync.Mutex
	parent context.Context // the context given to Lock, for the values of ctx
	ctx    *multiCtx       // made on first use
}

// multiCtx is the context of a multi-lock lease (or of the function DoMulti runs): cancelled
// when one of its locks' leases ends, with that lease's cause. Like a single lease's context,
// Err and Value check the leases' deadlines themselves, and Value finds each name's lease for
// re-entry.
type multiCtx struct {
	context.Context
	m      *multiLease
	cancel context.CancelCauseFunc
}

// tokensKey finds the fencing tokens of the innermost lease in a context, by name.
type tokensKey struct{}

func (m *multiLease) context() *multiCtx {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ctx == nil {
		inner, cancel := detach(&m.parent)
		m.ctx = &multiCtx{Context: inner, m: m, cancel: cancel}
		m.watch(m.ctx.cancel)
	}
	return m.ctx
}

// watch makes cancel run with the cause of the first member lease to end.
func (m *multiLease) watch(cancel context.CancelCauseFunc) (stop func()) {
	stops := make([]func() bool, 0, len(m.members))
	for _, l := range m.members {
		lctx := l.st.context()
		stops = append(stops, context.AfterFunc(lctx, func() { cancel(context.Cause(lctx)) }))
	}
	return func() {
		for _, s := range stops {
			s()
		}
	}
}

// doContext returns the context for the function run by DoMulti: cancelled when parent is, or
// when a member lease ends (with its cause); it carries the leases for re-entry.
func (m *multiLease) doContext(parent context.Context) (context.Context, func()) {
	inner, cancel := context.WithCancelCause(parent)
	stop := m.watch(cancel)
	return &multiCtx{Context: inner, m: m, cancel: cancel}, func() {
		stop()
		cancel(nil)
	}
}

func (x *multiCtx) Err() error {
	x.cancelIfEnded()
	return x.Context.Err()
}

// leaseOn finds the member lease on key, else looks further out (see leaseFinder).
func (x *multiCtx) leaseOn(e *engine, key string) *leaseState {
	for _, l := range x.m.members {
		if l.st.spec.key == key {
			return l.st
		}
	}
	return heldIn(x.Context, e, key)
}

func (x *multiCtx) Value(k any) any {
	switch k := k.(type) {
	case *engine:
		if len(x.m.members) > 0 && k == x.m.members[0].st.e {
			return x
		}
	case tokenKey:
		return x.m.token
	case tokensKey:
		return x.m.tokens()
	}
	x.cancelIfEnded() // context.Cause and context.WithCancel look up the parent's state through Value
	return x.Context.Value(k)
}

// cancelIfEnded cancels the context at once if a member lease has ended or its deadline passed.
func (x *multiCtx) cancelIfEnded() {
	if st := x.m.endedMember(); st != nil {
		st.mu.Lock()
		cause := st.cause
		st.mu.Unlock()
		x.cancel(cause)
	}
}

// endedMember returns the first member lease that has ended (or whose deadline passed), or nil.
func (m *multiLease) endedMember() *leaseState {
	for _, l := range m.members {
		st := l.st
		st.expired()
		if st.state.Load() != stateHeld {
			return st
		}
	}
	return nil
}

// lostMember returns the first member lease that was lost (or closed), or nil.
func (m *multiLease) lostMember() *leaseState {
	for _, l := range m.members {
		st := l.st
		st.expired()
		if s := st.state.Load(); s == stateLost || s == stateClosed {
			return st
		}
	}
	return nil
}

func (m *multiLease) tokens() map[string]uint64 {
	out := make(map[string]uint64, len(m.members))
	for _, l := range m.members {
		out[l.st.spec.name] = l.st.token
	}
	return out
}

// endedErr is the error for using a multi-lock lease that is no longer held.
func (m *multiLease) endedErr(l *Lease) error {
	if st := m.endedMember(); st != nil && !l.unlocked.Load() {
		return st.endedErr()
	}
	return fmt.Errorf("%w: locks %s were released", ErrNotHeld, quoteNames(m.names))
}

// Tokens returns the fencing token of each lock the lease holds, by name: one entry for a
// Mutex's lease, one per name for a MultiMutex's. Give each protected resource the token of the
// name that guards it: tokens of different names are not ordered with respect to each other.
// A nil lease returns nil.
func (l *Lease) Tokens() map[string]uint64 {
	switch {
	case l == nil:
		return nil
	case l.multi != nil:
		return l.multi.tokens()
	}
	return map[string]uint64{l.st.spec.name: l.st.token}
}

// Names returns the names of the locks the lease holds: the one name of a Mutex's lease, or a
// MultiMutex's names as given. A nil lease returns nil.
func (l *Lease) Names() []string {
	switch {
	case l == nil:
		return nil
	case l.multi != nil:
		return slices.Clone(l.multi.names)
	}
	return []string{l.st.spec.name}
}

// TokensFromContext returns the fencing tokens, by lock name, of the lease whose context ctx is
// (or derives from): a Lease's Context, or the context Do or DoMulti passes to its function.
// With nested locks they are the innermost lease's. ok is false when ctx carries no lease.
func TokensFromContext(ctx context.Context) (tokens map[string]uint64, ok bool) {
	tokens, ok = ctx.Value(tokensKey{}).(map[string]uint64)
	return maps.Clone(tokens), ok
}

func (m *multiLease) name() string { return strings.Join(m.names, ", ") }

func (m *multiLease) unlock(ctx context.Context, l *Lease) error {
	if !l.unlocked.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: locks %s already unlocked", ErrNotHeld, quoteNames(m.names))
	}
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
		defer cancel()
	}
	err := m.e.unlockMembers(ctx, m.members)
	m.mu.Lock()
	mctx := m.ctx
	m.mu.Unlock()
	if mctx != nil {
		mctx.cancel(nil)
	}
	return err
}

func (m *multiLease) extend(ctx context.Context, l *Lease, ttl time.Duration) error {
	if ttl < MinTTL {
		return fmt.Errorf("%w: ttl %v is below the minimum %v", ErrInvalid, ttl, MinTTL)
	}
	if err := checkTTL(ttl, m.members[0].st.spec.renew); err != nil {
		return err
	}
	if l.unlocked.Load() || m.endedMember() != nil {
		return m.endedErr(l)
	}
	rd := backend.Round{Leases: make([]backend.Renewal, len(m.members))}
	for i, mb := range m.members {
		st := mb.st
		rd.Leases[i] = backend.Renewal{Key: st.spec.key, Owner: st.owner, TTL: protocol.Millis(ttl), Ack: st.spec.ack}
	}
	sent := mono()
	outs := m.e.b.Renew(ctx, rd).Leases
	for i, mb := range m.members {
		st := mb.st
		switch {
		case outs[i].Err == backend.ErrNotAcked:
			return fmt.Errorf("%w: extend %q: the new lease is on the master only", ErrReplicaAck, st.spec.name)
		case outs[i].Err != nil:
			return m.e.redisErr("extend "+strconv.Quote(st.spec.name), outs[i].Err)
		case !outs[i].OK:
			st.end(endLost, st.lost("Extend found it no longer held by this lease"))
			return st.endedErr()
		}
	}
	for _, mb := range m.members {
		if mb.st.renewed(sent, ttl) {
			m.e.renewer.reschedule(mb.st)
		}
	}
	return nil
}

// ttl is the shortest remaining lease among the names, as the servers see them.
func (m *multiLease) ttl(ctx context.Context, l *Lease) (time.Duration, error) {
	if l.unlocked.Load() || m.endedMember() != nil {
		return 0, m.endedErr(l)
	}
	least := time.Duration(-1)
	for _, mb := range m.members {
		d, err := mb.TTL(ctx)
		if err != nil {
			return 0, err
		}
		if least < 0 || d < least {
			least = d
		}
	}
	return least, nil
}

// unlockMembers gives up one hold of each of leases (member holds of a multi-lock, or what an
// acquisition gives back): an inner hold drops one hold on the server; a last hold passes the
// lock to a waiter of this client, or, for all those that do not, is released in one round
// trip on one server. It reports every failure, as Unlock would each.
func (e *engine) unlockMembers(ctx context.Context, leases []*Lease) error {
	var errs []error
	var last []*leaseState
	for _, l := range leases {
		if !l.unlocked.CompareAndSwap(false, true) {
			continue
		}
		st := l.st
		lastHold, state := st.dropHold()
		switch {
		case state == stateClosed:
			errs = append(errs, ErrClosed)
		case lastHold && state == stateHeld:
			// As in Lease.Unlock: a renewal already on its way may find this release's doing
			// on the server, which is not a loss.
			st.releasing.Store(true)
			last = append(last, st)
		default:
			// An inner hold, or a lease already lost: as Lease.Unlock does.
			res, err := e.b.Release(ctx, st.releaseReq(lastHold))
			if err := st.afterInnerRelease(state, res, err); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return joinErrors(append(errs, e.letGoAll(ctx, last)...)...)
}

// letGoAll ends the last hold of each of sts, as letGo does one: a lock goes to this client's
// next waiter for it, or is released; the releases go in one pipeline on one server (in
// parallel in quorum mode).
func (e *engine) letGoAll(ctx context.Context, sts []*leaseState) []error {
	var errs []error
	var reqs []backend.ReleaseReq
	var rel []*leaseState
	for _, st := range sts {
		if done, err := e.handOff(ctx, st); done {
			errs = append(errs, err)
			continue
		}
		reqs = append(reqs, e.leavingQueue(st, st.releaseReq(true)))
		rel = append(rel, st)
	}
	if len(reqs) == 0 {
		return errs
	}
	results, rerrs := e.releaseMany(ctx, reqs)
	for k, st := range rel {
		if err := e.afterRelease(st, reqs[k], results[k], rerrs[k]); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// releaseMany runs the releases in one pipeline where the deployment can, else in parallel.
func (e *engine) releaseMany(ctx context.Context, reqs []backend.ReleaseReq) ([]protocol.Released, []error) {
	if mb := e.traits.Multi; mb != nil {
		return mb.ReleaseMany(ctx, reqs)
	}
	out, errs := make([]protocol.Released, len(reqs)), make([]error, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Go(func() { out[i], errs[i] = e.b.Release(ctx, r) })
	}
	wg.Wait()
	return out, errs
}
