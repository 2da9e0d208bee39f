package dlock

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/protocol"
)

// The calls and replies of the scripts, as the header of each script in internal/protocol/scripts/ lays them out
// (the reference docs/PROTOCOL.md explains), checked without a server: each builder puts its
// keys and arguments where the script reads them, and each reader maps every documented reply
// (and nothing else) to its meaning.

// checkCall fails t unless c runs script on keys with args.
func checkCall(t *testing.T, what string, c conn.Call, script *conn.Script, keys, args []string) {
	t.Helper()
	if c.Script != script || !slices.Equal(c.Keys, keys) || !slices.Equal(c.Args, args) {
		name := "<nil>"
		if c.Script != nil {
			name = c.Script.Name
		}
		t.Errorf("%s: %s KEYS %q ARGV %q; want %s KEYS %q ARGV %q", what, name, c.Keys, c.Args, script.Name, keys, args)
	}
}

// The root's Scripts is the protocol's list, in its order (internal/protocol's tests check
// that list against the embedded files).
func TestScripts_AsTheProtocolLists(t *testing.T) {
	if got, want := Scripts(), protocol.Scripts(); !slices.Equal(got, want) {
		t.Errorf("Scripts() = %v; want protocol.Scripts() = %v", got, want)
	}
}

// acquire.lua: KEYS = the lock key and its queue keys; ARGV = owner, lease ms, description,
// mode ("r": re-enter only, "q": queue when held, "": neither), channel, "s" (SPUBLISH) or "p",
// the client id, for "q" the acceptance window ms, and optionally the entry's place.
func TestAcquireArgs_Call(t *testing.T) {
	keys := []string{"dlock:{n}", "dlock:{n}:q", "dlock:{n}:w"}
	a := acquireArgs{keys: keys, owner: "secret:1", ttl: "3000", meta: "{}", channel: "dlock:{n}:rel", client: "c1"}
	checkCall(t, "acquire", a.call(), protocol.ScriptAcquire, keys, []string{"secret:1", "3000", "{}", "", "dlock:{n}:rel", "p", "c1", ""})
	r := a
	r.reenterOnly = true
	checkCall(t, "re-enter only", r.call(), protocol.ScriptAcquire, keys, []string{"secret:1", "3000", "{}", "r", "dlock:{n}:rel", "p", "c1", ""})
	q := a
	q.queue, q.sharded, q.window = true, true, "900"
	checkCall(t, "queue, sharded", q.call(), protocol.ScriptAcquire, keys, []string{"secret:1", "3000", "{}", "q", "dlock:{n}:rel", "s", "c1", "900"})
	q.place = "1796000000000000"
	checkCall(t, "queue at a place", q.call(), protocol.ScriptAcquire, keys, []string{"secret:1", "3000", "{}", "q", "dlock:{n}:rel", "s", "c1", "900", "1796000000000000"})
}

func TestReadAcquire(t *testing.T) {
	for _, tc := range []struct {
		reply []int64
		want  acquired
	}{
		{[]int64{1, 1700000000000000, 1}, acquired{ok: true, token: 1700000000000000, holds: 1}},
		{[]int64{1, 42, 3}, acquired{ok: true, token: 42, holds: 3}},               // re-entered
		{[]int64{0, -2, 0}, acquired{notMine: true, pttl: -1}},                     // re-enter only, not the caller's
		{[]int64{0, 1500, 42}, acquired{pttl: 1500 * time.Millisecond, token: 42}}, // held by another
		{[]int64{0, 0, 42}, acquired{pttl: 0, token: 42}},                          // its lease ends now
	} {
		got, err := readAcquire(tc.reply)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("readAcquire(%v) = %+v, %v; want %+v", tc.reply, got, err, tc.want)
		}
	}
	for _, bad := range [][]int64{nil, {1, 42}, {1, 42, 1, 0}} {
		if got, err := readAcquire(bad); err == nil {
			t.Errorf("readAcquire(%v) = %+v, want an error", bad, got)
		}
	}
}

// release.lua: KEYS = the lock key and its queue keys; ARGV = owner, retention ms, channel,
// "1" (all holds) or "0" (one), "s" (SPUBLISH) or "p", the token floor ("0": none), and
// optionally a client id whose queue entry goes too.
func TestReleaseArgs_Call(t *testing.T) {
	keys := []string{"dlock:{n}", "dlock:{n}:q", "dlock:{n}:w"}
	base := releaseArgs{keys: keys, owner: "secret:1", retention: "60000", channel: "dlock:{n}:rel"}
	for _, tc := range []struct {
		what string
		edit func(*releaseArgs)
		tail []string
	}{
		{"one hold", func(*releaseArgs) {}, []string{"0", "p", "0"}},
		{"all holds", func(a *releaseArgs) { a.all = true }, []string{"1", "p", "0"}},
		{"sharded", func(a *releaseArgs) { a.sharded = true }, []string{"0", "s", "0"}},
		{"floor", func(a *releaseArgs) { a.floor = 42 }, []string{"0", "p", "42"}},
		{"leaving client", func(a *releaseArgs) { a.all, a.leave = true, "c1" }, []string{"1", "p", "0", "c1"}},
		{"everything", func(a *releaseArgs) { a.all, a.sharded, a.floor, a.leave = true, true, 7, "c1" }, []string{"1", "s", "7", "c1"}},
	} {
		a := base
		tc.edit(&a)
		checkCall(t, tc.what, a.call(), protocol.ScriptRelease, keys, append([]string{"secret:1", "60000", "dlock:{n}:rel"}, tc.tail...))
	}
}

func TestReadRelease(t *testing.T) {
	for _, tc := range []struct {
		reply []int64
		want  released
	}{
		{[]int64{-1}, released{}},                    // not the owner's
		{[]int64{0}, released{owned: true}},          // released (granted or announced)
		{[]int64{2}, released{owned: true, left: 2}}, // holds left
	} {
		got, err := readRelease(tc.reply)
		if err != nil || got != tc.want {
			t.Errorf("readRelease(%v) = %+v, %v; want %+v", tc.reply, got, err, tc.want)
		}
	}
	for _, bad := range [][]int64{nil, {0, 3}, {-1, 0}} {
		if got, err := readRelease(bad); err == nil {
			t.Errorf("readRelease(%v) = %+v, want an error", bad, got)
		}
	}
}

// renew.lua: KEYS = lock keys; ARGV = owner and lease ms of each key, in turn.
func TestRenewCall(t *testing.T) {
	keys := []string{"dlock:{a}", "dlock:{b}"}
	checkCall(t, "renew", renewCall(keys, []string{"oa", "ob"}, []string{"300", "600"}), protocol.ScriptRenew, keys, []string{"oa", "300", "ob", "600"})
	got, err := readRenew([]int64{1, 0, 1}, 3)
	if err != nil || !slices.Equal(got, []bool{true, false, true}) {
		t.Errorf("readRenew({1, 0, 1}) = %v, %v", got, err)
	}
	if got, err := readRenew([]int64{1}, 2); err == nil {
		t.Errorf("readRenew: one answer for two keys = %v, want an error", got)
	}
}

// pttl.lua: KEYS[1] = the lock key (of the lock's keys); ARGV = owner; the reply is the key's
// PTTL, or -2 when owner does not hold it.
func TestPTTLCall(t *testing.T) {
	keys := []string{"dlock:{n}", "dlock:{n}:q", "dlock:{n}:w"}
	checkCall(t, "pttl", pttlCall(keys, "secret:1"), protocol.ScriptPTTL, keys[:1], []string{"secret:1"})
	if d, ok, err := readPTTL([]int64{1500}); d != 1500*time.Millisecond || !ok || err != nil {
		t.Errorf("readPTTL({1500}) = %v, %v, %v", d, ok, err)
	}
	if d, ok, err := readPTTL([]int64{-2}); d != 0 || ok || err != nil {
		t.Errorf("readPTTL({-2}) = %v, %v, %v; want not held", d, ok, err)
	}
	for _, bad := range [][]int64{nil, {1, 2}} {
		if _, _, err := readPTTL(bad); err == nil {
			t.Errorf("readPTTL(%v): no error", bad)
		}
	}
}

// queue.lua: KEYS = the queue keys of each lock and the lock key, in triples; ARGV = the
// entry id, window ms and "l" (a Mutex's entry: report the lock) or "" of each, in turn, then,
// optionally, the goroutines waiting behind each. Reply: 1 per entry kept alive, 0 per entry
// gone, then per entry the lock's time left in ms (0 free, -1 not told).
func TestQueueCall(t *testing.T) {
	c := queueCall([]string{"dlock:{a}", "dlock:{b}:rw"}, []string{"ida", "idb"}, []string{"900", "1200"}, nil, []bool{true, false})
	checkCall(t, "queue", c, protocol.ScriptQueue, []string{"dlock:{a}:q", "dlock:{a}:w", "dlock:{a}", "dlock:{b}:rw:q", "dlock:{b}:rw:w", "dlock:{b}:rw"},
		[]string{"ida", "900", "l", "idb", "1200", ""})
	c = queueCall([]string{"dlock:{a}", "dlock:{b}"}, []string{"ida", "idb"}, []string{"900", "1200"}, []string{"3", "1"}, nil)
	checkCall(t, "queue", c, protocol.ScriptQueue, []string{"dlock:{a}:q", "dlock:{a}:w", "dlock:{a}", "dlock:{b}:q", "dlock:{b}:w", "dlock:{b}"},
		[]string{"ida", "900", "", "idb", "1200", "", "3", "1"})
	got, left, err := readQueue([]int64{0, 1, 1, -1, 0, 350}, 3)
	if err != nil || !slices.Equal(got, []bool{false, true, true}) ||
		!slices.Equal(left, []time.Duration{lockLeftUnknown, 0, 350 * time.Millisecond}) {
		t.Errorf("readQueue({0, 1, 1, -1, 0, 350}) = %v, %v, %v", got, left, err)
	}
	if got, _, err := readQueue([]int64{1}, 1); err == nil {
		t.Errorf("readQueue: one answer for one lock = %v, want an error (two per lock)", got)
	}
}

// handover.lua: KEYS = the lock key and its queue (not the entries); ARGV = holder's owner, the
// waiter's owner, lease ms, description, handovers in a row, the count from which to check,
// this client's id and the holder's token.
func TestHandoverArgs_Call(t *testing.T) {
	keys := []string{"dlock:{n}", "dlock:{n}:q", "dlock:{n}:w"}
	h := handoverArgs{keys: keys, holder: "old:1", owner: "new:2", ttl: "3000", meta: "{}", streak: 3, checkAt: 15,
		client: "c1", holderTk: 77}
	checkCall(t, "handover", h.call(), protocol.ScriptHandover, keys[:2], []string{"old:1", "new:2", "3000", "{}", "3", "15", "c1", "77"})
}

func TestReadHandover(t *testing.T) {
	for _, tc := range []struct {
		reply []int64
		want  handedOver
	}{
		{[]int64{1, 99}, handedOver{ok: true, token: 99}},
		{[]int64{0, 0}, handedOver{refused: true}},
		{[]int64{-1, 0}, handedOver{}}, // the holder lost the lock
	} {
		got, err := readHandover(tc.reply)
		if err != nil || got != tc.want {
			t.Errorf("readHandover(%v) = %+v, %v; want %+v", tc.reply, got, err, tc.want)
		}
	}
	for _, bad := range [][]int64{nil, {1}, {1, 2, 3}} {
		if got, err := readHandover(bad); err == nil {
			t.Errorf("readHandover(%v) = %+v, want an error", bad, got)
		}
	}
}
