package dlock

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/dlock-go/dlock/conn"
)

// renew sends the whole round to every server at once, one pipeline each: the releases (each
// decided when a majority answered it: the lock is then released, or was not held), the lease
// renewals and the queue entries' refreshes (renewed when a majority renewed them, lost or gone
// when a majority says so; otherwise an error, and the renewal loop retries). Each server's
// pipeline waits for the acquisitions of the released owners still running on it, so that a
// release never overtakes what it undoes. The round waits no longer than a third of the
// shortest lease or window in it (answerWait when it only releases), so that a server that
// never answers cannot hold up every other lease's renewal.
func (q *quorum) renew(ctx context.Context, rd round) roundResult {
	nRel, nLease := len(rd.releases), len(rd.leases)
	items := nRel + nLease + len(rd.entries)
	res := roundResult{relErrs: make([]error, nRel), leases: make([]renewed, nLease), entries: make([]renewed, len(rd.entries))}
	if items == 0 {
		return res
	}
	n := len(q.nodes)
	type span struct {
		from, to int
		kind     int // 0 release, 1 lease, 2 entry
	}
	var calls []conn.Call
	var spans []span
	var after []*pendingAcquire
	limit := time.Duration(-1)
	shorter := func(d time.Duration) {
		if limit < 0 || d < limit {
			limit = d
		}
	}
	for i, r := range rd.releases {
		calls = append(calls, releaseArgs{keys: r.keys, owner: r.owner, retention: q.retention, channel: r.channel,
			all: r.all, floor: r.floor, leave: r.leave, record: r.record}.call())
		spans = append(spans, span{i, i + 1, 0})
		if p := q.pendingOf(r.owner); p != nil {
			after = append(after, p)
		}
	}
	for i := 0; i < nLease; i += renewBatch {
		j := min(i+renewBatch, nLease)
		keys, owners, ttls := make([]string, 0, j-i), make([]string, 0, j-i), make([]string, 0, j-i)
		for _, l := range rd.leases[i:j] {
			keys, owners, ttls = append(keys, l.key), append(owners, l.owner), append(ttls, l.ttl)
			shorter(parseMS(l.ttl) / 3)
		}
		calls, spans = append(calls, renewCall(keys, owners, ttls)), append(spans, span{nRel + i, nRel + j, 1})
	}
	for i := 0; i < len(rd.entries); i += renewBatch {
		j := min(i+renewBatch, len(rd.entries))
		keys, ids, windows, waiting := make([]string, 0, j-i), make([]string, 0, j-i), make([]string, 0, j-i), make([]string, 0, j-i)
		watch := make([]bool, 0, j-i)
		for _, e := range rd.entries[i:j] {
			keys, ids, windows, waiting = append(keys, e.key), append(ids, e.id), append(windows, e.window), append(waiting, e.waiting)
			watch = append(watch, e.watch)
			shorter(parseMS(e.window) / 3)
		}
		calls, spans = append(calls, queueCall(keys, ids, windows, waiting, watch)), append(spans, span{nRel + nLease + i, nRel + nLease + j, 2})
	}
	if limit < 0 {
		limit = answerWait
	}
	yes, no := make([]int, items), make([]int, items)
	on := make([]uint64, items)
	freed := make([]bool, items)            // a server answered renew.lua's "released" for the lease
	lefts := make([][]time.Duration, items) // an entry's lock, by server that told: ms until it may be free
	failed := make([]int, len(calls))       // servers whose answer to call c is an error
	callOf := make([]int, items)
	for c, sp := range spans {
		for k := sp.from; k < sp.to; k++ {
			callOf[k] = c
		}
	}
	var answers int
	var errs []error
	decided := func() bool {
		for k := range items {
			pending := n - yes[k] - no[k] - failed[callOf[k]]
			if k < nRel { // a release is decided once a majority answered it either way
				if yes[k]+no[k] < q.need && pending > 0 {
					return false
				}
				continue
			}
			if yes[k] < q.need && yes[k]+pending >= q.need {
				return false
			}
		}
		return true
	}
	q.fanOutAdapt(ctx, calls, limit, false, true, "", after, func(r reply) bool {
		answers++
		for c, x := range r.res {
			sp := spans[c]
			var oks []bool
			err := x.Err
			if err == nil {
				switch sp.kind {
				case 0:
					var rel released
					rel, err = readRelease(x.Ints)
					oks = []bool{rel.owned}
				case 1:
					oks, err = readRenew(x.Ints, sp.to-sp.from)
					for k, v := range x.Ints {
						if err == nil && v == renewReleased {
							freed[sp.from+k] = true
						}
					}
				default:
					var left []time.Duration
					oks, left, err = readQueue(x.Ints, sp.to-sp.from)
					for k, l := range left {
						if l != lockLeftUnknown {
							lefts[sp.from+k] = append(lefts[sp.from+k], l)
						}
					}
				}
			}
			if err != nil {
				failed[c]++
				errs = append(errs, q.nodeErr(r.node, err))
				continue
			}
			for k, ok := range oks {
				if ok {
					yes[sp.from+k]++
					on[sp.from+k] |= 1 << r.node
				} else {
					no[sp.from+k]++
				}
			}
		}
		return decided()
	}, nil)
	undecided := func() error {
		if err := joinErrors(errs...); err != nil {
			return fmt.Errorf("undecided, %d of %d servers answered: %w", answers, n, err)
		}
		return fmt.Errorf("undecided, %d of %d servers answered in time", answers, n)
	}
	for k := range items {
		switch {
		case k < nRel:
			if yes[k]+no[k] < q.need {
				res.relErrs[k] = undecided()
			}
		default:
			out := &res.leases
			idx := k - nRel
			if k >= nRel+nLease {
				out, idx = &res.entries, k-nRel-nLease
			}
			(*out)[idx].on = on[k]
			if k >= nRel+nLease {
				// A majority may have the lock free once the need-th shortest time has passed.
				(*out)[idx].lockLeft = lockLeftUnknown
				if l := lefts[k]; len(l) >= q.need {
					slices.Sort(l)
					(*out)[idx].lockLeft = l[q.need-1]
				}
			}
			switch {
			case yes[k] >= q.need:
				(*out)[idx].ok = true
			case no[k] >= n-q.need+1: // a majority refused: lost, or gone
				(*out)[idx].released = freed[k]
			default:
				(*out)[idx].err = undecided()
			}
		}
	}
	return res
}

// pttl: the lease is held on a majority for at least the majority-th longest remaining lease;
// lost when fewer than a majority hold it.
func (q *quorum) pttl(ctx context.Context, keys []string, owner string) (time.Duration, bool, error) {
	var (
		left         []time.Duration
		no, answered int
		errs         []error
		res          time.Duration
		held         bool
		err          error
		n            = len(q.nodes)
	)
	if !q.fanOut(ctx, []conn.Call{pttlCall(keys, owner)}, answerWait, false, "", nil, func(r reply) bool {
		answered++
		d, ok, rerr := readPTTL(r.res[0].Ints)
		if r.res[0].Err != nil {
			rerr = r.res[0].Err
		}
		switch {
		case rerr != nil:
			errs = append(errs, q.nodeErr(r.node, rerr))
		case ok:
			left = append(left, d)
		default:
			no++
		}
		switch {
		case len(left) >= q.need:
			slices.Sort(left)
			res, held = left[len(left)-q.need], true
		case no >= n-q.need+1:
		case answered == n:
			err = fmt.Errorf("%d of %d servers answered: %w", n-len(errs), n, joinErrors(errs...))
		default:
			return false
		}
		return true
	}) {
		err = fmt.Errorf("%d of %d servers answered within %v: %w", answered-len(errs), n, answerWait, joinErrors(errs...))
	}
	return res, held, err
}
