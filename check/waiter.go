package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// The waiter-faults scenario: faults that hit a process waiting for the lock, not the holder.
// Across clients dlock grants on release: a Lock that finds the lock held queues its client
// on the server (the lock's <key>:q sorted set and <key>:w hash of entries), and a final
// release, or an acquisition that finds the lock free, gives the lock to the first live entry
// for its acceptance window and announces "g <token> <entry id> <window ms>" on the release
// channel; the entry's client makes the lease from the announcement. A waiter that is frozen
// or dead when its turn comes holds the lock without using it until the window runs out, and
// the others must then get it: the scenario measures how long that takes.
//
// How the harness knows a process waits, without touching the library: it reads the queue on
// the server. The trap springs on the holder's read, and holds that read while it reads the
// queue and stops (or kills) the process whose entry is first among those of other processes
// (an entry's description names its process's pid): the holder cannot release meanwhile, so
// the process picked is still waiting, and its turn comes when the holder lets go. The
// harness also listens on the release channel (directly, not through a proxy) and records
// every grant, so the analysis knows when the hit waiter was granted the lock and with which
// token.

// waiterVariants are what the fault does to the waiting process, in the order the schedule
// alternates between them: freeze it past its acceptance window but within the TTL, freeze
// it past the TTL, or SIGKILL it (a new incarnation takes its slot).
var waiterVariants = []string{"stop-past-window", "stop-past-ttl", "kill"}

// acceptWindow is the acceptance window of a queue entry for a lease of ttl, as dlock sets it
// (wait.go, acceptWindow): how long an entry lives unless its client refreshes it, and how
// long a grant lasts before its client renews it. A frozen or dead waiter delays the others
// by about this much.
func acceptWindow(ttl time.Duration) time.Duration { return min(ttl, time.Second) }

// minWaiterTTL is the shortest lease with room for the stop-past-window variant: a pause
// longer than the window by a margin, and shorter than the TTL by one.
func minWaiterTTL() time.Duration { return time.Second + 2*waiterPauseMargin }

// waiterPauseMargin keeps a pause clear of the window and of the TTL it must outlast or not.
const waiterPauseMargin = 150 * time.Millisecond

func planWaiter(p *plannedFault, rng *rand.Rand, n int, ttl time.Duration) {
	p.variant = waiterVariants[n%len(waiterVariants)]
	p.dur = waiterPause(p.variant, rng, ttl)
}

// waiterPause draws how long a waiter is frozen in variant: past its acceptance window but
// within the TTL, or past the TTL; 0 for any other variant (a kill).
func waiterPause(variant string, rng *rand.Rand, ttl time.Duration) time.Duration {
	win := acceptWindow(ttl)
	switch variant {
	case "stop-past-window":
		return win + waiterPauseMargin + time.Duration(rng.Int64N(int64(max(ttl-win-2*waiterPauseMargin, time.Millisecond))))
	case "stop-past-ttl":
		return ttl + 200*time.Millisecond + time.Duration(rng.Int64N(int64(400*time.Millisecond)))
	}
	return 0
}

// waiterHit is what a waiter fault hit: a process queued for the lock on the server.
type waiterHit struct {
	Slot  int    `json:"slot"`
	Inc   int    `json:"inc"`
	PID   int    `json:"pid"`
	Entry string `json:"entry"` // its first entry's id: "<client id>.<n>"
	Pos   int    `json:"pos"`   // that entry's place in the server's queue (0: first)
	Queue int    `json:"queue"` // entries in the queue then
}

func (h waiterHit) process() who { return who{Slot: h.Slot, Inc: h.Inc, G: -1} }

func (h waiterHit) String() string { return fmt.Sprintf("worker %d.%d (pid %d)", h.Slot, h.Inc, h.PID) }

// client is the id of the hit process's dlock client: its entries, and the grants to them, are
// named "<client>.<n>".
func (h waiterHit) client() string {
	if i := strings.LastIndexByte(h.Entry, '.'); i > 0 {
		return h.Entry[:i]
	}
	return h.Entry
}

var pidField = regexp.MustCompile(`"pid":(\d+)[,}]`)

// queueEntry is one entry of the lock's queue on the server.
type queueEntry struct {
	id  string
	pid int // from the entry's holder description; 0 when it names none
}

// readQueue reads the lock's queue on the server in order, and the pid its holder's
// description names (0 when the lock is free or released).
func readQueue(ctx context.Context, rdb *redis.Client, key string) (entries []queueEntry, holderPID int, err error) {
	pipe := rdb.Pipeline()
	ids := pipe.ZRange(ctx, key+":q", 0, -1)
	all := pipe.HGetAll(ctx, key+":w")
	val := pipe.Get(ctx, key)
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return nil, 0, err
	}
	descs := all.Val()
	for _, id := range ids.Val() {
		e := queueEntry{id: id}
		if m := pidField.FindStringSubmatch(descs[id]); m != nil {
			e.pid, _ = strconv.Atoi(m[1])
		}
		entries = append(entries, e)
	}
	if v := val.Val(); v != "" && !strings.HasPrefix(v, "- ") {
		if m := pidField.FindStringSubmatch(v); m != nil {
			holderPID, _ = strconv.Atoi(m[1])
		}
	}
	return entries, holderPID, nil
}

// hitWaiter stops or kills the process first in the lock's server-side queue among those
// other than the holder's, while the holder's read waits for the trap: the holder cannot
// release meanwhile, so the process is still waiting when it is hit, and is next to be granted.
// A read that finds no other process queued re-arms the trap for the next read, for at most
// waiterSearch.
func (r *runner) hitWaiter(p plannedFault, in *injection) *trap {
	var t *trap
	var first int64 // mono ns of the first read that found no waiter
	t = &trap{op: 'R', fire: func(w who, tok uint64) (time.Duration, bool) {
		_, holderPID := r.process(w)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		entries, _, err := readQueue(ctx, r.keys, dlockKey(r.lock))
		cancel()
		if err != nil {
			r.infraf("read the lock's queue: %v", err)
		}
		var hit *waiterHit
		var s *slot
		for i, e := range entries {
			if e.pid == 0 || e.pid == holderPID {
				continue
			}
			if s = r.slotOf(e.pid); s != nil {
				inc, _, _ := s.current()
				hit = &waiterHit{Slot: s.i, Inc: inc, PID: e.pid, Entry: e.id, Pos: i, Queue: len(entries)}
				break
			}
		}
		if hit == nil {
			r.waiterMisses.Add(1)
			if first == 0 {
				first = mono()
			}
			if mono()-first < int64(waiterSearch) {
				r.res.arm(t) // nobody else waits on the server yet: try at the next read
				return 0, false
			}
			// Bounded, so that the schedule never waits for good: the fault is recorded
			// without a waiter, and the analysis fails the run.
			in.spring()
			in.record(w, tok, p.variant)
			r.infraf("no other worker process queued on the server for the lock at any holder read in %v", waiterSearch)
			in.end()
			in.settle()
			return 0, false
		}
		in.spring()
		in.recordWaiter(w, tok, p.variant, *hit)
		if p.variant == "kill" {
			_ = syscall.Kill(hit.PID, syscall.SIGKILL)
			_, _, exited := s.current()
			go func() {
				defer in.settle()
				<-exited
				in.end()
				select {
				case <-r.ending:
				default:
					if err := r.spawn(s); err != nil {
						r.infraf("respawn worker %d: %v", s.i, err)
					}
				}
			}()
			return 0, false
		}
		r.stop(hit.PID)
		go func() {
			defer in.settle()
			time.Sleep(p.dur)
			_ = syscall.Kill(hit.PID, syscall.SIGCONT)
			in.end()
		}()
		return 0, false
	}}
	return t
}

// waiterSearch bounds how long a waiter-fault trap keeps looking for a queued process: less
// than the schedule gives a trap to spring (10 s).
const waiterSearch = 8 * time.Second

// slotOf returns the slot whose running worker process has pid, or nil.
func (r *runner) slotOf(pid int) *slot {
	for _, s := range r.slots {
		if _, p, _ := s.current(); p == pid {
			return s
		}
	}
	return nil
}

// recordWaiter records a waiter fault as starting now: w's request (the holder's, token tok)
// sprang it, and it hit the waiting process hit.
func (in *injection) recordWaiter(w who, tok uint64, variant string, hit waiterHit) {
	in.record(w, tok, variant)
	r := in.r
	r.mu.Lock()
	r.faults[in.i].Waiter = &hit
	r.mu.Unlock()
}

// announcement is one message on the lock's release channel, as the harness heard it.
type announcement struct {
	T       int64  `json:"t"` // CLOCK_MONOTONIC ns when it arrived
	Payload string `json:"payload"`
}

// grant is an announced grant: the lock given to a queue entry with a token.
type grant struct {
	at    int64
	token uint64
	entry string
}

// grants parses the grants among the announcements ("g <token> <entry id> <window ms>").
func grants(ans []announcement) []grant {
	var gs []grant
	for _, a := range ans {
		f := strings.Fields(a.Payload)
		if len(f) < 3 || f[0] != "g" {
			continue
		}
		tok, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		gs = append(gs, grant{at: a.T, token: tok, entry: f[2]})
	}
	return gs
}

// listener records every announcement on a channel until closed.
type listener struct {
	ps *redis.PubSub
	wg sync.WaitGroup

	mu  sync.Mutex
	got []announcement
}

// listen subscribes rdb to channel; it returns once the subscription is confirmed.
func listen(rdb *redis.Client, channel string) (*listener, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l := &listener{ps: rdb.Subscribe(ctx, channel)}
	if _, err := l.ps.Receive(ctx); err != nil {
		_ = l.ps.Close()
		return nil, fmt.Errorf("subscribe to %s: %w", channel, err)
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for m := range l.ps.Channel(redis.WithChannelSize(4096)) {
			at := mono()
			l.mu.Lock()
			l.got = append(l.got, announcement{T: at, Payload: m.Payload})
			l.mu.Unlock()
		}
	}()
	return l, nil
}

// close ends the subscription and returns what it heard.
func (l *listener) close() []announcement {
	_ = l.ps.Close()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]announcement(nil), l.got...)
}

// saveAnnouncements keeps what the listener heard beside the worker logs.
func saveAnnouncements(dir string, ans []announcement) {
	if b, err := json.Marshal(ans); err == nil {
		_ = os.WriteFile(filepath.Join(dir, "announcements.json"), b, 0o644)
	}
}

// checkWaiterStalls measures, where the fault hits a waiter (waiterFaults), the stall each
// fault caused: the time from the fault to the next acquisition by another process after the
// server granted the lock to the hit waiter (announced on the release channel, to an entry of
// the hit process's client, while it was frozen or dead), or after the fault when no such
// grant came. It is the fault's recovery figure. A fault after which the next acquisition's
// Lock call began only after that grant (nobody else waited) measures no stall, and is left
// out. The note says how many stalls ran past the acceptance window + killRecoverySlack after
// the grant (what dlock aims at: a dead waiter delays the others by about its window); one
// over the acceptance window + TTL from the fault means the queue stalled and fails the run; so
// does a fault that no acquisition by another process followed, and a run in which no hit
// waiter was granted the lock while down (it proves nothing). It also notes how often a hit
// waiter, let go again, got from Lock the lease granted while it was frozen, after that
// lease's window had run out: its first context check must say lost (checkLeaseContexts
// fails the run otherwise).
func (a *analysis) checkWaiterStalls() {
	if !a.sc.waiterFaults {
		return
	}
	f := a.f
	ttl := a.d.conf.TTL
	win := acceptWindow(ttl)
	bound := win + ttl
	gs := grants(a.d.announcements)
	firstCheck := map[uint64]event{} // per token, its lease's first context check
	for _, e := range a.d.events {
		if c, ok := firstCheck[e.Tok]; e.K == "chk" && (!ok || e.S < c.S) {
			firstCheck[e.Tok] = e
		}
	}
	var toGrant, fromGrant []time.Duration
	perVariant := map[string][]time.Duration{}
	idle, stale, staleLive := 0, 0, 0
	for _, flt := range a.d.faults {
		h := flt.Waiter
		if h == nil {
			a.fail("harness: %s fault at %s recorded no waiter", flt.Kind, ts(flt.Start, a.d.start))
			continue
		}
		hit := h.process()
		until := int64(math.MaxInt64) // a dead client's entries are granted whenever their turn comes
		if flt.Variant != "kill" {
			until = flt.End // a frozen one's, until it runs again
		}
		var g *grant
		for i := range gs {
			if gs[i].at >= flt.Start && gs[i].at <= until && strings.HasPrefix(gs[i].entry, h.client()+".") {
				g = &gs[i]
				break
			}
		}
		from := flt.Start
		var next *acq
		if g != nil {
			f.WaiterGranted++
			from = g.at
			toGrant = append(toGrant, time.Duration(g.at-flt.Start))
			for i := range a.acqs { // by token: the next grant to anyone else
				if q := &a.acqs[i]; q.tok > g.token && !q.w.sameProcess(hit) {
					next = q
					break
				}
			}
			for _, q := range a.acqs {
				if q.tok == g.token && q.w.sameProcess(hit) && next != nil && q.r > next.r {
					stale++ // the frozen waiter's Lock returned the grant after the lock moved on
					if c, ok := firstCheck[q.tok]; ok && c.Live {
						staleLive++
					}
				}
			}
		} else {
			for i := range a.acqs {
				if q := &a.acqs[i]; q.r > flt.Start && !q.w.sameProcess(hit) && (next == nil || q.r < next.r) {
					next = q
				}
			}
		}
		if next == nil {
			a.fail("%s fault (%s) at %s on waiting %s: no acquisition by another process followed it", flt.Kind, flt.Variant, ts(flt.Start, a.d.start), h)
			continue
		}
		if !waiting(a.d.events, hit, from) {
			idle++ // nobody else waited: no stall to measure
			continue
		}
		stall := time.Duration(next.r - flt.Start)
		f.Recovery = append(f.Recovery, stall)
		perVariant[flt.Variant] = append(perVariant[flt.Variant], stall)
		if g != nil {
			fromGrant = append(fromGrant, time.Duration(next.r-g.at))
		}
		if stall > bound {
			granted := "no grant to it was announced while it was down"
			if g != nil {
				granted = fmt.Sprintf("granted token %d at %s", g.token, ts(g.at, a.d.start))
			}
			a.fail("%s fault (%s) at %s on waiting %s (entry %d of %d; %s): the next acquisition by another process (%s, token %d, Lock %s–%s) came %v after the fault, over the acceptance window + TTL = %v: the queue stalled",
				flt.Kind, flt.Variant, ts(flt.Start, a.d.start), h, h.Pos+1, h.Queue, granted,
				next.w, next.tok, ts(next.s, a.d.start), ts(next.r, a.d.start), stall.Round(time.Millisecond), bound)
		}
	}
	if len(a.d.faults) > 0 && f.WaiterGranted == 0 {
		a.fail("no hit waiter was granted the lock while frozen or dead: the run proves nothing")
	}
	var variants []string
	for _, v := range waiterVariants {
		if ds := perVariant[v]; len(ds) > 0 {
			variants = append(variants, fmt.Sprintf("%s %d, max %s", v, len(ds), ms(slices.Max(ds))))
		}
	}
	over := 0
	for _, d := range fromGrant {
		if d > win+killRecoverySlack {
			over++
		}
	}
	a.note("waiter faults: %d; the hit waiter was granted the lock while frozen or dead after %d of them (fault → grant median %s ms); stall (fault → next acquisition by another process) median %s / max %s ms (%s); grant → that acquisition median %s / max %s ms, over the acceptance window %v + %d ms after %d of them; the run fails over window + TTL = %v; %d left out (nobody else waited); %d holder reads found no other process queued",
		len(a.d.faults), f.WaiterGranted, ms(median(toGrant)), ms(median(f.Recovery)), ms(maxOf(f.Recovery)), strings.Join(variants, "; "),
		ms(median(fromGrant)), ms(maxOf(fromGrant)), win, killRecoverySlack.Milliseconds(), over, bound, idle, a.d.waiterMisses)
	if stale > 0 {
		a.note("%d times a frozen waiter, let go, got from Lock the lease granted while it was frozen, after its window had run out and the lock had gone on (its first context check said held %d times)", stale, staleLive)
	}
}

// waiting reports whether a goroutine of a process other than hit was inside Lock at t (its
// call ended in a lease or in an error).
func waiting(events []event, hit who, t int64) bool {
	for _, e := range events {
		if e.K == "acq" && e.S <= t && e.R >= t && !e.who().sameProcess(hit) {
			return true
		}
	}
	return false
}

// median is the middle of ds (the lower one of an even count), 0 for none.
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// maxOf is the largest of ds, 0 for none.
func maxOf(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return slices.Max(ds)
}
