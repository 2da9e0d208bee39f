// Package backend runs dlock's scripts on a deployment: Backend is what the engine (the root
// package: leases, the renewal loop, the waits, the subscription) speaks to, OneServer its
// implementation on one Redis deployment (a server, Sentinel, or a Cluster), with the batching
// of concurrent calls (batch.go) and the multi-lock and latch calls (multi.go), and Quorum its
// implementation on independent servers under the majority rule. The wire format is
// internal/protocol's; the errors are internal/errs'.
package backend

import (
	"context"
	"time"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/protocol"
)

// Backend runs dlock's scripts on a deployment: one server (standalone, Sentinel or Cluster,
// through any conn.Conn: server.go) or a quorum of independent servers
// (quorum.go). It is the only part of the engine that knows which; the locks, the
// renewal loop, the wait queues and the subscription speak to this interface. Errors are the
// transport's, without the address: the caller adds it (addr).
type Backend interface {
	// Acquire runs acquire.lua. With ack.N > 0 it also asks that many replicas to acknowledge
	// it and reports how many did (-1 when not asked or unknown).
	Acquire(ctx context.Context, a protocol.AcquireArgs, ack ReplicaAck) (res protocol.Acquired, acked int, err error)
	// Release runs release.lua.
	Release(ctx context.Context, r ReleaseReq) (protocol.Released, error)
	// Renew sends one renewal round in one round trip where it can: the background releases
	// first (one error per release), then the renewals (one outcome per lease), then the
	// refreshes of queue entries (one outcome per entry: ok, gone, or an error).
	Renew(ctx context.Context, r Round) RoundResult
	// PTTL runs pttl.lua: the remaining lease, and false when owner lost the lock.
	PTTL(ctx context.Context, keys []string, owner string) (time.Duration, bool, error)
	// Handover runs handover.lua; only where Traits().Handover.
	Handover(ctx context.Context, h protocol.HandoverArgs) (protocol.HandedOver, error)
	// Listen opens the subscription on which release notices arrive.
	Listen(ctx context.Context, h conn.Handler) (conn.Listener, error)

	// The reads and writes of inspection and administration (the root's admin.go), and of
	// the eviction check (evict.go): replies with strings.
	Inspect(ctx context.Context, keys []string) (any, error)
	Scan(ctx context.Context, cursor, pattern string) (any, error)
	ForceUnlock(ctx context.Context, key, channel string) (any, error)
	Masters(ctx context.Context, args ...string) []conn.MasterReply
	// Run runs one script call and, with ack.N > 0, asks that many replicas to acknowledge it
	// (reporting how many did, -1 when not asked or unknown): the read-write locks and
	// semaphores (the root's shared.go) build and read their own calls. Only where Traits().Shared.
	Run(ctx context.Context, c conn.Call, ack ReplicaAck) (reply []int64, acked int, err error)
	// EvalAny runs a script whose reply may hold strings (their inspection and administration).
	EvalAny(ctx context.Context, s *conn.Script, keys []string, args ...string) (any, error)
	// Probe runs probe.lua on a key of a name nobody locks (keys: it and its queue keys) and
	// returns the commands the user may not run, and the server that said so.
	Probe(ctx context.Context, keys []string, channel string) (denied []string, addr string, err error)

	// Ping sends PING to the servers the client needs (Client.Ping): on one server or through
	// Sentinel its master, on a Cluster every master; in quorum mode until a majority
	// answered. Errors are errs.PingErr's, naming each server.
	Ping(ctx context.Context) error

	Traits() Traits
	Addr() string // the server(s), for error messages; never with a password
	Close() error
}

// Traits are what a deployment can do, for the parts that adapt to it.
type Traits struct {
	// Majority is how many servers must agree, of servers: 1 of 1 on one server.
	Majority, Servers int
	// LocalHandoffs: a lock may pass among one client's waiters without any command (the
	// waiter takes over the holder's lease with the next token).
	LocalHandoffs bool
	// Handover: it may also pass to one of them through handover.lua (a new owner and token in
	// one round trip), which checks that no other client is queued.
	Handover bool
	// ReplicaAck: WithReplicaAck can be honoured.
	ReplicaAck bool
	// Queue: waiting clients queue on the server, and a release grants the lock to the first
	// of them (docs/PROTOCOL.md, "The queue").
	Queue bool
	// Shared: read-write locks and semaphores can be had (the root's shared.go); Sharded: their scripts
	// announce with SPUBLISH (Redis Cluster).
	Shared, Sharded bool
	// Multi: the deployment's calls for multi-locks and latches (multi.go), nil where
	// it has none (quorum mode: multi-locks take their names one by one, and latches are
	// refused). Every capability is asked here, in the traits, never of the backend's type.
	Multi Multi
}

// ReplicaAck asks that an acquisition or renewal count only once n replicas have it.
type ReplicaAck struct {
	N    int
	Wait time.Duration
}

// ReleaseReq is a release as a lease asks for it; the backend adds what the deployment
// decides (the token retention, sharded announcements).
type ReleaseReq struct {
	Keys    []string
	Channel string
	Owner   string
	All     bool   // every hold, not one
	Floor   uint64 // the lease's token: the least token the released value keeps
	Leave   string // a client id whose queue entry goes too
	// Shared: a read-write lock's or semaphore's hold, released by shared.lua (nil: a mutex)
	Shared *protocol.SharedSpec
	Record string // adaptive lease: record the hold, keeping the record this long (ms)
}

// Renewal is one lease in a renewal round.
type Renewal struct {
	Key    string
	Owner  string
	TTL    string // ms
	Ack    ReplicaAck
	Shared bool // a read-write lock's or semaphore's hold, renewed by shared.lua
}

// Queued is one of a client's queue entries to keep alive.
type Queued struct {
	Key     string // the lock key
	ID      string // the entry's (its registration's)
	Window  string // ms
	Waiting string // goroutines of the client waiting for the lock (decimal); "" when unknown
	Watch   bool   // a Mutex's entry: the refresh reports when the lock may next be free
}

// Renewed is the outcome of one renewal: extended, lost (the owner no longer holds the
// lock, or the entry is gone), or neither, with the error to retry after.
type Renewed struct {
	OK  bool
	Err error
	On  uint64 // quorum mode: the servers that renewed it
	// Released: not ok because the server holds the lock released (renew.lua's -1): someone
	// other than the holder released it, an administrator's ForceUnlock.
	Released bool
	// LockLeft, for a queue entry refreshed with watch: how long after the refresh was sent
	// the lock may be free (0: free then; protocol.LockLeftUnknown: not told). Unset for leases.
	LockLeft time.Duration
}

// Round is one renewal round: background releases, lease renewals, queue entry refreshes.
type Round struct {
	Releases []ReleaseReq
	Leases   []Renewal
	Entries  []Queued
}

// RoundResult answers a round: one error per release, one outcome per lease and per entry.
type RoundResult struct {
	RelErrs []error
	Leases  []Renewed
	Entries []Renewed
}
