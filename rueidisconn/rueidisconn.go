// Package rueidisconn adapts a rueidis client (github.com/redis/rueidis) to dlock's transport
// interface. rueidis pipelines concurrent commands on shared connections automatically, which
// makes it dlock's fast default: dlock.Dial uses it.
package rueidisconn

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/dlock-go/dlock/conn"
)

// flushDelay lets rueidis gather concurrent commands for this long before writing them: fewer
// system calls per command on both ends, for at most this much added latency.
var flushDelay = 20 * time.Microsecond

type adapter struct {
	c    rueidis.Client
	addr string
	own  bool
}

var _ conn.Conn = (*adapter)(nil)

// New wraps c. Closing the returned Conn does not close c.
func New(c rueidis.Client) conn.Conn {
	addrs := make([]string, 0, 4)
	for a := range c.Nodes() {
		addrs = append(addrs, a)
	}
	return &adapter{c: c, addr: strings.Join(addrs, ",")}
}

// Dial parses url (redis://, rediss://, unix://, with user:password@ and /db) and connects.
// It returns an error naming the address when the server cannot be reached. Closing the
// returned Conn closes the connection.
func Dial(ctx context.Context, url string) (conn.Conn, error) {
	opt, err := rueidis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("bad redis url: %w", err)
	}
	return DialOptions(ctx, opt)
}

// DialOptions connects with opt; client-side caching is turned off (dlock does not use it).
func DialOptions(ctx context.Context, opt rueidis.ClientOption) (conn.Conn, error) {
	opt.DisableCache = true
	if opt.MaxFlushDelay == 0 {
		opt.MaxFlushDelay = flushDelay
	}
	if opt.PipelineMultiplex == 0 {
		// One pipelined connection per server instead of rueidis' default of several: calls of
		// one client reach the server in the order they were made (an abandoned acquisition
		// before the release that undoes it), and no connection is dialled lazily under a
		// caller whose context ends mid-dial (that dial's failure is shared by every call
		// waiting for the connection). Measured side by side, throughput is within noise.
		opt.PipelineMultiplex = -1
	}
	if dl, ok := ctx.Deadline(); ok && (opt.Dialer.Timeout == 0 || time.Until(dl) < opt.Dialer.Timeout) {
		opt.Dialer.Timeout = max(time.Until(dl), time.Millisecond)
	}
	addr := strings.Join(opt.InitAddress, ",")
	c, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, fmt.Errorf("cannot reach redis at %s: %w", addr, err)
	}
	return &adapter{c: c, addr: addr, own: true}, nil
}

func (a *adapter) Addr() string { return a.addr }

func (a *adapter) Close() error {
	if a.own {
		a.c.Close()
	}
	return nil
}

// Command sends one arbitrary command; see conn.Conn.
func (a *adapter) Command(ctx context.Context, args ...string) (any, error) {
	if len(args) == 0 {
		return nil, errors.New("empty command")
	}
	dctx, done := noDeadline(ctx)
	defer done()
	v, err := a.c.Do(dctx, a.c.B().Arbitrary(args[0]).Args(args[1:]...).Build()).ToAny()
	err = ctxCause(ctx, err)
	if rueidis.IsRedisNil(err) {
		return nil, nil
	}
	return v, err
}

func (a *adapter) evalsha(s *conn.Script, keys, args []string) rueidis.Completed {
	return a.c.B().Evalsha().Sha1(s.SHA).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
}

func (a *adapter) eval(s *conn.Script, keys, args []string) rueidis.Completed {
	return a.c.B().Eval().Script(s.Src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
}

func (a *adapter) Eval(ctx context.Context, s *conn.Script, keys, args []string) ([]int64, error) {
	dctx, done := noDeadline(ctx)
	defer done()
	resp := a.c.Do(dctx, a.evalsha(s, keys, args))
	if noScript(resp.Error()) {
		resp = a.c.Do(dctx, a.eval(s, keys, args))
	}
	v, err := ints(resp)
	return v, ctxCause(ctx, err)
}

// noDeadline returns a context that is cancelled when ctx is but has no deadline of its own.
// Given a deadline, rueidis may send a command synchronously with that deadline on the shared
// connection, and a deadline that passes mid-call then closes the connection under every
// other command on it (for instance a user's Lock under a renewal batch that timed out).
// Without one, an expired call is abandoned and the connection stays up.
func noDeadline(ctx context.Context) (context.Context, func()) {
	if _, ok := ctx.Deadline(); !ok {
		return ctx, func() {}
	}
	dctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	return dctx, func() {
		stop()
		cancel()
	}
}

// ctxCause reports the caller's own context error (DeadlineExceeded, say) in place of the
// cancellation of the context noDeadline made from it.
func ctxCause(ctx context.Context, err error) error {
	if err != nil && errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func (a *adapter) EvalMulti(ctx context.Context, calls []conn.Call) []conn.Result {
	out := a.evalMulti(ctx, calls)
	for i := range out {
		out[i].Err = ctxCause(ctx, out[i].Err)
	}
	return out
}

func (a *adapter) evalMulti(parent context.Context, calls []conn.Call) []conn.Result {
	ctx, done := noDeadline(parent)
	defer done()
	cmds := make(rueidis.Commands, len(calls))
	for i, c := range calls {
		cmds[i] = a.evalsha(c.Script, c.Keys, c.Args)
	}
	out := make([]conn.Result, len(calls))
	var again []int
	for i, resp := range a.c.DoMulti(ctx, cmds...) {
		if noScript(resp.Error()) {
			again = append(again, i)
			continue
		}
		out[i].Ints, out[i].Err = ints(resp)
	}
	if len(again) > 0 {
		cmds = cmds[:0]
		for _, i := range again {
			cmds = append(cmds, a.eval(calls[i].Script, calls[i].Keys, calls[i].Args))
		}
		for j, resp := range a.c.DoMulti(ctx, cmds...) {
			out[again[j]].Ints, out[again[j]].Err = ints(resp)
		}
	}
	return out
}

func noScript(err error) bool {
	if err == nil {
		return false
	}
	re, ok := rueidis.IsRedisErr(err)
	return ok && re.IsNoScript()
}

func ints(resp rueidis.RedisResult) ([]int64, error) {
	msg, err := resp.ToMessage()
	if err != nil {
		return nil, err
	}
	if msg.IsArray() {
		return msg.AsIntSlice()
	}
	v, err := msg.AsInt64()
	if err != nil {
		return nil, err
	}
	return []int64{v}, nil
}

// Listen takes a dedicated connection for pub/sub.
func (a *adapter) Listen(ctx context.Context, h conn.Handler) (conn.Listener, error) {
	dc, release := a.c.Dedicate()
	ln := &listener{dc: dc, release: release, done: make(chan error, 1)}
	errs := dc.SetPubSubHooks(rueidis.PubSubHooks{
		OnMessage: func(m rueidis.PubSubMessage) { h.Message(m.Channel, m.Message) },
		OnSubscription: func(s rueidis.PubSubSubscription) {
			if s.Kind == "subscribe" || s.Kind == "ssubscribe" {
				h.Subscribed(s.Channel)
			}
		},
	})
	// The dedicated connection is opened lazily; a PING makes an unreachable server fail here.
	if err := dc.Do(ctx, dc.B().Ping().Build()).Error(); err != nil {
		dc.Close()
		release()
		return nil, fmt.Errorf("pub/sub connection to %s: %w", a.addr, err)
	}
	ln.wg.Add(1)
	go func() {
		defer ln.wg.Done()
		for err := range errs {
			if err != nil && !errors.Is(err, rueidis.ErrClosing) {
				ln.done <- err
			}
		}
		close(ln.done)
	}()
	return ln, nil
}

type listener struct {
	dc      rueidis.DedicatedClient
	release func()
	done    chan error
	wg      sync.WaitGroup
	once    sync.Once
}

func (l *listener) Subscribe(ctx context.Context, channels ...string) error {
	return l.dc.Do(ctx, l.dc.B().Subscribe().Channel(channels...).Build()).Error()
}

func (l *listener) Unsubscribe(ctx context.Context, channels ...string) error {
	return l.dc.Do(ctx, l.dc.B().Unsubscribe().Channel(channels...).Build()).Error()
}

func (l *listener) Done() <-chan error { return l.done }

func (l *listener) Close() error {
	l.once.Do(func() {
		l.dc.Close()
		l.release()
		l.wg.Wait()
	})
	return nil
}
