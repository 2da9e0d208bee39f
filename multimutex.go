package dlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/backend"
	"github.com/dlock-go/dlock/internal/protocol"
	"github.com/dlock-go/dlock/internal/slot"
)

// MaxMultiNames is the most names one MultiMutex takes. One attempt runs one script over every
// name of a server (three keys each), which keeps the server busy for a few microseconds per
// name; a multi-lock of more names than this is better split or redesigned.
const MaxMultiNames = 64

// MultiMutex is a handle on several named locks taken together: a Lock holds every one of them
// or none. The names are the same locks as Mutex's (same keys, same fencing tokens): a Mutex
// holding one of them blocks a MultiMutex that contains it, and the other way round. It is
// cheap to make (no I/O) and safe for concurrent use; each Lock or TryLock that succeeds
// returns its own Lease, which holds every name. See "Multi-locks" in the package documentation
// for the order in which names are taken, and why waiting can neither deadlock nor starve.
type MultiMutex struct {
	e      *engine
	names  []string    // as given
	specs  []*lockSpec // one per name, in the global order (see multiOrder)
	groups [][]int     // indexes into specs: the names one attempt takes together, in order
	wait   time.Duration
	err    error
}

// MultiMutex returns a handle on the locks called names, taken together. Options apply to
// every name and override the client's defaults. An empty list, more than MaxMultiNames names,
// a name given twice, or an invalid name or option is reported (ErrInvalid) by Lock and
// TryLock; so is an adaptive lease (WithAdaptiveTTL, also as the client's default: give the
// multi-lock WithTTL).
func (c *Client) MultiMutex(names []string, opts ...Option) *MultiMutex {
	mm := &MultiMutex{names: slices.Clone(names)}
	if c == nil {
		mm.err = fmt.Errorf("%w: nil client", ErrInvalid)
		return mm
	}
	mm.e = c.e
	switch {
	case len(names) == 0:
		mm.err = fmt.Errorf("%w: multi-lock of no names", ErrInvalid)
		return mm
	case len(names) > MaxMultiNames:
		mm.err = fmt.Errorf("%w: multi-lock of %d names, more than MaxMultiNames (%d)", ErrInvalid, len(names), MaxMultiNames)
		return mm
	}
	if turnAsked(opts) {
		mm.err = fmt.Errorf("%w: WithTurnSlice is not available for a multi-lock: its names are taken and released together, through the server", ErrInvalid)
		return mm
	}
	seen := make(map[string]bool, len(names))
	for _, name := range names {
		m := c.Mutex(name, opts...)
		m.spec.slice = 0 // a client default for Mutexes
		if m.err != nil {
			mm.err = m.err
			return mm
		}
		if seen[name] {
			mm.err = fmt.Errorf("%w: multi-lock names %q twice", ErrInvalid, name)
			return mm
		}
		if m.spec.adapt != nil {
			// The scripts that take and release several names at once record no holds.
			mm.err = fmt.Errorf("%w: WithAdaptiveTTL is not available for a multi-lock (give it WithTTL)", ErrInvalid)
			return mm
		}
		seen[name] = true
		mm.specs = append(mm.specs, m.spec)
	}
	slices.SortFunc(mm.specs, multiOrder)
	mm.wait = mm.specs[0].wait
	mm.groups = groupsOf(c.e.traits.Multi, mm.specs)
	return mm
}

// multiOrder is the global order in which every client takes the names of a multi-lock: by
// Cluster hash slot of the key, then by key. Every deployment uses it (the slot is computed
// on one server too), so any two multi-locks of one deployment take their names in the same
// order.
func multiOrder(a, b *lockSpec) int {
	if c := cmp.Compare(slot.Of(a.key), slot.Of(b.key)); c != 0 {
		return c
	}
	return strings.Compare(a.key, b.key)
}

// groupsOf cuts specs (in the global order) into the names one attempt takes together: all of
// them on one server; those of one slot each on a Cluster; one by one in quorum mode.
func groupsOf(mb backend.Multi, specs []*lockSpec) [][]int {
	var groups [][]int
	for i, spec := range specs {
		switch {
		case i == 0, mb == nil, mb.OneSlot() && slot.Of(spec.key) != slot.Of(specs[i-1].key):
			groups = append(groups, []int{i})
		default:
			groups[len(groups)-1] = append(groups[len(groups)-1], i)
		}
	}
	return groups
}

// Names returns the lock names, as given.
func (mm *MultiMutex) Names() []string { return slices.Clone(mm.names) }

// Lock acquires every lock, waiting as long as ctx and WithWait allow, and returns one Lease
// that holds them all; on failure it holds none (what it took is released). Waiting is woken
// by the release of the name that blocked it (no polling), and never deadlocks with other
// multi-locks, whatever order their names were given in. A name that ctx carries a lease on
// from the same client (a Lease's Context, or the context inside Do or DoMulti) is re-entered:
// same token, one more hold. A wait that ends while another owner holds a name returns a
// *NotAcquiredError naming it.
func (mm *MultiMutex) Lock(ctx context.Context) (*Lease, error) {
	return mm.lock(ctx, true)
}

// TryLock makes one attempt to take every lock (one round trip on one server): it holds them
// all, or none and returns a *NotAcquiredError (errors.Is ErrNotAcquired) naming a name another
// owner holds.
func (mm *MultiMutex) TryLock(ctx context.Context) (*Lease, error) {
	return mm.lock(ctx, false)
}

// errMove is an attempt's answer, made while waiting for one name, that another name is now the
// one to wait for.
var errMove = errors.New("dlock: wait for another name")

// multiAcq is one acquisition of a MultiMutex under way.
type multiAcq struct {
	e       *engine
	mm      *MultiMutex
	parent  context.Context // the caller's: the leases' values
	held    []*Lease        // per spec: the hold this acquisition has, or nil
	reent   []bool          // per spec: held re-enters a lease the caller's context carries
	ordered []bool          // per group: its attempts take the free names before the busy one
	blocked int             // the spec that blocked the last attempt (-1: none yet)
	nq      *noQuorumSeen   // quorum mode: whether the last attempt found too few servers answering
}

func (mm *MultiMutex) lock(ctx context.Context, wait bool) (*Lease, error) {
	if mm == nil {
		return nil, fmt.Errorf("%w: nil multi-mutex", ErrInvalid)
	}
	if mm.err != nil {
		return nil, mm.err
	}
	if o := mm.e.obs; o != nil {
		return o.lockMulti(ctx, mm, wait)
	}
	return mm.acquire(ctx, wait)
}

// acquire is lock for a valid multi-mutex.
func (mm *MultiMutex) acquire(ctx context.Context, wait bool) (*Lease, error) {
	e := mm.e
	if e.closed.Load() {
		return nil, ErrClosed
	}
	if ctx.Err() != nil {
		return nil, mm.ctxErr(ctx)
	}
	a := &multiAcq{
		e: e, mm: mm, parent: ctx, blocked: -1,
		held: make([]*Lease, len(mm.specs)), reent: make([]bool, len(mm.specs)), ordered: make([]bool, len(mm.groups)),
	}
	for i, spec := range mm.specs {
		st := heldIn(ctx, e, spec.key)
		if st == nil {
			continue
		}
		if !sameLease(st.spec, spec) {
			a.giveBackAll(ctx)
			return nil, fmt.Errorf("%w: re-enter %q: %s", ErrInvalid, spec.name, leaseDiff(st.spec, spec))
		}
		l, err := e.reenter(ctx, st)
		if err != nil {
			a.giveBackAll(ctx)
			return nil, err
		}
		a.held[i], a.reent[i] = l, true
	}
	return lockOrWait(ctx, mm.wait, wait,
		func() (*Lease, error) {
			for g := range mm.groups {
				r, err := a.try(ctx, g, false, -1, nil)
				if err != nil {
					a.giveBackAll(ctx)
					return nil, err
				}
				if r.busy >= 0 {
					a.giveBackAll(ctx)
					return nil, e.notAcquired(ctx, mm.specs[r.busy], r.h, 0, nil)
				}
			}
			return a.lease(), nil
		},
		func(wctx context.Context) (*Lease, error) {
			if e.traits.Servers > 1 {
				a.nq = &noQuorumSeen{}
			}
			if err := a.run(wctx); err != nil {
				a.giveBackAll(ctx)
				return nil, err
			}
			return a.lease(), nil
		},
		func(wctx context.Context, waited time.Duration, cause error) error {
			if a.blocked < 0 {
				return mm.ctxErr(wctx)
			}
			if qerr := a.nq.last(); qerr != nil {
				return a.nq.ended(qerr, waited, cause)
			}
			return e.notAcquired(ctx, mm.specs[a.blocked], holder{pttl: -1}, waited, cause)
		})
}

func (mm *MultiMutex) ctxErr(ctx context.Context) error {
	return fmt.Errorf("dlock: locks %s: %w", quoteNames(mm.names), ctx.Err())
}

// quoteNames lists names for messages: "a", "b".
func quoteNames(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return strings.Join(q, ", ")
}

// run takes every name, group by group in the global order. In each group the attempts are
// all or none and, when a name is busy, queue for the first busy one, holding nothing of the
// group, until the group is ordered: once the acquisition was given a name it waited for (its
// turn came in that name's queue), or had to wait for another name than the one it queued
// for. From then on its attempts take the free names before the first busy one, and keep them
// while they wait for that one. Before waiting for a name, it gives back every name it holds
// that comes after it in the global order (re-entered names excepted), so that a waiter only
// ever holds names that come before the one it waits for.
func (a *multiAcq) run(ctx context.Context) error {
	e, mm := a.e, a.mm
	for {
		g, err := a.firstMissing(ctx)
		if err != nil || g < 0 {
			return err
		}
		first := a.missing(g)[0]
		var (
			wait  = first
			known *holder
			reg   *registration
		)
		if !e.waits.queued(mm.specs[first].key) {
			if e.traits.Queue {
				reg = e.newRegistration(mm.specs[first])
			}
			r, err := a.try(ctx, g, a.ordered[g], -1, reg)
			a.noteQuorum(err)
			if errors.Is(err, ErrNoQuorum) {
				// Too few servers of a quorum answered: wait a moment, as Lock does.
				r, err = tryResult{busy: first, h: holder{pttl: noQuorumRetry}}, nil
			}
			if err != nil {
				return err
			}
			if r.busy < 0 {
				continue
			}
			if !r.queued {
				reg = nil
			}
			wait, known = r.busy, &r.h
		}
		// Else callers of this client already wait for the first name this acquisition lacks:
		// an attempt could only fail, so it queues behind them at once (as Mutex's Lock does),
		// and most often gets the name passed on by this client's holder without a command.
		// Either way it waits holding no name after the one it waits for.
		a.giveBackAbove(ctx, wait)
		a.blocked = wait
		st, err := e.waitInQueue(ctx, mm.specs[wait], known, reg, a.attemptAt(g, wait))
		if err == nil || errors.Is(err, errMove) {
			a.ordered[g] = true
		}
		switch {
		case errors.Is(err, errMove):
			continue
		case err != nil:
			return err
		case a.held[wait] == nil:
			a.held[wait] = &Lease{st: st} // granted, or passed on by a holder of this client
		case a.held[wait].st != st:
			(&Lease{st: st}).Unlock(context.WithoutCancel(ctx)) // cannot happen: a second hold, given back
		}
	}
}

// attemptAt is the attempt of the head of the queue for spec f (of group g): queueing there
// when f is still the first busy name, else telling the head to leave (errMove).
func (a *multiAcq) attemptAt(g, f int) attemptFunc {
	return func(ctx context.Context, reg *registration) (*leaseState, holder, error) {
		r, err := a.try(ctx, g, a.ordered[g], f, reg)
		a.noteQuorum(err)
		if err != nil {
			return nil, holder{}, err
		}
		if r.busy >= 0 {
			a.blocked = r.busy
			a.giveBackAbove(ctx, r.busy)
		}
		switch {
		case a.held[f] != nil:
			return a.held[f].st, holder{}, nil
		case r.pending, r.busy == f:
			return nil, r.h, nil
		}
		return nil, holder{}, errMove
	}
}

// noteQuorum notes an attempt's outcome in quorum mode (see noQuorumSeen).
func (a *multiAcq) noteQuorum(err error) {
	if a.nq != nil {
		a.nq.note(err)
	}
}

// missing returns the specs of group g this acquisition does not hold yet, in order.
func (a *multiAcq) missing(g int) []int {
	var idx []int
	for _, i := range a.mm.groups[g] {
		if a.held[i] == nil {
			idx = append(idx, i)
		}
	}
	return idx
}

// firstMissing returns the first group with a name not held (-1: none). A name taken earlier
// whose lease has ended meanwhile (lost while the acquisition waited for another) is taken
// again; a re-entered one ends the acquisition with its error.
func (a *multiAcq) firstMissing(ctx context.Context) (int, error) {
	first := -1
	for g, idx := range a.mm.groups {
		for _, i := range idx {
			l := a.held[i]
			if l != nil && (l.st.expired() || l.st.state.Load() != stateHeld) {
				if a.reent[i] {
					return -1, l.st.endedErr()
				}
				a.held[i] = nil
				l.Unlock(context.WithoutCancel(ctx)) // clears what the server may still hold of it
			}
			if a.held[i] == nil && first < 0 {
				first = g
			}
		}
	}
	return first, nil
}

// tryResult is the outcome of one attempt on a group; the names it took are in multiAcq.held.
type tryResult struct {
	busy    int    // the first busy spec, -1 when none
	h       holder // its holder
	queued  bool   // the registration is queued at busy
	pending bool   // the name queued for was granted, and the grant's announcement came first: its lease is on its way to the queue's head
}

// try makes one attempt on the names of group g not held yet: all or none, or with prefix the
// free ones before the first busy one. With a registration it queues the client at the first
// busy name when at < 0, or at spec at only when that is the first busy one (at's lock is then
// taken under the registration's owner, as a claim of a grant to it when it was one).
func (a *multiAcq) try(ctx context.Context, g int, prefix bool, at int, reg *registration) (tryResult, error) {
	e, specs := a.e, a.mm.specs
	res := tryResult{busy: -1}
	idx := a.missing(g)
	if len(idx) == 0 {
		return res, nil
	}
	mb := e.traits.Multi
	ok := mb != nil
	if !ok || len(idx) == 1 {
		return a.tryOne(ctx, idx[0], at, reg)
	}
	if err := e.guard.refusal(ctx); err != nil {
		return res, fmt.Errorf("dlock: locks %s: %w", quoteNames(a.mm.names), err)
	}
	spec0 := specs[idx[0]]
	owner := e.newOwner()
	args := protocol.MultiAcquireArgs{Owner: owner, TTL: spec0.ttlArg, Meta: spec0.meta, Prefix: prefix, At: "*"}
	atPos := -1
	for k, i := range idx {
		args.Keys = append(args.Keys, specs[i].keys...)
		if i == at {
			atPos = k
			args.At = strconv.Itoa(k + 1)
		}
	}
	if reg != nil {
		args.Entry, args.EOwner, args.Window = reg.id, reg.owner, reg.winArg
		if at >= 0 && atPos < 0 {
			args.Entry = "" // not a name of this attempt: queue nowhere
		}
	}
	sent := mono()
	r, acked, err := mb.AcquireMulti(ctx, args, spec0.ack)
	if err != nil {
		a.abandon(idx, atPos, at, owner, reg, args.Entry != "")
		if ctx.Err() != nil {
			return res, fmt.Errorf("dlock: locks %s: %w", quoteNames(a.mm.names), ctx.Err())
		}
		return res, e.redisErr("lock "+quoteNames(a.mm.names), err)
	}
	var taken []*leaseState
	for k, i := range idx {
		t := r.Tokens[k]
		if t == 0 {
			continue
		}
		o := owner
		if k == atPos && reg != nil && args.Entry != "" {
			o = reg.owner
			if !e.claimed(reg) {
				// Granted to reg, and the announcement got there first: the lease is on its
				// way to the head.
				res.pending, res.h = true, holder{pttl: -1, token: t}
				continue
			}
		}
		st := newLeaseState(e, specs[i], a.parent, o, t, sent)
		if !e.renewer.add(st) {
			e.renewer.orphan(specs[i].releaseReq(o), specs[i].ttl)
			return res, ErrClosed
		}
		a.held[i] = &Lease{st: st}
		taken = append(taken, st)
	}
	if r.Busy >= 0 {
		res.busy, res.h = idx[r.Busy], holder{pttl: r.PTTL, token: r.Token}
		if reg != nil && args.Entry != "" && (atPos < 0 || r.Busy == atPos) {
			if atPos < 0 {
				reg.spec = specs[res.busy] // queued at the busy name: the registration is its
			}
			e.registered(reg, sent, 1, []uint64{r.Token})
			res.queued = true
		}
	}
	if spec0.ack.N > 0 && acked < spec0.ack.N && len(taken) > 0 {
		return res, a.rollBack(ctx, idx, taken, acked)
	}
	return res, nil
}

// tryOne is try for a group of one name left (or a backend without multi-lock calls): the
// plain acquisition (acquire.lua), with every rule of Mutex's attempt.
func (a *multiAcq) tryOne(ctx context.Context, i, at int, reg *registration) (tryResult, error) {
	res := tryResult{busy: -1}
	spec := a.mm.specs[i]
	if reg != nil && at < 0 {
		reg.spec = spec
	}
	st, h, err := a.e.attempt(ctx, spec, reg)
	switch {
	case err != nil:
		return res, err
	case st != nil:
		a.held[i] = &Lease{st: st}
		return res, nil
	}
	res.busy, res.h, res.queued = i, h, reg != nil
	res.pending = reg != nil && h.pttl < 0 && h.token != 0
	return res, nil
}

// abandon undoes what a multi-lock attempt on the names idx may have done on the server when
// its reply was lost (the script may have run all the same): it releases every name under the
// attempt's owner secret, and withdraws the registration (queued with the attempt when queued
// is set) wherever it may have been queued: at the attempt's name atPos (spec at), or at any.
func (a *multiAcq) abandon(idx []int, atPos, at int, owner string, reg *registration, queued bool) {
	e, specs := a.e, a.mm.specs
	for k, i := range idx {
		if k != atPos {
			e.renewer.orphan(specs[i].releaseReq(owner), specs[i].ttl)
		}
	}
	if reg == nil || !queued {
		return
	}
	if atPos >= 0 {
		if !e.unregister(reg) {
			e.renewer.orphan(specs[at].releaseReq(reg.owner), specs[at].ttl)
		}
		return
	}
	reg.state.Store(regDone)
	for _, i := range idx {
		req := specs[i].releaseReq(reg.owner)
		req.Leave = reg.id
		e.renewer.orphan(req, specs[i].ttl)
	}
}

// rollBack releases the names an attempt just took (taken, among idx), which too few replicas
// acknowledged (a failover now could hand them to a replica that never saw them), and returns
// the ErrReplicaAck error that says so.
func (a *multiAcq) rollBack(ctx context.Context, idx []int, taken []*leaseState, acked int) error {
	for _, i := range idx {
		if l := a.held[i]; l != nil && slices.Contains(taken, l.st) {
			a.held[i] = nil
			l.Unlock(context.WithoutCancel(ctx))
		}
	}
	ack := a.mm.specs[idx[0]].ack
	return fmt.Errorf("%w: locks %s: %d of %d replicas acknowledged within %v; released again",
		ErrReplicaAck, quoteNames(a.mm.names), max(acked, 0), ack.N, ack.Wait)
}

// giveBackAbove releases every name held (but the re-entered ones) that comes after spec b in
// the global order: a waiter for b holds only names before it.
func (a *multiAcq) giveBackAbove(ctx context.Context, b int) {
	var back []*Lease
	for i := b + 1; i < len(a.held); i++ {
		if a.held[i] != nil && !a.reent[i] {
			back = append(back, a.held[i])
			a.held[i] = nil
		}
	}
	if len(back) > 0 {
		a.e.unlockMembers(context.WithoutCancel(ctx), back)
	}
}

// giveBackAll releases everything the acquisition holds: the names it took, and the holds it
// added to re-entered ones.
func (a *multiAcq) giveBackAll(ctx context.Context) {
	var back []*Lease
	for i, l := range a.held {
		if l != nil {
			back = append(back, l)
			a.held[i] = nil
		}
	}
	if len(back) > 0 {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
		defer cancel()
		a.e.unlockMembers(rctx, back)
	}
}

// lease makes the Lease of a complete acquisition.
func (a *multiAcq) lease() *Lease {
	m := &multiLease{e: a.e, names: a.mm.names, members: a.held, parent: a.parent}
	for _, l := range a.held {
		m.token = max(m.token, l.st.token)
	}
	return &Lease{multi: m}
}

// DoMulti acquires every lock of names together (waiting as MultiMutex.Lock does), runs fn with
// a context that is cancelled when ctx is or when any of the locks is lost (cause ErrLost,
// naming it), and releases them all when fn returns or panics. Its outcomes are Do's: fn's
// error, joined with an error wrapping ErrLost when a lock was lost before fn returned, or with
// the release error. TokensFromContext gives fn one fencing token per name.
func (c *Client) DoMulti(ctx context.Context, names []string, fn func(ctx context.Context) error, opts ...Option) (err error) {
	if fn == nil {
		return fmt.Errorf("%w: nil function", ErrInvalid)
	}
	l, err := c.MultiMutex(names, opts...).Lock(ctx)
	if err != nil {
		return err
	}
	m := l.multi
	fctx, stop := m.doContext(ctx)
	defer func() {
		stop()
		if lost := m.lostMember(); lost != nil {
			l.Unlock(context.WithoutCancel(ctx))
			err = lostWhileFn(err, lost.spec.name, "was lost while fn ran", lost.endedErr())
			return
		}
		err = withUnlockErr(err, l.Unlock(ctx))
	}()
	return fn(fctx)
}
