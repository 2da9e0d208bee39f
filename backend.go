package dlock

import (
	"context"
	"time"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/protocol"
)

// backend runs dlock's scripts on a deployment: one server (standalone, Sentinel or Cluster,
// through any conn.Conn: backend_server.go) or a quorum of independent servers
// (backend_quorum.go). It is the only part of the engine that knows which; the locks, the
// renewal loop, the wait queues and the subscription speak to this interface. Errors are the
// transport's, without the address: the caller adds it (addr).
type backend interface {
	// acquire runs acquire.lua. With ack.n > 0 it also asks that many replicas to acknowledge
	// it and reports how many did (-1 when not asked or unknown).
	acquire(ctx context.Context, a protocol.AcquireArgs, ack replicaAck) (res protocol.Acquired, acked int, err error)
	// release runs release.lua.
	release(ctx context.Context, r releaseReq) (protocol.Released, error)
	// renew sends one renewal round in one round trip where it can: the background releases
	// first (one error per release), then the renewals (one outcome per lease), then the
	// refreshes of queue entries (one outcome per entry: ok, gone, or an error).
	renew(ctx context.Context, r round) roundResult
	// pttl runs pttl.lua: the remaining lease, and false when owner lost the lock.
	pttl(ctx context.Context, keys []string, owner string) (time.Duration, bool, error)
	// handover runs handover.lua; only where traits().handover.
	handover(ctx context.Context, h protocol.HandoverArgs) (protocol.HandedOver, error)
	// listen opens the subscription on which release notices arrive.
	listen(ctx context.Context, h conn.Handler) (conn.Listener, error)

	// The reads and writes of inspection and administration (admin.go), and of the
	// eviction check (evict.go): replies with strings.
	inspect(ctx context.Context, keys []string) (any, error)
	scan(ctx context.Context, cursor, pattern string) (any, error)
	forceUnlock(ctx context.Context, key, channel string) (any, error)
	masters(ctx context.Context, args ...string) []conn.MasterReply
	// run runs one script call and, with ack.n > 0, asks that many replicas to acknowledge it
	// (reporting how many did, -1 when not asked or unknown): the read-write locks and
	// semaphores (shared.go) build and read their own calls. Only where traits().shared.
	run(ctx context.Context, c conn.Call, ack replicaAck) (reply []int64, acked int, err error)
	// evalAny runs a script whose reply may hold strings (their inspection and administration).
	evalAny(ctx context.Context, s *conn.Script, keys []string, args ...string) (any, error)
	// probe runs probe.lua on a key of a name nobody locks (keys: it and its queue keys) and
	// returns the commands the user may not run, and the server that said so.
	probe(ctx context.Context, keys []string, channel string) (denied []string, addr string, err error)

	// ping sends PING to the servers the client needs (Client.Ping): on one server or through
	// Sentinel its master, on a Cluster every master; in quorum mode until a majority
	// answered. Errors are errs.PingErr's, naming each server.
	ping(ctx context.Context) error

	traits() traits
	addr() string // the server(s), for error messages; never with a password
	close() error
}

// traits are what a deployment can do, for the parts that adapt to it.
type traits struct {
	// majority is how many servers must agree, of servers: 1 of 1 on one server.
	majority, servers int
	// localHandoffs: a lock may pass among one client's waiters without any command (the
	// waiter takes over the holder's lease with the next token).
	localHandoffs bool
	// handover: it may also pass to one of them through handover.lua (a new owner and token in
	// one round trip), which checks that no other client is queued.
	handover bool
	// replicaAck: WithReplicaAck can be honoured.
	replicaAck bool
	// queue: waiting clients queue on the server, and a release grants the lock to the first
	// of them (docs/PROTOCOL.md, "The queue").
	queue bool
	// shared: read-write locks and semaphores can be had (shared.go); sharded: their scripts
	// announce with SPUBLISH (Redis Cluster).
	shared, sharded bool
	// multi: the deployment's calls for multi-locks and latches (backend_multi.go), nil where
	// it has none (quorum mode: multi-locks take their names one by one, and latches are
	// refused). Every capability is asked here, in the traits, never of the backend's type.
	multi multiBackend
}

// replicaAck asks that an acquisition or renewal count only once n replicas have it.
type replicaAck struct {
	n    int
	wait time.Duration
}

// releaseReq is a release as a lease asks for it; the backend adds what the deployment
// decides (the token retention, sharded announcements).
type releaseReq struct {
	keys    []string
	channel string
	owner   string
	all     bool   // every hold, not one
	floor   uint64 // the lease's token: the least token the released value keeps
	leave   string // a client id whose queue entry goes too
	// shared: a read-write lock's or semaphore's hold, released by shared.lua (nil: a mutex)
	shared *protocol.SharedSpec
	record string // adaptive lease: record the hold, keeping the record this long (ms)
}

// renewal is one lease in a renewal round.
type renewal struct {
	key    string
	owner  string
	ttl    string // ms
	ack    replicaAck
	shared bool // a read-write lock's or semaphore's hold, renewed by shared.lua
}

// queued is one of a client's queue entries to keep alive.
type queued struct {
	key     string // the lock key
	id      string // the entry's (its registration's)
	window  string // ms
	waiting string // goroutines of the client waiting for the lock (decimal); "" when unknown
	watch   bool   // a Mutex's entry: the refresh reports when the lock may next be free
}

// renewed is the outcome of one renewal: extended, lost (the owner no longer holds the
// lock, or the entry is gone), or neither, with the error to retry after.
type renewed struct {
	ok  bool
	err error
	on  uint64 // quorum mode: the servers that renewed it
	// released: not ok because the server holds the lock released (renew.lua's -1): someone
	// other than the holder released it, an administrator's ForceUnlock.
	released bool
	// lockLeft, for a queue entry refreshed with watch: how long after the refresh was sent
	// the lock may be free (0: free then; protocol.LockLeftUnknown: not told). Unset for leases.
	lockLeft time.Duration
}

// round is one renewal round: background releases, lease renewals, queue entry refreshes.
type round struct {
	releases []releaseReq
	leases   []renewal
	entries  []queued
}

// roundResult answers a round: one error per release, one outcome per lease and per entry.
type roundResult struct {
	relErrs []error
	leases  []renewed
	entries []renewed
}
