package dlock

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/protocol"
)

// multiBackend is what a deployment whose locks live on one server (standalone, Sentinel, or a
// Cluster slot by slot) adds to backend for multi-locks and latches: scripts that touch several
// keys of one slot at once. The quorum backend does not have it: there a MultiMutex takes its
// names one by one (acquire.lua through backend.acquire), and latches are not offered.
type multiBackend interface {
	// acquireMulti runs multiacquire.lua, followed by a WAIT when ack.n > 0 (it then reports how
	// many replicas acknowledged, else -1).
	acquireMulti(ctx context.Context, a multiArgs, ack replicaAck) (multiAcquired, int, error)
	// releaseMany releases every hold of each request (all of them are final releases), in one
	// pipeline: multirelease.lua for the requests of one slot, release.lua for a lone one.
	releaseMany(ctx context.Context, rs []releaseReq) ([]protocol.Released, []error)
	// latch runs latch.lua.
	latch(ctx context.Context, a latchArgs) (latchState, error)
	// oneSlot reports whether the keys of one script call must share a hash slot (a Cluster).
	oneSlot() bool
}

var _ multiBackend = (*oneServer)(nil)

func (s *oneServer) oneSlot() bool { return s.cluster }

func (s *oneServer) acquireMulti(ctx context.Context, a multiArgs, ack replicaAck) (multiAcquired, int, error) {
	a.sharded = s.cluster
	r, acked, err := s.run(ctx, a.call(), ack)
	if err != nil {
		return multiAcquired{}, -1, err
	}
	res, err := readMultiAcquire(r, len(a.keys)/3)
	return res, acked, err
}

func (s *oneServer) releaseMany(ctx context.Context, rs []releaseReq) ([]protocol.Released, []error) {
	out, errs := make([]protocol.Released, len(rs)), make([]error, len(rs))
	if len(rs) == 0 {
		return out, errs
	}
	keys := make([]string, len(rs))
	for i, r := range rs {
		keys[i] = r.keys[0]
	}
	groups := s.chunks(keys, nil) // one slot each on a Cluster
	calls := make([]conn.Call, len(groups))
	for g, idx := range groups {
		if len(idx) == 1 {
			calls[g] = s.releaseCall(rs[idx[0]])
			continue
		}
		m := multiReleaseArgs{retention: s.retention, sharded: s.cluster}
		for _, i := range idx {
			m.reqs = append(m.reqs, rs[i])
		}
		calls[g] = m.call()
	}
	results := s.cn.EvalMulti(ctx, calls)
	for g, idx := range groups {
		r := conn.Result{Err: errShortReply}
		if g < len(results) {
			r = results[g]
		}
		var got []protocol.Released
		err := r.Err
		switch {
		case err != nil:
		case len(idx) == 1:
			var one protocol.Released
			one, err = protocol.ReadRelease(r.Ints)
			got = []protocol.Released{one}
		default:
			got, err = readMultiRelease(r.Ints, len(idx))
		}
		for k, i := range idx {
			if err != nil {
				errs[i] = err
			} else {
				out[i] = got[k]
			}
		}
	}
	return out, errs
}

// multiReleaseArgs: multirelease.lua releases every hold of each request's owner, each lock as
// release.lua does; the keys of one call share a slot.
type multiReleaseArgs struct {
	reqs      []releaseReq
	retention string
	sharded   bool
}

func (a multiReleaseArgs) call() conn.Call {
	keys := make([]string, 0, 3*len(a.reqs))
	args := make([]string, 0, 2+3*len(a.reqs))
	args = append(args, a.retention, protocol.PubArg(a.sharded))
	for _, r := range a.reqs {
		keys = append(keys, r.keys...)
		args = append(args, r.owner, strconv.FormatUint(r.floor, 10), r.leave)
	}
	return conn.Call{Script: protocol.ScriptMultiRelease, Keys: keys, Args: args}
}

// readMultiRelease returns, per lock, whether its owner held it (it is released now).
func readMultiRelease(r []int64, n int) ([]protocol.Released, error) {
	if len(r) != n {
		return nil, fmt.Errorf("multirelease.lua: %d answers for %d locks", len(r), n)
	}
	out := make([]protocol.Released, n)
	for i, v := range r {
		out[i].Owned = v == 0
	}
	return out, nil
}

func (s *oneServer) latch(ctx context.Context, a latchArgs) (latchState, error) {
	a.sharded = s.cluster
	a.retention = s.retention
	return evalRead(ctx, s.cn, a.call(), readLatch)
}

// multiArgs: multiacquire.lua takes several locks of one slot, all or none (or, with prefix,
// the free ones before the first busy one), and queues the caller at a busy one.
type multiArgs struct {
	keys    []string // per lock, in the global order: its key and queue keys (lockSpec.keys)
	owner   string   // the owner secret of the locks taken
	ttl     string   // the lease, ms
	meta    string   // the holder description
	prefix  bool     // ordered mode: take the free locks before the first busy one
	sharded bool     // announce with SPUBLISH (Redis Cluster)
	entry   string   // the caller's queue entry id; "" to queue nowhere
	at      string   // where to queue: "*" the first busy lock, "<i>" lock i (1-based) only
	eowner  string   // the entry's owner secret (also lock at's owner when taken)
	window  string   // the entry's acceptance window, ms
}

func (a multiArgs) call() conn.Call {
	mode := "a"
	if a.prefix {
		mode = "p"
	}
	at := a.at
	if a.entry == "" {
		at = ""
	}
	return conn.Call{Script: protocol.ScriptMultiAcquire, Keys: a.keys, Args: []string{
		a.owner, a.ttl, a.meta, mode, protocol.PubArg(a.sharded), a.entry, at, a.eowner, a.window,
	}}
}

// multiAcquired is multiacquire.lua's answer, with 0-based indexes.
type multiAcquired struct {
	busy   int           // the first busy lock; -1 when every lock was taken
	pttl   time.Duration // busy's remaining lease (or the window of a grant just made)
	token  uint64        // busy's holder's token
	tokens []uint64      // per lock: the token when this call took or claimed it, else 0
}

func readMultiAcquire(r []int64, n int) (multiAcquired, error) {
	if len(r) != 3+n || r[0] < 0 || r[0] > int64(n) {
		return multiAcquired{}, fmt.Errorf("multiacquire.lua: unexpected reply %v for %d locks", r, n)
	}
	res := multiAcquired{busy: int(r[0]) - 1, pttl: time.Duration(r[1]) * time.Millisecond, token: uint64(r[2]), tokens: make([]uint64, n)}
	for i := range n {
		res.tokens[i] = uint64(r[3+i])
	}
	return res, nil
}

// latchArgs: latch.lua reads a latch (creating it when absent), counts it down, or only reads.
type latchArgs struct {
	key       string
	op        byte   // 'c' read or create, 'd' count down, 's' read only
	count     int    // the initial count; 0: never create
	ttl       string // ms
	retention string // ms: how long an expired latch's record stays after its deadline
	channel   string
	sharded   bool
	id        string // with 'd': the count-down's id ("" for none)
}

func (a latchArgs) call() conn.Call {
	return conn.Call{Script: protocol.ScriptLatch, Keys: []string{a.key}, Args: []string{
		string(a.op), strconv.Itoa(a.count), a.ttl, a.retention, a.channel, protocol.PubArg(a.sharded), a.id,
	}}
}

// latchState is latch.lua's answer.
type latchState struct {
	status  int // latch.lua's: 0 read, 1 counted, 2 id counted before, 3 other count, 4 none
	left    int
	initial int
	rest    time.Duration // until the deadline; 0 or less: expired
}

const (
	latchRead = iota
	latchCounted
	latchCountedBefore
	latchOtherCount
	latchNone
)

func readLatch(r []int64) (latchState, error) {
	if len(r) != 4 || r[0] < latchRead || r[0] > latchNone {
		return latchState{}, fmt.Errorf("latch.lua: unexpected reply %v", r)
	}
	return latchState{status: int(r[0]), left: int(r[1]), initial: int(r[2]), rest: time.Duration(r[3]) * time.Millisecond}, nil
}
