// Package goredisconn adapts a go-redis v9 client (redis.UniversalClient: *redis.Client,
// *redis.ClusterClient, a Sentinel-backed failover client or *redis.Ring) to dlock's transport
// interface, for services that already have one.
package goredisconn

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/conn"
)

type adapter struct {
	c    redis.UniversalClient
	addr string
}

var _ conn.Conn = (*adapter)(nil)

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
	return &adapter{c: c, addr: addr}
}

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

func (a *adapter) Eval(ctx context.Context, s *conn.Script, keys, args []string) ([]int64, error) {
	av := argv(args)
	v, err := a.c.EvalSha(ctx, s.SHA, keys, av...).Result()
	if isNoScript(err) {
		v, err = a.c.Eval(ctx, s.Src, keys, av...).Result()
	}
	if err != nil {
		return nil, err
	}
	return ints(v)
}

func (a *adapter) EvalMulti(ctx context.Context, calls []conn.Call) []conn.Result {
	out := make([]conn.Result, len(calls))
	cmds := make([]*redis.Cmd, len(calls))
	_, err := a.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, c := range calls {
			cmds[i] = p.EvalSha(ctx, c.Script.SHA, c.Keys, argv(c.Args)...)
		}
		return nil
	})
	var again []int
	for i, cmd := range cmds {
		v, cerr := cmd.Result()
		switch {
		case isNoScript(cerr):
			again = append(again, i)
		case cerr != nil:
			out[i].Err = cerr
		default:
			out[i].Ints, out[i].Err = ints(v)
		}
	}
	if err != nil && len(again) == 0 {
		for i := range out {
			if out[i].Err == nil && out[i].Ints == nil {
				out[i].Err = err
			}
		}
	}
	for _, i := range again {
		out[i].Ints, out[i].Err = a.Eval(ctx, calls[i].Script, calls[i].Keys, calls[i].Args)
	}
	return out
}

func isNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

func ints(v any) ([]int64, error) {
	switch x := v.(type) {
	case int64:
		return []int64{x}, nil
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
// connection error (the caller then opens a new listener).
func (a *adapter) Listen(ctx context.Context, h conn.Handler) (conn.Listener, error) {
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
