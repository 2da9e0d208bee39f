package dlock

import (
	"fmt"
	"strconv"
	"time"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/protocol"
)

// The Lua scripts, and for each the one function that builds its call and the one that reads
// its reply. docs/PROTOCOL.md describes their keys, arguments and replies; nothing else in the
// package knows an argument's position or a reply's shape.

// Scripts returns the Lua scripts dlock runs, for inspection and for loading them ahead of time
// (SCRIPT LOAD) on servers that restrict EVAL.
func Scripts() []*conn.Script { return protocol.Scripts() }

// ms is a duration as the scripts take it: whole milliseconds, in decimal.
func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// pubArg is the scripts' announcement argument: "s" for SPUBLISH (Redis Cluster, sharded
// pub/sub), "p" for PUBLISH.
func pubArg(sharded bool) string {
	if sharded {
		return "s"
	}
	return "p"
}

// flagArg is a script's yes-or-no argument: "1" or "0".
func flagArg(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// acquireArgs: acquire.lua takes the lock for owner, re-enters it when owner holds it, or,
// when it is held, queues the caller's client for it.
type acquireArgs struct {
	keys        []string // the lock key and its queue keys (lockSpec.keys)
	owner       string   // a secret unique to this acquisition (or to the queue entry)
	ttl         string   // the lease, ms
	meta        string   // the holder description stored with the lock
	reenterOnly bool     // never take a free lock: only add a hold to owner's
	queue       bool     // when held, queue the caller's client, with owner for a grant
	channel     string   // where a grant is announced
	sharded     bool     // announce with SPUBLISH (Redis Cluster)
	client      string   // the caller's client id: its queue entry
	window      string   // queue: the acceptance window, ms
	place       string   // queue: the entry's place ("": the server's time)
	// queuedLate (quorum mode, queue): told of a server that queued the entry after the
	// attempt was decided (and the holder's token there).
	queuedLate func(server int, token uint64)
	// adaptive lease (keys then end with the hold record): its bounds, ms; "": a fixed lease
	adaptLo, adaptHi string
}

// mode is acquire.lua's mode argument: "r" re-entry only, "q" queue when busy, "" neither.
func (a *acquireArgs) mode() string {
	switch {
	case a.reenterOnly:
		return "r"
	case a.queue:
		return "q"
	}
	return ""
}

func (a acquireArgs) call() conn.Call {
	args := []string{a.owner, a.ttl, a.meta, a.mode(), a.channel, pubArg(a.sharded), a.client, a.window}
	if a.place != "" || a.adaptHi != "" {
		args = append(args, a.place)
	}
	if a.adaptHi != "" {
		args = append(args, a.adaptLo, a.adaptHi)
	}
	return conn.Call{Script: protocol.ScriptAcquire, Keys: a.keys, Args: args}
}

// acquired is acquire.lua's answer.
type acquired struct {
	ok      bool          // taken, or re-entered
	token   uint64        // ok: the lock's token; else the holder's (0 when unknown)
	holds   int           // ok: owner's holds now
	pttl    time.Duration // !ok: the holder's remaining lease; negative when unknown
	notMine bool          // reenterOnly, and the lock is not owner's
	// dirty (quorum mode): the attempt may have left owner holding the lock on some servers;
	// they are being released in the background, so owner must not be used again.
	dirty bool
	// queuedOn (quorum mode, with a queue entry): the servers that queued or refreshed it.
	queuedOn uint64
	// tokensOn (quorum mode, !ok): the holder's token on each server that refused (0: none).
	tokensOn []uint64
	// ttl (adaptive lease): the lease the server chose: ok, the lease's; else the one a grant
	// to the caller's queue entry is renewed to. 0 for a fixed lease.
	ttl time.Duration
}

func readAcquire(r []int64) (acquired, error) {
	var ttl time.Duration
	if len(r) == 4 && r[3] > 0 {
		ttl, r = time.Duration(r[3])*time.Millisecond, r[:3]
	}
	switch {
	case len(r) != 3:
		return acquired{}, fmt.Errorf("acquire.lua: unexpected reply %v", r)
	case r[0] == 1:
		return acquired{ok: true, token: uint64(r[1]), holds: int(r[2]), ttl: ttl}, nil
	case r[1] == -2 && r[2] == 0:
		return acquired{notMine: true, pttl: -1}, nil
	}
	return acquired{pttl: time.Duration(r[1]) * time.Millisecond, token: uint64(r[2]), ttl: ttl}, nil
}

// releaseArgs: release.lua gives up one of owner's holds, or all of them; a final release
// grants the lock to the first client in its queue, or announces that it is free.
type releaseArgs struct {
	keys      []string // the lock key and its queue keys
	owner     string
	retention string // how long the released value keeps the last token, ms
	channel   string // the lock's release channel
	all       bool   // drop every hold, not one
	sharded   bool   // announce with SPUBLISH (Redis Cluster)
	floor     uint64 // the least token to keep (the lease's, which may be above the stored one); 0: none
	leave     string // a client id whose queue entry goes too (its waiters all left)
	record    string // adaptive lease: record the hold, keeping the record this long (ms); "": not
}

func (a releaseArgs) call() conn.Call {
	args := []string{a.owner, a.retention, a.channel, flagArg(a.all), pubArg(a.sharded), strconv.FormatUint(a.floor, 10)}
	if a.leave != "" || a.record != "" {
		args = append(args, a.leave)
	}
	if a.record != "" {
		args = append(args, a.record)
	}
	return conn.Call{Script: protocol.ScriptRelease, Keys: a.keys, Args: args}
}

// released is release.lua's answer.
type released struct {
	owned bool // false: owner did not hold the lock (it was lost); nothing changed
	left  int  // holds left; 0: released (and granted or announced)
}

func readRelease(r []int64) (released, error) {
	switch {
	case len(r) == 1 && r[0] < 0:
		return released{}, nil
	case len(r) == 1:
		return released{owned: true, left: int(r[0])}, nil
	}
	return released{}, fmt.Errorf("release.lua: unexpected reply %v", r)
}

// renewCall: renew.lua extends, in one call, the lease of each key whose holder is still the
// given owner. Keys must share a slot on a Cluster.
func renewCall(keys, owners, ttls []string) conn.Call {
	args := make([]string, 0, 2*len(keys))
	for i := range keys {
		args = append(args, owners[i], ttls[i])
	}
	return conn.Call{Script: protocol.ScriptRenew, Keys: keys, Args: args}
}

// readRenew returns, per key of the call, whether its lease was extended.
// renewReleased is renew.lua's answer for a lock released by someone other than its owner.
const renewReleased = -1

func readRenew(r []int64, n int) ([]bool, error) {
	if len(r) != n {
		return nil, fmt.Errorf("renew.lua: %d answers for %d keys", len(r), n)
	}
	out := make([]bool, n)
	for i, v := range r {
		out[i] = v == 1
	}
	return out, nil
}

// pttlCall: pttl.lua reads the remaining lease, for its owner only.
func pttlCall(keys []string, owner string) conn.Call {
	return conn.Call{Script: protocol.ScriptPTTL, Keys: keys[:1], Args: []string{owner}}
}

// queueCall: queue.lua keeps queue entries alive: entry ids[i] of the lock at lockKeys[i],
// for windows[i], and, when waiting is set, records waiting[i] in it: how many goroutines of
// the client wait for that lock. For an entry with watch[i] (a Mutex's: lockKeys[i] is a lock
// key, not a read-write lock's or semaphore's hash), it reports when the lock may next be
// free. Keys must share a slot on a Cluster.
func queueCall(lockKeys, ids, windows, waiting []string, watch []bool) conn.Call {
	keys := make([]string, 0, 3*len(lockKeys))
	args := make([]string, 0, 4*len(lockKeys))
	for i, k := range lockKeys {
		q, w := protocol.QueueKeys(k)
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
	return conn.Call{Script: protocol.ScriptQueue, Keys: keys, Args: args}
}

// lockLeftUnknown is readQueue's time left for a lock it was not told about.
const lockLeftUnknown = time.Duration(-1)

// readQueue returns, per lock of the call, whether the client's entry was kept alive and, for
// an entry refreshed with watch, how long until the lock may be free (0: free now;
// lockLeftUnknown: not told).
func readQueue(r []int64, n int) ([]bool, []time.Duration, error) {
	if len(r) != 2*n {
		return nil, nil, fmt.Errorf("queue.lua: %d answers for %d locks", len(r), n)
	}
	out, left := make([]bool, n), make([]time.Duration, n)
	for i, v := range r[:n] {
		out[i] = v == 1
		left[i] = lockLeftUnknown
		if l := r[n+i]; out[i] && l >= 0 {
			left[i] = time.Duration(l) * time.Millisecond
		}
	}
	return out, left, nil
}

// readPTTL returns the remaining lease, and false when owner no longer holds the lock.
func readPTTL(r []int64) (time.Duration, bool, error) {
	if len(r) != 1 {
		return 0, false, fmt.Errorf("pttl.lua: unexpected reply %v", r)
	}
	if r[0] < 0 {
		return 0, false, nil
	}
	return time.Duration(r[0]) * time.Millisecond, true, nil
}

// handoverArgs: handover.lua passes a lock from its holder straight to a waiter of the same
// client under a new owner, unless other clients queue and the client had its turn.
type handoverArgs struct {
	keys     []string // the lock key and its queue
	holder   string   // the holder's owner secret
	owner    string   // the waiter's new owner secret
	ttl      string   // the waiter's lease, ms
	meta     string   // the waiter's holder description
	streak   int      // handovers in a row so far within this client
	checkAt  int      // from this many in a row on, refuse while other clients queue
	client   string   // this client's id (its own queue entries are not another client)
	holderTk uint64   // the holder's token (local handoffs put it above the stored one)
}

func (a handoverArgs) call() conn.Call {
	return conn.Call{Script: protocol.ScriptHandover, Keys: a.keys[:2], Args: []string{
		a.holder, a.owner, a.ttl, a.meta, strconv.Itoa(a.streak), strconv.Itoa(a.checkAt),
		a.client, strconv.FormatUint(a.holderTk, 10),
	}}
}

// handedOver is handover.lua's answer.
type handedOver struct {
	ok      bool   // the waiter holds the lock
	token   uint64 // ok: its new token
	refused bool   // other clients wait: release instead
	// neither: the holder no longer owns the lock
}

func readHandover(r []int64) (handedOver, error) {
	if len(r) != 2 {
		return handedOver{}, fmt.Errorf("handover.lua: unexpected reply %v", r)
	}
	switch r[0] {
	case 1:
		return handedOver{ok: true, token: uint64(r[1])}, nil
	case 0:
		return handedOver{refused: true}, nil
	}
	return handedOver{}, nil
}
