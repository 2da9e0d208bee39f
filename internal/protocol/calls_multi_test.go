package protocol

import (
	"slices"
	"testing"
	"time"
)

// The calls and replies of multiacquire.lua, multirelease.lua and latch.lua, as the header of
// each script lays them out, checked without a server.

func TestMultiArgs_Call(t *testing.T) {
	keys := []string{"p:{a}", "p:{a}:q", "p:{a}:w", "p:{b}", "p:{b}:q", "p:{b}:w"}
	a := MultiAcquireArgs{Keys: keys, Owner: "o:1", TTL: "3000", Meta: "{}", At: "*", EOwner: "o:2", Window: "900"}
	checkCall(t, "all or none, no entry", a.Call(), ScriptMultiAcquire, keys, []string{"o:1", "3000", "{}", "a", "p", "", "", "o:2", "900"})
	a.Entry, a.Prefix, a.Sharded = "c.7", true, true
	checkCall(t, "prefix, queue at the first busy", a.Call(), ScriptMultiAcquire, keys, []string{"o:1", "3000", "{}", "p", "s", "c.7", "*", "o:2", "900"})
	a.At = "2"
	checkCall(t, "queue at lock 2 only", a.Call(), ScriptMultiAcquire, keys, []string{"o:1", "3000", "{}", "p", "s", "c.7", "2", "o:2", "900"})
}

func TestReadMultiAcquire(t *testing.T) {
	got, err := ReadMultiAcquire([]int64{0, 0, 0, 100, 200}, 2)
	if err != nil || got.Busy != -1 || !slices.Equal(got.Tokens, []uint64{100, 200}) {
		t.Errorf("all taken: %+v, %v", got, err)
	}
	got, err = ReadMultiAcquire([]int64{2, 1500, 42, 100, 0}, 2)
	if err != nil || got.Busy != 1 || got.PTTL != 1500*time.Millisecond || got.Token != 42 || !slices.Equal(got.Tokens, []uint64{100, 0}) {
		t.Errorf("second busy: %+v, %v", got, err)
	}
	for _, bad := range [][]int64{{0, 0, 0, 1}, {3, 0, 0, 1, 2}, {-1, 0, 0, 1, 2}} {
		if _, err := ReadMultiAcquire(bad, 2); err == nil {
			t.Errorf("%v read as a reply for 2 locks", bad)
		}
	}
}

func TestMultiReleaseArgs_Call(t *testing.T) {
	a := MultiReleaseArgs{Retention: "60000", Reqs: []ReleaseArgs{
		{Keys: []string{"p:{a}", "p:{a}:q", "p:{a}:w"}, Owner: "o:1", Floor: 7},
		{Keys: []string{"p:{b}", "p:{b}:q", "p:{b}:w"}, Owner: "o:2", Leave: "c.3"},
	}}
	checkCall(t, "two locks", a.Call(), ScriptMultiRelease,
		[]string{"p:{a}", "p:{a}:q", "p:{a}:w", "p:{b}", "p:{b}:q", "p:{b}:w"},
		[]string{"60000", "p", "o:1", "7", "", "o:2", "0", "c.3"})
	got, err := ReadMultiRelease([]int64{0, -1}, 2)
	if err != nil || !got[0].Owned || got[1].Owned {
		t.Errorf("readMultiRelease = %+v, %v", got, err)
	}
	if _, err := ReadMultiRelease([]int64{0}, 2); err == nil {
		t.Error("one answer read as two")
	}
}

func TestLatchArgs_Call(t *testing.T) {
	a := LatchArgs{Key: "p:{x}:latch", Op: 'd', Count: 5, TTL: "600000", Retention: "60000", Channel: "p:{x}:latch:rel", ID: "=w1"}
	checkCall(t, "count down", a.Call(), ScriptLatch, []string{"p:{x}:latch"}, []string{"d", "5", "600000", "60000", "p:{x}:latch:rel", "p", "=w1"})
	a.Op, a.Sharded, a.ID = 's', true, ""
	checkCall(t, "read only", a.Call(), ScriptLatch, []string{"p:{x}:latch"}, []string{"s", "5", "600000", "60000", "p:{x}:latch:rel", "s", ""})
	got, err := ReadLatch([]int64{1, 3, 5, 1200})
	if err != nil || got != (LatchState{Status: LatchCounted, Left: 3, Initial: 5, Rest: 1200 * time.Millisecond}) {
		t.Errorf("readLatch = %+v, %v", got, err)
	}
	for _, bad := range [][]int64{{1, 2, 3}, {5, 0, 0, 0}, {-1, 0, 0, 0}} {
		if _, err := ReadLatch(bad); err == nil {
			t.Errorf("%v read as latch.lua's reply", bad)
		}
	}
}
