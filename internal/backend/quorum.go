package backend

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/protocol"
)

// inParallel runs f on each of xs (with its index), all at once, and returns their answers in
// the order of xs when every one is in.
func inParallel[X, T any](xs []X, f func(int, X) T) []T {
	out := make([]T, len(xs))
	var wg sync.WaitGroup
	for i, x := range xs {
		wg.Go(func() { out[i] = f(i, x) })
	}
	wg.Wait()
	return out
}

// Quorum is the backend of N independent Redis masters (Redlock): every script runs on every
// server in parallel, and the answers are combined by the majority rule of each script: a
// lock is held when a majority of servers hold it. A call returns as soon as the answers
// decide it, so a slow server costs nothing; calls still running finish in the background.
type Quorum struct {
	nodes     []conn.Conn
	need      int    // a majority of len(nodes)
	retention string // ms, for release.lua and forceunlock.lua
	desc      string // "quorum of 5 [a b c d e]"
	Own       bool   // Close closes the nodes' connections (DialQuorum made them)

	pmu     sync.Mutex
	pending map[string]*pendingAcquire // owner -> its acquisition still running on some server

	latency atomic.Int64 // ns: a moving average of the servers' answer times

	// OnNodeError, when set (by the client: its observer), is told of each server's error: the
	// server, the script (or command) that failed, and the error.
	OnNodeError func(server, op string, err error)

	bg      sync.WaitGroup  // calls still running on slow servers after a decision was reached
	closing context.Context // cancelled by Close: abandons those calls
	// Halt cancels closing without waiting (Close does, then waits for the calls; the root's
	// quorum.go calls it alone when the client cannot be made).
	Halt context.CancelFunc
}

var _ Backend = (*Quorum)(nil)

func NewQuorum(nodes []conn.Conn, retention time.Duration) *Quorum {
	q := &Quorum{nodes: slices.Clone(nodes), need: len(nodes)/2 + 1, retention: protocol.Millis(retention)}
	q.closing, q.Halt = context.WithCancel(context.Background())
	addrs := make([]string, len(nodes))
	for i, cn := range nodes {
		addrs[i] = cn.Addr()
	}
	q.desc = fmt.Sprintf("quorum of %d [%s]", len(nodes), strings.Join(addrs, " "))
	return q
}

func (q *Quorum) Traits() Traits {
	// Local handoffs, but no server handover: after localHandoffs in a row the lock is
	// released (the servers' stored tokens then follow the last local token, the release's
	// floor), which grants it to the first client queued. Waiting clients queue on every
	// server at the same place, so that the servers grant to the same one; no retry jitter.
	return Traits{Majority: q.need, Servers: len(q.nodes), LocalHandoffs: true, Queue: true}
}

func (q *Quorum) Addr() string { return q.desc }

func (q *Quorum) Close() error {
	q.Halt()
	q.bg.Wait()
	if !q.Own {
		return nil
	}
	var errs []error
	for _, n := range q.nodes {
		errs = append(errs, n.Close())
	}
	return joinErrors(errs...)
}

// answerWait bounds how long a release or a TTL query waits for a decisive majority of answers.
const answerWait = 2 * time.Second

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
// returns finish in the background (Close waits for them): they end with ctx, or, with
// detach, at answerWait whatever becomes of ctx (a release every server must hear, though the
// caller returns once a majority answered and may then cancel ctx).
func (q *Quorum) fanOut(ctx context.Context, calls []conn.Call, limit time.Duration, detach bool, owner string, after *pendingAcquire, decide func(reply) bool) bool {
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
// fail every call. Once decided (or given up), the answers still to come go to late, when set.
func (q *Quorum) fanOutAdapt(ctx context.Context, calls []conn.Call, limit time.Duration, adapt, detach bool, owner string, after []*pendingAcquire, decide func(reply) bool, late func(reply)) bool {
	start := time.Now()
	mine := q.register(owner)
	out := &fanAnswers{ch: make(chan reply, len(q.nodes)), late: late}
	if late != nil {
		defer out.settle()
	}
	q.launch(ctx, calls, detach, after, owner, mine, out)
	return q.collect(ctx, out.ch, start, limit, adapt, decide)
}

// fanAnswers carries the servers' answers of one fan-out to its caller and, once the caller
// has decided, to late instead.
type fanAnswers struct {
	ch      chan reply // buffered for every server: put never blocks
	late    func(reply)
	mu      sync.Mutex
	decided bool // set by settle, only when late is set
}

// put hands one server's answer to the caller, or to late once the caller has decided.
func (a *fanAnswers) put(r reply) {
	a.mu.Lock()
	if a.decided {
		a.mu.Unlock()
		a.late(r)
		return
	}
	a.ch <- r
	a.mu.Unlock()
}

// settle marks the fan-out decided and passes to late the answers that came but were not read.
func (a *fanAnswers) settle() {
	a.mu.Lock()
	a.decided = true
	var rest []reply
	for len(a.ch) > 0 {
		rest = append(rest, <-a.ch)
	}
	a.mu.Unlock()
	for _, r := range rest {
		a.late(r)
	}
}

// register records the acquisition of owner about to run on every server, so that releases of
// owner wait for it (pendingOf); nil when owner is empty (not an acquisition).
func (q *Quorum) register(owner string) *pendingAcquire {
	if owner == "" {
		return nil
	}
	mine := &pendingAcquire{done: make([]chan struct{}, len(q.nodes))}
	for i := range mine.done {
		mine.done[i] = make(chan struct{})
	}
	q.pmu.Lock()
	if q.pending == nil {
		q.pending = make(map[string]*pendingAcquire)
	}
	q.pending[owner] = mine
	q.pmu.Unlock()
	return mine
}

// unregister forgets mine, whose calls have all ended, unless a newer acquisition of owner
// took its place.
func (q *Quorum) unregister(owner string, mine *pendingAcquire) {
	if mine == nil {
		return
	}
	q.pmu.Lock()
	if q.pending[owner] == mine {
		delete(q.pending, owner)
	}
	q.pmu.Unlock()
}

// launch starts calls on every server, one goroutine each, and gives each answer to out. The
// calls outlive the fan-out when a decision comes first: they end with ctx (with detach, at
// answerWait whatever becomes of ctx) or at Close; once every server answered, a background
// goroutine (which Close waits for) releases their context and unregisters mine.
func (q *Quorum) launch(ctx context.Context, calls []conn.Call, detach bool, after []*pendingAcquire, owner string, mine *pendingAcquire, out *fanAnswers) {
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
		q.unregister(owner, mine)
	}()
	for i, n := range q.nodes {
		go func() {
			defer left.Done()
			out.put(q.callOne(cctx, i, n, calls, after, mine))
		}()
	}
}

// callOne runs calls on server i, n, once its answers to the acquisitions in after came; then
// it marks mine's call on that server done, takes the answer time into the moving average and
// reports the server's errors (unless ctx ended).
func (q *Quorum) callOne(ctx context.Context, i int, n conn.Conn, calls []conn.Call, after []*pendingAcquire, mine *pendingAcquire) reply {
	for _, p := range after {
		select {
		case <-p.done[i]:
		case <-ctx.Done():
		}
	}
	sent := time.Now()
	r := reply{i, n.EvalMulti(ctx, calls)}
	if mine != nil {
		close(mine.done[i])
	}
	if r.res[0].Err == nil {
		q.observe(time.Since(sent))
	}
	if q.OnNodeError != nil && ctx.Err() == nil {
		q.nodeErrors(n.Addr(), calls, r.res)
	}
	return r
}

// collect feeds the answers from ch to decide, one at a time in the caller's goroutine, until
// decide reports true or every server answered (true), or limit (when > 0) passes or ctx ends
// first (false). With adapt, a first answer that took more than a quarter of limit stretches
// the limit to four times that answer's time, counted from start.
func (q *Quorum) collect(ctx context.Context, ch <-chan reply, start time.Time, limit time.Duration, adapt bool, decide func(reply) bool) bool {
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

// pendingOf returns the acquisition of owner still running on some server, or nil.
func (q *Quorum) pendingOf(owner string) *pendingAcquire {
	q.pmu.Lock()
	defer q.pmu.Unlock()
	return q.pending[owner]
}

func (q *Quorum) nodeErr(node int, err error) error {
	return fmt.Errorf("%s: %w", q.nodes[node].Addr(), err)
}

// noQuorum is the error of an operation that fewer than a majority of servers answered (within
// wait, when it is not 0).
func (q *Quorum) noQuorum(op string, states []errs.ServerState, wait time.Duration) error {
	return &errs.QuorumError{Op: op, Need: q.need, Wait: wait, Servers: states}
}

var errNoHandover = errors.New("dlock: no handover in quorum mode")

func (q *Quorum) Handover(context.Context, protocol.HandoverArgs) (protocol.HandedOver, error) {
	return protocol.HandedOver{}, errNoHandover
}

var errNoShared = errors.New("dlock: read-write locks and semaphores are not available in quorum mode")

// Run is not offered: Traits().Shared is false, so no read-write lock or semaphore gets here.
func (q *Quorum) Run(context.Context, conn.Call, ReplicaAck) ([]int64, int, error) {
	return nil, -1, errNoShared
}

func (q *Quorum) EvalAny(context.Context, *conn.Script, []string, ...string) (any, error) {
	return nil, errNoShared
}

// observe takes one server's answer time into the moving average (weight 1/8).
func (q *Quorum) observe(d time.Duration) {
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
func (q *Quorum) nodeErrors(addr string, calls []conn.Call, res []conn.Result) {
	for i, r := range res {
		if r.Err == nil {
			continue
		}
		op := "WAIT"
		if i < len(calls) && calls[i].Script != nil {
			op = calls[i].Script.Name
		}
		q.OnNodeError(addr, op, r.Err)
		return
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
