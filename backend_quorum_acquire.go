package dlock

import (
	"context"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/dlock-go/dlock/conn"
)

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
