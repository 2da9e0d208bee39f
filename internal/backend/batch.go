package backend

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/protocol"
)

// Batching: a client's concurrent acquisitions and releases on one server (standalone or
// Sentinel) go as one acquire.lua call and one release.lua call over many locks (the scripts'
// batch form, docs/PROTOCOL.md), so that the server pays a script call, and its reads of the
// time, of the queues and of the listeners, once per batch instead of once per lock.
//
// A call leaves at once, alone and in the one-lock form, while fewer than loneMax calls or
// batches are on their way and none waits: a lone caller's latency is that of a plain call, and
// a few concurrent callers are not held back for one another. Otherwise it waits for the next
// batch, which starts at once when fewer than batchOut batches are on their way, else when the
// first call or batch comes back, with everything that queued meanwhile (from a goroutine that
// keeps sending what queues meanwhile); no goroutine runs while nothing waits. A batch holds calls that were all outstanding at
// once, so any order among them is one they could have had; each lock in it is done exactly
// as its own call would do it, with its own reply.

// loneMax is how many calls (and batches) may be on their way before a call waits for a batch.
// Measured on 2 vCPUs, Lock+Unlock on distinct names, one client (docs/BENCHMARKS.md): batching
// from the third call on cost 20-30 % of the pairs/s at 4 and 16 goroutines, since a batch runs
// the scripts' slow path and its callers wait for a slot; at 64 goroutines a batch saves the
// server a third of its CPU per pair and wins. 16 keeps the gain at 64 and loses nothing below.
const loneMax = 16

// batchOut is how many batches may be on their way at once. Two keeps a second batch gathering
// while one is on the wire; more would only cut the batches thinner.
const batchOut = 2

// batchMax is the most locks one script call of a batch carries (more go as further calls in
// the same pipeline): the server runs a call whole, so this bounds how long it blocks others.
const batchMax = 64

// errBatchClosed fails a call still waiting for a batch when the client closes.
var errBatchClosed = errors.New("dlock: client closed")

// batcher gathers one server's concurrent acquire.lua and release.lua calls.
type batcher struct {
	cn        conn.Conn
	retention string // ms, for release.lua

	ctx    context.Context // of the batches: cancelled by stop
	cancel context.CancelFunc
	wg     sync.WaitGroup // the goroutines sending batches

	mu      sync.Mutex
	out     int // calls and batches on their way, guarded by mu
	batches int // of which batches
	// loneMax and batchOut, as the constants (tests of batching lower them)
	loneMax, batchOut int
	acqs              []*batchedAcquire
	rels              []*batchedRelease
	closed            bool
}

// A call waiting in a batch. state: queued, then sent or abandoned (the caller gave up before
// it was sent: it never is).
const (
	pendQueued int32 = iota
	pendSent
	pendAbandoned
)

type pending struct {
	state atomic.Int32
	done  chan struct{} // closed when the result is set
	err   error
	ctx   context.Context // the caller's: its values go with the batch (callersCtx)
}

// batched is a call waiting in a batch: its input (protocol.AcquireArgs or ReleaseReq) and,
// once done, its result.
type batched[In, Out any] struct {
	pending
	in  In
	res Out
}

type (
	batchedAcquire = batched[protocol.AcquireArgs, protocol.Acquired]
	batchedRelease = batched[ReleaseReq, protocol.Released]
)

func newBatcher(cn conn.Conn, retention string) *batcher {
	ctx, cancel := context.WithCancel(context.Background())
	return &batcher{cn: cn, retention: retention, ctx: ctx, cancel: cancel, loneMax: loneMax, batchOut: batchOut}
}

// batchable reports whether a can go in a batch: the batch form takes the server's time as a
// queue entry's place (no place of its own) and derives the other keys from the lock key.
func batchable(a protocol.AcquireArgs) bool { return a.Place == "" && a.QueuedLate == nil }

// acquire runs acquire.lua for a: alone, or in the next batch.
func (b *batcher) acquire(ctx context.Context, a protocol.AcquireArgs) (protocol.Acquired, error) {
	return submit(ctx, b, a, &b.acqs, (*batcher).acquireAlone)
}

// release runs release.lua for r: alone, or in the next batch.
func (b *batcher) release(ctx context.Context, r ReleaseReq) (protocol.Released, error) {
	return submit(ctx, b, r, &b.rels, (*batcher).releaseAlone)
}

// submit runs one call: alone (sendAlone) while the batcher lets calls leave at once, else
// queued (on queue, b.acqs or b.rels) for the next batch.
func submit[In, Out any](ctx context.Context, b *batcher, in In, queue *[]*batched[In, Out], sendAlone func(*batcher, context.Context, In) (Out, error)) (Out, error) {
	var zero Out
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	b.mu.Lock()
	if b.closed || (b.out < b.loneMax && len(b.acqs)+len(b.rels) == 0) {
		b.out++
		b.mu.Unlock()
		res, err := sendAlone(b, ctx, in)
		b.finish()
		return res, err
	}
	p := &batched[In, Out]{in: in}
	p.done, p.ctx = make(chan struct{}), ctx
	*queue = append(*queue, p)
	b.startLocked()
	select {
	case <-p.done:
		return p.res, p.err
	case <-ctx.Done():
		// If the batch was sent, the script may run: the caller treats this as any call whose
		// reply it did not wait for (it releases under the owner in the background).
		p.state.CompareAndSwap(pendQueued, pendAbandoned)
		return zero, ctx.Err()
	}
}

// startLocked starts sending the queue if a batch may go now, and unlocks b.mu.
func (b *batcher) startLocked() {
	if b.batches >= b.batchOut {
		b.mu.Unlock()
		return
	}
	b.out++
	b.batches++
	acqs, rels := b.takeLocked()
	b.wg.Add(1)
	b.mu.Unlock()
	go b.run(acqs, rels)
}

// finish gives up the slot of a call sent alone, or passes it to a batch of the calls queued
// meanwhile.
func (b *batcher) finish() {
	b.mu.Lock()
	if len(b.acqs)+len(b.rels) == 0 || b.closed || b.batches >= b.batchOut {
		b.out--
		b.mu.Unlock()
		return
	}
	b.batches++
	acqs, rels := b.takeLocked()
	b.wg.Add(1)
	b.mu.Unlock()
	go b.run(acqs, rels)
}

func (b *batcher) takeLocked() ([]*batchedAcquire, []*batchedRelease) {
	acqs, rels := b.acqs, b.rels
	b.acqs, b.rels = nil, nil
	return acqs, rels
}

// run sends a batch, then the calls queued meanwhile, until the queue is empty.
func (b *batcher) run(acqs []*batchedAcquire, rels []*batchedRelease) {
	defer b.wg.Done()
	for {
		b.send(acqs, rels)
		b.mu.Lock()
		if len(b.acqs)+len(b.rels) == 0 || b.closed {
			b.out--
			b.batches--
			b.mu.Unlock()
			return
		}
		acqs, rels = b.takeLocked()
		b.mu.Unlock()
	}
}

// stop fails the calls still waiting, cancels the batches on their way and waits for them.
func (b *batcher) stop() {
	b.mu.Lock()
	b.closed = true
	acqs, rels := b.takeLocked()
	b.mu.Unlock()
	failAll(acqs, errBatchClosed)
	failAll(rels, errBatchClosed)
	b.cancel()
	b.wg.Wait()
}

// failAll gives each of ps the error err.
func failAll[In, Out any](ps []*batched[In, Out], err error) {
	for _, p := range ps {
		p.err = err
		close(p.done)
	}
}

// send sends the calls of one batch in one pipeline: acquisitions in acquire.lua calls of up
// to batchMax locks, releases in release.lua calls likewise (a lone one in its one-lock form).
func (b *batcher) send(acqs []*batchedAcquire, rels []*batchedRelease) {
	acqChunks, relChunks := chunked(live(acqs)), chunked(live(rels))
	var calls []conn.Call
	var callers []context.Context
	for _, ch := range acqChunks {
		calls = append(calls, protocol.AcquireBatchCall(ch, acquireArgsOf))
		for _, p := range ch {
			callers = append(callers, p.ctx)
		}
	}
	for _, ch := range relChunks {
		calls = append(calls, b.releaseBatchCall(ch))
		for _, p := range ch {
			callers = append(callers, p.ctx)
		}
	}
	if len(calls) == 0 {
		return
	}
	results := b.cn.EvalMulti(b.callersCtx(callers), calls)
	result := func(i int) conn.Result {
		if i < len(results) {
			return results[i]
		}
		return conn.Result{Err: ErrShortReply}
	}
	var alone []func()
	for c, ch := range acqChunks {
		outs, err := protocol.ReadAcquireBatch(result(c), len(ch))
		alone = settle(b, ch, outs, err, (*batcher).acquireAlone, alone)
	}
	for c, ch := range relChunks {
		outs, err := protocol.ReadReleaseBatch(result(len(acqChunks)+c), len(ch))
		alone = settle(b, ch, outs, err, (*batcher).releaseAlone, alone)
	}
	for _, f := range alone {
		f()
	}
}

// chunked cuts a batch's calls of one script into script calls of up to batchMax locks.
func chunked[P any](ps []P) [][]P {
	var out [][]P
	for len(ps) > 0 {
		n := min(len(ps), batchMax)
		out = append(out, ps[:n])
		ps = ps[n:]
	}
	return out
}

// settle gives each call of one script call of a batch its answer: outs, read from the
// script call's reply, or err, when there is none. A lock that raised an error is to be sent
// alone (sendAlone), to learn the error (or succeed): its call is appended to alone, which is
// returned.
func settle[In, Out any](b *batcher, ch []*batched[In, Out], outs []protocol.BatchAnswer[Out], err error,
	sendAlone func(*batcher, context.Context, In) (Out, error), alone []func()) []func() {
	for i, p := range ch {
		switch {
		case err != nil:
			p.err = err
		case outs[i].Failed:
			alone = append(alone, func() {
				p.res, p.err = sendAlone(b, b.callersCtx([]context.Context{p.ctx}), p.in)
				close(p.done)
			})
			continue
		default:
			p.res, p.err = outs[i].Res, outs[i].Err
		}
		close(p.done)
	}
	return alone
}

// callersCtx is the context of a batch's call: cancelled when the batcher stops (b.ctx: no
// caller's end cuts the others' calls), with the values of the first caller's context, and
// conn.Callers giving every caller's, so that the transport's hooks (tracing, metrics)
// attribute the call to the requests it serves.
func (b *batcher) callersCtx(callers []context.Context) context.Context {
	return conn.WithCallers(valuesOf{b.ctx, context.WithoutCancel(callers[0])}, callers)
}

// valuesOf is ctx with the values of another context (without its cancellation: a context
// derived from it finds b.ctx's).
type valuesOf struct {
	context.Context
	values context.Context
}

func (c valuesOf) Value(key any) any { return c.values.Value(key) }

// live returns the calls whose callers still wait, marked sent.
func live[P interface{ sent() bool }](ps []P) []P {
	out := ps[:0]
	for _, p := range ps {
		if p.sent() {
			out = append(out, p)
		}
	}
	return out
}

// sent marks the call sent, unless its caller gave up first.
func (p *pending) sent() bool { return p.state.CompareAndSwap(pendQueued, pendSent) }

// acquireArgsOf is what a waiting acquisition acquires.
func acquireArgsOf(p *batchedAcquire) *protocol.AcquireArgs { return &p.in }

func (b *batcher) acquireAlone(ctx context.Context, a protocol.AcquireArgs) (protocol.Acquired, error) {
	return evalRead(ctx, b.cn, a.Call(), protocol.ReadAcquire)
}

func (b *batcher) releaseAlone(ctx context.Context, r ReleaseReq) (protocol.Released, error) {
	return evalRead(ctx, b.cn, r.args(b.retention, false).Call(), protocol.ReadRelease)
}

// releaseBatchCall builds the call of a batch of releases: release.lua's batch form (one
// release: its one-lock form), releases with the same settings in one group. It puts ps in
// the order of the reply.
func (b *batcher) releaseBatchCall(ps []*batchedRelease) conn.Call {
	if len(ps) == 1 {
		return ps[0].in.args(b.retention, false).Call()
	}
	type group struct {
		all    bool
		record string
		ps     []*batchedRelease
	}
	var groups []*group
	for _, p := range ps {
		var g *group
		for _, x := range groups {
			if x.all == p.in.All && x.record == p.in.Record {
				g = x
				break
			}
		}
		if g == nil {
			g = &group{all: p.in.All, record: p.in.Record}
			groups = append(groups, g)
		}
		g.ps = append(g.ps, p)
	}
	keys := make([]string, 0, len(ps))
	args := make([]string, 0, 2+4*len(groups)+3*len(ps))
	args = append(args, "", b.retention)
	ps = ps[:0]
	for _, g := range groups {
		args = append(args, protocol.FlagArg(g.all), "p", g.record, strconv.Itoa(len(g.ps)))
		for _, p := range g.ps {
			keys = append(keys, p.in.Keys[0])
			args = append(args, p.in.Owner, strconv.FormatUint(p.in.Floor, 10), p.in.Leave)
			ps = append(ps, p)
		}
	}
	return conn.Call{Script: protocol.ScriptRelease, Keys: keys, Args: args}
}

// SetLimits sets how many calls may be on their way before a call waits for a batch, and how
// many batches may be on their way at once (loneMax and batchOut by default): tests of batching
// lower them to make the slots few.
func (b *batcher) SetLimits(lone, batches int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.loneMax, b.batchOut = lone, batches
}

// Load reports how many calls and batches are on their way, and how many acquisitions and
// releases wait for the next batch.
func (b *batcher) Load() (out, acqs, rels int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.out, len(b.acqs), len(b.rels)
}
