package backend

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/protocol"
	"github.com/dlock-go/dlock/internal/slot"
)

// OneServer is the backend of one Redis deployment reached through one conn.Conn: a single
// server, a master followed through Sentinel, or a Cluster (whose client routes each call to
// the slot's master). On a Cluster it announces releases with SPUBLISH and cuts renewal
// calls at slot boundaries; with WithReplicaAck it follows calls with WAIT.
type OneServer struct {
	cn        conn.Conn
	Cluster   bool
	retention string // ms, for release.lua and forceunlock.lua
	Own       bool   // Close closes cn (Dial made it)
	// Batch gathers concurrent acquisitions and releases into batches (batch.go); nil on a
	// Cluster, whose keys of one call must share a slot.
	Batch *batcher
}

var _ Backend = (*OneServer)(nil)

func NewOneServer(cn conn.Conn, retention time.Duration) *OneServer {
	s := &OneServer{cn: cn, retention: protocol.Millis(retention)}
	if cl, ok := cn.(conn.Clustered); ok && cl.Cluster() {
		s.Cluster = true
	} else {
		s.Batch = newBatcher(cn, s.retention)
	}
	return s
}

func (s *OneServer) Traits() Traits {
	return Traits{Majority: 1, Servers: 1, LocalHandoffs: true, Handover: true, ReplicaAck: true, Queue: true, Shared: true, Sharded: s.Cluster, Multi: s}
}

func (s *OneServer) Addr() string { return s.cn.Addr() }
func (s *OneServer) Close() error {
	if s.Batch != nil {
		s.Batch.stop()
	}
	if !s.Own {
		return nil
	}
	return s.cn.Close()
}

func (s *OneServer) Acquire(ctx context.Context, a protocol.AcquireArgs, ack ReplicaAck) (protocol.Acquired, int, error) {
	a.Sharded = s.Cluster
	if ack.N == 0 && s.Batch != nil && batchable(a) {
		res, err := s.Batch.acquire(ctx, a)
		return res, -1, err
	}
	r, acked, err := s.Run(ctx, a.Call(), ack)
	if err != nil {
		return protocol.Acquired{}, -1, err
	}
	res, err := protocol.ReadAcquire(r)
	return res, acked, err
}

func (s *OneServer) releaseCall(r ReleaseReq) conn.Call {
	if r.Shared != nil {
		return r.args(s.retention, s.Cluster).SharedCall(r.Shared)
	}
	return r.args(s.retention, s.Cluster).Call()
}

// args is release.lua's one-lock call for r, with the token retention (ms) and the kind of
// announcement (SPUBLISH when sharded) of the server it goes to.
func (r ReleaseReq) args(retention string, sharded bool) protocol.ReleaseArgs {
	return protocol.ReleaseArgs{
		Keys: r.Keys, Owner: r.Owner, Retention: retention, Channel: r.Channel,
		All: r.All, Sharded: sharded, Floor: r.Floor, Leave: r.Leave, Record: r.Record,
	}
}

func (s *OneServer) Release(ctx context.Context, r ReleaseReq) (protocol.Released, error) {
	if s.Batch != nil && r.Shared == nil { // a read-write lock's or semaphore's goes alone (shared.lua)
		return s.Batch.release(ctx, r)
	}
	return evalRead(ctx, s.cn, s.releaseCall(r), protocol.ReadRelease)
}

// renewBatch is how many leases one renew.lua call extends; a call of this size keeps the
// server busy for well under a millisecond.
const renewBatch = 256

// Renew sends the round in one pipeline: the releases, then renew.lua calls of up to
// renewBatch keys (on a Cluster, of one slot each), then, if a lease asks for replica
// acknowledgement, one WAIT that covers every renewal before it, then queue.lua calls for the
// queue entries (cut the same way).
func (s *OneServer) Renew(ctx context.Context, rd Round) RoundResult {
	calls := make([]conn.Call, 0, len(rd.Releases)+len(rd.Leases)/renewBatch+len(rd.Entries)/renewBatch+3)
	for _, r := range rd.Releases {
		calls = append(calls, s.releaseCall(r))
	}
	leaseCalls, leaseChunks := s.leaseCalls(rd.Leases)
	calls = append(calls, leaseCalls...)
	ack := roundAck(rd.Leases)
	waitAt := -1
	if ack.N > 0 {
		waitAt = len(calls)
		calls = append(calls, conn.Call{WaitReplicas: ack.N, WaitTimeout: ack.Wait})
	}
	entryFrom := len(calls)
	entryCalls, entryChunks := s.entryCalls(rd.Entries)
	calls = append(calls, entryCalls...)
	results := roundReplies(s.cn.EvalMulti(ctx, calls))
	var res RoundResult
	res.RelErrs = make([]error, len(rd.Releases))
	for i := range rd.Releases {
		if r := results.at(i); r.Err != nil {
			res.RelErrs[i] = r.Err
		} else if _, err := protocol.ReadRelease(r.Ints); err != nil {
			res.RelErrs[i] = err
		}
	}
	acked := -1
	if waitAt >= 0 {
		if w := results.at(waitAt); w.Err == nil && len(w.Ints) == 1 {
			acked = int(w.Ints[0])
		}
	}
	res.Leases = readLeases(rd.Leases, leaseChunks, results, len(rd.Releases), acked)
	res.Entries = readEntries(len(rd.Entries), entryChunks, results, entryFrom)
	return res
}

// roundAck is the replica acknowledgement a round's WAIT asks for: the most replicas and the
// longest wait any of its leases asks for.
func roundAck(leases []Renewal) ReplicaAck {
	var ack ReplicaAck
	for _, l := range leases {
		ack.N, ack.Wait = max(ack.N, l.Ack.N), max(ack.Wait, l.Ack.Wait)
	}
	return ack
}

// leaseCalls cuts a round's leases into renew.lua calls (shared.lua's for the shared holds)
// and returns them with, for each, the indexes into leases it renews.
func (s *OneServer) leaseCalls(leases []Renewal) ([]conn.Call, [][]int) {
	leaseKeys := make([]string, len(leases))
	for i, l := range leases {
		leaseKeys[i] = l.Key
	}
	chunks := s.chunks(leaseKeys, func(i int) bool { return leases[i].Shared })
	calls := make([]conn.Call, 0, len(chunks))
	for _, ch := range chunks {
		keys, owners, ttls := make([]string, len(ch)), make([]string, len(ch)), make([]string, len(ch))
		for k, idx := range ch {
			keys[k], owners[k], ttls[k] = leases[idx].Key, leases[idx].Owner, leases[idx].TTL
		}
		if leases[ch[0]].Shared {
			calls = append(calls, protocol.SharedRenewCall(keys, owners, ttls))
		} else {
			calls = append(calls, protocol.RenewCall(keys, owners, ttls))
		}
	}
	return calls, chunks
}

// entryCalls cuts a round's queue entries into queue.lua calls and returns them with, for
// each, the indexes into entries it refreshes.
func (s *OneServer) entryCalls(entries []Queued) ([]conn.Call, [][]int) {
	entryKeys := make([]string, len(entries))
	for i, q := range entries {
		entryKeys[i] = q.Key
	}
	chunks := s.chunks(entryKeys, nil)
	calls := make([]conn.Call, 0, len(chunks))
	for _, ch := range chunks {
		keys, ids, windows, waiting := make([]string, len(ch)), make([]string, len(ch)), make([]string, len(ch)), make([]string, len(ch))
		watch := make([]bool, len(ch))
		for k, idx := range ch {
			e := entries[idx]
			keys[k], ids[k], windows[k], waiting[k], watch[k] = e.Key, e.ID, e.Window, e.Waiting, e.Watch
		}
		calls = append(calls, protocol.QueueCall(keys, ids, windows, waiting, watch))
	}
	return calls, chunks
}

// roundReplies is the answer to a round's pipeline, one result per call.
type roundReplies []conn.Result

// at is call i's result; errShortReply when the answer stops before it.
func (rs roundReplies) at(i int) conn.Result {
	if i < len(rs) {
		return rs[i]
	}
	return conn.Result{Err: ErrShortReply}
}

// readLeases reads the renew.lua answers of a round, whose calls (one per chunk of leases)
// start at from: each lease renewed, refused (and whether it was released), or an error, which
// is also what a renewal fewer replicas acknowledged than its lease asks for gets (acked: the
// WAIT's count, -1 when unknown), so that it is tried again.
func readLeases(leases []Renewal, chunks [][]int, results roundReplies, from, acked int) []Renewed {
	out := make([]Renewed, len(leases))
	for c, ch := range chunks {
		r := results.at(from + c)
		oks, err := r.Ints, r.Err
		var flags []bool
		if err == nil {
			flags, err = protocol.ReadRenew(oks, len(ch))
		}
		for k, idx := range ch {
			switch {
			case err != nil:
				out[idx].Err = err
			case flags[k] && leases[idx].Ack.N > 0 && leases[idx].Ack.N > acked:
				out[idx].Err = ErrNotAcked // renewed on the master only: try again
			default:
				out[idx].OK = flags[k]
				out[idx].Released = oks[k] == protocol.RenewReleased
			}
		}
	}
	return out
}

// readEntries reads the queue.lua answers of a round's n entries, whose calls (one per chunk)
// start at from: each entry refreshed or gone, and when its lock may be free; or an error.
func readEntries(n int, chunks [][]int, results roundReplies, from int) []Renewed {
	out := make([]Renewed, n)
	for c, ch := range chunks {
		r := results.at(from + c)
		var flags []bool
		var left []time.Duration
		err := r.Err
		if err == nil {
			flags, left, err = protocol.ReadQueue(r.Ints, len(ch))
		}
		for k, idx := range ch {
			if err != nil {
				out[idx].Err = err
			} else {
				out[idx].OK, out[idx].LockLeft = flags[k], left[k]
			}
		}
	}
	return out
}

// chunks cuts keys into the calls of a round: up to renewBatch each, on a Cluster of one
// slot each, and, when apart is given, of keys for which it says the same (they go to another
// script). It returns indexes into keys.
func (s *OneServer) chunks(keys []string, apart func(int) bool) [][]int {
	order := make([]int, len(keys))
	for i := range order {
		order[i] = i
	}
	if apart != nil && !slices.ContainsFunc(order, apart) {
		apart = nil // none goes to another script: the order is the keys'
	}
	side := func(i int) bool { return apart != nil && apart(i) }
	if s.Cluster || apart != nil {
		slices.SortStableFunc(order, func(a, b int) int {
			if sa, sb := side(a), side(b); sa != sb {
				if sa {
					return 1
				}
				return -1
			}
			if !s.Cluster {
				return 0
			}
			return cmp.Compare(slot.Of(keys[a]), slot.Of(keys[b]))
		})
	}
	var out [][]int
	for i := 0; i < len(order); {
		j := i + 1
		for j < len(order) && j-i < renewBatch && side(order[j]) == side(order[i]) &&
			(!s.Cluster || slot.Of(keys[order[j]]) == slot.Of(keys[order[i]])) {
			j++
		}
		out = append(out, order[i:j])
		i = j
	}
	return out
}

var (
	ErrShortReply = errors.New("dlock: transport returned fewer replies than calls")
	ErrNotAcked   = errors.New("dlock: renewal not acknowledged by enough replicas")
)

func (s *OneServer) Run(ctx context.Context, c conn.Call, ack ReplicaAck) ([]int64, int, error) {
	if ack.N == 0 {
		r, err := s.cn.Eval(ctx, c.Script, c.Keys, c.Args)
		return r, -1, err
	}
	// WAIT right after the script, on the same connection, covers its write.
	rs := s.cn.EvalMulti(ctx, []conn.Call{c, {WaitReplicas: ack.N, WaitTimeout: ack.Wait}})
	if rs[0].Err != nil {
		return nil, -1, rs[0].Err
	}
	acked := -1
	if len(rs) == 2 && rs[1].Err == nil && len(rs[1].Ints) == 1 {
		acked = int(rs[1].Ints[0])
	}
	return rs[0].Ints, acked, nil
}

func (s *OneServer) EvalAny(ctx context.Context, sc *conn.Script, keys []string, args ...string) (any, error) {
	return evalStrings(ctx, s.cn, sc, keys, args...)
}

func (s *OneServer) PTTL(ctx context.Context, keys []string, owner string) (time.Duration, bool, error) {
	c := protocol.PTTLCall(keys, owner)
	r, err := s.cn.Eval(ctx, c.Script, c.Keys, c.Args)
	if err != nil {
		return 0, false, err
	}
	return protocol.ReadPTTL(r)
}

func (s *OneServer) Handover(ctx context.Context, h protocol.HandoverArgs) (protocol.HandedOver, error) {
	return evalRead(ctx, s.cn, h.Call(), protocol.ReadHandover)
}

func (s *OneServer) Listen(ctx context.Context, h conn.Handler) (conn.Listener, error) {
	return s.cn.Listen(ctx, h)
}

// Inspect runs inspect.lua on the locks whose keys are given (with their queues).
func (s *OneServer) Inspect(ctx context.Context, keys []string) (any, error) {
	return evalStrings(ctx, s.cn, protocol.ScriptInspect, inspectKeys(keys))
}

// inspectKeys gives each lock key with its queue keys, as inspect.lua takes them.
func inspectKeys(keys []string) []string {
	out := make([]string, 0, 3*len(keys))
	for _, k := range keys {
		q, w := protocol.QueueKeys(k)
		out = append(out, k, q, w)
	}
	return out
}

// InspectWidth is how many elements inspect.lua answers per lock.
const InspectWidth = 4

func (s *OneServer) ForceUnlock(ctx context.Context, key, channel string) (any, error) {
	args := []string{s.retention, channel}
	if s.Cluster {
		args = append(args, "s")
	}
	q, w := protocol.QueueKeys(key)
	return evalStrings(ctx, s.cn, protocol.ScriptForceUnlock, []string{key, q, w}, args...)
}

func (s *OneServer) Scan(ctx context.Context, cursor, pattern string) (any, error) {
	return s.cn.Command(ctx, "SCAN", cursor, "MATCH", pattern, "COUNT", "1000")
}

func (s *OneServer) Masters(ctx context.Context, args ...string) []conn.MasterReply {
	if ms, ok := s.cn.(conn.Masters); ok {
		return ms.CommandMasters(ctx, args...)
	}
	v, err := s.cn.Command(ctx, args...)
	return []conn.MasterReply{{Addr: s.cn.Addr(), Reply: v, Err: err}}
}

func (s *OneServer) Ping(ctx context.Context) error {
	var failed []error
	for _, r := range s.Masters(ctx, "PING") {
		if r.Err != nil {
			failed = append(failed, errs.PingErr(r.Addr, r.Err))
		}
	}
	return joinErrors(failed...)
}

// evalRead runs the script call c and reads its reply with read.
func evalRead[T any](ctx context.Context, cn conn.Conn, c conn.Call, read func([]int64) (T, error)) (T, error) {
	r, err := cn.Eval(ctx, c.Script, c.Keys, c.Args)
	if err != nil {
		var zero T
		return zero, err
	}
	return read(r)
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

func (s *OneServer) Probe(ctx context.Context, keys []string, channel string) ([]string, string, error) {
	reply, err := evalStrings(ctx, s.cn, protocol.ScriptProbe, keys, channel, protocol.PubArg(s.Cluster))
	return probeDenied(reply), s.cn.Addr(), err
}

// probeDenied reads probe.lua's reply.
func probeDenied(reply any) []string {
	arr, _ := reply.([]any)
	var out []string
	for _, v := range arr {
		if name, ok := v.(string); ok {
			out = append(out, name)
		}
	}
	return out
}
