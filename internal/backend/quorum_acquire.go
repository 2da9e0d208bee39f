package backend

import (
	"context"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/protocol"
	"github.com/dlock-go/dlock/internal/timing"
)

// QuorumTimeout is how long an acquisition waits for the servers' answers: small against the
// lease, as the Redlock algorithm asks ("5-50 ms for a 10 s auto-release time"), so that a
// majority of frozen or unreachable servers fails an attempt fast: 50 ms, or a third of a TTL
// shorter than 150 ms.
func QuorumTimeout(ttl time.Duration) time.Duration {
	return min(50*time.Millisecond, ttl/3)
}

// Acquire: the lock is taken when a majority of servers took (or re-entered) it within
// quorumTimeout, before the lease could have run out; its token is the largest among them.
// Otherwise it is released on every server that may have granted it, and the answer says when
// to try again: after a split vote (some servers granted it, not a majority) a random 1-8 ms,
// so that the contenders stop colliding; else when enough holders' leases run out for a
// majority. When fewer than a majority answered at all, the error is a *QuorumError.
func (q *Quorum) Acquire(ctx context.Context, a protocol.AcquireArgs, _ ReplicaAck) (protocol.Acquired, int, error) {
	sent := timing.Mono()
	t := q.newAcquireTally()
	ttl := parseMS(a.TTL)
	// On a machine or network slow for every server, wait longer: eight times the recent
	// answer time, up to a third of the lease.
	wait := max(QuorumTimeout(ttl), min(8*time.Duration(q.latency.Load()), ttl/3))
	var (
		res protocol.Acquired
		err error
	)
	// decide runs in this goroutine, one answer at a time, until it returns true.
	decided := q.fanOutAdapt(ctx, []conn.Call{a.Call()}, wait, true, false, a.Owner, afterOf(q.pendingOf(a.Owner)), func(r reply) bool {
		t.add(r, a.Queue)
		var done bool
		res, done, err = q.decideAcquire(t, a)
		return done
	}, lateReply(a))
	if !decided { // no decision within the timeout, or the caller gave up
		res, err = q.undecidedAcquire(ctx, t, a, wait)
	}
	res = q.acquiredLease(res, t, a, ttl, sent)
	res.QueuedOn, res.TokensOn = t.queuedOn, t.tokensOn
	if !a.ReenterOnly && (err != nil || (!res.OK && (t.yes > 0 || !decided))) {
		// Some servers may hold it for owner: give it back everywhere. (When every server
		// refused there is nothing to give back, and owner, a queue entry's, stays usable.) A
		// queue entry's owner is given back by the caller, unless a grant to the entry reached
		// a majority meanwhile (engine.dropRegistration).
		if !a.Queue {
			q.releaseOwner(a.Keys, a.Owner)
		}
		res.Dirty = true
	}
	return res, -1, err
}

// acquireTally counts the servers' answers to one acquisition, as they come.
type acquireTally struct {
	yes, no, failed int                // servers that granted it, refused it, answered with an error
	token           uint64             // the largest token among the granting servers
	holds           int                // the most holds among them
	pttls           []time.Duration    // the refusing servers' holders' remaining leases, when known
	queuedOn        uint64             // bit i: server i queued the caller
	tokensOn        []uint64           // per server that refused: its current token
	leases, offers  []time.Duration    // adaptive lease: the granting servers' and the others' choices
	states          []errs.ServerState // what each server did, for a *errs.QuorumError
}

// newAcquireTally returns the tally of an acquisition no server has answered yet.
func (q *Quorum) newAcquireTally() *acquireTally {
	t := &acquireTally{tokensOn: make([]uint64, len(q.nodes)), states: make([]errs.ServerState, len(q.nodes))}
	for i, node := range q.nodes {
		t.states[i] = errs.ServerState{Addr: node.Addr(), State: "no answer"}
	}
	return t
}

// add counts server r.node's answer; queue says whether a refusal queued the caller.
func (t *acquireTally) add(r reply, queue bool) {
	x, rerr := protocol.ReadAcquire(r.res[0].Ints)
	if r.res[0].Err != nil {
		rerr = r.res[0].Err
	}
	switch {
	case rerr != nil:
		t.failed++
		t.states[r.node].State, t.states[r.node].Err = "error", rerr
	case x.OK:
		t.yes++
		t.token = max(t.token, x.Token)
		t.holds = max(t.holds, x.Holds)
		t.states[r.node].State = "granted"
		if x.TTL > 0 {
			t.leases = append(t.leases, x.TTL)
		}
	default:
		t.no++
		if x.TTL > 0 {
			t.offers = append(t.offers, x.TTL)
		}
		t.states[r.node].State = "held by another owner"
		t.tokensOn[r.node] = x.Token
		if queue {
			t.queuedOn |= 1 << r.node
		}
		if x.PTTL >= 0 && !x.NotMine {
			t.pttls = append(t.pttls, x.PTTL)
		}
	}
}

// decideAcquire reports whether the answers so far decide a's acquisition (false while a
// majority can still grant it) and, when they do, its outcome.
func (q *Quorum) decideAcquire(t *acquireTally, a protocol.AcquireArgs) (protocol.Acquired, bool, error) {
	switch {
	case t.yes >= q.need:
		return protocol.Acquired{OK: true, Token: t.token, Holds: t.holds}, true, nil
	case len(q.nodes)-t.no-t.failed >= q.need:
		return protocol.Acquired{}, false, nil // a majority can still grant it
	case a.ReenterOnly:
		return protocol.Acquired{NotMine: true, PTTL: -1}, true, nil
	case t.yes+t.no < q.need: // not because of a holder: servers are down
		return protocol.Acquired{}, true, q.noQuorum("lock", t.states, 0)
	}
	return q.refused(t), true, nil
}

// undecidedAcquire is the outcome of an acquisition that no decision came for within wait, or
// whose caller gave up (ctx).
func (q *Quorum) undecidedAcquire(ctx context.Context, t *acquireTally, a protocol.AcquireArgs, wait time.Duration) (protocol.Acquired, error) {
	switch {
	case ctx.Err() != nil:
		return protocol.Acquired{}, ctx.Err()
	case a.ReenterOnly:
		return protocol.Acquired{NotMine: true, PTTL: -1}, nil
	case t.yes+t.no < q.need:
		return protocol.Acquired{}, q.noQuorum("lock", t.states, wait)
	}
	return q.refused(t), nil
}

// refused is a refusal's answer of when to try again: after a split vote (some servers granted
// it) a random 1-8 ms; else when a majority could grant it (freeIn).
func (q *Quorum) refused(t *acquireTally) protocol.Acquired {
	if t.yes > 0 {
		return protocol.Acquired{PTTL: time.Duration(1+rand.Int64N(8)) * time.Millisecond}
	}
	return protocol.Acquired{PTTL: q.freeIn(t.pttls)}
}

// acquiredLease sets res's adaptive lease from the servers' choices and, as Redlock asks,
// turns a grant into a failure when the majority took longer than the validity time (TTL -
// drift, counted from sent) to answer.
func (q *Quorum) acquiredLease(res protocol.Acquired, t *acquireTally, a protocol.AcquireArgs, ttl time.Duration, sent int64) protocol.Acquired {
	if res.OK {
		// Each server chose its own adaptive lease: the lock is held on a majority for the
		// need-th longest (renewals then give every server the same).
		if res.TTL = timing.MajorityLease(t.leases, q.need); res.TTL > 0 {
			ttl = res.TTL
		}
	} else {
		res.TTL = timing.MajorityLease(t.offers, q.need)
	}
	if res.OK && !a.ReenterOnly && timing.Mono() >= sent+int64(ttl-timing.Drift(ttl)) {
		// The lease has no time left. Give it back and count the attempt as failed.
		return protocol.Acquired{}
	}
	return res
}

// freeIn estimates when a majority could grant the lock: the servers that refused free up as
// their holders' leases run out. Negative: unknown (the waiter then waits a whole TTL or for a
// release notice).
func (q *Quorum) freeIn(pttls []time.Duration) time.Duration {
	if q.need > len(pttls) {
		return -1
	}
	slices.Sort(pttls)
	return pttls[q.need-1]
}

// lateReply returns what to do with an answer to a's acquisition that comes after the decision:
// a refusal that queued the caller is reported to a.QueuedLate (the server has the entry).
func lateReply(a protocol.AcquireArgs) func(reply) {
	if !a.Queue || a.QueuedLate == nil {
		return nil
	}
	return func(r reply) {
		if r.res[0].Err != nil {
			return
		}
		if x, err := protocol.ReadAcquire(r.res[0].Ints); err == nil && !x.OK && !x.NotMine {
			a.QueuedLate(r.node, x.Token)
		}
	}
}

// releaseOwner releases, in the background, every hold of owner on every server: after an
// acquisition that did not reach a quorum, no server may keep it.
func (q *Quorum) releaseOwner(keys []string, owner string) {
	call := protocol.ReleaseArgs{Keys: keys, Owner: owner, Retention: q.retention, Channel: protocol.ReleaseChannel(keys[0]), All: true}.Call()
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
