package dlock

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/slot"
)

// oneServer is the backend of one Redis deployment reached through one conn.Conn: a single
// server, a master followed through Sentinel, or a Cluster (whose client routes each call to
// the slot's master). On a Cluster it announces releases with SPUBLISH and cuts renewal
// calls at slot boundaries; with WithReplicaAck it follows calls with WAIT.
type oneServer struct {
	cn        conn.Conn
	cluster   bool
	retention string // ms, for release.lua and forceunlock.lua
	own       bool   // close closes cn (Dial made it)
}

var _ backend = (*oneServer)(nil)

func newOneServer(cn conn.Conn, retention time.Duration) *oneServer {
	s := &oneServer{cn: cn, retention: ms(retention)}
	if cl, ok := cn.(conn.Clustered); ok && cl.Cluster() {
		s.cluster = true
	}
	return s
}

func (s *oneServer) traits() traits {
	return traits{majority: 1, handover: true, replicaAck: true}
}

func (s *oneServer) addr() string { return s.cn.Addr() }
func (s *oneServer) close() error {
	if !s.own {
		return nil
	}
	return s.cn.Close()
}

func (s *oneServer) acquire(ctx context.Context, a acquireArgs, ack replicaAck) (acquired, int, error) {
	c := a.call()
	if ack.n == 0 {
		r, err := s.cn.Eval(ctx, c.Script, c.Keys, c.Args)
		if err != nil {
			return acquired{}, -1, err
		}
		res, err := readAcquire(r)
		return res, -1, err
	}
	// WAIT right after the script, on the same connection, covers its write.
	rs := s.cn.EvalMulti(ctx, []conn.Call{c, {WaitReplicas: ack.n, WaitTimeout: ack.wait}})
	if rs[0].Err != nil {
		return acquired{}, -1, rs[0].Err
	}
	acked := -1
	if len(rs) == 2 && rs[1].Err == nil && len(rs[1].Ints) == 1 {
		acked = int(rs[1].Ints[0])
	}
	res, err := readAcquire(rs[0].Ints)
	return res, acked, err
}

func (s *oneServer) releaseCall(r releaseReq) conn.Call {
	return releaseArgs{
		keys: r.keys, owner: r.owner, retention: s.retention, channel: r.channel,
		all: r.all, sharded: s.cluster, floor: r.floor, count: r.count,
	}.call()
}

func (s *oneServer) release(ctx context.Context, r releaseReq) (released, error) {
	c := s.releaseCall(r)
	res, err := s.cn.Eval(ctx, c.Script, c.Keys, c.Args)
	if err != nil {
		return released{}, err
	}
	return readRelease(res)
}

// renewBatch is how many leases one renew.lua call extends; a call of this size keeps the
// server busy for well under a millisecond.
const renewBatch = 256

// renew sends the round in one pipeline: the releases, then renew.lua calls of up to
// renewBatch keys (on a Cluster, of one slot each), then, if a lease asks for replica
// acknowledgement, one WAIT that covers every renewal before it.
func (s *oneServer) renew(ctx context.Context, releases []releaseReq, leases []renewal) ([]error, []renewed) {
	calls := make([]conn.Call, 0, len(releases)+len(leases)/renewBatch+2)
	for _, r := range releases {
		calls = append(calls, s.releaseCall(r))
	}
	order := make([]int, len(leases)) // leases in the order their keys go out
	for i := range order {
		order[i] = i
	}
	if s.cluster {
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(slot.Of(leases[a].key), slot.Of(leases[b].key)) })
	}
	type span struct{ from, to int } // in order
	var spans []span
	for i := 0; i < len(order); {
		j := min(i+renewBatch, len(order))
		if s.cluster {
			sl := slot.Of(leases[order[i]].key)
			j = i + 1
			for j < len(order) && j-i < renewBatch && slot.Of(leases[order[j]].key) == sl {
				j++
			}
		}
		keys := make([]string, 0, j-i)
		owners := make([]string, 0, j-i)
		ttls := make([]string, 0, j-i)
		for _, k := range order[i:j] {
			keys = append(keys, leases[k].key)
			owners = append(owners, leases[k].owner)
			ttls = append(ttls, leases[k].ttl)
		}
		calls = append(calls, renewCall(keys, owners, ttls))
		spans = append(spans, span{i, j})
		i = j
	}
	var ack replicaAck
	for _, l := range leases {
		ack.n, ack.wait = max(ack.n, l.ack.n), max(ack.wait, l.ack.wait)
	}
	if ack.n > 0 {
		calls = append(calls, conn.Call{WaitReplicas: ack.n, WaitTimeout: ack.wait})
	}
	results := s.cn.EvalMulti(ctx, calls)
	result := func(i int) conn.Result {
		if i < len(results) {
			return results[i]
		}
		return conn.Result{Err: errShortReply}
	}
	relErrs := make([]error, len(releases))
	for i := range releases {
		if r := result(i); r.Err != nil {
			relErrs[i] = r.Err
		} else if _, err := readRelease(r.Ints); err != nil {
			relErrs[i] = err
		}
	}
	acked := -1
	if ack.n > 0 {
		if w := result(len(calls) - 1); w.Err == nil && len(w.Ints) == 1 {
			acked = int(w.Ints[0])
		}
	}
	outs := make([]renewed, len(leases))
	for c, sp := range spans {
		r := result(len(releases) + c)
		var oks []bool
		err := r.Err
		if err == nil {
			oks, err = readRenew(r.Ints, sp.to-sp.from)
		}
		for k, idx := range order[sp.from:sp.to] {
			switch {
			case err != nil:
				outs[idx].err = err
			case oks[k] && leases[idx].ack.n > 0 && leases[idx].ack.n > acked:
				outs[idx].err = errNotAcked // renewed on the master only: try again
			default:
				outs[idx].ok = oks[k]
			}
		}
	}
	return relErrs, outs
}

var (
	errShortReply = errors.New("dlock: transport returned fewer replies than calls")
	errNotAcked   = errors.New("dlock: renewal not acknowledged by enough replicas")
)

func (s *oneServer) pttl(ctx context.Context, keys []string, owner string) (time.Duration, bool, error) {
	c := pttlCall(keys, owner)
	r, err := s.cn.Eval(ctx, c.Script, c.Keys, c.Args)
	if err != nil {
		return 0, false, err
	}
	return readPTTL(r)
}

func (s *oneServer) handover(ctx context.Context, h handoverArgs) (handedOver, error) {
	h.sharded = s.cluster
	c := h.call()
	r, err := s.cn.Eval(ctx, c.Script, c.Keys, c.Args)
	if err != nil {
		return handedOver{}, err
	}
	return readHandover(r)
}

func (s *oneServer) listen(ctx context.Context, h conn.Handler) (conn.Listener, error) {
	return s.cn.Listen(ctx, h)
}

func (s *oneServer) inspect(ctx context.Context, keys []string) (any, error) {
	return evalStrings(ctx, s.cn, scriptInspect, keys)
}

func (s *oneServer) forceUnlock(ctx context.Context, key, channel string) (any, error) {
	args := []string{s.retention, channel}
	if s.cluster {
		args = append(args, "s")
	}
	return evalStrings(ctx, s.cn, scriptForceUnlock, []string{key}, args...)
}

func (s *oneServer) numSub(ctx context.Context, channels []string) (any, error) {
	return s.cn.Command(ctx, append([]string{"PUBSUB", "NUMSUB"}, channels...)...)
}

func (s *oneServer) scan(ctx context.Context, cursor, pattern string) (any, error) {
	return s.cn.Command(ctx, "SCAN", cursor, "MATCH", pattern, "COUNT", "1000")
}

func (s *oneServer) masters(ctx context.Context, args ...string) []conn.MasterReply {
	if ms, ok := s.cn.(conn.Masters); ok {
		return ms.CommandMasters(ctx, args...)
	}
	v, err := s.cn.Command(ctx, args...)
	return []conn.MasterReply{{Addr: s.cn.Addr(), Reply: v, Err: err}}
}

// evalStrings runs s through Conn.Command, so that its reply may hold strings: by SHA, and
// with the source when the server does not have the script cached.
func evalStrings(ctx context.Context, cn conn.Conn, s *conn.Script, keys []string, args ...string) (any, error) {
	cmd := make([]string, 0, 3+len(keys)+len(args))
	cmd = append(cmd, "EVALSHA", s.SHA, strconv.Itoa(len(keys)))
	cmd = append(cmd, keys...)
	cmd = append(cmd, args...)
	reply, err := cn.Command(ctx, cmd...)
	if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		cmd[0], cmd[1] = "EVAL", s.Src
		reply, err = cn.Command(ctx, cmd...)
	}
	return reply, err
}
