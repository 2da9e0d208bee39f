package protocol

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/dlock-go/dlock/conn"
)

// The calls and replies of the scripts, as the header of each script in scripts/ lays them out
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

// acquire.lua: KEYS = the lock key and its queue keys; ARGV = owner, lease ms, description,
// mode ("r": re-enter only, "q": queue when held, "": neither), channel, "s" (SPUBLISH) or "p",
// the client id, for "q" the acceptance window ms, and optionally the entry's place.
func TestAcquireArgs_Call(t *testing.T) {
	keys := []string{"dlock:{n}", "dlock:{n}:q", "dlock:{n}:w"}
	a := AcquireArgs{Keys: keys, Owner: "secret:1", TTL: "3000", Meta: "{}", Channel: "dlock:{n}:rel", Client: "c1"}
	checkCall(t, "acquire", a.Call(), ScriptAcquire, keys, []string{"secret:1", "3000", "{}", "", "dlock:{n}:rel", "p", "c1", ""})
	r := a
	r.ReenterOnly = true
	checkCall(t, "re-enter only", r.Call(), ScriptAcquire, keys, []string{"secret:1", "3000", "{}", "r", "dlock:{n}:rel", "p", "c1", ""})
	q := a
	q.Queue, q.Sharded, q.Window = true, true, "900"
	checkCall(t, "queue, sharded", q.Call(), ScriptAcquire, keys, []string{"secret:1", "3000", "{}", "q", "dlock:{n}:rel", "s", "c1", "900"})
	q.Place = "1796000000000000"
	checkCall(t, "queue at a place", q.Call(), ScriptAcquire, keys, []string{"secret:1", "3000", "{}", "q", "dlock:{n}:rel", "s", "c1", "900", "1796000000000000"})
}

func TestReadAcquire(t *testing.T) {
	for _, tc := range []struct {
		reply []int64
		want  Acquired
	}{
		{[]int64{1, 1700000000000000, 1}, Acquired{OK: true, Token: 1700000000000000, Holds: 1}},
		{[]int64{1, 42, 3}, Acquired{OK: true, Token: 42, Holds: 3}},               // re-entered
		{[]int64{0, -2, 0}, Acquired{NotMine: true, PTTL: -1}},                     // re-enter only, not the caller's
		{[]int64{0, 1500, 42}, Acquired{PTTL: 1500 * time.Millisecond, Token: 42}}, // held by another
		{[]int64{0, 0, 42}, Acquired{PTTL: 0, Token: 42}},                          // its lease ends now
	} {
		got, err := ReadAcquire(tc.reply)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("readAcquire(%v) = %+v, %v; want %+v", tc.reply, got, err, tc.want)
		}
	}
	for _, bad := range [][]int64{nil, {1, 42}, {1, 42, 1, 0}} {
		if got, err := ReadAcquire(bad); err == nil {
			t.Errorf("readAcquire(%v) = %+v, want an error", bad, got)
		}
	}
}

// release.lua: KEYS = the lock key and its queue keys; ARGV = owner, retention ms, channel,
// "1" (all holds) or "0" (one), "s" (SPUBLISH) or "p", the token floor ("0": none), and
// optionally a client id whose queue entry goes too.
func TestReleaseArgs_Call(t *testing.T) {
	keys := []string{"dlock:{n}", "dlock:{n}:q", "dlock:{n}:w"}
	base := ReleaseArgs{Keys: keys, Owner: "secret:1", Retention: "60000", Channel: "dlock:{n}:rel"}
	for _, tc := range []struct {
		what string
		edit func(*ReleaseArgs)
		tail []string
	}{
		{"one hold", func(*ReleaseArgs) {}, []string{"0", "p", "0"}},
		{"all holds", func(a *ReleaseArgs) { a.All = true }, []string{"1", "p", "0"}},
		{"sharded", func(a *ReleaseArgs) { a.Sharded = true }, []string{"0", "s", "0"}},
		{"floor", func(a *ReleaseArgs) { a.Floor = 42 }, []string{"0", "p", "42"}},
		{"leaving client", func(a *ReleaseArgs) { a.All, a.Leave = true, "c1" }, []string{"1", "p", "0", "c1"}},
		{"everything", func(a *ReleaseArgs) { a.All, a.Sharded, a.Floor, a.Leave = true, true, 7, "c1" }, []string{"1", "s", "7", "c1"}},
	} {
		a := base
		tc.edit(&a)
		checkCall(t, tc.what, a.Call(), ScriptRelease, keys, append([]string{"secret:1", "60000", "dlock:{n}:rel"}, tc.tail...))
	}
}

func TestReadRelease(t *testing.T) {
	for _, tc := range []struct {
		reply []int64
		want  Released
	}{
		{[]int64{-1}, Released{}},                    // not the owner's
		{[]int64{0}, Released{Owned: true}},          // released (granted or announced)
		{[]int64{2}, Released{Owned: true, Left: 2}}, // holds left
	} {
		got, err := ReadRelease(tc.reply)
		if err != nil || got != tc.want {
			t.Errorf("readRelease(%v) = %+v, %v; want %+v", tc.reply, got, err, tc.want)
		}
	}
	for _, bad := range [][]int64{nil, {0, 3}, {-1, 0}} {
		if got, err := ReadRelease(bad); err == nil {
			t.Errorf("readRelease(%v) = %+v, want an error", bad, got)
		}
	}
}

// renew.lua: KEYS = lock keys; ARGV = owner and lease ms of each key, in turn.
func TestRenewCall(t *testing.T) {
	keys := []string{"dlock:{a}", "dlock:{b}"}
	checkCall(t, "renew", RenewCall(keys, []string{"oa", "ob"}, []string{"300", "600"}), ScriptRenew, keys, []string{"oa", "300", "ob", "600"})
	got, err := ReadRenew([]int64{1, 0, 1}, 3)
	if err != nil || !slices.Equal(got, []bool{true, false, true}) {
		t.Errorf("readRenew({1, 0, 1}) = %v, %v", got, err)
	}
	if got, err := ReadRenew([]int64{1}, 2); err == nil {
		t.Errorf("readRenew: one answer for two keys = %v, want an error", got)
	}
}

// pttl.lua: KEYS[1] = the lock key (of the lock's keys); ARGV = owner; the reply is the key's
// PTTL, or -2 when owner does not hold it.
func TestPTTLCall(t *testing.T) {
	keys := []string{"dlock:{n}", "dlock:{n}:q", "dlock:{n}:w"}
	checkCall(t, "pttl", PTTLCall(keys, "secret:1"), ScriptPTTL, keys[:1], []string{"secret:1"})
	if d, ok, err := ReadPTTL([]int64{1500}); d != 1500*time.Millisecond || !ok || err != nil {
		t.Errorf("readPTTL({1500}) = %v, %v, %v", d, ok, err)
	}
	if d, ok, err := ReadPTTL([]int64{-2}); d != 0 || ok || err != nil {
		t.Errorf("readPTTL({-2}) = %v, %v, %v; want not held", d, ok, err)
	}
	for _, bad := range [][]int64{nil, {1, 2}} {
		if _, _, err := ReadPTTL(bad); err == nil {
			t.Errorf("readPTTL(%v): no error", bad)
		}
	}
}

// queue.lua: KEYS = the queue keys of each lock and the lock key, in triples; ARGV = the
// entry id, window ms and "l" (a Mutex's entry: report the lock) or "" of each, in turn, then,
// optionally, the goroutines waiting behind each. Reply: 1 per entry kept alive, 0 per entry
// gone, then per entry the lock's time left in ms (0 free, -1 not told).
func TestQueueCall(t *testing.T) {
	c := QueueCall([]string{"dlock:{a}", "dlock:{b}:rw"}, []string{"ida", "idb"}, []string{"900", "1200"}, nil, []bool{true, false})
	checkCall(t, "queue", c, ScriptQueue, []string{"dlock:{a}:q", "dlock:{a}:w", "dlock:{a}", "dlock:{b}:rw:q", "dlock:{b}:rw:w", "dlock:{b}:rw"},
		[]string{"ida", "900", "l", "idb", "1200", ""})
	c = QueueCall([]string{"dlock:{a}", "dlock:{b}"}, []string{"ida", "idb"}, []string{"900", "1200"}, []string{"3", "1"}, nil)
	checkCall(t, "queue", c, ScriptQueue, []string{"dlock:{a}:q", "dlock:{a}:w", "dlock:{a}", "dlock:{b}:q", "dlock:{b}:w", "dlock:{b}"},
		[]string{"ida", "900", "", "idb", "1200", "", "3", "1"})
	got, left, err := ReadQueue([]int64{0, 1, 1, -1, 0, 350}, 3)
	if err != nil || !slices.Equal(got, []bool{false, true, true}) ||
		!slices.Equal(left, []time.Duration{LockLeftUnknown, 0, 350 * time.Millisecond}) {
		t.Errorf("readQueue({0, 1, 1, -1, 0, 350}) = %v, %v, %v", got, left, err)
	}
	if got, _, err := ReadQueue([]int64{1}, 1); err == nil {
		t.Errorf("readQueue: one answer for one lock = %v, want an error (two per lock)", got)
	}
}

// handover.lua: KEYS = the lock key and its queue (not the entries); ARGV = holder's owner, the
// waiter's owner, lease ms, description, handovers in a row, the count from which to check,
// this client's id and the holder's token.
func TestHandoverArgs_Call(t *testing.T) {
	keys := []string{"dlock:{n}", "dlock:{n}:q", "dlock:{n}:w"}
	h := HandoverArgs{Keys: keys, Holder: "old:1", Owner: "new:2", TTL: "3000", Meta: "{}", Streak: 3, CheckAt: 15,
		Client: "c1", HolderToken: 77}
	checkCall(t, "handover", h.Call(), ScriptHandover, keys[:2], []string{"old:1", "new:2", "3000", "{}", "3", "15", "c1", "77"})
}

func TestReadHandover(t *testing.T) {
	for _, tc := range []struct {
		reply []int64
		want  HandedOver
	}{
		{[]int64{1, 99}, HandedOver{OK: true, Token: 99}},
		{[]int64{0, 0}, HandedOver{Refused: true}},
		{[]int64{-1, 0}, HandedOver{}}, // the holder lost the lock
	} {
		got, err := ReadHandover(tc.reply)
		if err != nil || got != tc.want {
			t.Errorf("readHandover(%v) = %+v, %v; want %+v", tc.reply, got, err, tc.want)
		}
	}
	for _, bad := range [][]int64{nil, {1}, {1, 2, 3}} {
		if got, err := ReadHandover(bad); err == nil {
			t.Errorf("readHandover(%v) = %+v, want an error", bad, got)
		}
	}
}

// The adaptive lease's arguments and replies, as acquire.lua and release.lua lay them out,
// checked without a server. A lock without the option sends exactly what it sent before
// (TestAcquireArgs_Call, TestReleaseArgs_Call).

// acquire.lua: with the adaptive lease, KEYS end with the hold record and ARGV with the place
// ("" for the server's time) and the bounds in ms.
func TestAcquireArgs_CallAdaptive(t *testing.T) {
	keys := []string{"dlock:{n}", "dlock:{n}:q", "dlock:{n}:w", "dlock:{n}:h"}
	a := AcquireArgs{Keys: keys, Owner: "secret:1", TTL: "3000", Meta: "{}", Channel: "dlock:{n}:rel", Client: "c1",
		AdaptLo: "100", AdaptHi: "3000"}
	checkCall(t, "adaptive", a.Call(), ScriptAcquire, keys, []string{"secret:1", "3000", "{}", "", "dlock:{n}:rel", "p", "c1", "", "", "100", "3000"})
	a.Queue, a.Window, a.Place = true, "900", "1796000000000000"
	checkCall(t, "adaptive, queued at a place", a.Call(), ScriptAcquire, keys,
		[]string{"secret:1", "3000", "{}", "q", "dlock:{n}:rel", "p", "c1", "900", "1796000000000000", "100", "3000"})
}

func TestReadAcquire_Adaptive(t *testing.T) {
	for _, tc := range []struct {
		reply []int64
		want  Acquired
	}{
		{[]int64{1, 42, 1, 750}, Acquired{OK: true, Token: 42, Holds: 1, TTL: 750 * time.Millisecond}},
		{[]int64{0, 1500, 42, 300}, Acquired{PTTL: 1500 * time.Millisecond, Token: 42, TTL: 300 * time.Millisecond}},
	} {
		got, err := ReadAcquire(tc.reply)
		if err != nil || got.OK != tc.want.OK || got.Token != tc.want.Token || got.Holds != tc.want.Holds || got.PTTL != tc.want.PTTL || got.TTL != tc.want.TTL {
			t.Errorf("readAcquire(%v) = %+v, %v; want %+v", tc.reply, got, err, tc.want)
		}
	}
	for _, bad := range [][]int64{{1, 42, 1, 0}, {1, 42, 1, -5}, {1, 42, 1, 750, 1}} {
		if got, err := ReadAcquire(bad); err == nil {
			t.Errorf("readAcquire(%v) = %+v, want an error", bad, got)
		}
	}
}

// release.lua: with a hold to record, ARGV ends with the leaving entry ("" for none) and the
// record's retention in ms.
func TestReleaseArgs_CallRecord(t *testing.T) {
	keys := []string{"dlock:{n}", "dlock:{n}:q", "dlock:{n}:w", "dlock:{n}:h"}
	a := ReleaseArgs{Keys: keys, Owner: "secret:1", Retention: "60000", Channel: "dlock:{n}:rel", All: true, Floor: 42, Record: "86400000"}
	checkCall(t, "record", a.Call(), ScriptRelease, keys, []string{"secret:1", "60000", "dlock:{n}:rel", "1", "p", "42", "", "86400000"})
	a.Leave = "c1.7"
	checkCall(t, "record and leave", a.Call(), ScriptRelease, keys, []string{"secret:1", "60000", "dlock:{n}:rel", "1", "p", "42", "c1.7", "86400000"})
}
