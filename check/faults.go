package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The faults. Each kind is a pair of small functions: plan draws its durations and variant
// from the seeded schedule, inject builds the trap that plays it out. A trap springs on the
// next request of the matching kind to reach the resource, so a fault always hits the
// goroutine holding the lock, inside its critical section, and with it that goroutine's whole
// worker process.

// fault is one kind of fault: a scenario's row names it.
type fault struct {
	// plan fills in what the fault needs beyond the schedule's gap: its variant, duration,
	// work and servers. n counts the faults planned before it. It draws from rng in a fixed
	// order, so that a seed gives the same schedule in every build.
	plan func(p *plannedFault, rng *rand.Rand, n int, ttl time.Duration)
	// inject returns the trap that plays out p, reporting to in.
	inject func(r *runner, p plannedFault, in *injection) *trap
}

var (
	pauseHolder     = fault{plan: planPause, inject: (*runner).pauseHolder}
	killHolder      = fault{plan: planNothing, inject: (*runner).killHolder}
	cutHolderOff    = fault{plan: planPartition, inject: (*runner).cutHolderOff}
	slowHolderLinks = fault{plan: planLatency, inject: (*runner).slowHolderLinks}
	restartRedis    = fault{plan: planRestart, inject: (*runner).restartRedis}
	failOver        = fault{plan: planFailover, inject: (*runner).failOver}
	killMinority    = fault{plan: planKillMinority, inject: (*runner).killMinority}
	// restartMajorityMember restarts a server of the holder's bare majority empty at once;
	// restartMajorityMemberLate keeps it down longer than a lease first.
	restartMajorityMember     = fault{plan: planMajorityRestart(false), inject: (*runner).restartMajorityMember}
	restartMajorityMemberLate = fault{plan: planMajorityRestart(true), inject: (*runner).restartMajorityMember}
	evictHeldLock             = fault{plan: planEviction, inject: (*runner).evictHeldLock}
	exhaustMemory             = fault{plan: planOutOfMemory, inject: (*runner).exhaustMemory}
	hitWaiter                 = fault{plan: planWaiter, inject: (*runner).hitWaiter}
)

// pauseVariants are the places a paused holder is frozen, in the order the schedule
// alternates between them.
var pauseVariants = []string{"before-write", "after-read"}

func planNothing(*plannedFault, *rand.Rand, int, time.Duration) {}

func planPause(p *plannedFault, rng *rand.Rand, n int, ttl time.Duration) {
	p.variant = pauseVariants[n%len(pauseVariants)]
	p.dur = ttl + 200*time.Millisecond + time.Duration(rng.Int64N(int64(400*time.Millisecond)))
}

func planPartition(p *plannedFault, rng *rand.Rand, _ int, ttl time.Duration) {
	p.dur = ttl + 300*time.Millisecond + time.Duration(rng.Int64N(int64(300*time.Millisecond)))
	p.work = ttl + 200*time.Millisecond
}

func planLatency(p *plannedFault, rng *rand.Rand, _ int, _ time.Duration) {
	p.dur = 2*time.Second + time.Duration(rng.Int64N(int64(time.Second)))
}

func planRestart(p *plannedFault, rng *rand.Rand, _ int, ttl time.Duration) {
	p.dur = 100*time.Millisecond + time.Duration(rng.Int64N(int64(200*time.Millisecond)))
	p.work = time.Duration(rng.Int64N(int64(ttl / 2)))
}

func planFailover(p *plannedFault, rng *rand.Rand, _ int, ttl time.Duration) {
	p.work = time.Duration(rng.Int64N(int64(ttl)))
}

func planKillMinority(p *plannedFault, rng *rand.Rand, _ int, ttl time.Duration) {
	p.servers = rng.Perm(quorum.servers())
	p.dur = ttl + 300*time.Millisecond + time.Duration(rng.Int64N(int64(500*time.Millisecond)))
	p.work = time.Duration(rng.Int64N(int64(ttl / 2)))
}

// planMajorityRestart plans a restart of a majority member: at once (as fast as redis-server
// starts), or delayed past any lease.
func planMajorityRestart(delayed bool) func(*plannedFault, *rand.Rand, int, time.Duration) {
	return func(p *plannedFault, rng *rand.Rand, _ int, ttl time.Duration) {
		p.servers = rng.Perm(quorum.servers())
		p.work = time.Duration(rng.Int64N(int64(ttl)))
		p.dur = 0
		if delayed {
			p.dur = ttl + 300*time.Millisecond
		}
	}
}

// planEviction gives the holder a twentieth to a half of a TTL of work: a short one often ends
// before its client's next renewal finds the key gone, so the holder writes after a second
// holder took the lock (a lost update unfenced, a refused write fenced); a longer one lets it
// learn in time. Either outlasts the filler's burst (a few ms), so the key is evicted while the
// holder holds it.
func planEviction(p *plannedFault, rng *rand.Rand, _ int, ttl time.Duration) {
	p.work = ttl/20 + time.Duration(rng.Int64N(int64(ttl/2-ttl/20)))
}

// planOutOfMemory keeps the server out of memory for longer than a lease, so that renewals,
// releases and acquisitions all meet it. The holder works up to a TTL (renewing its lease, a
// third of a TTL apart, under it) and unlocks inside it.
func planOutOfMemory(p *plannedFault, rng *rand.Rand, _ int, ttl time.Duration) {
	p.dur = ttl + 500*time.Millisecond + time.Duration(rng.Int64N(int64(500*time.Millisecond)))
	p.work = time.Duration(rng.Int64N(int64(ttl)))
}

// injection is the bookkeeping of one fault, the same for every kind: the schedule waits on
// fired (the trap sprang) and then on done (the fault played out); the run waits on
// r.faultWG for the fault and whatever it started (a respawn).
type injection struct {
	r           *runner
	kind        string
	fired, done chan struct{}
	i           int // the fault's index in r.faults
}

func newInjection(r *runner) *injection {
	return &injection{r: r, kind: r.conf.Scenario, fired: make(chan struct{}), done: make(chan struct{})}
}

// spring is the first thing a trap does: the fault is under way. settle must follow once
// the fault and whatever it started are over.
func (in *injection) spring() {
	in.r.faultWG.Add(1)
	close(in.fired)
}

// settle tells the run that nothing the fault started is left.
func (in *injection) settle() { in.r.faultWG.Done() }

// record records the fault as starting now, sprung by w's request with token tok.
func (in *injection) record(w who, tok uint64, variant string) {
	r := in.r
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faults = append(r.faults, faultRec{Kind: in.kind, Variant: variant, Slot: w.Slot, Inc: w.Inc, G: w.G, Token: tok, Start: mono()})
	in.i = len(r.faults) - 1
}

// describe sets the fault's variant once it is known (it played out).
func (in *injection) describe(variant string) {
	r := in.r
	r.mu.Lock()
	r.faults[in.i].Variant = variant
	r.mu.Unlock()
}

// startAt moves the fault's recorded start to t (it was sprung earlier: turns.go).
func (in *injection) startAt(t int64) {
	r := in.r
	r.mu.Lock()
	r.faults[in.i].Start = t
	r.mu.Unlock()
}

// end records the end of the fault and lets the schedule go on.
func (in *injection) end() { in.endAt(mono()) }

// endAt records the end of the fault at t and lets the schedule go on.
func (in *injection) endAt(t int64) {
	r := in.r
	r.mu.Lock()
	r.faults[in.i].End = t
	r.mu.Unlock()
	close(in.done)
}

// process returns the slot and pid of the worker process that w belongs to. It is the running
// incarnation: an older one is dead and makes no requests.
func (r *runner) process(w who) (*slot, int) {
	s := r.slots[w.Slot]
	_, pid, _ := s.current()
	return s, pid
}

// pauseHolder SIGSTOPs the holder's process past its TTL, then SIGCONTs it, where the drawn
// variant says.
func (r *runner) pauseHolder(p plannedFault, in *injection) *trap {
	if p.variant == "before-write" {
		return r.pauseBeforeWrite(p, in)
	}
	return r.pauseAfterRead(p, in)
}

// pauseBeforeWrite freezes the holder between its last context check and its write reaching
// the resource, the worst place: the trap holds the write until the process runs again, so it
// lands after the pause, and only a fence can stop it.
func (r *runner) pauseBeforeWrite(p plannedFault, in *injection) *trap {
	return &trap{op: 'W', fire: func(w who, tok uint64) (time.Duration, bool) {
		in.spring()
		defer in.settle()
		_, pid := r.process(w)
		in.record(w, tok, p.variant)
		r.stop(pid)
		time.Sleep(p.dur)
		_ = syscall.Kill(pid, syscall.SIGCONT)
		in.end()
		return 0, false // the write is applied now, after the pause
	}}
}

// pauseAfterRead freezes the holder with its read's answer in flight: it must see the loss at
// its next context check.
func (r *runner) pauseAfterRead(p plannedFault, in *injection) *trap {
	return &trap{op: 'R', fire: func(w who, tok uint64) (time.Duration, bool) {
		in.spring()
		_, pid := r.process(w)
		in.record(w, tok, p.variant)
		r.stop(pid) // frozen before it gets its answer
		go func() {
			defer in.settle()
			time.Sleep(p.dur)
			_ = syscall.Kill(pid, syscall.SIGCONT)
			in.end()
		}()
		return 0, false
	}}
}

// killHolder SIGKILLs the holder's process inside its critical section; once it is gone a new
// incarnation takes its slot (unless the run is ending).
func (r *runner) killHolder(_ plannedFault, in *injection) *trap {
	return &trap{op: 'R', fire: func(w who, tok uint64) (time.Duration, bool) {
		in.spring()
		s, pid := r.process(w)
		in.record(w, tok, "")
		_ = syscall.Kill(pid, syscall.SIGKILL)
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
		return 0, true // the killed worker never gets an answer
	}}
}

// cutHolderOff makes the proxies of the holder's process hold every byte past its TTL, and
// keeps the holder working meanwhile: it must be told that its lease is lost.
func (r *runner) cutHolderOff(p plannedFault, in *injection) *trap {
	return &trap{op: 'R', fire: func(w who, tok uint64) (time.Duration, bool) {
		in.spring()
		s := r.slots[w.Slot]
		for _, px := range s.proxies {
			px.Block()
		}
		in.record(w, tok, "")
		go func() {
			defer in.settle()
			time.Sleep(p.dur)
			for _, px := range s.proxies {
				px.Unblock()
			}
			in.end()
		}()
		return p.work, false // keep working while cut off: the lease must be reported lost
	}}
}

// slowHolderLinks delays every byte between the holder's process and Redis by 50 ms ± 25 ms
// for a while.
func (r *runner) slowHolderLinks(p plannedFault, in *injection) *trap {
	return &trap{op: 'R', fire: func(w who, tok uint64) (time.Duration, bool) {
		in.spring()
		s := r.slots[w.Slot]
		for _, px := range s.proxies {
			px.SetJitter(25 * time.Millisecond)
			px.SetDelay(50 * time.Millisecond)
		}
		in.record(w, tok, "")
		go func() {
			defer in.settle()
			time.Sleep(p.dur)
			for _, px := range s.proxies {
				px.SetDelay(0)
				px.SetJitter(0)
			}
			in.end()
		}()
		return 0, false
	}}
}

// restartRedis kills the redis-server while the holder works and starts it again empty (no
// persistence): the holder is mid-work when its lock vanishes.
func (r *runner) restartRedis(p plannedFault, in *injection) *trap {
	return &trap{op: 'R', fire: func(w who, tok uint64) (time.Duration, bool) {
		in.spring()
		in.record(w, tok, "")
		_ = r.srvs[0].Kill()
		go func() {
			defer in.settle()
			time.Sleep(p.dur)
			if err := r.srvs[0].Restart(); err != nil {
				r.infraf("redis restart: %v", err)
			} else {
				in.describe(r.leaseAfterRestart(tok))
			}
			in.end()
		}()
		return p.work, false
	}}
}

// Where a restart found the lease of the holder it hit (faultRec.Variant): a server that
// persists its writes (scenario.persist) must bring it back, or the run proves nothing.
const (
	restartKept  = "lease kept"
	restartGone  = "lease gone"
	restartMoved = "lease ended before the kill"
)

// leaseAfterRestart reads the lock's key on the restarted server (directly, not through a
// proxy) and says whether it still holds the lease of tok.
func (r *runner) leaseAfterRestart(tok uint64) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := r.srvs[0].Do(ctx, "GET", dlockKey(r.lock))
	for err != nil && strings.Contains(err.Error(), "LOADING") && ctx.Err() == nil {
		// The server answers before it has loaded its data back: ask again once it has.
		time.Sleep(5 * time.Millisecond)
		v, err = r.srvs[0].Do(ctx, "GET", dlockKey(r.lock))
	}
	switch f := strings.Fields(v); {
	case err != nil:
		return fmt.Sprintf("%s? the key could not be read: %v", restartGone, err)
	case v == "":
		return restartGone + ": no key"
	case len(f) >= 2 && f[0] != "-" && f[1] == strconv.FormatUint(tok, 10):
		return fmt.Sprintf("%s: the key holds token %d", restartKept, tok)
	case len(f) >= 2 && f[1] >= strconv.FormatUint(tok, 10) && len(f[1]) == len(strconv.FormatUint(tok, 10)):
		// Released by the holder, or granted on, before the kill landed: the restart kept the
		// key, but the hit lease had ended already.
		return fmt.Sprintf("%s: the key reads %q", restartMoved, v)
	default:
		return fmt.Sprintf("%s: the key reads %q", restartGone, v)
	}
}

// failOver SIGKILLs the Sentinel group's master while a holder works; Sentinel promotes a
// replica and the old master comes back empty as a replica. Replication is asynchronous: a
// lock not yet copied to the promoted replica is gone.
func (r *runner) failOver(p plannedFault, in *injection) *trap {
	return &trap{op: 'R', fire: func(w who, tok uint64) (time.Duration, bool) {
		in.spring()
		in.record(w, tok, r.group.Master().Addr)
		go func() {
			defer in.settle()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, _, err := r.group.Failover(ctx); err != nil {
				r.infraf("sentinel failover: %v", err)
			}
			in.end()
		}()
		return p.work, false
	}}
}

// killMinority kills a minority (2 of 5) of the quorum's servers while a holder works; they
// come back empty after more than a lease.
func (r *runner) killMinority(p plannedFault, in *injection) *trap {
	return &trap{op: 'R', fire: func(w who, tok uint64) (time.Duration, bool) {
		in.spring()
		down := p.servers[:2]
		in.record(w, tok, fmt.Sprintf("servers %d,%d", down[0], down[1]))
		for _, k := range down {
			_ = r.srvs[k].Kill()
		}
		go func() {
			defer in.settle()
			time.Sleep(p.dur)
			for _, k := range down {
				if err := r.srvs[k].Restart(); err != nil {
					r.infraf("redis restart: %v", err)
				}
			}
			in.end()
		}()
		return p.work, false
	}}
}

// evictHeldLock has the filler write back to back into the evicting server while the holder
// works, until the server evicts the lock's key (bounded: burstKeys, burstTime). The holder's
// client learns of it at its next renewal; a client that polls the lock can take it before.
func (r *runner) evictHeldLock(p plannedFault, in *injection) *trap {
	return &trap{op: 'R', fire: func(w who, tok uint64) (time.Duration, bool) {
		in.spring()
		in.record(w, tok, "")
		go func() {
			defer in.settle()
			keys, evicted, err := r.filler.burst()
			switch {
			case err != nil:
				r.infraf("filler burst: %v", err)
			case evicted:
				in.describe(fmt.Sprintf("lock key evicted after %d filler keys", keys))
			default:
				in.describe(fmt.Sprintf("lock key not evicted by %d filler keys", keys))
			}
			in.end()
		}()
		return p.work, false
	}}
}

// exhaustMemory sets the noeviction server's maxmemory to half its used_memory while the
// holder works, so that it refuses every write that needs memory, and sets it back after
// p.dur. The fault's record runs from the reply to the first CONFIG SET to the sending of the
// second: the server is out of memory all through it.
func (r *runner) exhaustMemory(p plannedFault, in *injection) *trap {
	return &trap{op: 'R', fire: func(w who, tok uint64) (time.Duration, bool) {
		in.spring()
		srv := r.srvs[0]
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		was, err1 := srv.Do(ctx, "CONFIG", "GET", "maxmemory")
		used, err2 := infoField(ctx, srv, "memory", "used_memory")
		limit := used / 2
		_, err3 := srv.Do(ctx, "CONFIG", "SET", "maxmemory", strconv.FormatInt(limit, 10))
		cancel()
		if err := errors.Join(err1, err2, err3); err != nil {
			r.infraf("out of memory: %v", err)
		}
		in.record(w, tok, fmt.Sprintf("maxmemory %d < used_memory %d for %v", limit, used, p.dur.Round(time.Millisecond)))
		_, was, _ = strings.Cut(was, "\n") // CONFIG GET replies name, value
		go func() {
			defer in.settle()
			time.Sleep(p.dur)
			var err error
			var sent int64
			for range 5 { // bounded: a server that cannot be told fails the run
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				sent = mono()
				_, err = srv.Do(ctx, "CONFIG", "SET", "maxmemory", was)
				cancel()
				if err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				r.infraf("out of memory: set maxmemory back to %s: %v", was, err)
			}
			in.endAt(sent)
		}()
		return p.work, false
	}}
}

// restartMajorityMember plays Redlock's hazard. Under contention a holder often holds the lock
// on a bare majority only (a competing attempt took the other servers, then released them).
// The checker reads every server to see where the holder's lease is, keeps it on three of them
// (by cutting the holder's links to the other two), and once its keys there would have expired
// (TTL + 100 ms), SIGKILLs one server of the three and restarts it empty after p.dur. At once:
// the others can form a majority of that empty server and the two the holder cannot reach,
// while the holder still believes it holds the lock. Delayed past the lease: the holder cannot
// renew on a majority and learns it lost the lock before the server is back.
func (r *runner) restartMajorityMember(p plannedFault, in *injection) *trap {
	return &trap{op: 'R', fire: func(w who, tok uint64) (time.Duration, bool) {
		in.spring()
		s, pid := r.process(w)
		keep, cut, note := r.bareMajority(pid, p.servers)
		c := keep[0]
		for _, k := range cut {
			s.proxies[k].Block()
		}
		in.record(w, tok, fmt.Sprintf("held on %v%s; links to %v cut; server %d down %v", keep, note, cut, c, p.dur.Round(time.Millisecond)))
		go func() {
			defer in.settle()
			time.Sleep(r.conf.TTL + 100*time.Millisecond) // its keys on the cut servers expire
			_ = r.srvs[c].Kill()
			time.Sleep(p.dur)
			if err := r.srvs[c].Restart(); err != nil {
				r.infraf("redis restart: %v", err)
			}
			time.Sleep(r.conf.TTL)
			for _, k := range cut {
				s.proxies[k].Unblock()
			}
			in.end()
		}()
		return r.conf.TTL + 100*time.Millisecond + p.dur + p.work, false
	}}
}

// bareMajority picks, in the order of servers, three servers that hold the lock for process
// pid (keep) and the other two (cut). If the lease ended between the holder's check and this
// read (it is then no bare-majority holder), keep is filled up with servers of the order and
// note says so: the same fault is injected on servers of the schedule.
func (r *runner) bareMajority(pid int, servers []int) (keep, cut []int, note string) {
	held := r.holdersOf(pid)
	for _, k := range servers {
		if held[k] && len(keep) < 3 {
			keep = append(keep, k)
		}
	}
	if len(keep) < 3 {
		note = fmt.Sprintf(" (holder's lease on %d servers only)", len(keep))
		for _, k := range servers {
			if len(keep) < 3 && !slices.Contains(keep, k) {
				keep = append(keep, k)
			}
		}
	}
	for _, k := range servers {
		if !slices.Contains(keep, k) {
			cut = append(cut, k)
		}
	}
	return keep, cut, note
}

// holdersOf reads the lock key on every server directly (not through a proxy) and reports
// which ones hold it for process pid. The value is "<owner> <token> <holds> <description>"
// and the description names the holder's pid; the token differs from server to server in
// quorum mode (each server has its own counter), so it cannot identify the lease.
func (r *runner) holdersOf(pid int) []bool {
	held := make([]bool, len(r.srvs))
	want := fmt.Sprintf(`"pid":%d,`, pid)
	for k, srv := range r.srvs {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		v, err := srv.Do(ctx, "GET", dlockKey(r.lock))
		cancel()
		if err == nil && !strings.HasPrefix(v, "- ") && strings.Contains(v, want) {
			held[k] = true
		}
	}
	return held
}

// dlockKey is the Redis key of a lock name with the default prefix (docs/PROTOCOL.md).
func dlockKey(name string) string { return "dlock:{" + name + "}" }

// stop sends SIGSTOP to pid and returns once the process is frozen.
func (r *runner) stop(pid int) {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		r.infraf("SIGSTOP %d: %v", pid, err)
		return
	}
	if err := waitStopped(pid, 2*time.Second); err != nil {
		r.infraf("%v", err)
	}
}
