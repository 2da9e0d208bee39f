package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Turns per process (scenario.turnSlice): the workers' Mutex takes dlock.WithTurnSlice, so at
// a holder's last Unlock, with no goroutine of its process waiting, the Client keeps the lock
// on the server (parked, renewed) until the turn (turnSlice since the Client got the lock from
// the server) is over, and a Lock or TryLock of its process meanwhile takes it back with the
// next token and no round trip. A parked lock is a held lock, so a turn row is held to the
// guarantees of its plain counterpart; what it adds is where its fault lands.
//
// A plain fault springs on a holder's request to the resource, inside its critical section.
// A turn row's fault also comes, in turn with those, between holds (the between-holds
// variant). Its trap springs on the write of a lease its goroutine took back from a parked turn
// (such a turn is young, and that goroutine's sibling was not waiting), or, when none comes
// within turnSeek, on that of the polling process's goroutine that waits in Lock (its sibling
// polls with TryLock every 10 ms, so it is seldom waiting when this one unlocks) early in its
// turn (its token, the server's clock at the turn's start, says when that was). The answer to
// the write tells the worker to stop its own process right after that lease's Unlock, and then
// to think a while before its next Lock. Once the process is stopped the checker records where
// the lock was: parked (the server's key still held with the process's tokens, no goroutine of
// it holding), held (a sibling had taken it), or released (the turn was over, or the lock had
// gone to another process); then it keeps it frozen, kills it, or cuts it off. A pause or a cut
// past the TTL must not let the process take back a parked lock that ran out (its Lock must go
// to the server): two holders at once, stale writes and lost updates fail such a row as any
// other; a kill of a parked lock holds the others for up to the TTL, which the kill row's bound
// (TTL + killRecoverySlack) checks.

// turnSlice is the turn slice of the turn rows' workers.
const turnSlice = 2 * time.Millisecond

// turnThink is how long the goroutine a between-holds fault targets waits after its Unlock
// before it locks again: longer than a turn, so that it does not take the parked lock back
// itself before the fault lands.
const turnThink = 20 * time.Millisecond

// turnSeek is how long a between-holds trap waits for the write of a lease taken back from a
// parked turn before it settles for any lease early in its turn (the schedule gives a trap
// 10 s to spring).
const turnSeek = 5 * time.Second

// The between-holds variant, and where such a fault found the lock (faultRec.Variant).
const (
	variantBetween      = "between-holds"
	turnParked          = "between-holds: parked"
	turnHeld            = "between-holds: held by a sibling"
	turnReleased        = "between-holds: released"
	turnUnlockNotLogged = "between-holds: Unlock not seen"
	turnNotStopped      = "between-holds: stopped from outside"
)

// isBetweenHolds reports whether a fault's variant is the between-holds one (whatever it found).
func isBetweenHolds(variant string) bool { return strings.HasPrefix(variant, variantBetween) }

// turnHit plays a turn row's fault out on the process (slot s, pid), found stopped right
// after a holder's Unlock: it hits, and returns what ends the fault (it ends with in.end).
type turnHit func(r *runner, s *slot, pid int, p plannedFault, in *injection) (finish func())

// turnFault is f, whose plan draws plain variants, with every (plain+1)-th fault between holds
// instead, played out by hit. The plain faults keep f's order of variants.
func turnFault(f fault, plain int, hit turnHit) fault {
	return fault{
		plan: func(p *plannedFault, rng *rand.Rand, n int, ttl time.Duration) {
			round := plain + 1
			f.plan(p, rng, n/round*plain+n%round, ttl)
			if n%round == plain {
				p.variant = variantBetween
			}
		},
		inject: func(r *runner, p plannedFault, in *injection) *trap {
			if p.variant == variantBetween {
				return r.betweenHolds(p, in, hit)
			}
			return f.inject(r, p, in)
		},
	}
}

// pauseTurn keeps the process frozen for the fault's duration (past the TTL).
func pauseTurn(_ *runner, _ *slot, pid int, p plannedFault, in *injection) func() {
	return func() {
		time.Sleep(p.dur)
		_ = syscall.Kill(pid, syscall.SIGCONT)
		in.end()
	}
}

// killTurn kills the process; once it is gone a new incarnation takes its slot.
func killTurn(r *runner, s *slot, pid int, _ plannedFault, in *injection) func() {
	_, _, exited := s.current()
	_ = syscall.Kill(pid, syscall.SIGKILL)
	<-exited
	return func() {
		in.end()
		select {
		case <-r.ending:
		default:
			if err := r.spawn(s); err != nil {
				r.infraf("respawn worker %d: %v", s.i, err)
			}
		}
	}
}

// cutTurn makes the process's proxies hold every byte, lets it run again, cut off, and ends
// the cut after the fault's duration (past the TTL).
func cutTurn(_ *runner, s *slot, pid int, p plannedFault, in *injection) func() {
	for _, px := range s.proxies {
		px.Block()
	}
	_ = syscall.Kill(pid, syscall.SIGCONT)
	return func() {
		time.Sleep(p.dur)
		for _, px := range s.proxies {
			px.Unblock()
		}
		in.end()
	}
}

// betweenHolds is the trap of a between-holds fault (see above). Its answer to the write tells
// the worker to stop its own process (SIGSTOP) right after that lease's Unlock and, once it
// runs again, to wait turnThink before its next Lock (worker.go): from outside, the Unlock is
// seen too late for a 2 ms turn on a loaded machine (1 to 4 ms late when tried), while the
// worker stops microseconds after it. The trap then waits for the process to be stopped, notes
// where the lock is, and hits.
func (r *runner) betweenHolds(p plannedFault, in *injection, hit turnHit) *trap {
	poller := len(r.slots) - 1 // its goroutine 0 polls (spawn)
	armed := time.Now()
	return &trap{
		op: 'W',
		only: func(w who, tok uint64) bool {
			// Best, the write of a lease its goroutine took back from a parked turn (the
			// previous lease on the record is its own, token - 1): that turn is young and
			// parks, and its sibling was not waiting. Such leases are few (a waiter granted the
			// lock by a release seldom parks: see the note on docs/CORRECTNESS.md's turn rows),
			// so after turnSeek any lease early in its turn of the polling process's goroutine
			// that waits in Lock will do.
			if p, ok := r.res.prevLease(tok); ok && p.Token == tok-1 && p.who() == w {
				return true
			}
			if time.Since(armed) < turnSeek || (!r.sc.noPoll && (w.Slot != poller || w.G == 0)) {
				return false
			}
			// Early in its turn, so that some of it is left once the write is answered and the
			// lease unlocked: a token is its turn's server token (the server's TIME in µs at
			// the grant, acquire.lua) plus at most 15.
			age := time.Duration(time.Now().UnixMicro()-int64(tok)) * time.Microsecond
			return age >= -time.Millisecond && age < turnSlice/2
		},
		fire: func(w who, tok uint64) (time.Duration, bool) {
			in.spring()
			s := r.slots[w.Slot]
			inc, pid, _ := s.current()
			tail := &logTail{path: r.workerLog(s.i, inc)}
			if fi, err := os.Stat(tail.path); err == nil {
				tail.off = fi.Size() // whole lines (one write each); the Unlock comes after
			}
			go func() {
				defer in.settle()
				in.record(w, tok, variantBetween)
				variant := turnUnlockNotLogged
				if err := waitStopped(pid, 2*time.Second); err != nil {
					// It did not stop itself (its write was refused, so the answer did not
					// say): the fault lands now, wherever the process is.
					variant = turnNotStopped
					r.stop(pid)
				} else if unl, ok := tail.unlock(w, tok); ok {
					in.startAt(unl.R) // it stopped itself right after
					variant = r.whereIsTurn(tail, tok)
				}
				in.describe(variant)
				hit(r, s, pid, p, in)()
			}()
			return turnThink, false // the write is applied; then the worker stops itself
		},
	}
}

// whereIsTurn says where the lock was when a between-holds fault hit the process whose last
// Unlock (in tail's log) was of token tok: parked, held by a sibling, or released. The
// process's tokens from its last server token T are T … T+15, and the server's next token is
// at least T+16, so the key's token tells whether the lock is still the process's.
func (r *runner) whereIsTurn(tail *logTail, tok uint64) string {
	held := tail.holding(tok)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	v, err := r.keys.Get(ctx, dlockKey(r.lock)).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return turnReleased
	case err != nil:
		return turnReleased + " (key unread: " + err.Error() + ")"
	}
	f := strings.Fields(v)
	if len(f) < 2 || f[0] == "-" {
		return turnReleased
	}
	t, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil || tok < t || tok > t+15 {
		return turnReleased // another client's
	}
	if held {
		return turnHeld
	}
	return turnParked
}

// workerLog is the log file of incarnation inc of slot i.
func (r *runner) workerLog(i, inc int) string {
	return filepath.Join(r.conf.Dir, fmt.Sprintf("worker-%d.%d.jsonl", i, inc))
}

// logTail reads a worker's log as it grows: the events since the last read.
type logTail struct {
	path   string
	off    int64
	events []event
}

// read appends the complete lines written since the last read.
func (t *logTail) read() {
	f, err := os.Open(t.path)
	if err != nil {
		return
	}
	defer f.Close()
	if _, err := f.Seek(t.off, 0); err != nil {
		return
	}
	br := bufio.NewReader(f)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			return // an incomplete line is read again next time
		}
		t.off += int64(len(line))
		var e event
		if json.Unmarshal(line, &e) == nil {
			t.events = append(t.events, e)
		}
	}
}

// unlock returns the Unlock event of w's lease of tok, if the log has it.
func (t *logTail) unlock(w who, tok uint64) (event, bool) {
	t.read()
	for _, e := range t.events {
		if e.K == "unl" && e.G == w.G && e.Tok == tok {
			return e, true
		}
	}
	return event{}, false
}

// holding reports whether, as far as the log says now, a goroutine of the process holds a lease
// with a token after tok (the tail starts before the Unlock of tok, so it sees every such
// acquisition): one acquired and not yet unlocked.
func (t *logTail) holding(tok uint64) bool {
	t.read()
	open := map[uint64]bool{}
	for _, e := range t.events {
		switch {
		case e.K == "acq" && e.Res == "ok" && e.Tok > tok:
			open[e.Tok] = true
		case e.K == "unl":
			delete(open, e.Tok)
		}
	}
	return len(open) > 0
}

// checkTurnFaults counts a turn row's between-holds faults by where they found the lock, and
// measures, for those that found it parked, how long the other processes went without it:
// from the fault to their next acquisition (a kill: about the TTL, the parked lease running
// out; checkRecovery bounds it). A run none of whose faults found the lock parked is noted:
// it exercised no parked turn.
func (a *analysis) checkTurnFaults() {
	if a.sc.turnSlice == 0 {
		return
	}
	f := a.f
	between := 0
	for _, flt := range a.d.faults {
		if !isBetweenHolds(flt.Variant) {
			continue
		}
		between++
		switch {
		case flt.Variant == turnParked:
			f.TurnParked++
		case flt.Variant == turnHeld:
			f.TurnHeld++
		default:
			f.TurnReleased++
			continue
		}
		if flt.Variant != turnParked {
			continue
		}
		next := int64(0)
		for _, q := range a.acqs {
			if !q.w.sameProcess(flt.who()) && q.r > flt.Start && (next == 0 || q.r < next) {
				next = q.r
			}
		}
		if next > 0 {
			f.TurnParkedWaitMax = max(f.TurnParkedWaitMax, time.Duration(next-flt.Start))
		}
	}
	if between > 0 && f.TurnParked == 0 {
		a.note("no between-holds fault (of %d) found the lock parked: %d held by a sibling, %d released", between, f.TurnHeld, f.TurnReleased)
	}
}
