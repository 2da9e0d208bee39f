package backend

import (
	"context"
	"fmt"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/protocol"
)

// Release: the holds left as a majority counts them, or not owned when a majority says the
// caller does not hold the lock.
func (q *Quorum) Release(ctx context.Context, r ReleaseReq) (protocol.Released, error) {
	c := protocol.ReleaseArgs{Keys: r.Keys, Owner: r.Owner, Retention: q.retention, Channel: r.Channel,
		All: r.All, Floor: r.Floor, Leave: r.Leave, Record: r.Record}.Call()
	var (
		ok, notHeld, bad int
		res              protocol.Released
		err              error
		errs             []error
	)
	n := len(q.nodes)
	if !q.fanOut(ctx, []conn.Call{c}, answerWait, true, "", q.pendingOf(r.Owner), func(rp reply) bool {
		x, rerr := protocol.ReadRelease(rp.res[0].Ints)
		if rp.res[0].Err != nil {
			rerr = rp.res[0].Err
		}
		switch {
		case rerr != nil:
			bad++
			errs = append(errs, q.nodeErr(rp.node, rerr))
		case x.Owned:
			ok++
			res.Left = max(res.Left, x.Left)
		default:
			notHeld++
		}
		switch {
		case ok >= q.need:
			res.Owned = true
		case notHeld > n-q.need: // a majority no longer holds it: it was lost
			res = protocol.Released{}
		case ok+notHeld+bad == n:
			err = fmt.Errorf("%d of %d servers answered: %w", ok+notHeld, n, joinErrors(errs...))
		default:
			return false
		}
		return true
	}) {
		err = fmt.Errorf("%d of %d servers answered within %v: %w", ok+notHeld, n, answerWait, joinErrors(errs...))
	}
	return res, err
}
