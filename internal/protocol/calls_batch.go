package protocol

import (
	"fmt"
	"strconv"

	"github.com/dlock-go/dlock/conn"
)

// The batch forms of acquire.lua and release.lua (docs/PROTOCOL.md): many locks in one script
// call, each done as its own call would do it, with its own answer.

// AcquireBatchCall builds the call of a batch of acquisitions, each call of ps acquiring
// args(p): acquire.lua's batch form (one lock: its one-lock form), locks with the same settings
// in one group. It puts ps in the order of the reply (ReadAcquireBatch).
func AcquireBatchCall[P any](ps []P, args func(P) *AcquireArgs) conn.Call {
	if len(ps) == 1 {
		return args(ps[0]).Call()
	}
	type group struct {
		head []string // lease, description, mode, "p", window, least, greatest
		ps   []P
	}
	var groups []*group
	for _, p := range ps {
		a := args(p)
		mode := a.Mode()
		var g *group
		for _, x := range groups {
			h := x.head
			if h[0] == a.TTL && h[1] == a.Meta && h[2] == mode && h[4] == a.Window && h[5] == a.AdaptLo && h[6] == a.AdaptHi {
				g = x
				break
			}
		}
		if g == nil {
			g = &group{head: []string{a.TTL, a.Meta, mode, "p", a.Window, a.AdaptLo, a.AdaptHi}}
			groups = append(groups, g)
		}
		g.ps = append(g.ps, p)
	}
	// The reply follows the groups' order: ps is put in that order.
	keys := make([]string, 0, len(ps))
	argv := make([]string, 0, 1+8*len(groups)+2*len(ps))
	argv = append(argv, "")
	ps = ps[:0]
	for _, g := range groups {
		argv = append(argv, g.head...)
		argv = append(argv, strconv.Itoa(len(g.ps)))
		for _, p := range g.ps {
			a := args(p)
			keys = append(keys, a.Keys[0])
			argv = append(argv, a.Owner, a.Client)
			ps = append(ps, p)
		}
	}
	return conn.Call{Script: ScriptAcquire, Keys: keys, Args: argv}
}

// BatchAnswer is one lock's answer in a batch.
type BatchAnswer[Out any] struct {
	Res    Out
	Err    error
	Failed bool // doing the lock raised an error: send it alone
}

// ReadAcquireBatch reads the reply to AcquireBatchCall for n locks: four integers a lock, the
// first -1 when doing the lock raised an error, the last 0 when the lease is the one asked for.
func ReadAcquireBatch(r conn.Result, n int) ([]BatchAnswer[Acquired], error) {
	return readBatch(r, n, "acquire.lua", 4, ReadAcquire, func(x []int64) BatchAnswer[Acquired] {
		if x[0] == -1 {
			return BatchAnswer[Acquired]{Failed: true}
		}
		if x[3] == 0 {
			x = x[:3]
		}
		res, err := ReadAcquire(x)
		return BatchAnswer[Acquired]{Res: res, Err: err}
	})
}

// ReadReleaseBatch reads the reply of release.lua's batch form for n locks: an integer a lock, -2 when
// doing the lock raised an error.
func ReadReleaseBatch(r conn.Result, n int) ([]BatchAnswer[Released], error) {
	return readBatch(r, n, "release.lua", 1, ReadRelease, func(x []int64) BatchAnswer[Released] {
		if x[0] == -2 {
			return BatchAnswer[Released]{Failed: true}
		}
		res, err := ReadRelease(x)
		return BatchAnswer[Released]{Res: res, Err: err}
	})
}

// readBatch reads the reply of script's batch form for n locks, width integers a lock, each
// read by lock; a batch of one went in the one-lock form, whose reply one reads.
func readBatch[Out any](r conn.Result, n int, script string, width int,
	one func([]int64) (Out, error), lock func([]int64) BatchAnswer[Out]) ([]BatchAnswer[Out], error) {
	if r.Err != nil {
		return nil, r.Err
	}
	if n == 1 {
		res, err := one(r.Ints)
		return []BatchAnswer[Out]{{Res: res, Err: err}}, nil
	}
	if len(r.Ints) != width*n {
		return nil, fmt.Errorf("%s: %d answers for a batch of %d locks", script, len(r.Ints), n)
	}
	out := make([]BatchAnswer[Out], n)
	for i := range out {
		out[i] = lock(r.Ints[width*i : width*(i+1)])
	}
	return out, nil
}
