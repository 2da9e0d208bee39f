package dlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/conn"
)

// quorum is the backend of N independent Redis masters (Redlock): every script runs on every
// server in parallel, and the answers are combined by the majority rule of each script: a
// lock is held when a majority of servers hold it. A call returns as soon as the answers
// decide it, so a slow server costs nothing; calls still running finish in the background.
type quorum struct {
	nodes     []conn.Conn
	need      int    // a majority of len(nodes)
	retention string // ms, for release.lua and forceunlock.lua
	desc      string // "quorum of 5 [a b c d e]"
	own       bool   // close the nodes' connections (DialQuorum made them)

	pmu     sync.Mutex
	pending map[string]*pendingAcquire // owner -> its acquisition still running on some server

	latency atomic.Int64 // ns: a moving average of the servers' answer times

	ev *observer // reports the servers' errors (observe.go); set by the client

	bg      sync.WaitGroup  // calls still running on slow servers after a decision was reached
	closing context.Context // cancelled by close: abandons those calls
	halt    context.CancelFunc
}

var _ backend = (*quorum)(nil)

func newQuorumBackend(nodes []conn.Conn, retention time.Duration) *quorum {
	q := &quorum{nodes: slices.Clone(nodes), need: len(nodes)/2 + 1, retention: ms(retention)}
	q.closing, q.halt = context.WithCancel(context.Background())
	addrs := make([]string, len(nodes))
	for i, cn := range nodes {
		addrs[i] = cn.Addr()
	}
	q.desc = fmt.Sprintf("quorum of %d [%s]", len(nodes), strings.Join(addrs, " "))
	return q
}

func (q *quorum) traits() traits {
	// Local handoffs, but no server handover: after localHandoffs in a row the lock is
	// released (the servers' stored tokens then follow the last local token, the release's
	// floor), which grants it to the first client queued. Waiting clients queue on every
	// server at the same place, so that the servers grant to the same one; no retry jitter.
	return traits{majority: q.need, servers: len(q.nodes), localHandoffs: true, queue: true}
}

func (q *quorum) addr() string { return q.desc }

func (q *quorum) close() error {
	q.halt()
	q.bg.Wait()
	if !q.own {
		return nil
	}
	var errs []error
	for _, n := range q.nodes {
		errs = append(errs, n.Close())
	}
	return joinErrors(errs...)
}

// reply is one server's answer to one fanned-out batch of calls.
type reply struct {
	node int
	res  []conn.Result
}

// pendingAcquire tracks one acquisition's calls still running on the servers: done[i] is closed
// when server i answered. A release of the same owner waits for it per server, so that it never
// overtakes the acquisition on a transport that may reorder calls (a connection pool): a late
// acquisition would otherwise leave the lock held on that server until its lease ran out.
type pendingAcquire struct {
	done []chan struct{}
}

// fanOut sends calls to every server in parallel and feeds the answers to decide (in the
// caller's goroutine, one at a time, so decide needs no lock), in the order they come, until
// decide reports true or every server answered (it then returns true), or limit (when > 0)
// passes first (it returns false). When owner is set (an acquisition), the calls are
// registered so that releases of owner wait for them per server; when after is set, each
// server's call first waits for that server's answer to it. Calls still running when fanOut
// returns finish in the background (close waits for them): they end with ctx, or, with
// detach, at answerWait whatever becomes of ctx (a release every server must hear, though the
// caller returns once a majority answered and may then cancel ctx).
func (q *quorum) fanOut(ctx context.Context, calls []conn.Call, limit time.Duration, detach bool, owner string, after *pendingAcquire, decide func(reply) bool) bool {
	return q.fanOutAdapt(ctx, calls, limit, false, detach, owner, afterOf(after), decide, nil)
}

func afterOf(p *pendingAcquire) []*pendingAcquire {
	if p == nil {
		return nil
	}
	return []*pendingAcquire{p}
}

// fanOutAdapt is fanOut; with adapt, the limit grows to four times the time the first answer
// took, so that a machine or network slow for everyone (not a few servers frozen) does not
// fail every call.
func (q *quorum) fanOutAdapt(ctx context.Context, calls []conn.Call, limit time.Duration, adapt, detach bool, owner string, after []*pendingAcquire, decide func(reply) bool, late func(reply)) bool {
	start := time.Now()
	var mine *pendingAcquire
	if owner != "" {
		mine = &pendingAcquire{done: make([]chan struct{}, len(q.nodes))}
		for i := range mine.done {
			mine.done[i] = make(chan struct{})
		}
		q.pmu.Lock()
		if q.pending == nil {
			q.pending = make(map[string]*pendingAcquire)
		}
		q.pending[owner] = mine
		q.pmu.Unlock()
	}
	ch := make(chan reply, len(q.nodes))
	// Once decided (or given up), the answers still to come go to late, when set.
	var lateMu sync.Mutex
	decided := false
	if late != nil {
		defer func() {
			lateMu.Lock()
			decided = true
			var rest []reply
			for len(ch) > 0 {
				rest = append(rest, <-ch)
			}
			lateMu.Unlock()
			for _, r := range rest {
				late(r)
			}
		}()
	}
	// The calls outlive this one when a decision comes first: they end with ctx (with detach, at
	// answerWait) or at close.
	var cctx context.Context
	var cancel context.CancelFunc
	if detach {
		cctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), answerWait)
	} else {
		cctx, cancel = context.WithCancel(ctx)
	}
	stop := context.AfterFunc(q.closing, cancel)
	var left sync.WaitGroup
	left.Add(len(q.nodes))
	q.bg.Add(1)
	go func() {
		defer q.bg.Done()
		left.Wait()
		stop()
		cancel()
		if mine != nil {
			q.pmu.Lock()
			if q.pending[owner] == mine {
				delete(q.pending, owner)
			}
			q.pmu.Unlock()
		}
	}()
	for i, n := range q.nodes {
		go func() {
			defer left.Done()
			for _, p := range after {
				select {
				case <-p.done[i]:
				case <-cctx.Done():
				}
			}
			sent := time.Now()
			r := reply{i, n.EvalMulti(cctx, calls)}
			if mine != nil {
				close(mine.done[i])
			}
			if r.res[0].Err == nil {
				q.observe(time.Since(sent))
			}
			if q.ev != nil && cctx.Err() == nil {
				q.nodeErrors(n.Addr(), calls, r.res)
			}
			lateMu.Lock()
			if decided {
				lateMu.Unlock()
				late(r)
				return
			}
			ch <- r
			lateMu.Unlock()
		}()
	}
	var expire <-chan time.Time
	var timer *time.Timer
	if limit > 0 {
		timer = time.NewTimer(limit)
		defer timer.Stop()
		expire = timer.C
	}
	for i := range q.nodes {
		select {
		case r := <-ch:
			if decide(r) {
				return true
			}
			if took := time.Since(start); adapt && i == 0 && timer != nil && 4*took > limit {
				if timer.Stop() {
					timer.Reset(4*took - took)
				}
			}
		case <-expire:
			return false
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// lateReply returns what to do with an answer to a's acquisition that comes after the decision:
// a refusal that queued the caller is reported to a.queuedLate (the server has the entry).
func (a acquireArgs) lateReply() func(reply) {
	if !a.queue || a.queuedLate == nil {
		return nil
	}
	return func(r reply) {
		if r.res[0].Err != nil {
			return
		}
		if x, err := readAcquire(r.res[0].Ints); err == nil && !x.ok && !x.notMine {
			a.queuedLate(r.node, x.token)
		}
	}
}

// pendingOf returns the acquisition of owner still running on some server, or nil.
func (q *quorum) pendingOf(owner string) *pendingAcquire {
	q.pmu.Lock()
	defer q.pmu.Unlock()
	return q.pending[owner]
}

func (q *quorum) nodeErr(node int, err error) error {
	return fmt.Errorf("%s: %w", q.nodes[node].Addr(), err)
}

// quorumTimeout is how long an acquisition waits for the servers' answers: small against the
// lease, as the Redlock algorithm asks ("5-50 ms for a 10 s auto-release time"), so that a
// majority of frozen or unreachable servers fails an attempt fast: 50 ms, or a third of a TTL
// shorter than 150 ms.
func quorumTimeout(ttl time.Duration) time.Duration {
	return min(50*time.Millisecond, ttl/3)
}

// acquire: the lock is taken when a majority of servers took (or re-entered) it within
// quorumTimeout, before the lease could have run out; its token is the largest among them.
// Otherwise it is released on every server that may have granted it, and the answer says when
// to try again: after a split vote (some servers granted it, not a majority) a random 1-8 ms,
// so that the contenders stop colliding; else when enough holders' leases run out for a
// majority. When fewer than a majority answered at all, the error is a *QuorumError.
func (q *quorum) acquire(ctx context.Context, a acquireArgs, _ replicaAck) (acquired, int, error) {
	n := len(q.nodes)
	sent := mono()
	var (
		yes, no, failed int
		token           uint64
		holds           int
		pttls           []time.Duration
		res             acquired
		err             error
		queuedOn        uint64
		tokensOn        = make([]uint64, n)
		leases, offers  []time.Duration // adaptive lease: the granting servers' and the others' choices
	)
	states := make([]ServerState, n)
	for i, node := range q.nodes {
		states[i] = ServerState{Addr: node.Addr(), State: "no answer"}
	}
	ttl := parseMS(a.ttl)
	// On a machine or network slow for every server, wait longer: eight times the recent
	// answer time, up to a third of the lease.
	wait := max(quorumTimeout(ttl), min(8*time.Duration(q.latency.Load()), ttl/3))
	// decide runs in this goroutine, one answer at a time, until it returns true.
	decided := q.fanOutAdapt(ctx, []conn.Call{a.call()}, wait, true, false, a.owner, afterOf(q.pendingOf(a.owner)), func(r reply) bool {
		x, rerr := readAcquire(r.res[0].Ints)
		if r.res[0].Err != nil {
			rerr = r.res[0].Err
		}
		switch {
		case rerr != nil:
			failed++
			states[r.node].State, states[r.node].Err = "error", rerr
		case x.ok:
			yes++
			token = max(token, x.token)
			holds = max(holds, x.holds)
			states[r.node].State = "granted"
			if x.ttl > 0 {
				leases = append(leases, x.ttl)
			}
		default:
			no++
			if x.ttl > 0 {
				offers = append(offers, x.ttl)
			}
			states[r.node].State = "held by another owner"
			tokensOn[r.node] = x.token
			if a.queue {
				queuedOn |= 1 << r.node
			}
			if x.pttl >= 0 && !x.notMine {
				pttls = append(pttls, x.pttl)
			}
		}
		switch {
		case yes >= q.need:
			res = acquired{ok: true, token: token, holds: holds}
		case n-no-failed >= q.need:
			return false // a majority can still grant it
		case a.reenterOnly:
			res = acquired{notMine: true, pttl: -1}
		case yes+no < q.need: // not because of a holder: servers are down
			err = q.noQuorum("lock", states, 0)
		case yes > 0:
			res = acquired{pttl: time.Duration(1+rand.Int64N(8)) * time.Millisecond}
		default:
			res = acquired{pttl: q.freeIn(pttls)}
		}
		return true
	}, a.lateReply())
	if !decided { // no decision within the timeout, or the caller gave up
		switch {
		case ctx.Err() != nil:
			res, err = acquired{}, ctx.Err()
		case a.reenterOnly:
			res, err = acquired{notMine: true, pttl: -1}, nil
		case yes+no < q.need:
			res, err = acquired{}, q.noQuorum("lock", states, wait)
		case yes > 0:
			res = acquired{pttl: time.Duration(1+rand.Int64N(8)) * time.Millisecond}
		default:
			res = acquired{pttl: q.freeIn(pttls)}
		}
	}
	if res.ok {
		// Each server chose its own adaptive lease: the lock is held on a majority for the
		// need-th longest (renewals then give every server the same).
		if res.ttl = majorityLease(leases, q.need); res.ttl > 0 {
			ttl = res.ttl
		}
	} else {
		res.ttl = majorityLease(offers, q.need)
	}
	if res.ok && !a.reenterOnly && mono() >= sent+int64(ttl-drift(ttl)) {
		// Redlock: the majority took longer than the validity time (TTL - drift) to answer,
		// so the lease has no time left. Give it back and count the attempt as failed.
		res = acquired{}
	}
	res.queuedOn, res.tokensOn = queuedOn, tokensOn
	if !a.reenterOnly && (err != nil || (!res.ok && (yes > 0 || !decided))) {
		// Some servers may hold it for owner: give it back everywhere. (When every server
		// refused there is nothing to give back, and owner, a queue entry's, stays usable.) A
		// queue entry's owner is given back by the caller, unless a grant to the entry reached
		// a majority meanwhile (engine.dropRegistration).
		if !a.queue {
			q.releaseOwner(a.keys, a.owner)
		}
		res.dirty = true
	}
	return res, -1, err
}

// freeIn estimates when a majority could grant the lock: the servers that refused free up as
// their holders' leases run out. Negative: unknown (the waiter then waits a whole TTL or for a
// release notice).
func (q *quorum) freeIn(pttls []time.Duration) time.Duration {
	if q.need > len(pttls) {
		return -1
	}
	slices.Sort(pttls)
	return pttls[q.need-1]
}

// releaseOwner releases, in the background, every hold of owner on every server: after an
// acquisition that did not reach a quorum, no server may keep it.
func (q *quorum) releaseOwner(keys []string, owner string) {
	call := releaseArgs{keys: keys, owner: owner, retention: q.retention, channel: releaseChannel(keys[0]), all: true}.call()
	p := q.pendingOf(owner)
	q.bg.Add(len(q.nodes))
	for i, n := range q.nodes {
		go func() {
			defer q.bg.Done()
			ctx, cancel := context.WithTimeout(q.closing, 2*time.Second)
			defer cancel()
			if p != nil {
				select {
				case <-p.done[i]: // after the acquisition's own call on this server
				case <-ctx.Done():
				}
			}
			n.EvalMulti(ctx, []conn.Call{call})
		}()
	}
}

// answerWait bounds how long a release or a TTL query waits for a decisive majority of answers.
const answerWait = 2 * time.Second

// release: the holds left as a majority counts them, or not owned when a majority says the
// caller does not hold the lock.
func (q *quorum) release(ctx context.Context, r releaseReq) (released, error) {
	c := releaseArgs{keys: r.keys, owner: r.owner, retention: q.retention, channel: r.channel,
		all: r.all, floor: r.floor, leave: r.leave, record: r.record}.call()
	var (
		ok, notHeld, bad int
		res              released
		err              error
		errs             []error
	)
	n := len(q.nodes)
	if !q.fanOut(ctx, []conn.Call{c}, answerWait, true, "", q.pendingOf(r.owner), func(rp reply) bool {
		x, rerr := readRelease(rp.res[0].Ints)
		if rp.res[0].Err != nil {
			rerr = rp.res[0].Err
		}
		switch {
		case rerr != nil:
			bad++
			errs = append(errs, q.nodeErr(rp.node, rerr))
		case x.owned:
			ok++
			res.left = max(res.left, x.left)
		default:
			notHeld++
		}
		switch {
		case ok >= q.need:
			res.owned = true
		case notHeld > n-q.need: // a majority no longer holds it: it was lost
			res = released{}
		case ok+notHeld+bad == n:
			err = fmt.Errorf("%d of %d servers answered: %w", ok+notHeld, n, joinErrors(errs...))
		default:
			return false
		}
		return true
	}) {
		err = fmt.Errorf("%d of %d servers answered within %v: %w", ok+notHeld, n, answerWait, joinErrors(errs...))
	}
	return res, err
}

// renew sends the whole round to every server at once, one pipeline each: the releases (each
// decided when a majority answered it: the lock is then released, or was not held), the lease
// renewals and the queue entries' refreshes (renewed when a majority renewed them, lost or gone
// when a majority says so; otherwise an error, and the renewal loop retries). Each server's
// pipeline waits for the acquisitions of the released owners still running on it, so that a
// release never overtakes what it undoes. The round waits no longer than a third of the
// shortest lease or window in it (answerWait when it only releases), so that a server that
// never answers cannot hold up every other lease's renewal.
func (q *quorum) renew(ctx context.Context, rd round) roundResult {
	nRel, nLease := len(rd.releases), len(rd.leases)
	items := nRel + nLease + len(rd.entries)
	res := roundResult{relErrs: make([]error, nRel), leases: make([]renewed, nLease), entries: make([]renewed, len(rd.entries))}
	if items == 0 {
		return res
	}
	n := len(q.nodes)
	type span struct {
		from, to int
		kind     int // 0 release, 1 lease, 2 entry
	}
	var calls []conn.Call
	var spans []span
	var after []*pendingAcquire
	limit := time.Duration(-1)
	shorter := func(d time.Duration) {
		if limit < 0 || d < limit {
			limit = d
		}
	}
	for i, r := range rd.releases {
		calls = append(calls, releaseArgs{keys: r.keys, owner: r.owner, retention: q.retention, channel: r.channel,
			all: r.all, floor: r.floor, leave: r.leave, record: r.record}.call())
		spans = append(spans, span{i, i + 1, 0})
		if p := q.pendingOf(r.owner); p != nil {
			after = append(after, p)
		}
	}
	for i := 0; i < nLease; i += renewBatch {
		j := min(i+renewBatch, nLease)
		keys, owners, ttls := make([]string, 0, j-i), make([]string, 0, j-i), make([]string, 0, j-i)
		for _, l := range rd.leases[i:j] {
			keys, owners, ttls = append(keys, l.key), append(owners, l.owner), append(ttls, l.ttl)
			shorter(parseMS(l.ttl) / 3)
		}
		calls, spans = append(calls, renewCall(keys, owners, ttls)), append(spans, span{nRel + i, nRel + j, 1})
	}
	for i := 0; i < len(rd.entries); i += renewBatch {
		j := min(i+renewBatch, len(rd.entries))
		keys, ids, windows, waiting := make([]string, 0, j-i), make([]string, 0, j-i), make([]string, 0, j-i), make([]string, 0, j-i)
		watch := make([]bool, 0, j-i)
		for _, e := range rd.entries[i:j] {
			keys, ids, windows, waiting = append(keys, e.key), append(ids, e.id), append(windows, e.window), append(waiting, e.waiting)
			watch = append(watch, e.watch)
			shorter(parseMS(e.window) / 3)
		}
		calls, spans = append(calls, queueCall(keys, ids, windows, waiting, watch)), append(spans, span{nRel + nLease + i, nRel + nLease + j, 2})
	}
	if limit < 0 {
		limit = answerWait
	}
	yes, no := make([]int, items), make([]int, items)
	on := make([]uint64, items)
	freed := make([]bool, items)            // a server answered renew.lua's "released" for the lease
	lefts := make([][]time.Duration, items) // an entry's lock, by server that told: ms until it may be free
	failed := make([]int, len(calls))       // servers whose answer to call c is an error
	callOf := make([]int, items)
	for c, sp := range spans {
		for k := sp.from; k < sp.to; k++ {
			callOf[k] = c
		}
	}
	var answers int
	var errs []error
	decided := func() bool {
		for k := range items {
			pending := n - yes[k] - no[k] - failed[callOf[k]]
			if k < nRel { // a release is decided once a majority answered it either way
				if yes[k]+no[k] < q.need && pending > 0 {
					return false
				}
				continue
			}
			if yes[k] < q.need && yes[k]+pending >= q.need {
				return false
			}
		}
		return true
	}
	q.fanOutAdapt(ctx, calls, limit, false, true, "", after, func(r reply) bool {
		answers++
		for c, x := range r.res {
			sp := spans[c]
			var oks []bool
			err := x.Err
			if err == nil {
				switch sp.kind {
				case 0:
					var rel released
					rel, err = readRelease(x.Ints)
					oks = []bool{rel.owned}
				case 1:
					oks, err = readRenew(x.Ints, sp.to-sp.from)
					for k, v := range x.Ints {
						if err == nil && v == renewReleased {
							freed[sp.from+k] = true
						}
					}
				default:
					var left []time.Duration
					oks, left, err = readQueue(x.Ints, sp.to-sp.from)
					for k, l := range left {
						if l != lockLeftUnknown {
							lefts[sp.from+k] = append(lefts[sp.from+k], l)
						}
					}
				}
			}
			if err != nil {
				failed[c]++
				errs = append(errs, q.nodeErr(r.node, err))
				continue
			}
			for k, ok := range oks {
				if ok {
					yes[sp.from+k]++
					on[sp.from+k] |= 1 << r.node
				} else {
					no[sp.from+k]++
				}
			}
		}
		return decided()
	}, nil)
	undecided := func() error {
		if err := joinErrors(errs...); err != nil {
			return fmt.Errorf("undecided, %d of %d servers answered: %w", answers, n, err)
		}
		return fmt.Errorf("undecided, %d of %d servers answered in time", answers, n)
	}
	for k := range items {
		switch {
		case k < nRel:
			if yes[k]+no[k] < q.need {
				res.relErrs[k] = undecided()
			}
		default:
			out := &res.leases
			idx := k - nRel
			if k >= nRel+nLease {
				out, idx = &res.entries, k-nRel-nLease
			}
			(*out)[idx].on = on[k]
			if k >= nRel+nLease {
				// A majority may have the lock free once the need-th shortest time has passed.
				(*out)[idx].lockLeft = lockLeftUnknown
				if l := lefts[k]; len(l) >= q.need {
					slices.Sort(l)
					(*out)[idx].lockLeft = l[q.need-1]
				}
			}
			switch {
			case yes[k] >= q.need:
				(*out)[idx].ok = true
			case no[k] >= n-q.need+1: // a majority refused: lost, or gone
				(*out)[idx].released = freed[k]
			default:
				(*out)[idx].err = undecided()
			}
		}
	}
	return res
}

// pttl: the lease is held on a majority for at least the majority-th longest remaining lease;
// lost when fewer than a majority hold it.
func (q *quorum) pttl(ctx context.Context, keys []string, owner string) (time.Duration, bool, error) {
	var (
		left         []time.Duration
		no, answered int
		errs         []error
		res          time.Duration
		held         bool
		err          error
		n            = len(q.nodes)
	)
	if !q.fanOut(ctx, []conn.Call{pttlCall(keys, owner)}, answerWait, false, "", nil, func(r reply) bool {
		answered++
		d, ok, rerr := readPTTL(r.res[0].Ints)
		if r.res[0].Err != nil {
			rerr = r.res[0].Err
		}
		switch {
		case rerr != nil:
			errs = append(errs, q.nodeErr(r.node, rerr))
		case ok:
			left = append(left, d)
		default:
			no++
		}
		switch {
		case len(left) >= q.need:
			slices.Sort(left)
			res, held = left[len(left)-q.need], true
		case no >= n-q.need+1:
		case answered == n:
			err = fmt.Errorf("%d of %d servers answered: %w", n-len(errs), n, joinErrors(errs...))
		default:
			return false
		}
		return true
	}) {
		err = fmt.Errorf("%d of %d servers answered within %v: %w", answered-len(errs), n, answerWait, joinErrors(errs...))
	}
	return res, held, err
}

var errNoHandover = errors.New("dlock: no handover in quorum mode")

func (q *quorum) handover(context.Context, handoverArgs) (handedOver, error) {
	return handedOver{}, errNoHandover
}

var errNoShared = errors.New("dlock: read-write locks and semaphores are not available in quorum mode")

// run is not offered: traits().shared is false, so no read-write lock or semaphore gets here.
func (q *quorum) run(context.Context, conn.Call, replicaAck) ([]int64, int, error) {
	return nil, -1, errNoShared
}

func (q *quorum) evalAny(context.Context, *conn.Script, []string, ...string) (any, error) {
	return nil, errNoShared
}

// noQuorum is the error of an operation that fewer than a majority of servers answered (within
// wait, when it is not 0).
func (q *quorum) noQuorum(op string, states []ServerState, wait time.Duration) error {
	return &QuorumError{Op: op, Need: q.need, Wait: wait, Servers: states}
}

// first runs f on every server in parallel and returns the answer of the first server, in the
// order given, that answered without an error (inspection reads that server's view).
func (q *quorum) first(ctx context.Context, f func(context.Context, conn.Conn) (any, error)) (any, error) {
	type ans struct {
		v   any
		err error
	}
	res := make([]ans, len(q.nodes))
	var wg sync.WaitGroup
	for i, n := range q.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := f(ctx, n)
			res[i] = ans{v, err}
		}()
	}
	wg.Wait()
	for _, r := range res {
		if r.err == nil {
			return r.v, nil
		}
	}
	return nil, res[0].err
}

func (q *quorum) inspect(ctx context.Context, keys []string) (any, error) {
	return q.first(ctx, func(ctx context.Context, cn conn.Conn) (any, error) {
		return evalStrings(ctx, cn, scriptInspect, inspectKeys(keys))
	})
}

// forceUnlock releases on every server; the reply is the first server's (in order) that
// answered.
func (q *quorum) forceUnlock(ctx context.Context, key, channel string) (any, error) {
	return q.first(ctx, func(ctx context.Context, cn conn.Conn) (any, error) {
		qk, _ := queueKeys(key)
		return evalStrings(ctx, cn, scriptForceUnlock, []string{key, qk}, q.retention, channel)
	})
}

// scan walks the first reachable server only, so that its cursor stays on one server.
func (q *quorum) scan(ctx context.Context, cursor, pattern string) (any, error) {
	var errs []error
	for _, n := range q.nodes {
		v, err := n.Command(ctx, "SCAN", cursor, "MATCH", pattern, "COUNT", "1000")
		if err == nil {
			return v, nil
		}
		errs = append(errs, err)
	}
	return nil, joinErrors(errs...)
}

// masters asks every server.
func (q *quorum) masters(ctx context.Context, args ...string) []conn.MasterReply {
	out := make([]conn.MasterReply, len(q.nodes))
	var wg sync.WaitGroup
	for i, n := range q.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := n.Command(ctx, args...)
			out[i] = conn.MasterReply{Addr: n.Addr(), Reply: v, Err: err}
		}()
	}
	wg.Wait()
	return out
}

// ping sends PING to every server and returns nil as soon as a majority answered, the
// servers a lock needs. Otherwise it waits for every answer (within ctx: a server that does
// not answer in time fails with ctx's error) and returns a *QuorumError that says what each
// server did ("answered" or "error"). Each server's error goes to the observer.
func (q *quorum) ping(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	type answer struct {
		node int
		err  error
	}
	answers := make(chan answer, len(q.nodes))
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for i, n := range q.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := n.Command(ctx, "PING")
			answers <- answer{i, err}
		}()
	}
	states := make([]ServerState, len(q.nodes))
	ok := 0
	for range q.nodes {
		a := <-answers
		states[a.node] = ServerState{Addr: q.nodes[a.node].Addr(), State: "answered"}
		if a.err != nil {
			states[a.node].State, states[a.node].Err = "error", a.err
			if q.ev != nil {
				q.ev.nodeError(states[a.node].Addr, "PING", a.err)
			}
			continue
		}
		if ok++; ok >= q.need {
			return nil
		}
	}
	return q.noQuorum("ping", states, 0)
}

// listen subscribes on every server, so that a release announced by any of them wakes the
// waiters. It succeeds when a majority could be reached; while some server is missing, the
// listener reports itself done after listenRetry so that the client subscribes again,
// including to the servers that came back.
func (q *quorum) listen(ctx context.Context, h conn.Handler) (conn.Listener, error) {
	ql := &quorumListener{done: make(chan error, 1), quit: make(chan struct{})}
	var mu sync.Mutex
	lns := make([]conn.Listener, len(q.nodes))
	var errs []error
	var wg sync.WaitGroup
	for i, n := range q.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Announcements say which server made them (a grant counts per server).
			nh := h
			if h.Message != nil {
				nh.Message = func(channel, payload string) { h.Message(channel, payload+serverTag+strconv.Itoa(i)) }
			}
			ln, err := n.Listen(ctx, nh)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			lns[i] = ln
		}()
	}
	wg.Wait()
	for _, ln := range lns {
		if ln != nil {
			ql.lns = append(ql.lns, ln)
		}
	}
	if len(ql.lns) < q.need {
		ql.closeAll()
		return nil, fmt.Errorf("pub/sub on %d of %d servers: %w", len(ql.lns), len(q.nodes), joinErrors(errs...))
	}
	missing := len(ql.lns) < len(q.nodes)
	ql.wg.Add(1)
	go ql.watch(missing)
	return ql, nil
}

// serverTag separates an announcement from the index of the server that made it, in quorum
// mode (see listen).
const serverTag = "\x00"

// errListenRetry ends a quorum listener that could not reach every server, after listenRetry,
// so that the client subscribes again, including to the servers that came back: no loss of the
// subscription (a majority was listening all along).
var errListenRetry = errors.New("pub/sub: retrying the servers that were unreachable")

// listenRetry is how long a quorum listener that could not reach every server waits before it
// asks to be made again.
const listenRetry = 3 * time.Second

// quorumListener is one conn.Listener over the listeners of the servers it could reach.
type quorumListener struct {
	lns  []conn.Listener
	done chan error
	quit chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

func (l *quorumListener) watch(missing bool) {
	defer l.wg.Done()
	cases := make(chan error, len(l.lns))
	stop := make(chan struct{})
	defer close(stop)
	for _, ln := range l.lns {
		go func() {
			select {
			case err := <-ln.Done():
				cases <- err
			case <-stop:
			}
		}()
	}
	var retry <-chan time.Time
	if missing {
		t := time.NewTimer(listenRetry)
		defer t.Stop()
		retry = t.C
	}
	select {
	case err := <-cases:
		if err == nil {
			err = errors.New("pub/sub connection closed")
		}
		l.done <- err
	case <-retry:
		l.done <- errListenRetry
	case <-l.quit:
	}
	close(l.done)
}

func (l *quorumListener) Subscribe(ctx context.Context, channels ...string) error {
	return l.each(func(ln conn.Listener) error { return ln.Subscribe(ctx, channels...) })
}

func (l *quorumListener) Unsubscribe(ctx context.Context, channels ...string) error {
	return l.each(func(ln conn.Listener) error { return ln.Unsubscribe(ctx, channels...) })
}

func (l *quorumListener) each(f func(conn.Listener) error) error {
	errs := make([]error, len(l.lns))
	var wg sync.WaitGroup
	for i, ln := range l.lns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(ln)
		}()
	}
	wg.Wait()
	return joinErrors(errs...)
}

func (l *quorumListener) Done() <-chan error { return l.done }

func (l *quorumListener) Close() error {
	l.once.Do(func() {
		close(l.quit)
		l.closeAll()
		l.wg.Wait()
	})
	return nil
}

func (l *quorumListener) closeAll() {
	for _, ln := range l.lns {
		ln.Close()
	}
}

// parseMS reads a duration in whole milliseconds, as the scripts take it.
func parseMS(s string) time.Duration {
	var v int64
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0
		}
		v = v*10 + int64(s[i]-'0')
	}
	return time.Duration(v) * time.Millisecond
}

// probe runs on every server; the first that denies something (or, when none does, no server)
// is reported. Servers that cannot be reached are left to the acquisitions to report.
func (q *quorum) probe(ctx context.Context, keys []string, channel string) ([]string, string, error) {
	type ans struct {
		denied []string
		err    error
	}
	res := make([]ans, len(q.nodes))
	var wg sync.WaitGroup
	for i, n := range q.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reply, err := evalStrings(ctx, n, scriptProbe, keys, channel, "p")
			res[i] = ans{probeDenied(reply), err}
		}()
	}
	wg.Wait()
	for i, r := range res {
		if len(r.denied) > 0 || (r.err != nil && classify(r.err) == ErrDenied) {
			return r.denied, q.nodes[i].Addr(), r.err
		}
	}
	return nil, "", nil
}

// observe takes one server's answer time into the moving average (weight 1/8).
func (q *quorum) observe(d time.Duration) {
	for {
		old := q.latency.Load()
		next := old + (int64(d)-old)/8
		if old == 0 {
			next = int64(d)
		}
		if q.latency.CompareAndSwap(old, next) {
			return
		}
	}
}

// nodeErrors reports the first error of one server's answer to calls, if any.
func (q *quorum) nodeErrors(addr string, calls []conn.Call, res []conn.Result) {
	for i, r := range res {
		if r.Err == nil {
			continue
		}
		op := "WAIT"
		if i < len(calls) && calls[i].Script != nil {
			op = calls[i].Script.Name
		}
		q.ev.nodeError(addr, op, r.Err)
		return
	}
}
