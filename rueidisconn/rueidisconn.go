// Package rueidisconn adapts a rueidis client (github.com/redis/rueidis) to dlock's transport
// interface. rueidis pipelines concurrent commands on shared connections automatically, which
// makes it dlock's fast default: dlock.Dial uses it.
//
// # Deployments
//
// Dial takes one URL:
//
//   - a single server: redis://[user:password@]host:port[/db], rediss://... for TLS, or
//     unix:///path/to/socket;
//   - Redis Cluster: any node's URL; more seed nodes go in repeated addr query parameters,
//     redis://[user:password@]host1:port1?addr=host2:port2&addr=host3:port3 (rueidis' own form,
//     which go-redis' ParseClusterURL reads too). rueidis finds out by itself that the server
//     is a cluster node and follows MOVED and ASK redirections, failovers and slot migrations;
//   - Sentinel: redis+sentinel://[user:password@]host:port[,host:port...]/<master name>[/<db>]
//     (rediss+sentinel:// for TLS). The hosts are the Sentinels; user and password are for the
//     master and its replicas, the Sentinels are asked without authentication. The client
//     connects to the master the Sentinels name and follows their failovers.
//
// On a cluster, the Conn reports Cluster() == true and its Listener subscribes with SSUBSCRIBE
// (sharded pub/sub), one connection per node that owns a subscribed channel's slot.
package rueidisconn

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/redact"
	"github.com/dlock-go/dlock/internal/scriptcall"
	"github.com/dlock-go/dlock/internal/slot"
	"github.com/dlock-go/dlock/internal/waitbatch"
)

// sentinelRefresh is how often a Sentinel client re-asks the Sentinels for the master, besides
// following their +switch-master announcements (in case it missed one).
const sentinelRefresh = 2 * time.Second

type adapter struct {
	c       rueidis.Client
	addr    string
	own     bool
	cluster bool

	// lone, when set (clients Dial made), carries a script call that no other is on its way
	// beside (loneBusy): a client of the same servers without auto-pipelining, whose pooled
	// connection writes and reads on the caller's goroutine. c's shared connection goes to
	// background mode for good once calls overlap (the renewal loop's, a batch's), and from then
	// on every call crosses its writer and reader goroutines; a lone Lock+Unlock loop, the first
	// thing a user measures, then pays several goroutine wake-ups per call for nothing.
	lone     rueidis.Client
	loneBusy atomic.Bool
	// calls: the calls on their way through this adapter, either path. A call takes the lone
	// path only when it is the only one: beside others, the pipelined connection carries it in
	// the same writes and reads, where the lone connection costs the server a read and a write
	// of its own per call.
	calls atomic.Int32
}

var (
	_ conn.Conn      = (*adapter)(nil)
	_ conn.Clustered = (*adapter)(nil)
)

// New wraps c. Closing the returned Conn does not close c.
func New(c rueidis.Client) conn.Conn {
	addrs := make([]string, 0, 4)
	for a := range c.Nodes() {
		addrs = append(addrs, a)
	}
	return &adapter{c: c, addr: strings.Join(addrs, ","), cluster: c.Mode() == rueidis.ClientModeCluster}
}

// DialOption changes how Dial connects.
type DialOption func(*rueidis.ClientOption)

// WithTLSConfig connects with TLS using cfg (for example one whose RootCAs hold a private CA),
// whatever the URL's scheme. With a rediss:// URL and no WithTLSConfig, the system's roots verify
// the server. For Sentinel, cfg is used for the Sentinels and the data servers alike.
func WithTLSConfig(cfg *tls.Config) DialOption {
	return func(o *rueidis.ClientOption) {
		c := cfg.Clone()
		if o.TLSConfig != nil && c.ServerName == "" {
			c.ServerName = o.TLSConfig.ServerName
		}
		o.TLSConfig = c
		if o.Sentinel.MasterSet != "" {
			o.Sentinel.TLSConfig = c
		}
	}
}

// Dial parses url and connects; see the package documentation for the URL forms (a single
// server, a cluster's seed nodes, or Sentinels and a master name). It returns an error naming
// the address when the server cannot be reached. Closing the returned Conn closes the
// connection.
func Dial(ctx context.Context, url string, opts ...DialOption) (conn.Conn, error) {
	opt, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	for _, o := range opts {
		o(&opt)
	}
	return DialOptions(ctx, opt)
}

// ParseURL turns a URL of any form Dial accepts into rueidis options.
func ParseURL(rawURL string) (rueidis.ClientOption, error) {
	if !strings.Contains(rawURL, "://") && !strings.HasPrefix(rawURL, "/") {
		rawURL = "redis://" + rawURL // the go-redis Addr habit: host:port
	}
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if ok && (scheme == "redis+sentinel" || scheme == "rediss+sentinel") {
		return parseSentinelURL(scheme, rest)
	}
	opt, err := rueidis.ParseURL(rawURL)
	if err != nil {
		// url.Error quotes the whole URL, password included: keep only what it says is wrong.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return opt, fmt.Errorf("bad redis url %s: %s", redact.URL(rawURL), redact.Text(err.Error(), password(rawURL)))
	}
	return opt, nil
}

// parseSentinelURL reads [user:password@]host:port[,host:port...]/<master>[/<db>].
func parseSentinelURL(scheme, rest string) (rueidis.ClientOption, error) {
	var opt rueidis.ClientOption
	bad := func(format string, args ...any) (rueidis.ClientOption, error) {
		raw := scheme + "://" + rest
		return opt, fmt.Errorf("bad redis url %s: %s", redact.URL(raw), redact.Text(fmt.Sprintf(format, args...), password(raw)))
	}
	if strings.ContainsAny(rest, "?#") {
		return bad("query parameters are not supported with Sentinel")
	}
	authority, path, _ := strings.Cut(rest, "/")
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		u, err := url.Parse("redis://" + authority[:i+1] + "host")
		if err != nil {
			return bad("user info: %v", err)
		}
		opt.Username = u.User.Username()
		opt.Password, _ = u.User.Password()
		authority = authority[i+1:]
	}
	for _, h := range strings.Split(authority, ",") {
		if h == "" {
			return bad("empty Sentinel address")
		}
		if !strings.Contains(h, ":") {
			h += ":26379"
		}
		opt.InitAddress = append(opt.InitAddress, h)
	}
	master, db, hasDB := strings.Cut(path, "/")
	if master == "" {
		return bad("no master name (redis+sentinel://host:port,.../<master name>)")
	}
	var err error
	if opt.Sentinel.MasterSet, err = url.PathUnescape(master); err != nil {
		return bad("master name: %v", err)
	}
	if hasDB && db != "" {
		if opt.SelectDB, err = strconv.Atoi(db); err != nil || opt.SelectDB < 0 {
			return bad("invalid database number %q", db)
		}
	}
	if scheme == "rediss+sentinel" {
		opt.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		opt.Sentinel.TLSConfig = opt.TLSConfig
	}
	return opt, nil
}

// password returns the password in a URL's user info, or "".
func password(rawURL string) string {
	_, rest, _ := strings.Cut(rawURL, "://")
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return ""
	}
	_, pw, _ := strings.Cut(rest[:at], ":")
	return pw
}

// DialOptions connects with opt; client-side caching is turned off (dlock does not use it).
func DialOptions(ctx context.Context, opt rueidis.ClientOption) (conn.Conn, error) {
	opt.DisableCache = true
	// MaxFlushDelay stays rueidis's (none) unless the caller sets one: a delay of 20 µs, which
	// gathers more commands per write, cost a third of the Lock+Unlock pairs/s at 4 and 16
	// goroutines (each caller waits for it twice per pair) and gained at most a tenth at 64,
	// where the batcher gathers calls anyway (measured side by side, on one client).
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
	if opt.Sentinel.MasterSet != "" {
		addr = "sentinel " + addr + " master " + opt.Sentinel.MasterSet
		if opt.Sentinel.TopologyRefreshInterval == 0 {
			opt.Sentinel.TopologyRefreshInterval = sentinelRefresh
		}
		if opt.Sentinel.Dialer.Timeout == 0 {
			opt.Sentinel.Dialer.Timeout = opt.Dialer.Timeout
		}
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		if msg := err.Error(); strings.Contains(msg, "WRONGPASS") || strings.Contains(msg, "NOAUTH") || strings.Contains(msg, "NOPERM") {
			return nil, fmt.Errorf("login to redis at %s refused: %w", addr, err)
		}
		return nil, fmt.Errorf("cannot reach redis at %s: %w", addr, err)
	}
	a := &adapter{c: c, addr: addr, own: true, cluster: c.Mode() == rueidis.ClientModeCluster}
	if !opt.DisableAutoPipelining {
		lopt := opt
		lopt.DisableAutoPipelining = true
		// One pooled connection is all it keeps: only one call at a time takes this path.
		lopt.BlockingPoolSize, lopt.BlockingPoolMinSize = 1, 0
		if a.lone, err = rueidis.NewClient(lopt); err != nil {
			c.Close()
			return nil, fmt.Errorf("cannot reach redis at %s: %w", addr, err)
		}
	}
	return a, nil
}

// Cluster reports whether the client talks to a Redis Cluster (see conn.Clustered).
func (a *adapter) Cluster() bool { return a.cluster }

func (a *adapter) Addr() string { return a.addr }

func (a *adapter) Close() error {
	if a.own {
		a.c.Close()
		if a.lone != nil {
			a.lone.Close()
		}
	}
	return nil
}

// settleDeadline waits, after a call on the lone client whose context's deadline has passed,
// until the context says so too: the connection's deadline can fire a moment before the
// context's timer, and the caller must then find ctx.Err() set (a deadline reached, not a
// server that failed).
func settleDeadline(ctx context.Context) {
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		<-ctx.Done()
	}
}

// takeLone returns the lone client for a call with ctx when it is free, marking it busy (the
// caller frees it). A context that can be cancelled but has no deadline goes the pipelined
// way instead: a synchronous call notices a context only through its deadline, and such a
// call must still end the moment its context does.
func (a *adapter) takeLone(ctx context.Context) (rueidis.Client, bool) {
	if a.lone == nil || a.calls.Load() > 1 {
		return nil, false
	}
	if _, ok := ctx.Deadline(); !ok && ctx.Done() != nil {
		return nil, false
	}
	if !a.loneBusy.CompareAndSwap(false, true) {
		return nil, false
	}
	return a.lone, true
}

// Command sends one arbitrary command; see conn.Conn.
func (a *adapter) Command(ctx context.Context, args ...string) (any, error) {
	if len(args) == 0 {
		return nil, errors.New("empty command")
	}
	a.calls.Add(1)
	defer a.calls.Add(-1)
	dctx, done := noDeadline(ctx)
	defer done()
	v, err := a.c.Do(dctx, a.arbitrary(args)).ToAny()
	err = ctxCause(ctx, err)
	if rueidis.IsRedisNil(err) {
		return nil, nil
	}
	return v, err
}

// arbitrary builds one command. A script call (EVALSHA, EVAL) whose keys share a slot names them
// as keys, so that on a Cluster rueidis sends it to the slot's master rather than to any node
// (which would answer MOVED, a round trip more); keys of several slots go as plain arguments, and
// the server refuses them (CROSSSLOT) as it would.
func (a *adapter) arbitrary(args []string) rueidis.Completed {
	if a.cluster && len(args) > 3 && (strings.EqualFold(args[0], "EVALSHA") || strings.EqualFold(args[0], "EVAL")) {
		if n, err := strconv.Atoi(args[2]); err == nil && n > 0 && 3+n <= len(args) {
			keys := args[3 : 3+n]
			first := slot.Of(keys[0])
			same := true
			for _, k := range keys[1:] {
				same = same && slot.Of(k) == first
			}
			if same {
				return a.c.B().Arbitrary(args[:3]...).Keys(keys...).Args(args[3+n:]...).Build()
			}
		}
	}
	return a.c.B().Arbitrary(args[0]).Args(args[1:]...).Build()
}

func (a *adapter) evalsha(s *conn.Script, keys, args []string) rueidis.Completed {
	return evalshaOn(a.c, s, keys, args)
}

func (a *adapter) eval(s *conn.Script, keys, args []string) rueidis.Completed {
	return evalOn(a.c, s, keys, args)
}

func evalshaOn(c rueidis.Client, s *conn.Script, keys, args []string) rueidis.Completed {
	return c.B().Evalsha().Sha1(s.SHA).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
}

func evalOn(c rueidis.Client, s *conn.Script, keys, args []string) rueidis.Completed {
	return c.B().Eval().Script(s.Src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
}

// Eval runs one script. Alone on its way, it goes on the lone client with ctx's deadline as it
// is (a deadline that passes closes only that pooled connection); else pipelined on the shared
// connection, without the deadline (see noDeadline).
func (a *adapter) Eval(ctx context.Context, s *conn.Script, keys, args []string) ([]int64, error) {
	a.calls.Add(1)
	defer a.calls.Add(-1)
	c, lone := a.takeLone(ctx)
	dctx, done := ctx, nop
	if lone {
		defer a.loneBusy.Store(false)
		defer settleDeadline(ctx)
	} else {
		c = a.c
		dctx, done = noDeadline(ctx)
	}
	defer done()
	v, err := scriptcall.Eval(func(eval bool) ([]int64, error) {
		if eval {
			return ints(c.Do(dctx, evalOn(c, s, keys, args)))
		}
		return ints(c.Do(dctx, evalshaOn(c, s, keys, args)))
	}, noScript)
	return v, ctxCause(ctx, err)
}

// noDeadline returns a context that is cancelled when ctx is but has no deadline of its own.
// Given a deadline, rueidis may send a command synchronously with that deadline on the shared
// connection, and a deadline that passes mid-call then closes the connection under every
// other command on it (for instance a user's Lock under a renewal batch that timed out).
// Without one, an expired call is abandoned and the connection stays up. The wrapper only
// hides Deadline: Done and Err are ctx's, so the call still ends when the deadline passes
// (one small allocation, where deriving a new cancellable context cost about fifteen per
// Lock+Unlock pair).
func noDeadline(ctx context.Context) (context.Context, func()) {
	if _, ok := ctx.Deadline(); !ok {
		return ctx, nop
	}
	return cancelOnly{ctx}, nop
}

func nop() {}

// cancelOnly is a context without a deadline, done when the context it wraps is.
type cancelOnly struct{ context.Context }

func (cancelOnly) Deadline() (time.Time, bool) { return time.Time{}, false }

// ctxCause reports the caller's own context error (DeadlineExceeded, say) in place of the
// cancellation of the context noDeadline made from it.
func ctxCause(ctx context.Context, err error) error {
	if err != nil && errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func (a *adapter) EvalMulti(ctx context.Context, calls []conn.Call) []conn.Result {
	a.calls.Add(1)
	defer a.calls.Add(-1)
	out := a.evalMulti(ctx, calls)
	for i := range out {
		out[i].Err = ctxCause(ctx, out[i].Err)
	}
	return out
}

func (a *adapter) evalMulti(parent context.Context, calls []conn.Call) []conn.Result {
	ctx, done := noDeadline(parent)
	defer done()
	if a.cluster && waitbatch.Has(calls) {
		return a.clusterWaitBatch(ctx, calls)
	}
	return a.batch(ctx, calls)
}

// command builds one call: EVALSHA (EVAL when eval is set) or, for a nil Script, WAIT.
func (a *adapter) command(c conn.Call, eval bool) rueidis.Completed {
	switch {
	case c.Script == nil:
		return a.c.B().Wait().Numreplicas(int64(c.WaitReplicas)).Timeout(scriptcall.WaitMillis(c)).Build()
	case eval:
		return a.eval(c.Script, c.Keys, c.Args)
	default:
		return a.evalsha(c.Script, c.Keys, c.Args)
	}
}

// batch sends calls in one DoMulti, and the scripts the server did not have again (see package
// scriptcall). rueidis sends a DoMulti that holds a blocking command (WAIT is one) on a single
// connection taken from its pool of dedicated connections, in order, so a WAIT covers the
// scripts before it.
func (a *adapter) batch(ctx context.Context, calls []conn.Call) []conn.Result {
	return scriptcall.Batch(calls, func(calls []conn.Call, eval bool) []conn.Result {
		cmds := make(rueidis.Commands, len(calls))
		for i, c := range calls {
			cmds[i] = a.command(c, eval)
		}
		out := make([]conn.Result, len(calls))
		for i, resp := range a.c.DoMulti(ctx, cmds...) {
			out[i].Ints, out[i].Err = ints(resp)
		}
		return out
	}, noScript)
}

// clusterWaitBatch runs a batch holding WAITs on a cluster: see package waitbatch. rueidis
// routes each group by its keys.
func (a *adapter) clusterWaitBatch(ctx context.Context, calls []conn.Call) []conn.Result {
	return waitbatch.Run(calls, func(_ string, calls []conn.Call) []conn.Result { return a.batch(ctx, calls) })
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
	return conn.Int(v), nil
}

// Listen takes a dedicated connection for pub/sub; on a cluster, see listenSharded.
func (a *adapter) Listen(ctx context.Context, h conn.Handler) (conn.Listener, error) {
	if a.cluster {
		return a.listenSharded(ctx, h)
	}
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
