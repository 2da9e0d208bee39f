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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/backend"
	"github.com/dlock-go/dlock/internal/protocol"
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
	// retentionArg: opts.retention in ms, as fenced.lua takes it
	retentionArg string

	closeOnce sync.Once
	bg        sync.WaitGroup // the renewal loop and the subscription
}

// engine is the machinery every lock of one Client shares. Each part is given what it uses:
//
//   - b, the backend: runs the scripts on the deployment (internal/backend);
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
	b       backend.Backend
	traits  backend.Traits
	renewer *renewer
	waits   *waitQueues
	notices *notifier
	guard   *evictionGuard
	// ev reports the client's events (observe.go); obs is ev when someone listens to the
	// frequent ones (acquisitions, waits, releases), else nil: one branch on the fast paths.
	ev  *observer
	obs *observer
	// sharedWaits: this client's waiters for read-write locks and semaphores (sharedwait.go)
	sharedWaits *sharedWaits
	latches     latchHubs // the latches this client's callers wait for (latch.go)

	ownerID  string // 128 random bits; each lease's secret is ownerID + a sequence number
	clientID string // 64 random bits, public: names this client's queue entries
	seq      atomic.Uint64
	// spareRegs: registrations of first attempts that took the lock at once, for the next
	// first attempt (firstRegistration)
	spareRegs sync.Pool
	closed    atomic.Bool
	done      chan struct{} // closed by Close: waiters stop waiting
}

// Dial connects to Redis at url through rueidis and returns a Client that owns the connection.
// Accepted forms (see package rueidisconn for details):
//
//   - one server: redis://[user:password@]host:port[/db], rediss://… (TLS), unix:///path, or
//     a bare host:port;
//   - Redis Cluster: any node, more seeds as ?addr=host:port&addr=host:port;
//   - Sentinel: redis+sentinel://[user:password@]host:port[,host:port…]/<master name>[/<db>]
//     (the hosts are the Sentinels; the client follows their failovers).
//
// WithCAFile or WithTLSConfig set up TLS. An empty URL (or one of spaces alone) is ErrInvalid:
// it is not read as localhost. It fails fast, naming the address, when the server cannot be
// reached or what answers there is not a Redis server (both ErrUnavailable), and when it can
// evict lock keys (see WithUnsafeEviction).
func Dial(ctx context.Context, url string, opts ...ClientOption) (*Client, error) {
	o := defaultOptions().withClient(opts)
	if o.err != nil {
		return nil, o.err
	}
	if err := noURL("Dial", url); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dlock: dial: %w", err)
	}
	cn, err := rueidisconn.Dial(ctx, url, o.dialOptions()...)
	if err != nil {
		return nil, dialErr(url, err)
	}
	s := backend.NewOneServer(cn, o.retention)
	s.Own = true
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
// or is not a Redis server (ErrUnavailable), or can evict lock keys (see WithUnsafeEviction).
func New(cn Conn, opts ...ClientOption) (*Client, error) {
	if cn == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrInvalid)
	}
	o := defaultOptions().withClient(opts)
	if o.err != nil {
		return nil, o.err
	}
	if err := o.noTLS("New"); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), newCheckTimeout)
	defer cancel()
	return newClient(ctx, backend.NewOneServer(cn, o.retention), o)
}

// newCheckTimeout bounds the server check of New and NewQuorum, which take no context.
const newCheckTimeout = 10 * time.Second

// newClient makes a Client over b once its servers passed the eviction check, and starts the
// renewal loop and the subscription.
func newClient(ctx context.Context, b backend.Backend, o options) (*Client, error) {
	logger := o.logger
	if logger == nil {
		logger = slog.Default()
	}
	tr := b.Traits()
	guard := newEvictionGuard(b, tr.Majority, o.evictOK, logger)
	risk, err := guard.check(ctx)
	if err != nil {
		var nr *notRedisError
		if errors.As(err, &nr) && tr.Servers == 1 {
			return nil, fmt.Errorf("dlock: %w", nr) // that, not "cannot read the memory policy"
		}
		if kind := classify(err); kind != nil && !errors.Is(err, kind) {
			err = fmt.Errorf("%w (%w)", err, kind)
		}
		return nil, err
	}
	if risk != nil {
		return nil, risk
	}
	if o.ackN > 0 {
		if err := replicasShort(ctx, b, o.ackN); err != nil {
			return nil, err
		}
	}
	if err := probe(ctx, b, o.prefix); err != nil {
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
	e.ev = newObserver(logger, o.observers)
	if e.ev.hot() {
		e.obs = e.ev
	}
	if qb, ok := b.(*backend.Quorum); ok {
		qb.OnNodeError = e.ev.nodeError
	}
	e.renewer = newRenewer(b, guard.check)
	e.renewer.ev = e.ev
	e.notices = newNotifier(b.Listen, e.granted)
	e.notices.own = e.clientID + "."
	e.notices.ev = e.ev
	e.waits = newWaitQueues(e.notices)
	e.renewer.entryGone = e.waits.entryGone
	e.renewer.lockEnds = e.waits.lockEnds
	e.renewer.waiting = e.waits.entryWaiters
	e.sharedWaits = newSharedWaits(e)
	o.ttlMS, o.ttlMSFor = protocol.Millis(o.ttl), o.ttl
	c := &Client{e: e, opts: o, meta: holderMeta(o.label), retentionArg: protocol.Millis(o.retention)}
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
		e.forgetParked()
		e.renewer.stop()
		e.notices.stop()
		c.bg.Wait()
		err = joinErrors(e.releaseAll(), e.b.Close())
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
	errs := e.b.Renew(ctx, backend.Round{Releases: releases}).RelErrs
	var failed []error
	for i, st := range held {
		if err := errs[len(errs)-len(held)+i]; err != nil {
			failed = append(failed, fmt.Errorf("dlock: release %q on close: %w", st.spec.name, err))
		}
		st.end(endClosed, ErrClosed)
	}
	return joinErrors(failed...)
}

// Ping checks that this client can reach the Redis servers it needs, for a readiness probe.
// It sends PING to the server (through Sentinel, to the current master; on a Cluster, to every
// master the slot map names: each holds some locks) and returns nil when every one answered.
// A server that refused the connection, did not answer within ctx, or is not a Redis server
// gives an error naming it that wraps ErrUnavailable and the cause (ErrDenied when it refused
// this user); several such errors are joined on one line. Through the go-redis transport a
// Cluster's Ping first has go-redis reload the slot map from one node: when that node does not
// answer, every master may be reported (each error names it), not only the one that is down.
//
// In quorum mode Ping returns nil as soon as a majority of the servers answered, as a lock
// needs no more: with a minority down it passes, and so do locks (each server's error goes to
// the Observer's NodeError and the DEBUG log). When a majority cannot answer it waits for
// every server (within ctx) and returns a *QuorumError (ErrNoQuorum, ErrUnavailable) that
// says what each server did.
//
// Ping waits as long as ctx allows: give it the probe's deadline. It takes no lock and reads
// no setting (a server that may evict keys passes; acquisitions then fail with
// ErrEvictionPolicy). After Close it returns ErrClosed.
func (c *Client) Ping(ctx context.Context) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("dlock: ping: %w", err)
	}
	return c.e.b.Ping(ctx)
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

// noTLS refuses TLS options given to New or NewQuorum, which do not dial: the connection
// they are given was set up by its owner.
func (o options) noTLS(fn string) error {
	if o.tlsConfig != nil {
		return fmt.Errorf("%w: %s: WithTLSConfig and WithCAFile set up the connections Dial and DialQuorum make; configure TLS on the client given to %s", ErrInvalid, fn, fn)
	}
	return nil
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
	var qe *QuorumError
	if errors.As(err, &qe) { // it names every server itself
		return fmt.Errorf("dlock: %s: %w", op, err)
	}
	switch kind := classify(err); kind {
	case ErrOutOfMemory:
		return fmt.Errorf("dlock: %s on %s: %w: its used memory reached maxmemory, and its maxmemory-policy noeviction refuses new keys until memory is freed (releases still work)",
			op, e.b.Addr(), ErrOutOfMemory)
	case nil:
		return fmt.Errorf("dlock: %s on %s: %w", op, e.b.Addr(), err)
	default:
		return fmt.Errorf("dlock: %s on %s: %w (%w)", op, e.b.Addr(), err, kind)
	}
}

// noURL refuses an empty URL (or one of spaces alone): rueidis would read it as
// localhost:6379, and the usual cause is an environment variable that is not set.
func noURL(fn, url string) error {
	if strings.TrimSpace(url) == "" {
		return fmt.Errorf("%w: %s: the Redis URL is empty, give one such as redis://host:6379/0 (an environment variable that is not set is the usual cause)", ErrInvalid, fn)
	}
	return nil
}

// dialErr wraps a failure to connect to url: bad input is ErrInvalid, a refused login
// ErrDenied, an unreachable server ErrUnavailable, and so is an address where something other
// than a Redis server answered (notRedisError).
func dialErr(url string, err error) error {
	switch kind := classify(err); {
	case speaksOtherProtocol(err):
		return fmt.Errorf("dlock: dial: %w", newNotRedis(rueidisconn.NewRedialing(url).Addr(), err))
	case strings.HasPrefix(err.Error(), "bad redis url"):
		return fmt.Errorf("dlock: dial: %w (%w)", err, ErrInvalid)
	case kind != nil:
		return fmt.Errorf("dlock: dial: %w (%w)", err, kind)
	}
	return fmt.Errorf("dlock: dial: %w", err)
}

// replicasShort reports a master with fewer than n replicas connected (INFO replication):
// WithReplicaAck(n, …) could never be satisfied there.
func replicasShort(ctx context.Context, b backend.Backend, n int) error {
	for _, r := range b.Masters(ctx, "INFO", "replication") {
		if r.Err != nil {
			continue // unreachable now: acquisitions will say so
		}
		text, _ := r.Reply.(string)
		for line := range strings.SplitSeq(text, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_slaves:"); ok {
				if k, err := strconv.Atoi(v); err == nil && k < n {
					return fmt.Errorf("%w: WithReplicaAck(%d, …): server %s has %d replica(s) connected, so no acquisition could be acknowledged",
						ErrReplicaAck, n, r.Addr, k)
				}
			}
		}
	}
	return nil
}

// probe fails with ErrDenied when the user may not run a command dlock's scripts call, naming
// the commands: without it, the first Lock or Unlock that needs one would fail halfway (a
// release that writes and then may not announce itself), or waits would fall back on lease
// times. Subscribing is checked when it first happens (notify.go).
func probe(ctx context.Context, b backend.Backend, prefix string) error {
	var nonce [6]byte
	rand.Read(nonce[:])
	key := protocol.LockKey(prefix, "dlock-probe:"+hex.EncodeToString(nonce[:]))
	q, w := protocol.QueueKeys(key)
	denied, addr, err := b.Probe(ctx, []string{key, q, w}, protocol.ReleaseChannel(key))
	switch {
	case len(denied) > 0:
		return fmt.Errorf("%w: server %s refuses this user the commands %s that dlock's scripts run: add +%s to its ACL rule (docs/SECURITY.md)",
			ErrDenied, addr, strings.Join(denied, ", "), strings.Join(denied, " +"))
	case err != nil && classify(err) == ErrDenied:
		return fmt.Errorf("%w: server %s refuses this user dlock's scripts or keys: %v (docs/SECURITY.md gives the ACL rule)", ErrDenied, addr, err)
	case err != nil && speaksOtherProtocol(err) && b.Traits().Servers == 1:
		// Reached with WithUnsafeEviction, which lets an unreadable memory policy pass.
		return fmt.Errorf("dlock: %w", newNotRedis(addr, err))
	}
	return nil // other failures: the acquisitions will say
}
