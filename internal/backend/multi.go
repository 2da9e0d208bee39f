package backend

import (
	"context"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/protocol"
)

// Multi is what a deployment whose locks live on one server (standalone, Sentinel, or a
// Cluster slot by slot) adds to backend for multi-locks and latches: scripts that touch several
// keys of one slot at once. The quorum backend does not have it: there a MultiMutex takes its
// names one by one (acquire.lua through backend.acquire), and latches are not offered.
type Multi interface {
	// AcquireMulti runs multiacquire.lua, followed by a WAIT when ack.N > 0 (it then reports how
	// many replicas acknowledged, else -1).
	AcquireMulti(ctx context.Context, a protocol.MultiAcquireArgs, ack ReplicaAck) (protocol.MultiAcquired, int, error)
	// ReleaseMany releases every hold of each request (all of them are final releases), in one
	// pipeline: multirelease.lua for the requests of one slot, release.lua for a lone one.
	ReleaseMany(ctx context.Context, rs []ReleaseReq) ([]protocol.Released, []error)
	// Latch runs latch.lua.
	Latch(ctx context.Context, a protocol.LatchArgs) (protocol.LatchState, error)
	// OneSlot reports whether the keys of one script call must share a hash slot (a Cluster).
	OneSlot() bool
}

var _ Multi = (*OneServer)(nil)

func (s *OneServer) OneSlot() bool { return s.Cluster }

func (s *OneServer) AcquireMulti(ctx context.Context, a protocol.MultiAcquireArgs, ack ReplicaAck) (protocol.MultiAcquired, int, error) {
	a.Sharded = s.Cluster
	r, acked, err := s.Run(ctx, a.Call(), ack)
	if err != nil {
		return protocol.MultiAcquired{}, -1, err
	}
	res, err := protocol.ReadMultiAcquire(r, len(a.Keys)/3)
	return res, acked, err
}

func (s *OneServer) ReleaseMany(ctx context.Context, rs []ReleaseReq) ([]protocol.Released, []error) {
	out, errs := make([]protocol.Released, len(rs)), make([]error, len(rs))
	if len(rs) == 0 {
		return out, errs
	}
	keys := make([]string, len(rs))
	for i, r := range rs {
		keys[i] = r.Keys[0]
	}
	groups := s.chunks(keys, nil) // one slot each on a Cluster
	calls := make([]conn.Call, len(groups))
	for g, idx := range groups {
		if len(idx) == 1 {
			calls[g] = s.releaseCall(rs[idx[0]])
			continue
		}
		m := protocol.MultiReleaseArgs{Retention: s.retention, Sharded: s.Cluster}
		for _, i := range idx {
			m.Reqs = append(m.Reqs, rs[i].args(s.retention, s.Cluster))
		}
		calls[g] = m.Call()
	}
	results := s.cn.EvalMulti(ctx, calls)
	for g, idx := range groups {
		r := conn.Result{Err: ErrShortReply}
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
			got, err = protocol.ReadMultiRelease(r.Ints, len(idx))
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

func (s *OneServer) Latch(ctx context.Context, a protocol.LatchArgs) (protocol.LatchState, error) {
	a.Sharded = s.Cluster
	a.Retention = s.retention
	return evalRead(ctx, s.cn, a.Call(), protocol.ReadLatch)
}
