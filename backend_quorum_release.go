package dlock

import (
	"context"
	"fmt"

	"github.com/dlock-go/dlock/conn"
)

// release: the holds left as a majority counts them, or not owned when a majority says the
// caller does not hold the lock.
func (q *quorum) release(ctx context.Context, r releaseReq) (released, error) {
	c := releaseArgs{keys: r.keys, owner: r.owner, retention: q.retention, channel: r.channel,
		all: r.all, floor: r.floor, leave: r.leave, record: r.record}.call()
	var (
		ok, notHeld, bad int
		res              released
		err              error
		errs             []error
	)
	n := len(q.nodes)
	if !q.fanOut(ctx, []conn.Call{c}, answerWait, true, "", q.pendingOf(r.owner), func(rp reply) bool {
		x, rerr := readRelease(rp.res[0].Ints)
		if rp.res[0].Err != nil {
			rerr = rp.res[0].Err
		}
		switch {
		case rerr != nil:
			bad++
			errs = append(errs, q.nodeErr(rp.node, rerr))
		case x.owned:
			ok++
			res.left = max(res.left, x.left)
		default:
			notHeld++
		}
		switch {
		case ok >= q.need:
			res.owned = true
		case notHeld > n-q.need: // a majority no longer holds it: it was lost
			res = released{}
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
