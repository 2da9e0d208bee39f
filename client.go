package dlock

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
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
	conn    conn.Conn
	opts    options // defaults for every lock
	meta    string  // holder description for opts.label
	ownerID string  // 128 random bits; each lease's secret is ownerID + a sequence number
	seq     atomic.Uint64

	retention string // WithTokenRetention, in ms, as release.lua takes it
	quorum    bool   // conn is a quorumConn (DialQuorum, NewQuorum)
	need      int    // servers that must answer a check: 1, or the quorum's majority
	guard     *evictionGuard
	cluster   bool // conn is on a Redis Cluster: sharded pub/sub, renewals grouped by slot

	queues   queues
	renewer  *renewer
	notifier *notifier

	closeOnce sync.Once
	closed    atomic.Bool
	done      chan struct{} // closed by Close: waiters stop waiting
	bg        sync.WaitGroup
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
// cannot be reached.
func Dial(ctx context.Context, url string, opts ...Option) (*Client, error) {
	o := defaultOptions().with(opts)
	if o.err != nil {
		return nil, o.err
	}
	cn, err := rueidisconn.Dial(ctx, url, o.dialOptions()...)
	if err != nil {
		return nil, fmt.Errorf("dlock: dial: %w", err)
	}
	c, err := newClient(ctx, cn, 1, opts)
	if err != nil {
		cn.Close()
		return nil, err
	}
	c.opts.ownerConn = true
	return c, nil
}

// New returns a Client that speaks through cn, an adapter from rueidisconn or goredisconn.
// Close does not close the Redis client behind cn; its owner does. Like Dial, it reads the
// server's memory policy (within newCheckTimeout) and fails when the server cannot be reached
// or can evict lock keys (see WithUnsafeEviction).
func New(cn Conn, opts ...Option) (*Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), newCheckTimeout)
	defer cancel()
	return newClient(ctx, cn, 1, opts)
}

// newCheckTimeout bounds the server check of New and NewQuorum, which take no context.
const newCheckTimeout = 10 * time.Second

// newClient makes a Client over cn once its servers passed the eviction check; need is how
// many of them must answer it (a majority in quorum mode).
func newClient(ctx context.Context, cn Conn, need int, opts []Option) (*Client, error) {
	if cn == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrInvalid)
	}
	o := defaultOptions().with(opts)
	if o.err != nil {
		return nil, o.err
	}
	logger := o.logger
	if logger == nil {
		logger = slog.Default()
	}
	guard := newEvictionGuard(cn, o.evictOK, logger)
	risk, err := guard.check(ctx, need)
	if err == nil {
		err = risk
	}
	if err != nil {
		return nil, err
	}
	var secret [16]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return nil, fmt.Errorf("dlock: owner secret: %w", err)
	}
	c := &Client{
		conn:      cn,
		opts:      o,
		meta:      holderMeta(o.label),
		ownerID:   base64.RawURLEncoding.EncodeToString(secret[:]) + ":",
		done:      make(chan struct{}),
		guard:     guard,
		need:      need,
		retention: strconv.FormatInt(o.retention.Milliseconds(), 10),
	}
	if cl, ok := cn.(conn.Clustered); ok && cl.Cluster() {
		c.cluster = true
	}
	c.queues.init(c)
	c.renewer = newRenewer(c)
	c.notifier = newNotifier(c)
	c.bg.Add(2)
	go func() { defer c.bg.Done(); c.renewer.run() }()
	go func() { defer c.bg.Done(); c.notifier.run() }()
	return c, nil
}

// Close ends every lease this client holds (each is released on the server, best effort, and
// its context cancelled with cause ErrClosed), makes waiting Lock calls return ErrClosed, stops
// the renewal loop and the subscription and waits for them to exit. It closes the connection
// if Dial made it. Calls after the first return nil.
func (c *Client) Close() error {
	var err error
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		close(c.done)
		c.renewer.stop()
		c.notifier.stop()
		c.bg.Wait()
		err = c.releaseAll()
		if c.opts.ownerConn {
			err = errors.Join(err, c.conn.Close())
		}
	})
	return err
}

// releaseAll releases every lease still held when the client closes, in one pipeline.
func (c *Client) releaseAll() error {
	held := c.renewer.drain()
	if len(held) == 0 {
		return nil
	}
	calls := make([]conn.Call, len(held))
	for i, st := range held {
		calls[i] = st.releaseCall(true, false)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var errs []error
	for i, r := range c.conn.EvalMulti(ctx, calls) {
		if r.Err != nil {
			errs = append(errs, fmt.Errorf("dlock: release %q on close: %w", held[i].name, r.Err))
		}
		held[i].end(ErrClosed)
	}
	return errors.Join(errs...)
}

func (c *Client) checkOpen() error {
	if c == nil {
		return fmt.Errorf("%w: nil client", ErrInvalid)
	}
	if c.closed.Load() {
		return ErrClosed
	}
	return nil
}

// newOwner returns a secret unique to one acquisition: the client's 128 random bits plus a
// sequence number.
func (c *Client) newOwner() string {
	var buf [48]byte
	b := append(buf[:0], c.ownerID...)
	b = appendUint(b, c.seq.Add(1))
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

// releaseArgs are the arguments of release.lua (docs/PROTOCOL.md): on a Cluster it announces
// with SPUBLISH; a non-zero floor (the lease's token, in quorum mode or after a local handoff)
// is the least token kept after the release; count asks a final release to say how many
// subscribers heard it.
func (c *Client) releaseArgs(owner, channel string, all bool, floor uint64, count bool) []string {
	flag := "0"
	if all {
		flag = "1"
	}
	pub := "p"
	if c.cluster {
		pub = "s"
	}
	switch {
	case count:
		return []string{owner, c.retention, channel, flag, pub, strconv.FormatUint(floor, 10), "c"}
	case floor != 0:
		return []string{owner, c.retention, channel, flag, pub, strconv.FormatUint(floor, 10)}
	case c.cluster:
		return []string{owner, c.retention, channel, flag, pub}
	}
	return []string{owner, c.retention, channel, flag}
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
func (c *Client) redisErr(op string, err error) error {
	if strings.Contains(err.Error(), "OOM command not allowed") {
		return fmt.Errorf("dlock: %s on %s: %w: its used memory reached maxmemory, and its maxmemory-policy noeviction refuses new keys until memory is freed (releases still work)",
			op, c.conn.Addr(), ErrOutOfMemory)
	}
	return fmt.Errorf("dlock: %s on %s: %w", op, c.conn.Addr(), err)
}
