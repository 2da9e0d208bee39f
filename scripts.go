package dlock

import (
	"embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/protocol"
)

// The Lua scripts, and for each the one function that builds its call and the one that reads
// its reply. docs/PROTOCOL.md describes their keys, arguments and replies; nothing else in the
// package knows an argument's position or a reply's shape.

//go:embed scripts/*.lua scripts/lib/*.lua
var scriptFS embed.FS

func mustScript(name string) *conn.Script {
	src, err := scriptFS.ReadFile("scripts/" + name)
	if err != nil {
		panic("dlock: missing embedded script " + name) // a build defect, not a runtime condition
	}
	lib, err := scriptFS.ReadFile("scripts/lib/common.lua")
	if err != nil {
		panic("dlock: missing the embedded script library")
	}
	full, err := assemble(string(lib), string(src))
	if err != nil {
		panic("dlock: script " + name + ": " + err.Error()) // a build defect too
	}
	return conn.NewScript(name, full)
}

// assemble puts the blocks of the script library lib that src asks for on its first line
// ("-- uses: a, b") into src, each once, with the blocks they need (scripts/lib/common.lua says
// how a block is written). A script that asks for none is src as it is. The blocks go before
// the script's text, or where it has marks (lines of their own):
//
//	-- (library: a, b)  here blocks a and b, and those they need that are not placed yet
//	-- (library)        here every other block asked for
//
// So a path that returns before a mark builds none of the blocks placed there (a Lua local
// function costs a closure on every call). Blocks placed together are in lib's order; a block
// named at a mark must be one the first line asks for.
func assemble(lib, src string) (string, error) {
	first, _, _ := strings.Cut(src, "\n")
	uses, ok := strings.CutPrefix(strings.TrimSpace(first), "-- uses:")
	if !ok {
		return src, nil
	}
	l := parseLibrary(lib)
	want := map[string]bool{}
	for _, name := range names(uses) {
		if err := l.with(want, name); err != nil {
			return "", err
		}
	}
	lines := strings.SplitAfter(src, "\n")
	marks, claimed, full, err := findMarks(lines, want)
	if err != nil {
		return "", err
	}
	unclaimed := func() []string {
		var out []string
		for name := range want {
			if !claimed[name] {
				out = append(out, name)
			}
		}
		return out
	}
	placed := map[string]bool{}
	if !full {
		// The blocks no mark names go first, before the script's text.
		text, err := l.place(placed, unclaimed())
		if err != nil {
			return "", err
		}
		lines[0] = text + lines[0]
	}
	for _, m := range marks {
		todo := m.named
		if todo == nil {
			todo = unclaimed()
		}
		text, err := l.place(placed, todo)
		if err != nil {
			return "", err
		}
		lines[m.line] = text
	}
	return strings.Join(lines, ""), nil
}

// library is the script library's blocks, in its file's order, and by name.
type library struct {
	blocks []*libBlock
	byName map[string]*libBlock
}

type libBlock struct {
	name  string
	needs []string
	text  strings.Builder
}

// parseLibrary reads the blocks of lib: each starts at a line "--- <name>", optionally
// followed by "(needs: a, b)".
func parseLibrary(lib string) *library {
	l := &library{byName: map[string]*libBlock{}}
	var cur *libBlock
	for _, line := range strings.SplitAfter(lib, "\n") {
		if head, ok := strings.CutPrefix(line, "--- "); ok {
			name, rest, _ := strings.Cut(strings.TrimSpace(head), " ")
			cur = &libBlock{name: name}
			if needs, ok := strings.CutPrefix(strings.TrimSpace(rest), "(needs:"); ok {
				for _, n := range strings.Split(strings.TrimSuffix(needs, ")"), ",") {
					cur.needs = append(cur.needs, strings.TrimSpace(n))
				}
			}
			l.blocks = append(l.blocks, cur)
			l.byName[name] = cur
			continue
		}
		if cur != nil {
			cur.text.WriteString(line)
		}
	}
	return l
}

// with adds name and every block it needs to set.
func (l *library) with(set map[string]bool, name string) error {
	b := l.byName[name]
	if b == nil {
		return fmt.Errorf("uses %q, which the script library does not have", name)
	}
	if set[name] {
		return nil
	}
	set[name] = true
	for _, n := range b.needs {
		if err := l.with(set, n); err != nil {
			return err
		}
	}
	return nil
}

// place returns the text of the blocks todo and those they need, in the library's order, but
// for those placed already (recorded in placed).
func (l *library) place(placed map[string]bool, todo []string) (string, error) {
	set := map[string]bool{}
	for _, name := range todo {
		if err := l.with(set, name); err != nil {
			return "", err
		}
	}
	var out strings.Builder
	for _, b := range l.blocks {
		if set[b.name] && !placed[b.name] {
			placed[b.name] = true
			out.WriteString(strings.TrimRight(b.text.String(), "\n"))
			out.WriteString("\n")
		}
	}
	return out.String(), nil
}

// libMark is a library mark in a script: at line, the blocks named (nil: "-- (library)", the
// blocks no other mark names).
type libMark struct {
	line  int
	named []string
}

// findMarks finds the library marks in a script's lines, in order, with the blocks named at
// partial marks (claimed; each must be one the script asks for, in want) and whether a full
// mark is among them.
func findMarks(lines []string, want map[string]bool) (marks []libMark, claimed map[string]bool, full bool, err error) {
	claimed = map[string]bool{}
	for i, line := range lines {
		t := strings.TrimSpace(line)
		if t == libraryMark {
			marks = append(marks, libMark{line: i})
			full = true
		} else if rest, ok := strings.CutPrefix(t, libraryMarkOf); ok && strings.HasSuffix(rest, ")") {
			m := libMark{line: i, named: names(strings.TrimSuffix(rest, ")"))}
			for _, n := range m.named {
				if !want[n] {
					return nil, nil, false, fmt.Errorf("places %q at a mark, but its first line does not ask for it", n)
				}
				claimed[n] = true
			}
			marks = append(marks, m)
		}
	}
	return marks, claimed, full, nil
}

// names splits a list "a, b" into its names.
func names(list string) []string {
	var out []string
	for _, n := range strings.Split(list, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// libraryMark, a line of its own in a script, is where assemble puts the library's blocks that
// no other mark places (instead of before the script's text): what comes before it runs
// without them. libraryMarkOf starts a mark that places the blocks it names: "-- (library: a, b)".
const (
	libraryMark   = "-- (library)"
	libraryMarkOf = "-- (library:"
)

var (
	scriptAcquire     = mustScript("acquire.lua")
	scriptRelease     = mustScript("release.lua")
	scriptRenew       = mustScript("renew.lua")
	scriptPTTL        = mustScript("pttl.lua")
	scriptHandover    = mustScript("handover.lua")
	scriptQueue       = mustScript("queue.lua")
	scriptProbe       = mustScript("probe.lua")
	scriptInspect     = mustScript("inspect.lua")
	scriptForceUnlock = mustScript("forceunlock.lua")
	scriptShared      = mustScript("shared.lua") // read-write locks and semaphores: scripts_shared.go
)

// Scripts returns the Lua scripts dlock runs, for inspection and for loading them ahead of time
// (SCRIPT LOAD) on servers that restrict EVAL.
func Scripts() []*conn.Script {
	return []*conn.Script{scriptAcquire, scriptRelease, scriptRenew, scriptPTTL, scriptHandover, scriptQueue, scriptInspect, scriptForceUnlock, scriptProbe,
		scriptMultiAcquire, scriptMultiRelease, scriptLatch, scriptShared, scriptFenced}
}

// ms is a duration as the scripts take it: whole milliseconds, in decimal.
func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

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
	return conn.Call{Script: scriptAcquire, Keys: a.keys, Args: args}
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
	return conn.Call{Script: scriptRelease, Keys: a.keys, Args: args}
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
	return conn.Call{Script: scriptRenew, Keys: keys, Args: args}
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
	return conn.Call{Script: scriptPTTL, Keys: keys[:1], Args: []string{owner}}
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
	return conn.Call{Script: scriptQueue, Keys: keys, Args: args}
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
	return conn.Call{Script: scriptHandover, Keys: a.keys[:2], Args: []string{
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
