package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
)

// The election rows (scenario.election): every goroutine of every worker process is a candidate
// of one election (Client.Election on the lock's name). A leader runs termSections critical
// sections on the register in its term, each fenced by the term (Leadership.Term as the
// token), checking the leadership's context before each step, and then steps down; the next
// candidate queued on the server leads. Half the goroutines campaign with Election.Campaign and
// Leadership.Resign, the other half hand their term's work to Client.RunElected, which
// campaigns and resigns around it. A candidate logs what a lock's holder logs: "acq" when it
// came to lead (the term as the token), "chk" for each look at the leadership's context, "sig"
// when that context ended with ErrLost, "unl" when it stepped down, so the faults, the fence
// and every lock analysis apply as they are; checkLeadership adds what an election promises.
//
// A term is believed from the return of its Campaign to the last check of its context that
// said "leading": the last moment its leader acted as the leader. Two terms are believed at
// once when the leader of one still acted after the next term had been granted (on the
// server's clock, placed on the monotonic timeline as for a lock's grants). That is the
// election's exclusion: dlock promises it (a leadership's context ends before another candidate
// can lead) where the server keeps the leader's lease; where the deployment can lose it (a
// restart without persistence, a failover to a replica the lease had not reached) it is the
// documented hazard, counted and reported, not failed. What a deposed leader sent before it
// knew (a write held up by a pause) is the fence's business: the fenced register must lose
// nothing.

// termSections is how many read-modify-write sections a leader runs in one term.
const termSections = 3

// runElection is run for an election row: terms of the election until ctx ends. It returns an
// error only when the resource connection failed.
func (w *worker) runElection(ctx context.Context, c *dlock.Client) error {
	value := fmt.Sprintf("worker %d.%d g%d", w.conf.Slot, w.conf.Inc, w.g)
	if w.g%2 == 1 {
		return w.runElected(ctx, c, value)
	}
	e := c.Election(w.conf.Lock)
	return retryCycles(ctx, func() (bool, error) { return w.term(ctx, e, value) }, nil)
}

// term campaigns, leads for termSections sections and resigns. ok is false when the campaign
// failed (the caller backs off).
func (w *worker) term(ctx context.Context, e *dlock.Election, value string) (ok bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	s := mono()
	ld, cerr := e.Campaign(cctx, value)
	r := mono()
	cancel()
	if cerr != nil {
		if ctx.Err() == nil {
			w.add(event{K: "acq", S: s, R: r, Res: "err: " + cerr.Error(), Is: kindsOf(cerr)})
		}
		return false, nil
	}
	tok := ld.Term()
	w.add(event{K: "acq", S: s, R: r, Tok: tok, Res: "ok"})
	check, stopWatch := w.watch(tok, ld.Context())
	defer stopWatch()
	defer func() {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		us := mono()
		rerr := ld.Resign(rctx)
		rcancel()
		w.add(event{K: "unl", S: us, R: mono(), Tok: tok, Res: errString(rerr), Is: kindsOf(rerr)})
	}()
	return true, w.lead(tok, ld.Context(), check)
}

// runElected leads through Client.RunElected: each call of its function is a term. The
// worker sees neither the campaign nor the resignation, only the function's call and return,
// so a term's "acq" spans from the previous term's end (or the start) to the call, and its
// "unl" is the return (RunElected resigns right after it).
func (w *worker) runElected(ctx context.Context, c *dlock.Client, value string) error {
	since := mono()
	err := c.RunElected(ctx, w.conf.Lock, value, func(lctx context.Context) error {
		r := mono()
		tok, ok := dlock.TokenFromContext(lctx)
		if !ok {
			return errors.New("RunElected's context carries no term")
		}
		w.add(event{K: "acq", S: since, R: r, Tok: tok, Res: "ok"})
		check, stopWatch := w.watch(tok, lctx)
		defer stopWatch()
		err := w.lead(tok, lctx, check)
		since = mono()
		w.add(event{K: "unl", S: since, R: since, Tok: tok})
		return err
	})
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// lead runs the term's sections, until the leadership's context ends.
func (w *worker) lead(tok uint64, lctx context.Context, check func() bool) error {
	for range termSections {
		w.seq++
		if err := w.section(tok, w.seq, check); err != nil {
			return err
		}
		if lctx.Err() != nil {
			return nil
		}
	}
	return nil
}

// checkLeadership checks, for an election row, what the election promises beyond a lock's
// guarantees (analyze runs those too): no two terms believed at once (see above; where the
// deployment can lose the leader's lease, forgetsLocks, they are the hazard figure instead);
// no term passed between campaigns of one process without the server (each campaign is its
// own holder: a local handoff would keep the former leader's value); and, where the fault
// deposes the leader (deposes), a term of another process after each fault. Terms unique and
// increasing are checkTokens', no lost update fenced is checkRegister's.
func (a *analysis) checkLeadership() {
	if !a.sc.election {
		return
	}
	f := a.f
	lastLive := map[uint64]int64{}
	for _, e := range a.d.events {
		if e.K == "chk" && e.Live {
			lastLive[e.Tok] = max(lastLive[e.Tok], e.S)
		}
	}
	var ex []string
	for _, q := range a.acqs {
		ll, ok := lastLive[q.tok]
		if !ok {
			continue
		}
		n, ok := a.nextGrant(q.tok)
		switch {
		case !ok || ll < n.lo:
		case ll > n.hi:
			f.LeaderOverlaps++
			if len(ex) < 3 {
				ex = append(ex, fmt.Sprintf("%s led term %d at %s, %s after %s's term %d began",
					q.w, q.tok, ts(ll, a.d.start), time.Duration(ll-n.hi).Round(time.Microsecond), n.w, n.tok))
			}
		default:
			f.LeaderOverlapsUnsure++
		}
	}
	if f.LeaderOverlaps > 0 {
		msg := fmt.Sprintf("%d terms believed at once with the next term: %s", f.LeaderOverlaps, joinN(ex, 3))
		if a.sc.forgetsLocks {
			f.LeaderOverlapsHazard = true
			a.note("hazard of this deployment (the server lost the leader's lease; doc.go): %s", msg)
		} else {
			a.fail("%s", msg)
		}
	}
	if a.sc.persist {
		kept, moved := 0, 0
		for _, flt := range a.d.faults {
			switch {
			case strings.HasPrefix(flt.Variant, restartKept):
				kept++
			case strings.HasPrefix(flt.Variant, restartMoved):
				moved++ // the data came back, but the hit term had ended as the kill landed
			}
		}
		a.note("%d of %d restarts brought the hit leader's lease back (%d found it ended before the kill)", kept, len(a.d.faults), moved)
		if kept == 0 && len(a.d.faults) > moved {
			a.fail("no restart of the persisting server brought the hit leader's lease back: the run proves nothing")
		}
	}
	if f.LocalHandoffs > 0 {
		a.fail("%d terms passed to another campaign of the same process without the server (a token within 15 of its previous term's)", f.LocalHandoffs)
	}
	if !a.sc.deposes {
		return
	}
	byR := append([]acq(nil), a.acqs...)
	sort.Slice(byR, func(i, j int) bool { return byR[i].r < byR[j].r })
	for _, flt := range a.d.faults {
		i := sort.Search(len(byR), func(i int) bool { return byR[i].r > flt.Start })
		for i < len(byR) && byR[i].w.sameProcess(flt.who()) {
			i++
		}
		if i == len(byR) {
			a.fail("%s fault at %s (%s, term %d): no other process led after it", flt.Kind, ts(flt.Start, a.d.start), flt.who(), flt.Token)
			continue
		}
		f.NewLeader = append(f.NewLeader, time.Duration(byR[i].r-flt.Start))
	}
}

// persistArgs makes a redis-server persist every write before it answers (an append-only file,
// fsynced at each write) in dir, outside the directory that redistest empties when it restarts
// the server: a restart then brings back every lease it had acknowledged.
func persistArgs(dir string) []string {
	return []string{"--dir", dir, "--appendonly", "yes", "--appendfsync", "always"}
}
