package dlock

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/rueidisconn"
)

// Conn is the transport a Client speaks to Redis through; see the rueidisconn and goredisconn
// adapters.
type Conn = conn.Conn

// Client hands out locks on one Redis deployment. It owns one renewal loop and one pub/sub
// subscription, shared by all of its locks. A Client is safe for concurrent use.
type Client struct {
	e    *engine
	opts options // defaults for every lock
	meta string  // holder description for opts.label

	closeOnce sync.Once
	bg        sync.WaitGroup // the renewal loop and the subscription
}

// engine is the machinery every lock of one Client shares. Each part is given what it uses:
//
//   - b, the backend: runs the scripts on the deployment (backend.go);
//   - renewer, the renewal loop: keeps held leases alive, ends lost ones, sends background
//     releases (renew.go);
//   - waits, this client's waiters per lock name, and both ends of the wait/handoff protocol
//     (wait.go);
//   - notices, the one subscription that wakes the waiters (notify.go);
//   - guard, the servers' eviction policy (evict.go).
//
// The locks (mutex.go) and their leases (lease.go) use the engine; the parts do not reach one
// another through it.
type engine struct {
	b       backend
	traits  traits
	renewer *renewer
	waits   *waitQueues
	notices *notifier
	guard   *evictionGuard

	ownerID  string // 128 random bits; each lease's secret is ownerID + a sequence number
	clientID string // 64 random bits, public: names this client's queue entries
	seq      atomic.Uint64
	closed   atomic.Bool
	done     chan struct{} // closed by Close: waiters stop waiting
}

// Dial connects to Redis at url through rueidis and returns a Client that owns the connection.
// Accepted forms (see package rueidisconn for details):
//
//   - one server: redis://[user:password@]host:port[/db], rediss://… (TLS), unix:///path;
//   - Redis Cluster: any node, more seeds as ?addr=host:port&addr=host:port;
//   - Sentinel: redis+sentinel://[user:password@]host:port[,host:port…]/<master name>[/<db>]
//     (the hosts are the Sentinels; the client follows their failovers).
//
// WithCAFile or WithTLSConfig set up TLS. It fails fast, naming the address, when the server
// cannot be reached, and when it can evict lock keys (see WithUnsafeEviction).
func Dial(ctx context.Context, url string, opts ...Option) (*Client, error) {
	o := defaultOptions().with(opts)
	if o.err != nil {
		return nil, o.err
	}
	cn, err := rueidisconn.Dial(ctx, url, o.dialOptions()...)
	if err != nil {
		return nil, fmt.Errorf("dlock: dial: %w", err)
	}
	s := newOneServer(cn, o.retention)
	s.own = true
	c, err := newClient(ctx, s, o)
	if err != nil {
		cn.Close()
		return nil, err
	}
	return c, nil
}

// New returns a Client that speaks through cn, an adapter from rueidisconn or goredisconn.
// Close does not close the Redis client behind cn; its owner does. Like Dial, it reads the
// server's memory policy (within newCheckTimeout) and fails when the server cannot be reached
// or can evict lock keys (see WithUnsafeEviction).
func New(cn Conn, opts ...Option) (*Client, error) {
	if cn == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrInvalid)
	}
	o := defaultOptions().with(opts)
	if o.err != nil {
		return nil, o.err
	}
	ctx, cancel := context.WithTimeout(context.Background(), newCheckTimeout)
	defer cancel()
	return newClient(ctx, newOneServer(cn, o.retention), o)
}

// newCheckTimeout bounds the server check of New and NewQuorum, which take no context.
const newCheckTimeout = 10 * time.Second

// newClient makes a Client over b once its servers passed the eviction check, and starts the
// renewal loop and the subscription.
func newClient(ctx context.Context, b backend, o options) (*Client, error) {
	logger := o.logger
	if logger == nil {
		logger = slog.Default()
	}
	tr := b.traits()
	guard := newEvictionGuard(b, tr.majority, o.evictOK, logger)
	risk, err := guard.check(ctx)
	if err == nil {
		err = risk
	}
	if err != nil {
		return nil, err
	}
	var secret [24]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return nil, fmt.Errorf("dlock: owner secret: %w", err)
	}
	e := &engine{
		b:        b,
		traits:   tr,
		guard:    guard,
		ownerID:  base64.RawURLEncoding.EncodeToString(secret[:16]) + ":",
		clientID: hex.EncodeToString(secret[16:]),
		done:     make(chan struct{}),
	}
	e.renewer = newRenewer(b, guard.check)
	e.notices = newNotifier(b.listen, e.granted)
	e.waits = newWaitQueues(e.notices)
	e.renewer.entryGone = e.waits.entryGone
	c := &Client{e: e, opts: o, meta: holderMeta(o.label)}
	c.bg.Add(2)
	go func() { defer c.bg.Done(); e.renewer.run() }()
	go func() { defer c.bg.Done(); e.notices.run() }()
	return c, nil
}

// Close ends every lease this client holds (each is released on the server, best effort, and
// its context cancelled with cause ErrClosed), makes waiting Lock calls return ErrClosed, stops
// the renewal loop and the subscription and waits for them to exit. It closes the connection
// if Dial made it. Calls after the first return nil.
func (c *Client) Close() error {
	if c == nil {
		return nil
	}
	var err error
	c.closeOnce.Do(func() {
		e := c.e
		e.closed.Store(true)
		close(e.done)
		e.renewer.stop()
		e.notices.stop()
		c.bg.Wait()
		err = errors.Join(e.releaseAll(), e.b.close())
	})
	return err
}

// releaseAll releases every lease still held when the client closes, in one round.
func (e *engine) releaseAll() error {
	held, releases := e.renewer.drain()
	for _, st := range held {
		releases = append(releases, st.releaseReq(true))
	}
	if len(releases) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	errs := e.b.renew(ctx, round{releases: releases}).relErrs
	var failed []error
	for i, st := range held {
		if err := errs[len(errs)-len(held)+i]; err != nil {
			failed = append(failed, fmt.Errorf("dlock: release %q on close: %w", st.spec.name, err))
		}
		st.end(endClosed, ErrClosed)
	}
	return errors.Join(failed...)
}

func (c *Client) checkOpen() error {
	if c == nil {
		return fmt.Errorf("%w: nil client", ErrInvalid)
	}
	if c.e.closed.Load() {
		return ErrClosed
	}
	return nil
}

// newOwner returns a secret unique to one acquisition: the client's 128 random bits plus a
// sequence number.
func (e *engine) newOwner() string {
	var buf [48]byte
	b := append(buf[:0], e.ownerID...)
	b = appendUint(b, e.seq.Add(1))
	return string(b)
}

func appendUint(b []byte, v uint64) []byte {
	var tmp [20]byte
	i := len(tmp)
	for {
		i--
		tmp[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			break
		}
	}
	return append(b, tmp[i:]...)
}

var processStart = time.Now()

// holderMeta describes this process for inspection tools (dlock status, dlock list).
func holderMeta(label string) string {
	host, _ := os.Hostname()
	b, _ := json.Marshal(struct {
		Host  string `json:"host"`
		PID   int    `json:"pid"`
		Start int64  `json:"start"`
		Label string `json:"label,omitempty"`
	}{host, os.Getpid(), processStart.Unix(), label})
	return string(b)
}

func (o options) dialOptions() []rueidisconn.DialOption {
	if o.tlsConfig == nil {
		return nil
	}
	return []rueidisconn.DialOption{rueidisconn.WithTLSConfig(o.tlsConfig)}
}

// refused reports whether err is the server's refusal by its access rules (ACL), which no
// retry can turn into a success; any other failure (a lost connection, a timeout, a server
// loading, read-only after a failover, or in a cluster slot move) may pass.
func refused(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "NOPERM") || strings.Contains(msg, "can't run this command")
}

// redisErr wraps a transport error with the server address, so "connection refused" says where.
// A server out of memory refuses an acquisition inside the script: that error says so plainly.
func (e *engine) redisErr(op string, err error) error {
	if strings.Contains(err.Error(), "OOM command not allowed") {
		return fmt.Errorf("dlock: %s on %s: %w: its used memory reached maxmemory, and its maxmemory-policy noeviction refuses new keys until memory is freed (releases still work)",
			op, e.b.addr(), ErrOutOfMemory)
	}
	return fmt.Errorf("dlock: %s on %s: %w", op, e.b.addr(), err)
}
