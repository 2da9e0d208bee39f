package protocol

import (
	"slices"
	"testing"
	"time"

	"github.com/dlock-go/dlock/conn"
)

// The batch forms of acquire.lua and release.lua, as the scripts' headers lay them out, checked
// without a server.

// A batch of acquisitions groups the locks by their settings, in the order each group first
// appears, and puts the calls in the order of the reply; a batch of one is the one-lock form.
func TestAcquireBatchCall(t *testing.T) {
	a := func(key, owner, ttl string) *AcquireArgs {
		return &AcquireArgs{Keys: []string{key, key + ":q", key + ":w"}, Owner: owner, TTL: ttl, Meta: "{}", Client: "c1"}
	}
	id := func(p *AcquireArgs) *AcquireArgs { return p }
	one := a("k:{1}", "o1", "3000")
	if got, want := AcquireBatchCall([]*AcquireArgs{one}, id), one.Call(); got.Script != want.Script || !slices.Equal(got.Keys, want.Keys) || !slices.Equal(got.Args, want.Args) {
		t.Errorf("a batch of one: %+v; want the one-lock form %+v", got, want)
	}
	ps := []*AcquireArgs{a("k:{1}", "o1", "3000"), a("k:{2}", "o2", "5000"), a("k:{3}", "o3", "3000")}
	first, second, third := ps[0], ps[1], ps[2]
	c := AcquireBatchCall(ps, id)
	checkCall(t, "three locks, two settings", c, ScriptAcquire, []string{"k:{1}", "k:{3}", "k:{2}"}, []string{
		"", "3000", "{}", "", "p", "", "", "", "2", "o1", "c1", "o3", "c1",
		"5000", "{}", "", "p", "", "", "", "1", "o2", "c1",
	})
	if ps[0] != first || ps[1] != third || ps[2] != second {
		t.Errorf("the calls are not in the reply's order: %v %v %v", ps[0].Owner, ps[1].Owner, ps[2].Owner)
	}
}

func TestReadAcquireBatch(t *testing.T) {
	got, err := ReadAcquireBatch(conn.Result{Ints: []int64{1, 7, 1, 0, -1, 0, 0, 0, 0, 1500, 9, 4000}}, 3)
	if err != nil || len(got) != 3 {
		t.Fatalf("ReadAcquireBatch = %+v, %v", got, err)
	}
	if a := got[0]; a.Failed || a.Err != nil || !a.Res.OK || a.Res.Token != 7 || a.Res.Holds != 1 || a.Res.TTL != 0 {
		t.Errorf("taken, fixed lease: %+v", a)
	}
	if !got[1].Failed {
		t.Errorf("a lock that raised an error is not marked to be sent alone: %+v", got[1])
	}
	if a := got[2]; a.Failed || a.Res.OK || a.Res.PTTL != 1500*time.Millisecond || a.Res.Token != 9 || a.Res.TTL != 4*time.Second {
		t.Errorf("busy, adaptive lease: %+v", a)
	}
	if got, err := ReadAcquireBatch(conn.Result{Ints: []int64{1, 7, 1}}, 1); err != nil || !got[0].Res.OK {
		t.Errorf("a batch of one reads the one-lock reply: %+v, %v", got, err)
	}
	if _, err := ReadAcquireBatch(conn.Result{Ints: []int64{1, 7, 1, 0}}, 2); err == nil {
		t.Error("one lock's answer read as two")
	}
}

func TestReadReleaseBatch(t *testing.T) {
	got, err := ReadReleaseBatch(conn.Result{Ints: []int64{0, -2, -1, 2}}, 4)
	if err != nil || len(got) != 4 {
		t.Fatalf("ReadReleaseBatch = %+v, %v", got, err)
	}
	if !got[0].Res.Owned || got[0].Res.Left != 0 || !got[1].Failed || got[2].Res.Owned || got[2].Failed || got[3].Res.Left != 2 {
		t.Errorf("released, raised an error, not owned, re-entered: %+v", got)
	}
	if _, err := ReadReleaseBatch(conn.Result{Ints: []int64{0}}, 2); err == nil {
		t.Error("one lock's answer read as two")
	}
}
