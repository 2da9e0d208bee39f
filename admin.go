package dlock

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/backend"
	"github.com/dlock-go/dlock/internal/protocol"
)

// Info describes one lock as the server stores it, for inspection tools (dlock status, dlock
// list). It is a snapshot: the lock may change hands as soon as it is read.
type Info struct {
	Name string
	// Held reports whether someone holds the lock.
	Held bool
	// Token is the holder's fencing token as the server issued it: after local handoffs (see
	// the package documentation, Waiting) the current holder's lease carries up to 15 more.
	// For a free lock it is the last token, while the server keeps it (the token retention
	// after a release), else 0.
	Token uint64
	// Holds is the holder's number of holds (re-entries count); 0 when free.
	Holds int
	// TTL is the remaining lease as the server sees it; 0 when free.
	TTL time.Duration
	// Holder is the holder's description, stored with the lock by the library; zero when free.
	Holder Holder
	// Waiters is the number of clients waiting for the lock: the clients in its queue on the
	// server (a client queues once however many of its goroutines wait; an entry that expired
	// may count until it is cleared). From ForceUnlock: the number of clients its announcement
	// reached (the client it granted the lock to, and listeners of the release channel); -1
	// when unknown.
	Waiters int
	// WaitingGoroutines is the number of goroutines waiting for the lock in the clients
	// queued for it on the server, as each client last reported in its queue entry (it
	// refreshes the count with the entry, every third of its acceptance window: a third of a
	// second by default; an entry without a count, of an older client or not refreshed yet,
	// counts 1). So 100 goroutines of one replica waiting read as Waiters 1, WaitingGoroutines
	// 100. 0 when nobody is queued; -1 when unknown (ForceUnlock).
	WaitingGoroutines int
	// LocalWaiters is the number of goroutines of the Client that made this Info (by Inspect
	// or List) waiting for the lock right now: exact, and counted without the server.
	LocalWaiters int
	// Kind is KindRWMutex for a read-write lock, KindSemaphore for a semaphore, and empty
	// (KindMutex) for a Mutex.
	Kind string
	// Shared describes the holders and waiters of a read-write lock or semaphore; nil for a
	// Mutex. Then Held reports whether anyone holds it, Holder is the writer, or the first
	// holder, Token the writer's (a read-write lock without a writer: the last writer's, the
	// readers'; a semaphore: the first holder's), Holds the number of holders (the writer's
	// holds), and TTL the longest lease left.
	Shared *SharedInfo
	// Leader is set when the lock is held by an election's leader (Client.Election): the
	// leader, its value and term. nil otherwise.
	Leader *LeaderInfo
	// HoldStats is what the server measured of the name's holds, for a lock taken with
	// WithAdaptiveTTL (zero otherwise, and once the record expired). Inspect and List read it;
	// ForceUnlock does not.
	HoldStats HoldStats
}

// Holder describes the process that holds a lock: the description the library stores with the
// lock when it acquires it (docs/PROTOCOL.md).
type Holder struct {
	Host  string    // host name
	PID   int       // process id on Host
	Start time.Time // when the holding process started (to the second)
	Label string    // WithLabel's label; empty when none
}

// TokenTime returns the server-clock time that Token encodes: the server makes tokens as
// max(previous token + 16, server time in microseconds), so for a lock taken while the
// server's clock was ahead of the name's previous token (the usual case) it is the time of the
// acquisition, to the microsecond. When the clock was behind (it stepped back, or two
// acquisitions fell within 16 microseconds) the token is previous + 16 and this time is later
// than the acquisition. Re-entries keep the token. Zero when Token is 0.
func (i Info) TokenTime() time.Time {
	if i.Token == 0 {
		return time.Time{}
	}
	return time.UnixMicro(int64(i.Token))
}

// Inspect reads the lock called name: whether it is held, by whom, its token, holds, remaining
// lease and waiting clients. The client's key prefix applies (WithPrefix). It returns an error
// when the key holds something that is not a dlock lock value.
func (c *Client) Inspect(ctx context.Context, name string) (Info, error) {
	if err := c.checkAdmin(name); err != nil {
		return Info{}, err
	}
	key := c.lockKey(name)
	// The hold record is read as one more "lock" of inspect.lua: its value and PTTL.
	reply, err := c.e.b.Inspect(ctx, []string{key, holdKey(key)})
	if err != nil {
		return Info{}, c.e.redisErr("inspect "+strconv.Quote(name), err)
	}
	arr, ok := reply.([]any)
	if !ok || len(arr) != 2*backend.InspectWidth {
		return Info{}, c.badReply("inspect", name, reply)
	}
	info, err := parseLock(name, arr[0], arr[1])
	if err != nil {
		return Info{}, err
	}
	info.HoldStats = parseHoldStats(arr[backend.InspectWidth], arr[backend.InspectWidth+1])
	queued, _ := arr[2].(int64)
	goroutines, _ := arr[3].(int64)
	info.WaitingGoroutines = int(goroutines)
	info.LocalWaiters = c.e.waits.localWaiters(key)
	info.Waiters = int(queued)
	return c.orShared(ctx, name, info) // a read-write lock or semaphore of that name (admin_shared.go)
}

// List returns every held lock whose name starts with prefix (all held locks when prefix is
// empty), sorted by name. It walks the keys with SCAN (MATCH on the lock key pattern, COUNT
// 1000), never KEYS, so it does not block the server; like any SCAN it sees each lock that
// stays held during the walk, and may or may not see one taken or released meanwhile.
// It scans the one server the client is connected to (on Redis Cluster, one node).
func (c *Client) List(ctx context.Context, prefix string) ([]Info, error) {
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	var out []Info
	err := c.scanKeys(ctx, protocol.KeyPattern(c.opts.prefix, prefix), prefix, func(found []string) error {
		var keys []string
		for _, k := range found {
			if _, ok := protocol.NameOfKey(c.opts.prefix, k); ok {
				keys = append(keys, k)
			}
		}
		if len(keys) == 0 {
			return nil
		}
		infos, err := c.inspectKeys(ctx, keys)
		out = append(out, infos...)
		return err
	})
	if err != nil {
		return nil, err
	}
	shared, err := c.listShared(ctx, prefix) // read-write locks and semaphores (admin_shared.go)
	if err != nil {
		return nil, err
	}
	out = append(out, shared...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// scanKeys walks the keys that match pattern with SCAN (COUNT 1000) and gives each batch SCAN
// returns to page, without the keys it gave before (SCAN may return a key twice). prefix, the
// caller's, names the walk in an error.
func (c *Client) scanKeys(ctx context.Context, pattern, prefix string, page func([]string) error) error {
	seen := make(map[string]bool)
	cursor := "0"
	for {
		reply, err := c.e.b.Scan(ctx, cursor, pattern)
		if err != nil {
			return c.e.redisErr("list", err)
		}
		arr, ok := reply.([]any)
		if !ok || len(arr) != 2 {
			return c.badReply("scan", prefix, reply)
		}
		next, ok1 := arr[0].(string)
		found, ok2 := arr[1].([]any)
		if !ok1 || !ok2 {
			return c.badReply("scan", prefix, reply)
		}
		var keys []string
		for _, f := range found {
			if k, ok := f.(string); ok && !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
		if err := page(keys); err != nil {
			return err
		}
		if cursor = next; cursor == "0" {
			return nil
		}
	}
}

// inspectKeys reads the given lock keys, and their hold records, in one script call and
// returns the held ones.
func (c *Client) inspectKeys(ctx context.Context, keys []string) ([]Info, error) {
	all := slices.Clone(keys)
	for _, k := range keys {
		all = append(all, holdKey(k))
	}
	reply, err := c.e.b.Inspect(ctx, all)
	if err != nil {
		return nil, c.e.redisErr("list", err)
	}
	arr, ok := reply.([]any)
	if !ok || len(arr) != backend.InspectWidth*len(all) {
		return nil, c.badReply("list", "", reply)
	}
	rec := backend.InspectWidth * len(keys) // the hold records' replies follow the locks'
	var held []Info
	for i, key := range keys {
		name, _ := protocol.NameOfKey(c.opts.prefix, key)
		a := arr[backend.InspectWidth*i : backend.InspectWidth*(i+1)]
		info, err := parseLock(name, a[0], a[1])
		if err != nil || !info.Held {
			continue // not a lock value (another application's key), or free
		}
		q, _ := a[2].(int64)
		g, _ := a[3].(int64)
		info.HoldStats = parseHoldStats(arr[rec+backend.InspectWidth*i], arr[rec+backend.InspectWidth*i+1])
		info.Waiters = int(q)
		info.WaitingGoroutines = int(g)
		info.LocalWaiters = c.e.waits.localWaiters(key)
		held = append(held, info)
	}
	return held, nil
}

// ForceUnlock releases the lock called name whoever holds it, as an administrator would: in
// one atomic step it does what the holder's Unlock would: the first client queued for the lock
// gets it (a grant, with a larger token), or, with nobody queued, it writes the released value
// (keeping the token for the retention, so the next holder's token is larger) and publishes the
// release notice. The
// holder's lease is then lost: its next renewal fails and its lease context is cancelled with
// ErrLost (until then it may still believe it holds the lock: fencing tokens protect the
// resource). It returns what was held, with Waiters set to the number of clients the
// announcement reached (the grantee's, and any listener of the release channel); when the lock was not held it changes nothing and returns an error wrapping
// ErrNotHeld, with the Info of the free lock.
func (c *Client) ForceUnlock(ctx context.Context, name string) (Info, error) {
	if err := c.checkAdmin(name); err != nil {
		return Info{}, err
	}
	key := c.lockKey(name)
	reply, err := c.e.b.ForceUnlock(ctx, key, protocol.ReleaseChannel(key))
	if err != nil {
		return Info{}, c.e.redisErr("force unlock "+strconv.Quote(name), err)
	}
	arr, ok := reply.([]any)
	if !ok || len(arr) != 3 {
		return Info{}, c.badReply("force unlock", name, reply)
	}
	info, err := parseLock(name, arr[0], arr[1])
	if err != nil {
		return Info{}, err
	}
	woken, ok := arr[2].(int64)
	if !ok {
		return Info{}, c.badReply("force unlock", name, reply)
	}
	info.Waiters = int(woken)
	if woken < 0 || !info.Held {
		if si, ok, err := c.forceShared(ctx, name); ok || err != nil {
			return si, err // a read-write lock or semaphore of that name (admin_shared.go)
		}
		info.Waiters = -1
		return info, fmt.Errorf("%w: %q is free", ErrNotHeld, name)
	}
	return info, nil
}

func (c *Client) checkAdmin(name string) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	return checkName(name)
}

func (c *Client) lockKey(name string) string { return protocol.LockKey(c.opts.prefix, name) }

func (c *Client) badReply(op, name string, reply any) error {
	return fmt.Errorf("dlock: %s %q: unexpected reply %v from %s", op, name, reply, c.e.b.Addr())
}

// parseLock decodes a lock's value and PTTL as the inspect and forceunlock scripts return them
// (docs/PROTOCOL.md: "<owner> <token> <holds> <description>" or "- <token> 0").
func parseLock(name string, value, pttl any) (Info, error) {
	info := Info{Name: name, Waiters: -1, WaitingGoroutines: -1}
	if value == nil {
		return info, nil
	}
	v, ok := value.(string)
	if !ok {
		return info, fmt.Errorf("dlock: %q: unexpected lock value %v", name, value)
	}
	f := strings.SplitN(v, " ", 4)
	if len(f) < 3 {
		return info, fmt.Errorf("dlock: %q: the key does not hold a dlock lock value", name)
	}
	token, err1 := strconv.ParseUint(f[1], 10, 64)
	holds, err2 := strconv.Atoi(f[2])
	if err1 != nil || err2 != nil {
		return info, fmt.Errorf("dlock: %q: the key does not hold a dlock lock value", name)
	}
	info.Token = token
	if f[0] == "-" {
		return info, nil // released; the last token is kept for a while
	}
	info.Held = true
	info.Holds = holds
	if ms, ok := pttl.(int64); ok && ms > 0 {
		info.TTL = time.Duration(ms) * time.Millisecond
	}
	if len(f) == 4 {
		var d struct {
			Host  string  `json:"host"`
			PID   int     `json:"pid"`
			Start int64   `json:"start"`
			Label string  `json:"label"`
			Value *string `json:"value"`       // an election's leader (election.go)
			Raw   []byte  `json:"value_bytes"` // its value, when not UTF-8
		}
		if json.Unmarshal([]byte(f[3]), &d) == nil {
			info.Holder = Holder{Host: d.Host, PID: d.PID, Label: d.Label}
			if d.Start > 0 {
				info.Holder.Start = time.Unix(d.Start, 0)
			}
			if d.Value != nil {
				value := *d.Value
				if d.Raw != nil {
					value = string(d.Raw)
				}
				info.Leader = &LeaderInfo{Value: value, Term: token, Holder: info.Holder, Since: info.TokenTime()}
			}
		}
	}
	return info, nil
}
