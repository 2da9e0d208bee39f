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
	"time"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/rueidisconn"
)

// DialQuorum connects to N independent Redis masters (not replicas of each other) and returns
// a Client whose locks are Redlock quorum locks over them: an acquisition is fanned out to
// every server in parallel and succeeds when a majority granted it while its lease still had
// time left (validity = TTL − time the acquisition took − drift; see WithTTL); on failure the
// lock is released everywhere. Renewal and release go to every server; the lease context is
// cancelled (cause ErrLost) when a majority can no longer be renewed in time. The Mutex,
// Lease and Do API, re-entry and wake-up on release (from any server) work as with Dial.
//
// A majority of urls must be reachable now; the others are dialled again, at most once a
// second, when a call needs them. Use an odd number of servers, typically 5. The fencing
// token guarantee in quorum mode is weaker than on one server: see the package documentation.
func DialQuorum(ctx context.Context, urls []string, opts ...Option) (*Client, error) {
	o := defaultOptions().with(opts)
	if o.err != nil {
		return nil, o.err
	}
	if len(urls) == 0 {
		return nil, fmt.Errorf("%w: DialQuorum needs at least one url", ErrInvalid)
	}
	nodes := make([]*lazyNode, len(urls))
	errs := make([]error, len(urls))
	var wg sync.WaitGroup
	for i, u := range urls {
		nodes[i] = &lazyNode{url: u, dialOpts: o.dialOptions()}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = nodes[i].dial(ctx)
		}()
	}
	wg.Wait()
	up := 0
	for _, err := range errs {
		if err == nil {
			up++
		}
	}
	if up < len(urls)/2+1 {
		for _, n := range nodes {
			n.Close()
		}
		return nil, fmt.Errorf("dlock: dial quorum: %d of %d servers reachable, a majority needs %d: %w",
			up, len(urls), len(urls)/2+1, errors.Join(errs...))
	}
	cns := make([]conn.Conn, len(nodes))
	for i, n := range nodes {
		cns[i] = n
	}
	c, err := newQuorum(ctx, cns, opts)
	if err != nil {
		for _, n := range nodes {
			n.Close()
		}
		return nil, err
	}
	c.conn.(*quorumConn).own = true
	return c, nil
}

// NewQuorum returns a quorum Client (see DialQuorum) over conns, one per independent Redis
// master, made by the rueidisconn or goredisconn adapters. Close does not close them.
func NewQuorum(conns []Conn, opts ...Option) (*Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), newCheckTimeout)
	defer cancel()
	return newQuorum(ctx, conns, opts)
}

func newQuorum(ctx context.Context, conns []Conn, opts []Option) (*Client, error) {
	if len(conns) == 0 {
		return nil, fmt.Errorf("%w: NewQuorum needs at least one connection", ErrInvalid)
	}
	for i, cn := range conns {
		if cn == nil {
			return nil, fmt.Errorf("%w: connection %d is nil", ErrInvalid, i)
		}
	}
	o := defaultOptions().with(opts)
	if o.ackN > 0 {
		return nil, fmt.Errorf("%w: WithReplicaAck is not available in quorum mode", ErrInvalid)
	}
	q := &quorumConn{nodes: slices.Clone(conns), need: len(conns)/2 + 1, retention: strconv.FormatInt(o.retention.Milliseconds(), 10)}
	q.closing, q.halt = context.WithCancel(context.Background())
	addrs := make([]string, len(conns))
	for i, cn := range conns {
		addrs[i] = cn.Addr()
	}
	q.addr = fmt.Sprintf("quorum of %d [%s]", len(conns), strings.Join(addrs, " "))
	c, err := newClient(ctx, q, q.need, opts)
	if err != nil {
		q.halt()
		return nil, err
	}
	c.quorum = true
	c.opts.ownerConn = true // the quorumConn is the client's own; it closes the servers' connections only for DialQuorum
	return c, nil
}

// quorumConn is a conn.Conn over N independent servers. It knows the replies of dlock's own
// scripts and combines them: a lock is held when a majority of servers hold it.
type quorumConn struct {
	nodes     []conn.Conn
	need      int    // majority
	retention string // WithTokenRetention in ms, for releaseOwner
	addr      string
	own       bool

	pmu     sync.Mutex
	pending map[string]*pendingAcquire // owner -> its acquisition still running on some server

	bg      sync.WaitGroup  // calls still running on slow servers after a decision was reached
	closing context.Context // cancelled by Close: abandons those calls
	halt    context.CancelFunc
}

var _ conn.Conn = (*quorumConn)(nil)

func (q *quorumConn) Addr() string { return q.addr }

func (q *quorumConn) Close() error {
	q.halt()
	q.bg.Wait()
	if !q.own {
		return nil
	}
	var errs []error
	for _, n := range q.nodes {
		errs = append(errs, n.Close())
	}
	return errors.Join(errs...)
}

// reply is one server's answer to one fanned-out call.
type reply struct {
	node int
	res  []conn.Result
}

// fanOut sends calls to every server in parallel and feeds the answers to decide (in the
// caller's goroutine, one at a time, so decide needs no lock), in the order they come, until
// decide reports true or every server answered (it then returns true), or limit (when > 0)
// passes first (it returns false). Calls still running then finish in the
// background (Close waits for them).
func (q *quorumConn) fanOut(ctx context.Context, calls []conn.Call, limit time.Duration, decide func(reply) bool) bool {
	return q.fanOutOrdered(ctx, calls, limit, "", nil, decide)
}

// pendingAcquire tracks one acquisition's calls still running on the servers: done[i] is closed
// when server i answered. A release of the same owner waits for it per server, so that it never
// overtakes the acquisition on a transport that may reorder calls (a connection pool): a late
// acquisition would otherwise leave the lock held on that server until its lease ran out.
type pendingAcquire struct {
	done []chan struct{}
}

// fanOutOrdered is fanOut; when after is set (an acquisition of owner), it is registered so that
// releases of owner wait for it per server; when waitFor is set, each server's call first waits
// for that server's answer to it.
func (q *quorumConn) fanOutOrdered(ctx context.Context, calls []conn.Call, limit time.Duration, owner string, waitFor *pendingAcquire, decide func(reply) bool) bool {
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
	// The calls outlive this one when a decision comes first: they end with ctx or at Close.
	cctx, cancel := context.WithCancel(ctx)
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
			if waitFor != nil {
				select {
				case <-waitFor.done[i]:
				case <-cctx.Done():
				}
			}
			r := reply{i, n.EvalMulti(cctx, calls)}
			if mine != nil {
				close(mine.done[i])
			}
			ch <- r
		}()
	}
	var expire <-chan time.Time
	if limit > 0 {
		t := time.NewTimer(limit)
		defer t.Stop()
		expire = t.C
	}
	for range q.nodes {
		select {
		case r := <-ch:
			if decide(r) {
				return true
			}
		case <-expire:
			return false
		}
	}
	return true
}

func (q *quorumConn) Eval(ctx context.Context, s *conn.Script, keys, args []string) ([]int64, error) {
	r := q.EvalMulti(ctx, []conn.Call{{Script: s, Keys: keys, Args: args}})
	return r[0].Ints, r[0].Err
}

// EvalMulti runs each call on every server and combines the answers per call. Calls of one
// batch must all be of one script (the renewal loop's batches mix renewals with releases, which
// are combined separately).
func (q *quorumConn) EvalMulti(ctx context.Context, calls []conn.Call) []conn.Result {
	out := make([]conn.Result, len(calls))
	// Group calls by script so each group is combined by its own rule; a batch is one round
	// trip per server either way.
	var renews, others []int
	for i, c := range calls {
		if c.Script == scriptRenew {
			renews = append(renews, i)
		} else {
			others = append(others, i)
		}
	}
	if len(renews) > 0 {
		sub := make([]conn.Call, len(renews))
		for j, i := range renews {
			sub[j] = calls[i]
		}
		for j, r := range q.renew(ctx, sub) {
			out[renews[j]] = r
		}
	}
	for _, i := range others {
		c := calls[i]
		switch c.Script {
		case scriptAcquire:
			out[i] = q.acquire(ctx, c)
		case scriptRelease:
			out[i] = q.release(ctx, c)
		case scriptPTTL:
			out[i] = q.pttl(ctx, c)
		default:
			out[i] = q.first(ctx, c)
		}
	}
	return out
}

// errNoQuorum says too few servers answered to decide.
func (q *quorumConn) errNoQuorum(answered int, errs []error) error {
	return &noQuorumError{
		msg:  fmt.Sprintf("dlock: no quorum: %d of %d servers answered in time, a majority needs %d", answered, len(q.nodes), q.need),
		errs: errors.Join(errs...),
	}
}

// noQuorumError is the error of an acquisition that failed because too few servers could be
// reached (not because another owner holds the lock). It matches ErrNotAcquired with errors.Is
// and wraps the servers' errors.
type noQuorumError struct {
	msg  string
	errs error
}

func (e *noQuorumError) Error() string {
	if e.errs == nil { // no server failed: too few answered within the lease
		return e.msg
	}
	return e.msg + ": " + e.errs.Error()
}
func (e *noQuorumError) Unwrap() error        { return e.errs }
func (e *noQuorumError) Is(target error) bool { return target == ErrNotAcquired }

// acquire combines acquire.lua replies: taken when a majority took (or re-entered) the lock.
// The token is the largest among the servers that granted it. On failure the lock is released
// on every server that may have granted it.
func (q *quorumConn) acquire(ctx context.Context, c conn.Call) conn.Result {
	n := len(q.nodes)
	var (
		yes, no, failed int
		token, holds    int64
		pttls           []int64
		errs            []error
		res             conn.Result
	)
	reentry := len(c.Args) > 3 && c.Args[3] == "r"
	// Past the lease time, an answer is useless: the lease would have no validity left.
	ttl, _ := strconv.ParseInt(c.Args[1], 10, 64)
	// decide runs in this goroutine, one answer at a time, until it returns true.
	decided := q.fanOutOrdered(ctx, []conn.Call{c}, time.Duration(ttl)*time.Millisecond, c.Args[0], q.pendingOf(c.Args[0]), func(r reply) bool {
		x := r.res[0]
		switch {
		case x.Err != nil:
			failed++
			errs = append(errs, fmt.Errorf("%s: %w", q.nodes[r.node].Addr(), x.Err))
		case len(x.Ints) == 3 && x.Ints[0] == 1:
			yes++
			token = max(token, x.Ints[1])
			holds = max(holds, x.Ints[2])
		case len(x.Ints) == 3:
			no++
			if x.Ints[1] >= 0 {
				pttls = append(pttls, x.Ints[1])
			}
		default:
			failed++
			errs = append(errs, fmt.Errorf("%s: unexpected reply %v", q.nodes[r.node].Addr(), x.Ints))
		}
		switch {
		case yes >= q.need:
			res = conn.Result{Ints: []int64{1, token, holds}}
		case n-no-failed >= q.need:
			return false // a majority can still grant it
		case reentry:
			res = conn.Result{Ints: []int64{0, -2, 0}}
		case failed > n-q.need: // not because of a holder: servers are down
			res = conn.Result{Err: q.errNoQuorum(n-failed, errs)}
		default:
			free := q.freeIn(yes, pttls)
			if yes > 0 {
				// A split vote: contenders each got part of the servers and all gave
				// them back. Retry after a random pause, so that they stop colliding.
				free = splitBackoff()
			}
			res = conn.Result{Ints: []int64{0, free, 0}}
		}
		return true
	})
	if !decided { // the lease time passed before a majority answered
		res = conn.Result{Err: q.errNoQuorum(yes+no, errs)}
		if reentry {
			res = conn.Result{Ints: []int64{0, -2, 0}}
		}
	}
	if !reentry && (res.Err != nil || res.Ints[0] != 1) {
		q.releaseOwner(c.Keys[0], c.Args[0])
	}
	return res
}

// pendingOf returns the acquisition of owner still running on some server, or nil.
func (q *quorumConn) pendingOf(owner string) *pendingAcquire {
	q.pmu.Lock()
	defer q.pmu.Unlock()
	return q.pending[owner]
}

// splitBackoff is the pause, in milliseconds, before retrying after a split vote: random in
// [1, 8] ms.
func splitBackoff() int64 { return 1 + rand.Int64N(8) }

// freeIn estimates how long until a majority could grant the lock: the servers that granted
// it now (released again) count as free; the others free up as their leases run out. -1 means
// unknown (the caller then waits a whole TTL or for a release notice).
func (q *quorumConn) freeIn(granted int, pttls []int64) int64 {
	more := q.need - granted
	if more <= 0 {
		return 0
	}
	if more > len(pttls) {
		return -1
	}
	slices.Sort(pttls)
	return pttls[more-1]
}

// releaseOwner releases, in the background, every hold of owner on key on every server: after
// an acquisition that did not reach a quorum, no server may keep it.
func (q *quorumConn) releaseOwner(key, owner string) {
	call := conn.Call{Script: scriptRelease, Keys: []string{key}, Args: []string{owner, q.retention, releaseChannel(key), "1"}}
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

// release combines release.lua replies: the holds left as a majority counts them, or -1 when a
// majority says the caller does not hold the lock. A counted release ({0, subscribers}) reports
// the most subscribers any of the answering servers had.
func (q *quorumConn) release(ctx context.Context, c conn.Call) conn.Result {
	var (
		ok, notHeld, bad int
		left, heard      int64
		counted          bool
		errs             []error
		res              conn.Result
	)
	n := len(q.nodes)
	if !q.fanOutOrdered(ctx, []conn.Call{c}, answerWait, "", q.pendingOf(c.Args[0]), func(r reply) bool {
		x := r.res[0]
		switch {
		case x.Err != nil:
			bad++
			errs = append(errs, fmt.Errorf("%s: %w", q.nodes[r.node].Addr(), x.Err))
		case (len(x.Ints) == 1 || len(x.Ints) == 2) && x.Ints[0] >= 0:
			ok++
			left = max(left, x.Ints[0])
			if len(x.Ints) == 2 {
				counted = true
				heard = max(heard, x.Ints[1])
			}
		default:
			notHeld++
		}
		switch {
		case ok >= q.need && counted:
			res = conn.Result{Ints: []int64{left, heard}}
		case ok >= q.need:
			res = conn.Result{Ints: []int64{left}}
		case notHeld > n-q.need: // a majority no longer holds it: it was lost
			res = conn.Result{Ints: []int64{-1}}
		case ok+notHeld+bad == n:
			res = conn.Result{Err: fmt.Errorf("dlock: %d of %d servers answered: %w", ok+notHeld, n, errors.Join(errs...))}
		default:
			return false
		}
		return true
	}) {
		res = conn.Result{Err: fmt.Errorf("dlock: %d of %d servers answered within %v: %w", ok+notHeld, n, answerWait, errors.Join(errs...))}
	}
	return res
}

// answerWait bounds how long a release or a TTL query waits for a decisive majority of answers.
const answerWait = 2 * time.Second

// renew combines renew.lua replies per key: renewed when a majority renewed it, lost when a
// majority says it no longer holds it; a key the answers leave undecided (servers down or
// slow) makes its call fail with a transport error, and the renewal loop retries it.
func (q *quorumConn) renew(ctx context.Context, calls []conn.Call) []conn.Result {
	n := len(q.nodes)
	type tally struct{ yes, no []int }
	var (
		answers int
		errs    []error
		failed  = make([]int, len(calls)) // servers whose answer to call i is an error
		t       = make([]tally, len(calls))
	)
	for i, c := range calls {
		t[i] = tally{make([]int, len(c.Keys)), make([]int, len(c.Keys))}
	}
	decided := func() bool {
		for i := range calls {
			for k := range t[i].yes {
				pending := n - t[i].yes[k] - t[i].no[k] - failed[i]
				if t[i].yes[k] < q.need && t[i].yes[k]+pending >= q.need {
					return false
				}
			}
		}
		return true
	}
	// Wait no longer than a third of the shortest lease in the batch: undecided keys are then
	// retried, and a server that never answers cannot hold up every other lease's renewal.
	limit := time.Duration(-1)
	for _, c := range calls {
		for k := 1; k < len(c.Args); k += 2 {
			if ms, err := strconv.ParseInt(c.Args[k], 10, 64); err == nil && (limit < 0 || time.Duration(ms)*time.Millisecond/3 < limit) {
				limit = time.Duration(ms) * time.Millisecond / 3
			}
		}
	}
	q.fanOut(ctx, calls, max(limit, 0), func(r reply) bool {
		answers++
		for i, x := range r.res {
			if x.Err != nil || len(x.Ints) != len(calls[i].Keys) {
				failed[i]++
				if x.Err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", q.nodes[r.node].Addr(), x.Err))
				}
				continue
			}
			for k, v := range x.Ints {
				if v == 1 {
					t[i].yes[k]++
				} else {
					t[i].no[k]++
				}
			}
		}
		return decided()
	})
	out := make([]conn.Result, len(calls))
	for i := range calls {
		ints := make([]int64, len(t[i].yes))
		for k := range ints {
			switch {
			case t[i].yes[k] >= q.need:
				ints[k] = 1
			case t[i].no[k] >= n-q.need+1:
				ints[k] = 0 // a majority refused: lost
			default:
				out[i].Err = fmt.Errorf("dlock: renewal undecided, %d of %d servers answered: %w", answers, n, errors.Join(errs...))
			}
		}
		if out[i].Err == nil {
			out[i].Ints = ints
		}
	}
	return out
}

// pttl combines pttl.lua replies: the lease is held on a majority for at least the
// majority-th longest remaining lease; -2 when fewer than a majority hold it.
func (q *quorumConn) pttl(ctx context.Context, c conn.Call) conn.Result {
	var (
		left     []int64
		no, bad  int
		errs     []error
		res      conn.Result
		n        = len(q.nodes)
		answered int
	)
	if !q.fanOut(ctx, []conn.Call{c}, answerWait, func(r reply) bool {
		answered++
		x := r.res[0]
		switch {
		case x.Err != nil:
			bad++
			errs = append(errs, fmt.Errorf("%s: %w", q.nodes[r.node].Addr(), x.Err))
		case len(x.Ints) == 1 && x.Ints[0] >= 0:
			left = append(left, x.Ints[0])
		default:
			no++
		}
		switch {
		case len(left) >= q.need:
			slices.Sort(left)
			res = conn.Result{Ints: []int64{left[len(left)-q.need]}}
		case no >= n-q.need+1:
			res = conn.Result{Ints: []int64{-2}}
		case answered == n:
			res = conn.Result{Err: fmt.Errorf("dlock: %d of %d servers answered: %w", n-bad, n, errors.Join(errs...))}
		default:
			return false
		}
		return true
	}) {
		res = conn.Result{Err: fmt.Errorf("dlock: %d of %d servers answered within %v: %w", answered-bad, n, answerWait, errors.Join(errs...))}
	}
	return res
}

// first runs any other script on every server and returns the answer of the first server, in
// the order given, that answered without an error.
func (q *quorumConn) first(ctx context.Context, c conn.Call) conn.Result {
	res := make([]conn.Result, len(q.nodes))
	var wg sync.WaitGroup
	for i, n := range q.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = n.EvalMulti(ctx, []conn.Call{c})[0]
		}()
	}
	wg.Wait()
	for _, r := range res {
		if r.Err == nil {
			return r
		}
	}
	return res[0]
}

// Command runs args on every server in parallel and returns the reply of the first server, in
// the order given, that answered without an error (inspection reads that server's view; a
// forced unlock runs on all of them). SCAN goes to the first reachable server only, so that its
// cursor stays on one server.
func (q *quorumConn) Command(ctx context.Context, args ...string) (any, error) {
	if len(args) > 0 && strings.EqualFold(args[0], "SCAN") {
		var errs []error
		for _, n := range q.nodes {
			v, err := n.Command(ctx, args...)
			if err == nil {
				return v, nil
			}
			errs = append(errs, err)
		}
		return nil, errors.Join(errs...)
	}
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
			v, err := n.Command(ctx, args...)
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

var _ conn.Masters = (*quorumConn)(nil)

// CommandMasters runs args on every server in parallel and returns each one's reply.
func (q *quorumConn) CommandMasters(ctx context.Context, args ...string) []conn.MasterReply {
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

// Listen subscribes on every server, so that a release announced by any of them wakes the
// waiters. It succeeds when a majority could be reached; while some server is missing, the
// listener reports itself done after a few seconds so that the client subscribes again,
// including to the servers that came back.
func (q *quorumConn) Listen(ctx context.Context, h conn.Handler) (conn.Listener, error) {
	ql := &quorumListener{done: make(chan error, 1), quit: make(chan struct{})}
	var mu sync.Mutex
	lns := make([]conn.Listener, len(q.nodes))
	var errs []error
	var wg sync.WaitGroup
	for i, n := range q.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ln, err := n.Listen(ctx, h)
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
		return nil, fmt.Errorf("pub/sub on %d of %d servers: %w", len(ql.lns), len(q.nodes), errors.Join(errs...))
	}
	missing := len(ql.lns) < len(q.nodes)
	ql.wg.Add(1)
	go ql.watch(missing)
	return ql, nil
}

// listenRetry is how long a quorum listener that could not reach every server waits before it
// asks to be made again.
const listenRetry = 3 * time.Second

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
		l.done <- errors.New("pub/sub: retrying the servers that were unreachable")
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
	return errors.Join(errs...)
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

// lazyNode is one server of DialQuorum: dialled at the start and, when that failed or the
// server was never reachable, again when a call needs it, at most once per redialEvery.
type lazyNode struct {
	url      string
	dialOpts []rueidisconn.DialOption

	mu       sync.Mutex
	cn       conn.Conn
	lastTry  time.Time
	lastErr  error
	closed   bool
	inFlight bool
}

const redialEvery = time.Second

func (n *lazyNode) dial(ctx context.Context) error {
	cn, err := rueidisconn.Dial(ctx, n.url, n.dialOpts...)
	n.mu.Lock()
	defer n.mu.Unlock()
	n.lastTry, n.lastErr = time.Now(), err
	if err != nil {
		return err
	}
	if n.closed {
		cn.Close()
		return ErrClosed
	}
	n.cn = cn
	return nil
}

// get returns the connection, dialling again when it is time to.
func (n *lazyNode) get(ctx context.Context) (conn.Conn, error) {
	n.mu.Lock()
	if n.cn != nil || n.closed {
		cn := n.cn
		n.mu.Unlock()
		if cn == nil {
			return nil, ErrClosed
		}
		return cn, nil
	}
	if n.inFlight || time.Since(n.lastTry) < redialEvery {
		err := n.lastErr
		n.mu.Unlock()
		return nil, fmt.Errorf("server %s unreachable: %w", n.Addr(), err)
	}
	n.inFlight = true
	n.mu.Unlock()
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	err := n.dial(dctx)
	cancel()
	n.mu.Lock()
	n.inFlight = false
	cn := n.cn
	n.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("server %s unreachable: %w", n.Addr(), err)
	}
	return cn, nil
}

func (n *lazyNode) Addr() string {
	a := n.url
	if i := strings.Index(a, "@"); i >= 0 {
		a = a[i+1:] // no password in error messages
	}
	a = strings.TrimPrefix(strings.TrimPrefix(n.url, "redis://"), "rediss://")
	if i := strings.IndexAny(a, "/?"); i >= 0 {
		a = a[:i]
	}
	return a
}

func (n *lazyNode) Eval(ctx context.Context, s *conn.Script, keys, args []string) ([]int64, error) {
	cn, err := n.get(ctx)
	if err != nil {
		return nil, err
	}
	return cn.Eval(ctx, s, keys, args)
}

func (n *lazyNode) EvalMulti(ctx context.Context, calls []conn.Call) []conn.Result {
	cn, err := n.get(ctx)
	if err != nil {
		out := make([]conn.Result, len(calls))
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	return cn.EvalMulti(ctx, calls)
}

func (n *lazyNode) Command(ctx context.Context, args ...string) (any, error) {
	cn, err := n.get(ctx)
	if err != nil {
		return nil, err
	}
	return cn.Command(ctx, args...)
}

func (n *lazyNode) Listen(ctx context.Context, h conn.Handler) (conn.Listener, error) {
	cn, err := n.get(ctx)
	if err != nil {
		return nil, err
	}
	return cn.Listen(ctx, h)
}

func (n *lazyNode) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	if n.cn != nil {
		err := n.cn.Close()
		n.cn = nil
		return err
	}
	return nil
}
