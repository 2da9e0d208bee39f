package dlock

import (
	"fmt"
	"strconv"
	"time"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/protocol"
)

// The calls of shared.lua, the script of the read-write locks and semaphores, and the readers
// of its replies (docs/PROTOCOL.md, "Read-write locks and semaphores"). As in scripts.go,
// nothing else in the package knows an argument's position or a reply's shape.

// sharedKind is what a hold of a read-write lock or semaphore is.
type sharedKind uint8

const (
	sharedRead    sharedKind = iota + 1 // a reader of a read-write lock
	sharedWrite                         // the writer of a read-write lock
	sharedPermits                       // permits of a semaphore
)

// rwAll is how many units a writer holds: a read-write lock counts as a semaphore of rwAll
// units, of which a reader takes one.
const rwAll = 1 << 30

// sharedSpec is what a lockSpec of a read-write lock or semaphore adds: the kind of hold and
// its units.
type sharedSpec struct {
	kind  sharedKind
	units int // 1 for a reader, rwAll for a writer, the permits asked for on a semaphore
	size  int // a semaphore's size as its handle declares it; 0 on a read-write lock
}

// kindArg is the script's name for the primitive.
func (s *sharedSpec) kindArg() string {
	if s.kind == sharedPermits {
		return "sem"
	}
	return "rw"
}

// sharedKeys returns the keys of the read-write lock or semaphore whose hash is key, in the
// order shared.lua takes them: the hash (its holders), its queue and the queue's entries.
func sharedKeys(key string) []string {
	q, w := protocol.QueueKeys(key)
	return []string{key, q, w}
}

// sharedAcquireArgs: the acquire operation takes units for owner, re-enters owner's hold,
// takes a read hold under a write hold, or, when they do not fit, queues the caller.
type sharedAcquireArgs struct {
	keys    []string    // the hash and its queue keys (sharedKeys)
	meta    string      // the holder description stored with the hold
	channel string      // where a grant is announced
	shared  *sharedSpec // the kind of hold and its units
	owner   string
	lease   string // ms
	mode    byte   // 0: take if free; 'q': queue when busy; 'r': re-enter owner's hold only; 'd': a read hold under parent's write hold
	entry   string // 'q': the caller's entry id
	window  string // 'q': its acceptance window, ms
	place   string // 'q': its place ("": the server's time)
	parent  string // 'd': the writer's owner secret
	sharded bool
}

func (a sharedAcquireArgs) call() conn.Call {
	sp := a.shared
	mode, pub := "", "p"
	if a.mode != 0 {
		mode = string(a.mode)
	}
	if a.sharded {
		pub = "s"
	}
	return conn.Call{Script: protocol.ScriptShared, Keys: a.keys, Args: []string{
		"a", a.owner, a.lease, a.meta, mode, a.channel, pub, a.entry, a.window,
		sp.kindArg(), strconv.Itoa(sp.units), strconv.Itoa(sp.size), a.parent, a.place,
	}}
}

// sharedAcquired is the acquire operation's answer.
type sharedAcquired struct {
	ok      bool
	token   uint64        // ok: the hold's token; else the last token (0: none)
	holds   int           // ok: owner's holds now
	retry   time.Duration // !ok: when to look again without a notice; negative: on a notice only
	notMine bool          // mode 'r' or 'd': owner's (or parent's) hold is gone
	size    int           // > 0: the units asked for exceed the semaphore's size, this one
	pending bool          // the caller's entry was granted, and the announcement came first
	stale   uint64        // !ok: a grant announced with a token not above it was made before the call
}

func readSharedAcquire(r []int64) (sharedAcquired, error) {
	switch {
	case len(r) != 3 && !(len(r) == 4 && r[0] == 0):
		return sharedAcquired{}, fmt.Errorf("shared.lua: unexpected reply %v", r)
	case r[0] == 1:
		return sharedAcquired{ok: true, token: uint64(r[1]), holds: int(r[2])}, nil
	case r[0] == -1:
		return sharedAcquired{size: int(r[1])}, nil
	case r[1] == -2 && r[2] == 0:
		return sharedAcquired{notMine: true, retry: -1}, nil
	}
	res := sharedAcquired{retry: time.Duration(r[1]) * time.Millisecond, token: uint64(r[2]), stale: uint64(r[2])}
	if len(r) == 4 {
		res.stale = uint64(r[3])
	}
	return res, nil
}

// sharedCall: the release operation of shared.lua gives up one hold of a.owner, the hold
// sp, or all of them (a.all), withdraws the queue entry a.leave, and grants the units freed
// to the clients queued. a.floor and a.record are release.lua's alone. Its reply reads as
// release.lua's (readRelease).
func (a releaseArgs) sharedCall(sp *sharedSpec) conn.Call {
	all, pub := "0", "p"
	if a.all {
		all = "1"
	}
	if a.sharded {
		pub = "s"
	}
	return conn.Call{Script: protocol.ScriptShared, Keys: a.keys, Args: []string{
		"r", a.owner, a.retention, a.channel, pub, all, sp.kindArg(), strconv.Itoa(sp.size), a.leave,
		strconv.Itoa(sp.units),
	}}
}

// sharedRenewCall: the renew operation extends, in one call, the lease of each hold whose
// owner still holds it. Its reply reads as renew.lua's (readRenew). Keys must share a slot on
// a Cluster.
func sharedRenewCall(keys, owners, ttls []string) conn.Call {
	args := make([]string, 0, 1+2*len(keys))
	args = append(args, "n")
	for i := range keys {
		args = append(args, owners[i], ttls[i])
	}
	return conn.Call{Script: protocol.ScriptShared, Keys: keys, Args: args}
}

// sharedPTTLCall: the pttl operation reads the lease left to owner's hold. Its reply reads as
// pttl.lua's (readPTTL).
func sharedPTTLCall(keys []string, owner string) conn.Call {
	return conn.Call{Script: protocol.ScriptShared, Keys: keys[:1], Args: []string{"t", owner}}
}

// sharedResizeArgs: the resize operation stores a semaphore's new size, sticky, and grants
// what now fits; size 0 makes a sticky size ordinary again (a reset). Reply: the former size
// (0: none stored), the units held, the holders, 1 when the former size was sticky, the size
// now (0: none), 1 when it is sticky.
func sharedResizeArgs(size int, retention, channel string, sharded bool) []string {
	pub := "p"
	if sharded {
		pub = "s"
	}
	return []string{"z", strconv.Itoa(size), retention, channel, pub}
}

// sharedForceArgs: the force operation drops every holder, whoever they are, and grants the
// units to the clients queued. Reply: the state before (sharedState), then the number of
// holders dropped.
func sharedForceArgs(retention, channel, kind string, sharded bool) []string {
	pub := "p"
	if sharded {
		pub = "s"
	}
	return []string{"f", retention, channel, pub, kind}
}

// sharedInspectArgs: the inspect operation reads the state (sharedState) and changes nothing.
var sharedInspectArgs = []string{"i"}

// sharedState is a read-write lock's or semaphore's state as the inspect and force operations
// return it.
type sharedState struct {
	exists  bool
	size    int // stored size (semaphore); 0: none
	used    int // units held by live holders
	token   uint64
	pttl    time.Duration // of the hash: how long the last token is kept
	queued  int           // live queue entries
	writers int           // among them, writers waiting
	sticky  bool          // the size was set by a resize, and stays until reset
	holders []sharedHolder
	rest    []any // what follows the holders (force: the number of holders dropped)
}

type sharedHolder struct {
	units, holds int
	token        uint64
	left         time.Duration
	meta         string
}

func readSharedState(reply any) (sharedState, error) {
	arr, ok := reply.([]any)
	if !ok || len(arr) < 8 {
		return sharedState{}, fmt.Errorf("shared.lua: unexpected reply %v", reply)
	}
	n := make([]int64, 8)
	for i := range n {
		if n[i], ok = arr[i].(int64); !ok {
			return sharedState{}, fmt.Errorf("shared.lua: unexpected reply %v", reply)
		}
	}
	st := sharedState{exists: n[0] == 1, size: int(n[1]), used: int(n[2]), token: uint64(n[3]),
		pttl: time.Duration(max(n[4], 0)) * time.Millisecond, queued: int(n[5]), writers: int(n[6]), sticky: n[7] == 1}
	i := 8
	for ; i+5 <= len(arr); i += 5 {
		var h sharedHolder
		units, ok1 := arr[i].(int64)
		holds, ok2 := arr[i+1].(int64)
		tok, ok3 := arr[i+2].(int64)
		left, ok4 := arr[i+3].(int64)
		meta, ok5 := arr[i+4].(string)
		if !ok1 || !ok2 || !ok3 || !ok4 {
			break
		}
		if !ok5 {
			meta = ""
		}
		h.units, h.holds, h.token, h.left, h.meta = int(units), int(holds), uint64(tok), time.Duration(left)*time.Millisecond, meta
		st.holders = append(st.holders, h)
	}
	st.rest = arr[i:]
	return st, nil
}
