// Package goredisconn adapts a go-redis v9 client (redis.UniversalClient: *redis.Client,
// *redis.ClusterClient, a Sentinel-backed failover client or *redis.Ring) to dlock's transport
// interface, for services that already have one.
//
// With a *redis.ClusterClient (or a UniversalClient that is one), the Conn reports
// Cluster() == true and its Listener subscribes with SSUBSCRIBE (sharded pub/sub), one
// connection per master that owns a subscribed channel's slot. A Sentinel-backed client
// (redis.NewFailoverClient, or NewUniversalClient with MasterName set) follows failovers by
// itself; wrap it like any *redis.Client.
//
// Script calls (Lock, Unlock and the like) from concurrent goroutines are sent together in
// pipelines, a few at a time (autoBatch): go-redis has no automatic pipelining, and one command
// per pooled connection costs both ends a system call per command. Such a pipeline is never
// cancelled by one of its callers (each caller still returns when its own context ends);
// go-redis's ReadTimeout and WriteTimeout bound it. Its context, as go-redis hooks see it, has
// the values of its first caller's context (so a tracing hook's pipeline span is a child of
// that caller's span), and CallerContexts gives every caller's context, one per command, so
// that a hook can attribute each command to the request that made it.
//
// A batch that holds a WAIT (dlock's replica acknowledgement) goes in one pipeline, on one
// connection; go-redis reads a pipeline's replies within the client's ReadTimeout (3 s by
// default), so keep the WAIT timeout below it.
package goredisconn

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/scriptcall"
	"github.com/dlock-go/dlock/internal/waitbatch"
)

type adapter struct {
	c    redis.UniversalClient
	addr string
	cc   *redis.ClusterClient // non-nil on a cluster
	ab   autoBatch
}

var (
	_ conn.Conn      = (*adapter)(nil)
	_ conn.Clustered = (*adapter)(nil)
)

// New wraps c. Closing the returned Conn does not close c.
//
// Set ContextTimeoutEnabled in c's options so that context deadlines bound each command (by
// default go-redis bounds reads by ReadTimeout only). dlock's lost-lock signal does not depend
// on it, but Lock, Unlock and Close return sooner on a dead connection with it.
func New(c redis.UniversalClient) conn.Conn {
	var addr string
	switch cc := c.(type) {
	case *redis.Client:
		addr = cc.Options().Addr
	case *redis.ClusterClient:
		addr = strings.Join(cc.Options().Addrs, ",")
	default:
		addr = fmt.Sprintf("%T", c)
	}
	cc, _ := c.(*redis.ClusterClient)
	a := &adapter{c: c, addr: addr, cc: cc}
	a.ab.c = c
	return a
}

// Cluster reports whether the client is a *redis.ClusterClient (see conn.Clustered).
func (a *adapter) Cluster() bool { return a.cc != nil }

func (a *adapter) Addr() string { return a.addr }

func (a *adapter) Close() error { return nil }

// Command sends one arbitrary command; see conn.Conn.
func (a *adapter) Command(ctx context.Context, args ...string) (any, error) {
	if len(args) == 0 {
		return nil, errors.New("empty command")
	}
	v, err := a.c.Do(ctx, argv(args)...).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	return v, err
}

func argv(args []string) []any {
	out := make([]any, len(args))
	for i, s := range args {
		out[i] = s
	}
	return out
}

// Eval runs one script call. Calls made while others are on their way are sent together, in
// one pipeline (see autoBatch).
func (a *adapter) Eval(ctx context.Context, s *conn.Script, keys, args []string) ([]int64, error) {
	return a.ab.eval(ctx, conn.Call{Script: s, Keys: keys, Args: args})
}

func (a *adapter) EvalMulti(ctx context.Context, calls []conn.Call) []conn.Result {
	if a.cc != nil && waitbatch.Has(calls) {
		return a.clusterWaitBatch(ctx, calls)
	}
	return batch(ctx, a.c, calls)
}

// queue adds one call to p: EVALSHA (EVAL when eval is set) or, for a nil Script, WAIT.
func queue(ctx context.Context, p redis.Pipeliner, c conn.Call, eval bool) redis.Cmder {
	switch {
	case c.Script == nil:
		return p.Do(ctx, "WAIT", c.WaitReplicas, scriptcall.WaitMillis(c))
	case eval:
		return p.Eval(ctx, c.Script.Src, c.Keys, argv(c.Args)...)
	default:
		return p.EvalSha(ctx, c.Script.SHA, c.Keys, argv(c.Args)...)
	}
}

// batch sends calls in one pipeline of c, and the scripts the server did not have again (see
// package scriptcall). On a *redis.Client a pipeline goes on one connection, in order, so a WAIT
// covers the scripts before it. callers, when set, are the contexts of the callers of the calls,
// one per call (autoBatch's pipelines): the pipeline runs under callerBatch's context for them.
func batch(ctx context.Context, c redis.Cmdable, calls []conn.Call, callers ...context.Context) []conn.Result {
	return scriptcall.BatchOf(calls, func(idx []int, calls []conn.Call, eval bool) []conn.Result {
		pctx := ctx
		if len(callers) > 0 {
			sent := callers
			if idx != nil {
				sent = make([]context.Context, len(idx))
				for j, i := range idx {
					sent[j] = callers[i]
				}
			}
			pctx = callerBatch(sent)
		}
		cmds := make([]redis.Cmder, len(calls))
		_, err := c.Pipelined(pctx, func(p redis.Pipeliner) error {
			for i, call := range calls {
				cmds[i] = queue(pctx, p, call, eval)
			}
			return nil
		})
		out := make([]conn.Result, len(calls))
		for i, cmd := range cmds {
			out[i].Ints, out[i].Err = result(cmd)
			if out[i].Err == nil && out[i].Ints == nil {
				out[i].Err = err
			}
		}
		return out
	}, isNoScript)
}

// result reads a script's or a WAIT's reply.
func result(cmd redis.Cmder) ([]int64, error) {
	switch c := cmd.(type) {
	case *redis.IntCmd:
		n, err := c.Result()
		if err != nil {
			return nil, err
		}
		return conn.Int(n), nil
	case *redis.Cmd:
		v, err := c.Result()
		if err != nil {
			return nil, err
		}
		return ints(v)
	}
	return nil, fmt.Errorf("unexpected command %T", cmd)
}

// clusterWaitBatch runs a batch holding WAITs on a cluster: see package waitbatch.
func (a *adapter) clusterWaitBatch(ctx context.Context, calls []conn.Call) []conn.Result {
	return waitbatch.Run(calls, func(key string, calls []conn.Call) []conn.Result {
		node, err := a.cc.MasterForKey(ctx, key)
		if err != nil {
			res := make([]conn.Result, len(calls))
			for i := range res {
				res[i].Err = err
			}
			return res
		}
		return batch(ctx, node, calls)
	})
}

func isNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

func ints(v any) ([]int64, error) {
	switch x := v.(type) {
	case int64:
		return conn.Int(x), nil
	case []any:
		out := make([]int64, len(x))
		for i, e := range x {
			n, ok := e.(int64)
			if !ok {
				return nil, fmt.Errorf("unexpected script reply element %T", e)
			}
			out[i] = n
		}
		return out, nil
	}
	return nil, fmt.Errorf("unexpected script reply %T", v)
}

// Listen opens a pub/sub connection and reads it on one goroutine until Close or a
// connection error (the caller then opens a new listener). On a cluster, see listenSharded.
func (a *adapter) Listen(ctx context.Context, h conn.Handler) (conn.Listener, error) {
	if a.cc != nil {
		return a.listenSharded(ctx, h)
	}
	ps := a.c.Subscribe(ctx)
	if err := ps.Ping(ctx); err != nil {
		ps.Close()
		return nil, fmt.Errorf("pub/sub connection to %s: %w", a.addr, err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	ln := &listener{ps: ps, cancel: cancel, done: make(chan error, 1)}
	ln.wg.Add(1)
	go func() {
		defer ln.wg.Done()
		defer close(ln.done)
		for {
			msg, err := ps.Receive(rctx)
			if err != nil {
				if rctx.Err() == nil && !errors.Is(err, redis.ErrClosed) {
					ln.done <- err
				}
				return
			}
			switch m := msg.(type) {
			case *redis.Message:
				h.Message(m.Channel, m.Payload)
			case *redis.Subscription:
				if m.Kind == "subscribe" || m.Kind == "ssubscribe" {
					h.Subscribed(m.Channel)
				}
			}
		}
	}()
	return ln, nil
}

type listener struct {
	ps     *redis.PubSub
	cancel context.CancelFunc
	done   chan error
	wg     sync.WaitGroup
	once   sync.Once
}

func (l *listener) Subscribe(ctx context.Context, channels ...string) error {
	return l.ps.Subscribe(ctx, channels...)
}

func (l *listener) Unsubscribe(ctx context.Context, channels ...string) error {
	return l.ps.Unsubscribe(ctx, channels...)
}

func (l *listener) Done() <-chan error { return l.done }

func (l *listener) Close() error {
	var err error
	l.once.Do(func() {
		l.cancel()
		err = l.ps.Close()
		l.wg.Wait()
	})
	return err
}
