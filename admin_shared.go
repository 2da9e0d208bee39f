package dlock

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/dlock-go/dlock/internal/protocol"
)

// Inspection and administration of read-write locks and semaphores: what Inspect, List and
// ForceUnlock (admin.go) add for them.

// Kinds of lock in Info.Kind.
const (
	KindMutex     = ""          // a Mutex
	KindRWMutex   = "rwmutex"   // a read-write lock (RWMutex)
	KindSemaphore = "semaphore" // a semaphore (Semaphore)
)

// SharedInfo describes the holders and waiters of a read-write lock or semaphore.
type SharedInfo struct {
	// Size is a semaphore's size as stored on the server, the one every handle uses (0 when
	// none is: nobody held it within the token retention, and no resize set it); 0 for a
	// read-write lock.
	Size int
	// SizeSticky reports that Size was set by Client.ResizeSemaphore: it stays, held or not,
	// until resized again or reset (Client.ResetSemaphoreSize).
	SizeSticky bool
	// Permits is how many permits of a semaphore are held; for a read-write lock, the number of
	// read holders.
	Permits int
	// Writer reports whether a writer holds a read-write lock (with Readers, a writer's own read
	// holds, taken under it).
	Writer bool
	// Readers is the number of read holders of a read-write lock.
	Readers int
	// Queued is how many callers wait in the server's queue (each has an entry of its own);
	// WritersQueued how many of them wait to write.
	Queued, WritersQueued int
	// Holders lists every hold, each with its own lease.
	Holders []ShareHolder
}

// ShareHolder is one hold of a read-write lock or semaphore.
type ShareHolder struct {
	Holder  Holder
	Write   bool          // the write hold of a read-write lock
	Permits int           // a semaphore's permits held; 1 for a reader, 0 for a writer
	Holds   int           // re-entries count
	Token   uint64        // the hold's fencing token
	TTL     time.Duration // its lease left
}

// kind returns which primitive spec is a hold of: KindMutex, KindRWMutex or KindSemaphore.
func (spec *lockSpec) kind() string {
	switch {
	case spec.shared == nil:
		return KindMutex
	case spec.shared.Kind == protocol.SharedPermits:
		return KindSemaphore
	}
	return KindRWMutex
}

// sharedInfo makes the Info of a read-write lock (kind protocol.SharedRead or
// protocol.SharedWrite) or semaphore (protocol.SharedPermits) called name from its state.
func sharedInfo(name string, kind protocol.SharedKind, s protocol.SharedState) Info {
	// Every waiting caller has an entry of its own: waiters and goroutines are one count.
	info := Info{Name: name, Kind: KindRWMutex, Token: s.Token, Waiters: s.Queued, WaitingGoroutines: s.Queued}
	sh := &SharedInfo{Queued: s.Queued, WritersQueued: s.Writers}
	if kind == protocol.SharedPermits {
		info.Kind, sh.Size, sh.SizeSticky, sh.WritersQueued = KindSemaphore, s.Size, s.Sticky, 0
	}
	info.Shared = sh
	var first *ShareHolder
	for _, h := range s.Holders {
		x := ShareHolder{Holder: parseHolder(h.Meta), Permits: h.Units, Holds: h.Holds, Token: h.Token, TTL: h.Left}
		switch {
		case kind == protocol.SharedPermits:
			sh.Permits += h.Units
		case h.Units >= protocol.RWAll:
			x.Write, x.Permits, sh.Writer = true, 0, true
			info.Token, info.Holder, info.Holds = h.Token, x.Holder, h.Holds
		default:
			sh.Readers++
			sh.Permits++
		}
		info.TTL = max(info.TTL, h.Left)
		sh.Holders = append(sh.Holders, x)
		if first == nil {
			first = &sh.Holders[len(sh.Holders)-1]
		}
	}
	info.Held = len(sh.Holders) > 0
	if info.Held && !sh.Writer {
		info.Holder, info.Holds = first.Holder, len(sh.Holders)
		if kind == protocol.SharedPermits {
			info.Token = first.Token
		}
	}
	return info
}

// parseHolder reads a holder description (docs/PROTOCOL.md); zero when it is not one.
func parseHolder(meta string) Holder {
	var d struct {
		Host  string `json:"host"`
		PID   int    `json:"pid"`
		Start int64  `json:"start"`
		Label string `json:"label"`
	}
	if json.Unmarshal([]byte(meta), &d) != nil {
		return Holder{}
	}
	h := Holder{Host: d.Host, PID: d.PID, Label: d.Label}
	if d.Start > 0 {
		h.Start = time.Unix(d.Start, 0)
	}
	return h
}

// sharedKinds are the primitives besides Mutex, in the order Inspect and ForceUnlock look at
// them.
var sharedKinds = []struct {
	suffix string
	kind   protocol.SharedKind
	what   string
}{{rwSuffix, protocol.SharedWrite, "read-write lock"}, {semSuffix, protocol.SharedPermits, "semaphore"}}

// inspectShared reads the read-write lock or semaphore (suffix) called name; exists reports
// whether the server has its state (held, or its last token kept).
func (c *Client) inspectShared(ctx context.Context, name, suffix string, kind protocol.SharedKind) (Info, bool, error) {
	key := c.lockKey(name) + suffix
	reply, err := c.e.b.EvalAny(ctx, protocol.ScriptShared, protocol.SharedKeys(key), protocol.SharedInspectArgs...)
	if err != nil {
		return Info{}, false, c.e.redisErr("inspect "+strconv.Quote(name), err)
	}
	s, err := protocol.ReadSharedState(reply)
	if err != nil {
		return Info{}, false, c.badReply("inspect", name, reply)
	}
	info := sharedInfo(name, kind, s)
	info.LocalWaiters = c.e.sharedWaits.localWaiters(key)
	return info, s.Exists || s.Queued > 0, nil
}

// orShared completes Inspect: when the Mutex called name (info) is not held, a held read-write
// lock or semaphore of that name is reported instead (or, none being held, one the server
// still knows when the Mutex is unknown to it).
func (c *Client) orShared(ctx context.Context, name string, info Info) (Info, error) {
	if info.Held || !c.e.traits.Shared {
		return info, nil
	}
	var known *Info
	for _, k := range sharedKinds {
		si, exists, err := c.inspectShared(ctx, name, k.suffix, k.kind)
		if err != nil {
			return Info{}, err
		}
		if si.Held {
			return si, nil
		}
		if exists && known == nil {
			known = &si
		}
	}
	if known != nil && info.Token == 0 {
		return *known, nil
	}
	return info, nil
}

// listShared returns the held read-write locks and semaphores whose names start with prefix.
func (c *Client) listShared(ctx context.Context, prefix string) ([]Info, error) {
	if !c.e.traits.Shared {
		return nil, nil
	}
	var out []Info
	for _, k := range sharedKinds {
		err := c.scanKeys(ctx, protocol.KeyPattern(c.opts.prefix, prefix)+k.suffix, prefix, func(keys []string) error {
			for _, key := range keys {
				if len(key) <= len(k.suffix) {
					continue
				}
				name, ok := protocol.NameOfKey(c.opts.prefix, key[:len(key)-len(k.suffix)])
				if !ok {
					continue
				}
				info, _, err := c.inspectShared(ctx, name, k.suffix, k.kind)
				if err != nil {
					return err
				}
				if info.Held {
					out = append(out, info)
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// forceShared completes ForceUnlock when the Mutex called name was not held: it drops every
// holder of the read-write lock or semaphore of that name, if one is held (the first found),
// and grants its units to the callers waiting. Their former holders' leases are lost at their
// next renewal. ok is false when neither was held.
func (c *Client) forceShared(ctx context.Context, name string) (Info, bool, error) {
	if !c.e.traits.Shared {
		return Info{}, false, nil
	}
	for _, k := range sharedKinds {
		key := c.lockKey(name) + k.suffix
		kindArg := (&protocol.SharedSpec{Kind: k.kind}).KindArg()
		reply, err := c.e.b.EvalAny(ctx, protocol.ScriptShared, protocol.SharedKeys(key),
			protocol.SharedForceArgs(protocol.Millis(c.opts.retention), protocol.ReleaseChannel(key), kindArg, c.e.traits.Sharded)...)
		if err != nil {
			return Info{}, false, c.e.redisErr("force unlock "+strconv.Quote(name), err)
		}
		s, err := protocol.ReadSharedState(reply)
		if err != nil || len(s.Rest) != 1 {
			return Info{}, false, c.badReply("force unlock", name, reply)
		}
		if dropped, _ := s.Rest[0].(int64); dropped > 0 {
			return sharedInfo(name, k.kind, s), true, nil // Waiters: the callers queued, to whom it may go
		}
	}
	return Info{}, false, nil
}

// String sums up the holders and waiters in one line.
func (s *SharedInfo) String() string {
	if s == nil {
		return ""
	}
	if s.Size > 0 {
		return fmt.Sprintf("%d of %d permits held by %s, %d waiting", s.Permits, s.Size, plural(len(s.Holders), "holder", "holders"), s.Queued)
	}
	w := "no writer"
	if s.Writer {
		w = "a writer"
	}
	return fmt.Sprintf("%s and %s, %d waiting (%s)", w, plural(s.Readers, "reader", "readers"), s.Queued, plural(s.WritersQueued, "writer", "writers"))
}

// plural writes n with the noun's singular or plural form: "1 reader", "2 readers".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}
