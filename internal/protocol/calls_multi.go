package protocol

import (
	"fmt"
	"strconv"
	"time"

	"github.com/dlock-go/dlock/conn"
)

// The calls and replies of the scripts of multi-locks and latches: multiacquire.lua,
// multirelease.lua and latch.lua.

// MultiReleaseArgs: multirelease.lua releases every hold of each request's owner, each lock as
// release.lua does; the keys of one call share a slot.
type MultiReleaseArgs struct {
	Reqs      []ReleaseArgs // Keys, Owner, Floor and Leave of each lock
	Retention string
	Sharded   bool
}

func (a MultiReleaseArgs) Call() conn.Call {
	keys := make([]string, 0, 3*len(a.Reqs))
	args := make([]string, 0, 2+3*len(a.Reqs))
	args = append(args, a.Retention, PubArg(a.Sharded))
	for _, r := range a.Reqs {
		keys = append(keys, r.Keys...)
		args = append(args, r.Owner, strconv.FormatUint(r.Floor, 10), r.Leave)
	}
	return conn.Call{Script: ScriptMultiRelease, Keys: keys, Args: args}
}

// ReadMultiRelease returns, per lock, whether its owner held it (it is released now).
func ReadMultiRelease(r []int64, n int) ([]Released, error) {
	if len(r) != n {
		return nil, fmt.Errorf("multirelease.lua: %d answers for %d locks", len(r), n)
	}
	out := make([]Released, n)
	for i, v := range r {
		out[i].Owned = v == 0
	}
	return out, nil
}

// MultiAcquireArgs: multiacquire.lua takes several locks of one slot, all or none (or, with
// Prefix, the free ones before the first busy one), and queues the caller at a busy one.
type MultiAcquireArgs struct {
	Keys    []string // per lock, in the global order: its key and queue keys (the root's lockSpec.keys)
	Owner   string   // the owner secret of the locks taken
	TTL     string   // the lease, ms
	Meta    string   // the holder description
	Prefix  bool     // ordered mode: take the free locks before the first busy one
	Sharded bool     // announce with SPUBLISH (Redis Cluster)
	Entry   string   // the caller's queue entry id; "" to queue nowhere
	At      string   // where to queue: "*" the first busy lock, "<i>" lock i (1-based) only
	EOwner  string   // the entry's owner secret (also the owner of lock At when taken)
	Window  string   // the entry's acceptance window, ms
}

func (a MultiAcquireArgs) Call() conn.Call {
	mode := "a"
	if a.Prefix {
		mode = "p"
	}
	at := a.At
	if a.Entry == "" {
		at = ""
	}
	return conn.Call{Script: ScriptMultiAcquire, Keys: a.Keys, Args: []string{
		a.Owner, a.TTL, a.Meta, mode, PubArg(a.Sharded), a.Entry, at, a.EOwner, a.Window,
	}}
}

// MultiAcquired is multiacquire.lua's answer, with 0-based indexes.
type MultiAcquired struct {
	Busy   int           // the first busy lock; -1 when every lock was taken
	PTTL   time.Duration // busy's remaining lease (or the window of a grant just made)
	Token  uint64        // busy's holder's token
	Tokens []uint64      // per lock: the token when this call took or claimed it, else 0
}

func ReadMultiAcquire(r []int64, n int) (MultiAcquired, error) {
	if len(r) != 3+n || r[0] < 0 || r[0] > int64(n) {
		return MultiAcquired{}, fmt.Errorf("multiacquire.lua: unexpected reply %v for %d locks", r, n)
	}
	res := MultiAcquired{Busy: int(r[0]) - 1, PTTL: time.Duration(r[1]) * time.Millisecond, Token: uint64(r[2]), Tokens: make([]uint64, n)}
	for i := range n {
		res.Tokens[i] = uint64(r[3+i])
	}
	return res, nil
}

// LatchArgs: latch.lua reads a latch (creating it when absent), counts it down, or only reads.
type LatchArgs struct {
	Key       string
	Op        byte   // 'c' read or create, 'd' count down, 's' read only
	Count     int    // the initial count; 0: never create
	TTL       string // ms
	Retention string // ms: how long an expired latch's record stays after its deadline
	Channel   string
	Sharded   bool
	ID        string // with 'd': the count-down's id ("" for none)
}

func (a LatchArgs) Call() conn.Call {
	return conn.Call{Script: ScriptLatch, Keys: []string{a.Key}, Args: []string{
		string(a.Op), strconv.Itoa(a.Count), a.TTL, a.Retention, a.Channel, PubArg(a.Sharded), a.ID,
	}}
}

// LatchState is latch.lua's answer.
type LatchState struct {
	Status  int // latch.lua's: 0 read, 1 counted, 2 id counted before, 3 other count, 4 none
	Left    int
	Initial int
	Rest    time.Duration // until the deadline; 0 or less: expired
}

// The values of LatchState.Status.
const (
	LatchRead = iota
	LatchCounted
	LatchCountedBefore
	LatchOtherCount
	LatchNone
)

func ReadLatch(r []int64) (LatchState, error) {
	if len(r) != 4 || r[0] < LatchRead || r[0] > LatchNone {
		return LatchState{}, fmt.Errorf("latch.lua: unexpected reply %v", r)
	}
	return LatchState{Status: int(r[0]), Left: int(r[1]), Initial: int(r[2]), Rest: time.Duration(r[3]) * time.Millisecond}, nil
}
