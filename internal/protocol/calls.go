package protocol

import (
	"fmt"
	"strconv"
	"time"

	"github.com/dlock-go/dlock/conn"
)

// For each Lua script, the one function that builds its call and the one that reads its reply.
// docs/PROTOCOL.md describes their keys, arguments and replies; nothing else in dlock knows an
// argument's position or a reply's shape.

// Millis is a duration as the scripts take it: whole milliseconds, in decimal.
func Millis(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// PubArg is the scripts' announcement argument: "s" for SPUBLISH (Redis Cluster, sharded
// pub/sub), "p" for PUBLISH.
func PubArg(sharded bool) string {
	if sharded {
		return "s"
	}
	return "p"
}

// FlagArg is a script's yes-or-no argument: "1" or "0".
func FlagArg(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// AcquireArgs: acquire.lua takes the lock for owner, re-enters it when owner holds it, or,
// when it is held, queues the caller's client for it.
type AcquireArgs struct {
	Keys        []string // the lock key and its queue keys (the root's lockSpec.keys)
	Owner       string   // a secret unique to this acquisition (or to the queue entry)
	TTL         string   // the lease, ms
	Meta        string   // the holder description stored with the lock
	ReenterOnly bool     // never take a free lock: only add a hold to owner's
	Queue       bool     // when held, queue the caller's client, with owner for a grant
	Channel     string   // where a grant is announced
	Sharded     bool     // announce with SPUBLISH (Redis Cluster)
	Client      string   // the caller's client id: its queue entry
	Window      string   // queue: the acceptance window, ms
	Place       string   // queue: the entry's place ("": the server's time)
	// QueuedLate (quorum mode, queue): told of a server that queued the entry after the
	// attempt was decided (and the holder's token there).
	QueuedLate func(server int, token uint64)
	// adaptive lease (keys then end with the hold record): its bounds, ms; "": a fixed lease
	AdaptLo, AdaptHi string
}

// Mode is acquire.lua's mode argument: "r" re-entry only, "q" queue when busy, "" neither.
func (a *AcquireArgs) Mode() string {
	switch {
	case a.ReenterOnly:
		return "r"
	case a.Queue:
		return "q"
	}
	return ""
}

func (a AcquireArgs) Call() conn.Call {
	args := []string{a.Owner, a.TTL, a.Meta, a.Mode(), a.Channel, PubArg(a.Sharded), a.Client, a.Window}
	if a.Place != "" || a.AdaptHi != "" {
		args = append(args, a.Place)
	}
	if a.AdaptHi != "" {
		args = append(args, a.AdaptLo, a.AdaptHi)
	}
	return conn.Call{Script: ScriptAcquire, Keys: a.Keys, Args: args}
}

// Acquired is acquire.lua's answer.
type Acquired struct {
	OK      bool          // taken, or re-entered
	Token   uint64        // ok: the lock's token; else the holder's (0 when unknown)
	Holds   int           // ok: owner's holds now
	PTTL    time.Duration // !ok: the holder's remaining lease; negative when unknown
	NotMine bool          // ReenterOnly, and the lock is not owner's
	// dirty (quorum mode): the attempt may have left owner holding the lock on some servers;
	// they are being released in the background, so owner must not be used again.
	Dirty bool
	// queuedOn (quorum mode, with a queue entry): the servers that queued or refreshed it.
	QueuedOn uint64
	// tokensOn (quorum mode, !ok): the holder's token on each server that refused (0: none).
	TokensOn []uint64
	// ttl (adaptive lease): the lease the server chose: ok, the lease's; else the one a grant
	// to the caller's queue entry is renewed to. 0 for a fixed lease.
	TTL time.Duration
}

func ReadAcquire(r []int64) (Acquired, error) {
	var ttl time.Duration
	if len(r) == 4 && r[3] > 0 {
		ttl, r = time.Duration(r[3])*time.Millisecond, r[:3]
	}
	switch {
	case len(r) != 3:
		return Acquired{}, fmt.Errorf("acquire.lua: unexpected reply %v", r)
	case r[0] == 1:
		return Acquired{OK: true, Token: uint64(r[1]), Holds: int(r[2]), TTL: ttl}, nil
	case r[1] == -2 && r[2] == 0:
		return Acquired{NotMine: true, PTTL: -1}, nil
	}
	return Acquired{PTTL: time.Duration(r[1]) * time.Millisecond, Token: uint64(r[2]), TTL: ttl}, nil
}

// ReleaseArgs: release.lua gives up one of owner's holds, or all of them; a final release
// grants the lock to the first client in its queue, or announces that it is free.
type ReleaseArgs struct {
	Keys      []string // the lock key and its queue keys
	Owner     string
	Retention string // how long the released value keeps the last token, ms
	Channel   string // the lock's release channel
	All       bool   // drop every hold, not one
	Sharded   bool   // announce with SPUBLISH (Redis Cluster)
	Floor     uint64 // the least token to keep (the lease's, which may be above the stored one); 0: none
	Leave     string // a client id whose queue entry goes too (its waiters all left)
	Record    string // adaptive lease: record the hold, keeping the record this long (ms); "": not
}

func (a ReleaseArgs) Call() conn.Call {
	args := []string{a.Owner, a.Retention, a.Channel, FlagArg(a.All), PubArg(a.Sharded), strconv.FormatUint(a.Floor, 10)}
	if a.Leave != "" || a.Record != "" {
		args = append(args, a.Leave)
	}
	if a.Record != "" {
		args = append(args, a.Record)
	}
	return conn.Call{Script: ScriptRelease, Keys: a.Keys, Args: args}
}

// Released is release.lua's answer.
type Released struct {
	Owned bool // false: owner did not hold the lock (it was lost); nothing changed
	Left  int  // holds left; 0: released (and granted or announced)
}

func ReadRelease(r []int64) (Released, error) {
	switch {
	case len(r) == 1 && r[0] < 0:
		return Released{}, nil
	case len(r) == 1:
		return Released{Owned: true, Left: int(r[0])}, nil
	}
	return Released{}, fmt.Errorf("release.lua: unexpected reply %v", r)
}

// RenewCall: renew.lua extends, in one call, the lease of each key whose holder is still the
// given owner. Keys must share a slot on a Cluster.
func RenewCall(keys, owners, ttls []string) conn.Call {
	args := make([]string, 0, 2*len(keys))
	for i := range keys {
		args = append(args, owners[i], ttls[i])
	}
	return conn.Call{Script: ScriptRenew, Keys: keys, Args: args}
}

// ReadRenew returns, per key of the call, whether its lease was extended.
// RenewReleased is renew.lua's answer for a lock released by someone other than its owner.
const RenewReleased = -1

func ReadRenew(r []int64, n int) ([]bool, error) {
	if len(r) != n {
		return nil, fmt.Errorf("renew.lua: %d answers for %d keys", len(r), n)
	}
	out := make([]bool, n)
	for i, v := range r {
		out[i] = v == 1
	}
	return out, nil
}

// PTTLCall: pttl.lua reads the remaining lease, for its owner only.
func PTTLCall(keys []string, owner string) conn.Call {
	return conn.Call{Script: ScriptPTTL, Keys: keys[:1], Args: []string{owner}}
}

// QueueCall: queue.lua keeps queue entries alive: entry ids[i] of the lock at lockKeys[i],
// for windows[i], and, when waiting is set, records waiting[i] in it: how many goroutines of
// the client wait for that lock. For an entry with watch[i] (a Mutex's: lockKeys[i] is a lock
// key, not a read-write lock's or semaphore's hash), it reports when the lock may next be
// free. Keys must share a slot on a Cluster.
func QueueCall(lockKeys, ids, windows, waiting []string, watch []bool) conn.Call {
	keys := make([]string, 0, 3*len(lockKeys))
	args := make([]string, 0, 4*len(lockKeys))
	for i, k := range lockKeys {
		q, w := QueueKeys(k)
		keys = append(keys, q, w, k)
		l := ""
		if i < len(watch) && watch[i] {
			l = "l"
		}
		args = append(args, ids[i], windows[i], l)
	}
	if len(waiting) == len(lockKeys) {
		args = append(args, waiting...)
	}
	return conn.Call{Script: ScriptQueue, Keys: keys, Args: args}
}

// LockLeftUnknown is ReadQueue's time left for a lock it was not told about.
const LockLeftUnknown = time.Duration(-1)

// ReadQueue returns, per lock of the call, whether the client's entry was kept alive and, for
// an entry refreshed with watch, how long until the lock may be free (0: free now;
// LockLeftUnknown: not told).
func ReadQueue(r []int64, n int) ([]bool, []time.Duration, error) {
	if len(r) != 2*n {
		return nil, nil, fmt.Errorf("queue.lua: %d answers for %d locks", len(r), n)
	}
	out, left := make([]bool, n), make([]time.Duration, n)
	for i, v := range r[:n] {
		out[i] = v == 1
		left[i] = LockLeftUnknown
		if l := r[n+i]; out[i] && l >= 0 {
			left[i] = time.Duration(l) * time.Millisecond
		}
	}
	return out, left, nil
}

// ReadPTTL returns the remaining lease, and false when owner no longer holds the lock.
func ReadPTTL(r []int64) (time.Duration, bool, error) {
	if len(r) != 1 {
		return 0, false, fmt.Errorf("pttl.lua: unexpected reply %v", r)
	}
	if r[0] < 0 {
		return 0, false, nil
	}
	return time.Duration(r[0]) * time.Millisecond, true, nil
}

// HandoverArgs: handover.lua passes a lock from its holder straight to a waiter of the same
// client under a new owner, unless other clients queue and the client had its turn.
type HandoverArgs struct {
	Keys        []string // the lock key and its queue
	Holder      string   // the holder's owner secret
	Owner       string   // the waiter's new owner secret
	TTL         string   // the waiter's lease, ms
	Meta        string   // the waiter's holder description
	Streak      int      // handovers in a row so far within this client
	CheckAt     int      // from this many in a row on, refuse while other clients queue
	Client      string   // this client's id (its own queue entries are not another client)
	HolderToken uint64   // the holder's token (local handoffs put it above the stored one)
}

func (a HandoverArgs) Call() conn.Call {
	return conn.Call{Script: ScriptHandover, Keys: a.Keys[:2], Args: []string{
		a.Holder, a.Owner, a.TTL, a.Meta, strconv.Itoa(a.Streak), strconv.Itoa(a.CheckAt),
		a.Client, strconv.FormatUint(a.HolderToken, 10),
	}}
}

// HandedOver is handover.lua's answer.
type HandedOver struct {
	OK      bool   // the waiter holds the lock
	Token   uint64 // ok: its new token
	Refused bool   // other clients wait: release instead
	// neither: the holder no longer owns the lock
}

func ReadHandover(r []int64) (HandedOver, error) {
	if len(r) != 2 {
		return HandedOver{}, fmt.Errorf("handover.lua: unexpected reply %v", r)
	}
	switch r[0] {
	case 1:
		return HandedOver{OK: true, Token: uint64(r[1])}, nil
	case 0:
		return HandedOver{Refused: true}, nil
	}
	return HandedOver{}, nil
}

// ProclaimCall: proclaim.lua announces an election's term on the release channel and, when
// meta is not empty, stores meta as the holder description of the lock at key, for its owner
// only; sharded announces with SPUBLISH (Redis Cluster).
func ProclaimCall(key, owner, meta, channel string, sharded bool) conn.Call {
	pub := ""
	if sharded {
		pub = "s"
	}
	return conn.Call{Script: ScriptProclaim, Keys: []string{key}, Args: []string{owner, meta, channel, pub}}
}

// ReadProclaim reads proclaim.lua's reply: the lock's token, and false when owner no longer
// holds it.
func ReadProclaim(reply any) (uint64, bool, error) {
	n, ok := reply.(int64)
	if !ok || n < 0 {
		return 0, false, fmt.Errorf("proclaim.lua: unexpected reply %v", reply)
	}
	return uint64(n), n > 0, nil
}
