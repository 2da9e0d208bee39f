package dlock

import (
	"slices"
	"testing"

	"github.com/dlock-go/dlock/internal/backend"
	"github.com/dlock-go/dlock/internal/protocol"
)

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
	if g := groupsOf(&backend.OneServer{}, specs); len(g) != 1 || len(g[0]) != 4 {
		t.Errorf("one server: groups %v, want one of 4", g)
	}
	g := groupsOf(&backend.OneServer{Cluster: true}, specs)
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
	if g := groupsOf((&backend.Quorum{}).Traits().Multi, specs); len(g) != 4 {
		t.Errorf("quorum: groups %v, want one per name", g)
	}
}
