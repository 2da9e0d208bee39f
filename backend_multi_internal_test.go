package dlock

import (
	"slices"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/protocol"
)

// The calls and replies of multiacquire.lua, multirelease.lua and latch.lua, as the header of
// each script lays them out, checked without a server.

func TestMultiArgs_Call(t *testing.T) {
	keys := []string{"p:{a}", "p:{a}:q", "p:{a}:w", "p:{b}", "p:{b}:q", "p:{b}:w"}
	a := multiArgs{keys: keys, owner: "o:1", ttl: "3000", meta: "{}", at: "*", eowner: "o:2", window: "900"}
	checkCall(t, "all or none, no entry", a.call(), protocol.ScriptMultiAcquire, keys, []string{"o:1", "3000", "{}", "a", "p", "", "", "o:2", "900"})
	a.entry, a.prefix, a.sharded = "c.7", true, true
	checkCall(t, "prefix, queue at the first busy", a.call(), protocol.ScriptMultiAcquire, keys, []string{"o:1", "3000", "{}", "p", "s", "c.7", "*", "o:2", "900"})
	a.at = "2"
	checkCall(t, "queue at lock 2 only", a.call(), protocol.ScriptMultiAcquire, keys, []string{"o:1", "3000", "{}", "p", "s", "c.7", "2", "o:2", "900"})
}

func TestReadMultiAcquire(t *testing.T) {
	got, err := readMultiAcquire([]int64{0, 0, 0, 100, 200}, 2)
	if err != nil || got.busy != -1 || !slices.Equal(got.tokens, []uint64{100, 200}) {
		t.Errorf("all taken: %+v, %v", got, err)
	}
	got, err = readMultiAcquire([]int64{2, 1500, 42, 100, 0}, 2)
	if err != nil || got.busy != 1 || got.pttl != 1500*time.Millisecond || got.token != 42 || !slices.Equal(got.tokens, []uint64{100, 0}) {
		t.Errorf("second busy: %+v, %v", got, err)
	}
	for _, bad := range [][]int64{{0, 0, 0, 1}, {3, 0, 0, 1, 2}, {-1, 0, 0, 1, 2}} {
		if _, err := readMultiAcquire(bad, 2); err == nil {
			t.Errorf("%v read as a reply for 2 locks", bad)
		}
	}
}

func TestMultiReleaseArgs_Call(t *testing.T) {
	a := multiReleaseArgs{retention: "60000", reqs: []releaseReq{
		{keys: []string{"p:{a}", "p:{a}:q", "p:{a}:w"}, owner: "o:1", floor: 7},
		{keys: []string{"p:{b}", "p:{b}:q", "p:{b}:w"}, owner: "o:2", leave: "c.3"},
	}}
	checkCall(t, "two locks", a.call(), protocol.ScriptMultiRelease,
		[]string{"p:{a}", "p:{a}:q", "p:{a}:w", "p:{b}", "p:{b}:q", "p:{b}:w"},
		[]string{"60000", "p", "o:1", "7", "", "o:2", "0", "c.3"})
	got, err := readMultiRelease([]int64{0, -1}, 2)
	if err != nil || !got[0].Owned || got[1].Owned {
		t.Errorf("readMultiRelease = %+v, %v", got, err)
	}
	if _, err := readMultiRelease([]int64{0}, 2); err == nil {
		t.Error("one answer read as two")
	}
}

func TestLatchArgs_Call(t *testing.T) {
	a := latchArgs{key: "p:{x}:latch", op: 'd', count: 5, ttl: "600000", retention: "60000", channel: "p:{x}:latch:rel", id: "=w1"}
	checkCall(t, "count down", a.call(), protocol.ScriptLatch, []string{"p:{x}:latch"}, []string{"d", "5", "600000", "60000", "p:{x}:latch:rel", "p", "=w1"})
	a.op, a.sharded, a.id = 's', true, ""
	checkCall(t, "read only", a.call(), protocol.ScriptLatch, []string{"p:{x}:latch"}, []string{"s", "5", "600000", "60000", "p:{x}:latch:rel", "s", ""})
	got, err := readLatch([]int64{1, 3, 5, 1200})
	if err != nil || got != (latchState{status: latchCounted, left: 3, initial: 5, rest: 1200 * time.Millisecond}) {
		t.Errorf("readLatch = %+v, %v", got, err)
	}
	for _, bad := range [][]int64{{1, 2, 3}, {5, 0, 0, 0}, {-1, 0, 0, 0}} {
		if _, err := readLatch(bad); err == nil {
			t.Errorf("%v read as latch.lua's reply", bad)
		}
	}
}

// The global order puts names by slot, then key, whatever order they are given in; on one
// server they form one group, on a Cluster one per slot, in quorum mode one each.
func TestMultiOrderAndGroups(t *testing.T) {
	var specs []*lockSpec
	for _, n := range []string{"x}2", "b", "x}1", "a"} {
		specs = append(specs, &lockSpec{name: n, key: protocol.LockKey("p:", n)})
	}
	slices.SortFunc(specs, multiOrder)
	for i := 1; i < len(specs); i++ {
		if multiOrder(specs[i-1], specs[i]) >= 0 {
			t.Fatalf("not sorted: %s before %s", specs[i-1].key, specs[i].key)
		}
	}
	if g := groupsOf(&oneServer{}, specs); len(g) != 1 || len(g[0]) != 4 {
		t.Errorf("one server: groups %v, want one of 4", g)
	}
	g := groupsOf(&oneServer{cluster: true}, specs)
	tagged := 0
	for _, grp := range g {
		if len(grp) == 2 {
			tagged++
			if specs[grp[0]].name[:2] != "x}" || specs[grp[1]].name[:2] != "x}" {
				t.Errorf("the group of two is not the names sharing the hash tag: %v", grp)
			}
		}
	}
	if len(g) != 3 || tagged != 1 {
		t.Errorf("Cluster: groups %v, want the two names of tag x together and the others apart", g)
	}
	if g := groupsOf((&quorum{}).traits().multi, specs); len(g) != 4 {
		t.Errorf("quorum: groups %v, want one per name", g)
	}
}
