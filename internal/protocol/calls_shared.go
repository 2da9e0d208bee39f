package protocol

import (
	"fmt"
	"strconv"
	"time"

	"github.com/dlock-go/dlock/conn"
)

// The calls of shared.lua, the script of the read-write locks and semaphores, and the readers
// of its replies (docs/PROTOCOL.md, "Read-write locks and semaphores"). As in calls.go,
// nothing else in dlock knows an argument's position or a reply's shape.

// SharedKind is what a hold of a read-write lock or semaphore is.
type SharedKind uint8

const (
	SharedRead    SharedKind = iota + 1 // a reader of a read-write lock
	SharedWrite                         // the writer of a read-write lock
	SharedPermits                       // permits of a semaphore
)

// RWAll is how many units a writer holds: a read-write lock counts as a semaphore of RWAll
// units, of which a reader takes one.
const RWAll = 1 << 30

// SharedSpec is what a lock handle of a read-write lock or semaphore adds (the root's
// lockSpec.shared): the kind of hold and its units.
type SharedSpec struct {
	Kind  SharedKind
	Units int // 1 for a reader, RWAll for a writer, the permits asked for on a semaphore
	Size  int // a semaphore's size as its handle declares it; 0 on a read-write lock
}

// KindArg is the script's name for the primitive.
func (s *SharedSpec) KindArg() string {
	if s.Kind == SharedPermits {
		return "sem"
	}
	return "rw"
}

// SharedKeys returns the keys of the read-write lock or semaphore whose hash is key, in the
// order shared.lua takes them: the hash (its holders), its queue and the queue's entries.
func SharedKeys(key string) []string {
	q, w := QueueKeys(key)
	return []string{key, q, w}
}

// SharedAcquireArgs: the acquire operation takes units for owner, re-enters owner's hold,
// takes a read hold under a write hold, or, when they do not fit, queues the caller.
type SharedAcquireArgs struct {
	Keys    []string    // the hash and its queue keys (SharedKeys)
	Meta    string      // the holder description stored with the hold
	Channel string      // where a grant is announced
	Shared  *SharedSpec // the kind of hold and its units
	Owner   string
	Lease   string // ms
	Mode    byte   // 0: take if free; 'q': queue when busy; 'r': re-enter owner's hold only; 'd': a read hold under parent's write hold
	Entry   string // 'q': the caller's entry id
	Window  string // 'q': its acceptance window, ms
	Place   string // 'q': its place ("": the server's time)
	Parent  string // 'd': the writer's owner secret
	Sharded bool
}

func (a SharedAcquireArgs) Call() conn.Call {
	sp := a.Shared
	mode, pub := "", "p"
	if a.Mode != 0 {
		mode = string(a.Mode)
	}
	if a.Sharded {
		pub = "s"
	}
	return conn.Call{Script: ScriptShared, Keys: a.Keys, Args: []string{
		"a", a.Owner, a.Lease, a.Meta, mode, a.Channel, pub, a.Entry, a.Window,
		sp.KindArg(), strconv.Itoa(sp.Units), strconv.Itoa(sp.Size), a.Parent, a.Place,
	}}
}

// SharedAcquired is the acquire operation's answer.
type SharedAcquired struct {
	OK      bool
	Token   uint64        // ok: the hold's token; else the last token (0: none)
	Holds   int           // ok: owner's holds now
	Retry   time.Duration // !ok: when to look again without a notice; negative: on a notice only
	NotMine bool          // mode 'r' or 'd': owner's (or parent's) hold is gone
	Size    int           // > 0: the units asked for exceed the semaphore's size, this one
	Pending bool          // the caller's entry was granted, and the announcement came first
	Stale   uint64        // !ok: a grant announced with a token not above it was made before the call
}

func ReadSharedAcquire(r []int64) (SharedAcquired, error) {
	switch {
	case len(r) != 3 && !(len(r) == 4 && r[0] == 0):
		return SharedAcquired{}, fmt.Errorf("shared.lua: unexpected reply %v", r)
	case r[0] == 1:
		return SharedAcquired{OK: true, Token: uint64(r[1]), Holds: int(r[2])}, nil
	case r[0] == -1:
		return SharedAcquired{Size: int(r[1])}, nil
	case r[1] == -2 && r[2] == 0:
		return SharedAcquired{NotMine: true, Retry: -1}, nil
	}
	res := SharedAcquired{Retry: time.Duration(r[1]) * time.Millisecond, Token: uint64(r[2]), Stale: uint64(r[2])}
	if len(r) == 4 {
		res.Stale = uint64(r[3])
	}
	return res, nil
}

// SharedCall: the release operation of shared.lua gives up one hold of a.owner, the hold
// sp, or all of them (a.all), withdraws the queue entry a.leave, and grants the units freed
// to the clients queued. a.floor and a.record are release.lua's alone. Its reply reads as
// release.lua's (ReadRelease).
func (a ReleaseArgs) SharedCall(sp *SharedSpec) conn.Call {
	all, pub := "0", "p"
	if a.All {
		all = "1"
	}
	if a.Sharded {
		pub = "s"
	}
	return conn.Call{Script: ScriptShared, Keys: a.Keys, Args: []string{
		"r", a.Owner, a.Retention, a.Channel, pub, all, sp.KindArg(), strconv.Itoa(sp.Size), a.Leave,
		strconv.Itoa(sp.Units),
	}}
}

// SharedRenewCall: the renew operation extends, in one call, the lease of each hold whose
// owner still holds it. Its reply reads as renew.lua's (ReadRenew). Keys must share a slot on
// a Cluster.
func SharedRenewCall(keys, owners, ttls []string) conn.Call {
	args := make([]string, 0, 1+2*len(keys))
	args = append(args, "n")
	for i := range keys {
		args = append(args, owners[i], ttls[i])
	}
	return conn.Call{Script: ScriptShared, Keys: keys, Args: args}
}

// SharedPTTLCall: the pttl operation reads the lease left to owner's hold. Its reply reads as
// pttl.lua's (ReadPTTL).
func SharedPTTLCall(keys []string, owner string) conn.Call {
	return conn.Call{Script: ScriptShared, Keys: keys[:1], Args: []string{"t", owner}}
}

// SharedResizeArgs: the resize operation stores a semaphore's new size, sticky, and grants
// what now fits; size 0 makes a sticky size ordinary again (a reset). Reply: the former size
// (0: none stored), the units held, the holders, 1 when the former size was sticky, the size
// now (0: none), 1 when it is sticky.
func SharedResizeArgs(size int, retention, channel string, sharded bool) []string {
	pub := "p"
	if sharded {
		pub = "s"
	}
	return []string{"z", strconv.Itoa(size), retention, channel, pub}
}

// SharedForceArgs: the force operation drops every holder, whoever they are, and grants the
// units to the clients queued. Reply: the state before (SharedState), then the number of
// holders dropped.
func SharedForceArgs(retention, channel, kind string, sharded bool) []string {
	pub := "p"
	if sharded {
		pub = "s"
	}
	return []string{"f", retention, channel, pub, kind}
}

// SharedInspectArgs: the inspect operation reads the state (SharedState) and changes nothing.
var SharedInspectArgs = []string{"i"}

// SharedState is a read-write lock's or semaphore's state as the inspect and force operations
// return it.
type SharedState struct {
	Exists  bool
	Size    int // stored size (semaphore); 0: none
	Used    int // units held by live holders
	Token   uint64
	PTTL    time.Duration // of the hash: how long the last token is kept
	Queued  int           // live queue entries
	Writers int           // among them, writers waiting
	Sticky  bool          // the size was set by a resize, and stays until reset
	Holders []SharedHolder
	Rest    []any // what follows the holders (force: the number of holders dropped)
}

type SharedHolder struct {
	Units, Holds int
	Token        uint64
	Left         time.Duration
	Meta         string
}

func ReadSharedState(reply any) (SharedState, error) {
	arr, ok := reply.([]any)
	if !ok || len(arr) < 8 {
		return SharedState{}, fmt.Errorf("shared.lua: unexpected reply %v", reply)
	}
	n := make([]int64, 8)
	for i := range n {
		if n[i], ok = arr[i].(int64); !ok {
			return SharedState{}, fmt.Errorf("shared.lua: unexpected reply %v", reply)
		}
	}
	st := SharedState{Exists: n[0] == 1, Size: int(n[1]), Used: int(n[2]), Token: uint64(n[3]),
		PTTL: time.Duration(max(n[4], 0)) * time.Millisecond, Queued: int(n[5]), Writers: int(n[6]), Sticky: n[7] == 1}
	i := 8
	for ; i+5 <= len(arr); i += 5 {
		var h SharedHolder
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
		h.Units, h.Holds, h.Token, h.Left, h.Meta = int(units), int(holds), uint64(tok), time.Duration(left)*time.Millisecond, meta
		st.Holders = append(st.Holders, h)
	}
	st.Rest = arr[i:]
	return st, nil
}
