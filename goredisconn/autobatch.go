package goredisconn

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/scriptcall"
)

// maxPipelines is how many calls or pipelines of batched calls may be on their way at once, each
// on its own pooled connection. A call made while that many are out waits for the next
// pipeline, together with every other call made meanwhile. Two keeps a second pipeline going
// while one is slow; more only spreads the calls thinner (docs/BENCHMARKS.md, "go-redis
// batching", gives the measurements).
const maxPipelines = 2

// autoBatch sends script calls of concurrent callers together, in pipelines of a go-redis
// client: a call made while fewer than maxPipelines calls or pipelines are out leaves at once,
// as a command of its own from the caller's goroutine; otherwise it waits in the queue, and the
// first call or pipeline to come back sends the whole queue as one pipeline (from a goroutine
// that keeps sending what queued meanwhile). No goroutine runs while nothing is queued.
type autoBatch struct {
	c redis.Cmdable

	mu     sync.Mutex
	queue  []*evalReq // guarded by mu
	active int        // pipelines on their way, guarded by mu
}

type evalReq struct {
	call      conn.Call
	ctx       context.Context // the caller's: its values go with the call (see callerBatch)
	res       conn.Result
	done      chan struct{} // closed when res is set
	abandoned atomic.Bool   // the caller returned: not sent if it was still queued
}

func (b *autoBatch) eval(ctx context.Context, call conn.Call) ([]int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	if b.active < maxPipelines && len(b.queue) == 0 {
		// Nothing to batch with: send the call from this goroutine, under its context, as one
		// command (the cheapest way when calls come one at a time).
		b.active++
		b.mu.Unlock()
		v, err := direct(ctx, b.c, call)
		b.finish()
		return v, err
	}
	r := &evalReq{call: call, ctx: ctx, done: make(chan struct{})}
	b.queue = append(b.queue, r)
	var batch []*evalReq
	if b.active < maxPipelines {
		b.active++
		batch, b.queue = b.queue, nil
	}
	b.mu.Unlock()
	if batch != nil {
		go b.run(batch)
	}
	select {
	case <-r.done:
		return r.res.Ints, r.res.Err
	case <-ctx.Done():
		r.abandoned.Store(true)
		return nil, ctx.Err()
	}
}

// run sends next, then the calls queued meanwhile, until the queue is empty.
func (b *autoBatch) run(next []*evalReq) {
	for {
		reqs := next[:0]
		for _, r := range next {
			if !r.abandoned.Load() {
				reqs = append(reqs, r)
			}
		}
		if len(reqs) > 0 {
			calls := make([]conn.Call, len(reqs))
			callers := make([]context.Context, len(reqs))
			for i, r := range reqs {
				calls[i], callers[i] = r.call, r.ctx
			}
			// The callers' cancellations stay out of the shared pipeline: one caller giving
			// up must not cut the others' calls. go-redis's read and write timeouts bound it.
			// Their values go with it (callerBatch), for go-redis hooks.
			for i, res := range batch(context.Background(), b.c, calls, callers...) {
				reqs[i].res = res
				close(reqs[i].done)
			}
		}
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.active--
			b.mu.Unlock()
			return
		}
		next, b.queue = b.queue, nil
		b.mu.Unlock()
	}
}

// finish gives up the slot of a call sent directly, or passes it to a pipeline of the calls
// queued meanwhile.
func (b *autoBatch) finish() {
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.active--
		b.mu.Unlock()
		return
	}
	next := b.queue
	b.queue = nil
	b.mu.Unlock()
	go b.run(next)
}

// direct sends one script call as a command of its own (see package scriptcall).
func direct(ctx context.Context, c redis.Cmdable, call conn.Call) ([]int64, error) {
	av := argv(call.Args)
	return scriptcall.Eval(func(eval bool) ([]int64, error) {
		var v any
		var err error
		if eval {
			v, err = c.Eval(ctx, call.Script.Src, call.Keys, av...).Result()
		} else {
			v, err = c.EvalSha(ctx, call.Script.SHA, call.Keys, av...).Result()
		}
		if err != nil {
			return nil, err
		}
		return ints(v)
	}, isNoScript)
}

// callerBatch returns the context of a pipeline that carries calls of the callers whose
// contexts are given, one per command in order: it is never cancelled and has no deadline (one
// caller giving up must not cut the others' calls), its values are the first caller's, and
// CallerContexts returns them all.
func callerBatch(callers []context.Context) context.Context {
	return &batchCtx{Context: context.WithoutCancel(callers[0]), callers: callers}
}

type batchCtx struct {
	context.Context
	callers []context.Context
}

type callersKey struct{}

func (c *batchCtx) Value(key any) any {
	if key == (callersKey{}) {
		return c.callers
	}
	return c.Context.Value(key)
}

// CallerContexts returns, for the context of a pipeline that this package sends on behalf of
// several concurrent callers (as a go-redis hook's ProcessPipelineHook receives it), the
// context of the caller of each command, in the order of the commands; nil for any other
// context. The pipeline's context itself has the values of the first caller's. A tracing hook
// can link its pipeline span to every caller's span with it, or a metrics hook attribute each
// command to the request that made it. The contexts are for their values: their callers may
// have given up waiting already.
func CallerContexts(ctx context.Context) []context.Context {
	callers, _ := ctx.Value(callersKey{}).([]context.Context)
	return callers
}
