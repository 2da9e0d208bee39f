// Package waitbatch runs, on a Redis Cluster, a batch of script calls that holds WAITs (see
// conn.Call). A WAIT only covers writes made on its own connection, to one node, so the scripts
// each WAIT covers (those since the previous WAIT) are grouped by hash slot, and each group is
// sent with its own copy of the WAIT, in one pipeline, to the slot's master. A WAIT's result is
// the smallest count of acknowledging replicas among its groups (or the first error). Both
// adapters use it; they differ only in how they send one group.
package waitbatch

import (
	"sync"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/slot"
)

// Has reports whether calls hold a WAIT: on a cluster, only such a batch needs Run.
func Has(calls []conn.Call) bool {
	for _, c := range calls {
		if c.Script == nil {
			return true
		}
	}
	return false
}

// Run splits calls into per-slot groups and sends every group with send, in parallel. key is a
// key of the group's slot ("" for a group without keys: a WAIT with no script before it, which
// any master may answer). send returns one result per call it was given.
func Run(calls []conn.Call, send func(key string, calls []conn.Call) []conn.Result) []conn.Result {
	type group struct {
		key   string
		idx   []int       // indexes in calls of the scripts, then of the WAIT
		calls []conn.Call // the same calls
		res   []conn.Result
	}
	var groups []*group
	bySlot := make(map[int]*group)
	for i, c := range calls {
		if c.Script != nil {
			s, key := -1, ""
			if len(c.Keys) > 0 {
				key = c.Keys[0]
				s = slot.Of(key)
			}
			g := bySlot[s]
			if g == nil {
				g = &group{key: key}
				bySlot[s] = g
				groups = append(groups, g)
			}
			g.idx = append(g.idx, i)
			g.calls = append(g.calls, c)
			continue
		}
		if len(bySlot) == 0 {
			groups = append(groups, &group{idx: []int{i}, calls: []conn.Call{c}})
		}
		for _, g := range bySlot {
			g.idx = append(g.idx, i)
			g.calls = append(g.calls, c)
		}
		clear(bySlot)
	}
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() { g.res = send(g.key, g.calls) })
	}
	wg.Wait()
	out := make([]conn.Result, len(calls))
	for _, g := range groups {
		for j, i := range g.idx {
			var r conn.Result
			if j < len(g.res) {
				r = g.res[j]
			}
			switch {
			case calls[i].Script != nil:
				out[i] = r
			case out[i].Err != nil:
			case r.Err != nil:
				out[i] = r
			case out[i].Ints == nil || (len(r.Ints) == 1 && r.Ints[0] < out[i].Ints[0]):
				out[i].Ints = r.Ints
			}
		}
	}
	return out
}
