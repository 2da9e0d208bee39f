package backend

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/protocol"
)

// Renew sends the whole round to every server at once, one pipeline each: the releases (each
// decided when a majority answered it: the lock is then released, or was not held), the lease
// renewals and the queue entries' refreshes (renewed when a majority renewed them, lost or gone
// when a majority says so; otherwise an error, and the renewal loop retries). Each server's
// pipeline waits for the acquisitions of the released owners still running on it, so that a
// release never overtakes what it undoes. The round waits no longer than a third of the
// shortest lease or window in it (answerWait when it only releases), so that a server that
// never answers cannot hold up every other lease's renewal.
func (q *Quorum) Renew(ctx context.Context, rd Round) RoundResult {
	nRel, nLease := len(rd.Releases), len(rd.Leases)
	items := nRel + nLease + len(rd.Entries)
	res := RoundResult{RelErrs: make([]error, nRel), Leases: make([]Renewed, nLease), Entries: make([]Renewed, len(rd.Entries))}
	if items == 0 {
		return res
	}
	calls, spans, after, limit := q.roundCalls(rd)
	t := q.newRoundTally(spans, items, nRel, len(calls))
	q.fanOutAdapt(ctx, calls, limit, false, true, "", after, func(r reply) bool {
		t.add(r)
		return t.decided()
	}, nil)
	t.fill(&res, nLease)
	return res
}

// The kinds of item a call of a quorum round carries.
const (
	spanRelease = iota
	spanLease
	spanEntry
)

// roundSpan is the items one call of a quorum round carries: from up to to, in the round's
// order of items (its releases, then its leases, then its entries), all of one kind.
type roundSpan struct {
	from, to int
	kind     int // spanRelease, spanLease or spanEntry
}

// roundCalls builds a round's pipeline, the same for every server: a release.lua call per
// release, renew.lua calls of up to renewBatch leases, queue.lua calls of up to renewBatch
// entries. With them it returns the span of items each call carries, the acquisitions of the
// released owners still running (which the pipeline waits for), and how long the round may
// wait: a third of its shortest lease or window, or answerWait when it has none.
func (q *Quorum) roundCalls(rd Round) ([]conn.Call, []roundSpan, []*pendingAcquire, time.Duration) {
	nRel, nLease := len(rd.Releases), len(rd.Leases)
	var calls []conn.Call
	var spans []roundSpan
	var after []*pendingAcquire
	limit := time.Duration(-1)
	shorter := func(d time.Duration) {
		if limit < 0 || d < limit {
			limit = d
		}
	}
	for i, r := range rd.Releases {
		calls = append(calls, protocol.ReleaseArgs{Keys: r.Keys, Owner: r.Owner, Retention: q.retention, Channel: r.Channel,
			All: r.All, Floor: r.Floor, Leave: r.Leave, Record: r.Record}.Call())
		spans = append(spans, roundSpan{i, i + 1, spanRelease})
		if p := q.pendingOf(r.Owner); p != nil {
			after = append(after, p)
		}
	}
	for i := 0; i < nLease; i += renewBatch {
		j := min(i+renewBatch, nLease)
		keys, owners, ttls := make([]string, 0, j-i), make([]string, 0, j-i), make([]string, 0, j-i)
		for _, l := range rd.Leases[i:j] {
			keys, owners, ttls = append(keys, l.Key), append(owners, l.Owner), append(ttls, l.TTL)
			shorter(parseMS(l.TTL) / 3)
		}
		calls, spans = append(calls, protocol.RenewCall(keys, owners, ttls)), append(spans, roundSpan{nRel + i, nRel + j, spanLease})
	}
	for i := 0; i < len(rd.Entries); i += renewBatch {
		j := min(i+renewBatch, len(rd.Entries))
		keys, ids, windows, waiting := make([]string, 0, j-i), make([]string, 0, j-i), make([]string, 0, j-i), make([]string, 0, j-i)
		watch := make([]bool, 0, j-i)
		for _, e := range rd.Entries[i:j] {
			keys, ids, windows, waiting = append(keys, e.Key), append(ids, e.ID), append(windows, e.Window), append(waiting, e.Waiting)
			watch = append(watch, e.Watch)
			shorter(parseMS(e.Window) / 3)
		}
		calls, spans = append(calls, protocol.QueueCall(keys, ids, windows, waiting, watch)), append(spans, roundSpan{nRel + nLease + i, nRel + nLease + j, spanEntry})
	}
	if limit < 0 {
		limit = answerWait
	}
	return calls, spans, after, limit
}

// roundTally counts the servers' answers to a quorum round, per item (in the round's order of
// items) and per call.
type roundTally struct {
	q       *Quorum
	nRel    int // the round's releases: items 0 up to nRel
	spans   []roundSpan
	yes, no []int             // per item: servers that renewed (or released) it, and that refused
	on      []uint64          // per item: bit i, server i renewed it
	freed   []bool            // per item: a server answered renew.lua's "released" for the lease
	lefts   [][]time.Duration // an entry's lock, by server that told: ms until it may be free
	failed  []int             // per call: servers whose answer to it is an error
	callOf  []int             // per item: the call that carries it
	answers int               // servers that answered
	errs    []error           // the servers' errors, which undecided reports
}

// newRoundTally returns the tally, before any server answered, of a round that has this many
// items (the first nRel of them releases) in this many calls, cut as spans says.
func (q *Quorum) newRoundTally(spans []roundSpan, items, nRel, calls int) *roundTally {
	t := &roundTally{q: q, nRel: nRel, spans: spans,
		yes: make([]int, items), no: make([]int, items), on: make([]uint64, items), freed: make([]bool, items),
		lefts: make([][]time.Duration, items), failed: make([]int, calls), callOf: make([]int, items)}
	for c, sp := range spans {
		for k := sp.from; k < sp.to; k++ {
			t.callOf[k] = c
		}
	}
	return t
}

// add counts server r.node's answers to every call of the round.
func (t *roundTally) add(r reply) {
	t.answers++
	for c, x := range r.res {
		sp := t.spans[c]
		oks, err := t.read(sp, x)
		if err != nil {
			t.failed[c]++
			t.errs = append(t.errs, t.q.nodeErr(r.node, err))
			continue
		}
		for k, ok := range oks {
			if ok {
				t.yes[sp.from+k]++
				t.on[sp.from+k] |= 1 << r.node
			} else {
				t.no[sp.from+k]++
			}
		}
	}
}

// read reads one server's answer x to the call of span sp: whether it renewed (or released)
// each item. On the way it notes the leases the server says were released and the times until
// the entries' locks may be free.
func (t *roundTally) read(sp roundSpan, x conn.Result) ([]bool, error) {
	if x.Err != nil {
		return nil, x.Err
	}
	switch sp.kind {
	case spanRelease:
		rel, err := protocol.ReadRelease(x.Ints)
		return []bool{rel.Owned}, err
	case spanLease:
		oks, err := protocol.ReadRenew(x.Ints, sp.to-sp.from)
		for k, v := range x.Ints {
			if err == nil && v == protocol.RenewReleased {
				t.freed[sp.from+k] = true
			}
		}
		return oks, err
	}
	oks, left, err := protocol.ReadQueue(x.Ints, sp.to-sp.from)
	for k, l := range left {
		if l != protocol.LockLeftUnknown {
			t.lefts[sp.from+k] = append(t.lefts[sp.from+k], l)
		}
	}
	return oks, err
}

// decided reports whether the answers so far decide every item: a release once a majority
// answered it either way, a lease or an entry once a majority renewed it or can no longer.
func (t *roundTally) decided() bool {
	n, need := len(t.q.nodes), t.q.need
	for k := range t.yes {
		pending := n - t.yes[k] - t.no[k] - t.failed[t.callOf[k]]
		if k < t.nRel {
			if t.yes[k]+t.no[k] < need && pending > 0 {
				return false
			}
			continue
		}
		if t.yes[k] < need && t.yes[k]+pending >= need {
			return false
		}
	}
	return true
}

// fill writes the round's outcome into res: an error for each release a majority did not
// answer, and each lease's and entry's outcome (nLease leases, then the entries).
func (t *roundTally) fill(res *RoundResult, nLease int) {
	for k := range t.yes {
		switch {
		case k < t.nRel:
			if t.yes[k]+t.no[k] < t.q.need {
				res.RelErrs[k] = t.undecided()
			}
		case k < t.nRel+nLease:
			res.Leases[k-t.nRel] = t.outcome(k, false)
		default:
			res.Entries[k-t.nRel-nLease] = t.outcome(k, true)
		}
	}
}

// outcome is item k's outcome, a lease's or (entry) a queue entry's: renewed when a majority
// renewed it, lost or gone when a majority refused, else an error; an entry also says when a
// majority may have its lock free, once the need-th shortest time told has passed.
func (t *roundTally) outcome(k int, entry bool) Renewed {
	need := t.q.need
	o := Renewed{On: t.on[k]}
	if entry {
		o.LockLeft = protocol.LockLeftUnknown
		if l := t.lefts[k]; len(l) >= need {
			slices.Sort(l)
			o.LockLeft = l[need-1]
		}
	}
	switch {
	case t.yes[k] >= need:
		o.OK = true
	case t.no[k] >= len(t.q.nodes)-need+1: // a majority refused: lost, or gone
		o.Released = t.freed[k]
	default:
		o.Err = t.undecided()
	}
	return o
}

// undecided is the error of an item the answers did not decide.
func (t *roundTally) undecided() error {
	n := len(t.q.nodes)
	if err := joinErrors(t.errs...); err != nil {
		return fmt.Errorf("undecided, %d of %d servers answered: %w", t.answers, n, err)
	}
	return fmt.Errorf("undecided, %d of %d servers answered in time", t.answers, n)
}

// PTTL: the lease is held on a majority for at least the majority-th longest remaining lease;
// lost when fewer than a majority hold it.
func (q *Quorum) PTTL(ctx context.Context, keys []string, owner string) (time.Duration, bool, error) {
	var (
		left         []time.Duration
		no, answered int
		errs         []error
		res          time.Duration
		held         bool
		err          error
		n            = len(q.nodes)
	)
	if !q.fanOut(ctx, []conn.Call{protocol.PTTLCall(keys, owner)}, answerWait, false, "", nil, func(r reply) bool {
		answered++
		d, ok, rerr := protocol.ReadPTTL(r.res[0].Ints)
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
