package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/goredisconn"
)

// Scenario 12: leader failover. electCandidates candidate processes campaign on one name; the
// one that leads "acts" (prints a line with a wall-clock timestamp to the parent) every
// millisecond. The parent SIGKILLs the leader and measures the time from the kill to the first
// action of the next leader, then starts a new candidate in place of the dead one, so that every
// kill finds electCandidates candidates. The contenders are dlock's elections (Campaign in a
// loop, RunElected) and the lock-and-retry loops users write with redsync and bsm/redislock
// (lock, extend every TTL/3, act while the lock is valid, lock again when it is not).

// electWorkerFlag re-executes this binary as one candidate process of scenario 12.
const electWorkerFlag = "__elect-worker"

const (
	electCandidates = 3
	// electReadyWithin bounds a candidate's start (dial, "ready"), electFirstWithin the first
	// term's start, on a loaded machine.
	electReadyWithin = 20 * time.Second
	electFirstWithin = 20 * time.Second
	// electActingGap: a leader whose last action is older than this is not acting (its action
	// period is 1 ms); the parent kills only a leader that acts.
	electActingGap = 100 * time.Millisecond
	// electBoundSlack is the bound's slack over the TTL: every kill's next leader acts within
	// TTL + electBoundSlack.
	electBoundSlack = 250 * time.Millisecond
	// redislockRetry is the redislock loop's retry interval (redislock.LinearBackoff; the
	// interval of its README's example).
	redislockRetry = 100 * time.Millisecond
)

// electOut is a candidate's stdout, one line per write.
type electOut struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (o *electOut) printf(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fmt.Fprintf(o.w, format+"\n", args...)
	o.w.Flush()
}

// act is the leader's work for term seq: one action a millisecond, the first at once, until
// ctx ends or valid (when not nil) says the term may be over. Each action is a line
// "a SEQ UNIXNANO" to the parent.
func (o *electOut) act(ctx context.Context, seq int, valid func() bool) {
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for ctx.Err() == nil && (valid == nil || valid()) {
		o.printf("a %d %d", seq, time.Now().UnixNano())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pause waits d or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// electContender is one way of electing a leader. run is a candidate's whole life: open the
// client, print "ready", then campaign and act while leading, again and again, until ctx ends.
type electContender struct {
	name   string
	kind   kind
	config string // for the notes under the table
	key    func(name string) string
	run    func(ctx context.Context, addr, name string, ttl time.Duration, out *electOut) error
}

var electContenders = []*electContender{
	{
		name: "dlock Campaign (rueidis)", kind: kindDlock,
		config: "`dlock.Dial(ctx, url, dlock.WithTTL(ttl))`, `Election.Campaign` in a loop; the leader acts until `Leadership.Context()` ends, then resigns and campaigns again",
		key:    dlockKey,
		run: func(ctx context.Context, addr, name string, ttl time.Duration, out *electOut) error {
			c, err := dlock.Dial(ctx, "redis://"+addr+"/0", dlock.WithTTL(ttl))
			if err != nil {
				return err
			}
			defer c.Close()
			return campaignLoop(ctx, c, name, out)
		},
	},
	{
		name: "dlock Campaign (go-redis)", kind: kindDlock,
		config: "as dlock Campaign (rueidis), through `dlock.New(goredisconn.New(rdb), dlock.WithTTL(ttl))`, go-redis pool of 64",
		key:    dlockKey,
		run: func(ctx context.Context, addr, name string, ttl time.Duration, out *electOut) error {
			rdb := newGoredis(addr)
			defer rdb.Close()
			c, err := dlock.New(goredisconn.New(rdb), dlock.WithTTL(ttl))
			if err != nil {
				return err
			}
			defer c.Close()
			return campaignLoop(ctx, c, name, out)
		},
	},
	{
		name: "dlock RunElected (rueidis)", kind: kindDlock,
		config: "`dlock.Dial(ctx, url, dlock.WithTTL(ttl))`, `Client.RunElected(ctx, name, value, fn)`; fn acts until its context ends",
		key:    dlockKey,
		run: func(ctx context.Context, addr, name string, ttl time.Duration, out *electOut) error {
			c, err := dlock.Dial(ctx, "redis://"+addr+"/0", dlock.WithTTL(ttl))
			if err != nil {
				return err
			}
			defer c.Close()
			out.printf("ready")
			seq := 0
			err = c.RunElected(ctx, name, candidateValue(), func(lctx context.Context) error {
				seq++
				out.act(lctx, seq, nil)
				return lctx.Err()
			})
			if ctx.Err() != nil {
				return nil
			}
			return err
		},
	},
	{
		name: "redsync lock-and-retry", kind: kindPeer,
		config: "go-redsync/redsync v4.18.1, go-redis pool of 64, `NewMutex(name, WithExpiry(ttl), WithTries(MaxInt32))`, `LockContext` " +
			"with redsync's default retry delay (random 50–250 ms between tries); the leader acts while `time.Now()` is before `Until()`, " +
			"`ExtendContext` every TTL/3 (a failed extension ends the term), then locks again",
		key: func(name string) string { return name },
		run: func(ctx context.Context, addr, name string, ttl time.Duration, out *electOut) error {
			rdb := newGoredis(addr)
			defer rdb.Close()
			rs := redsync.New(redsyncgoredis.NewPool(rdb))
			out.printf("ready")
			for seq := 1; ctx.Err() == nil; seq++ {
				m := rs.NewMutex(name, redsync.WithExpiry(ttl), redsync.WithTries(math.MaxInt32))
				if err := m.LockContext(ctx); err != nil {
					if ctx.Err() == nil {
						out.printf("note: redsync lock: %s", oneLine(err))
						pause(ctx, 50*time.Millisecond)
					}
					continue
				}
				var until atomic.Int64
				until.Store(m.Until().UnixNano())
				extend := func(ctx context.Context) bool {
					ok, err := m.ExtendContext(ctx)
					if ok && err == nil {
						until.Store(m.Until().UnixNano())
						return true
					}
					return false
				}
				leadWithExtend(ctx, ttl, seq, out, extend, func() bool { return time.Now().UnixNano() < until.Load() })
				uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ttl)
				m.UnlockContext(uctx)
				cancel()
			}
			return nil
		},
	},
	{
		name: "redislock lock-and-retry", kind: kindPeer,
		config: fmt.Sprintf("bsm/redislock v0.9.4, go-redis pool of 64, `Obtain(ctx, name, ttl, &Options{RetryStrategy: LinearBackoff(%v)})` "+
			"(the retry of its README's example: one try every %v); the leader acts until TTL after its last successful "+
			"`Obtain` or `Refresh` began, `Refresh` every TTL/3 (a failed refresh ends the term), then obtains again", msText(redislockRetry), msText(redislockRetry)),
		key: func(name string) string { return name },
		run: func(ctx context.Context, addr, name string, ttl time.Duration, out *electOut) error {
			rdb := newGoredis(addr)
			defer rdb.Close()
			rl := redislock.New(rdb)
			out.printf("ready")
			for seq := 1; ctx.Err() == nil; seq++ {
				start := time.Now()
				l, err := rl.Obtain(ctx, name, ttl, &redislock.Options{RetryStrategy: redislock.LinearBackoff(redislockRetry)})
				if err != nil {
					if ctx.Err() == nil {
						out.printf("note: redislock obtain: %s", oneLine(err))
						pause(ctx, 50*time.Millisecond)
					}
					continue
				}
				var until atomic.Int64
				until.Store(start.Add(ttl).UnixNano())
				extend := func(ctx context.Context) bool {
					t := time.Now()
					if err := l.Refresh(ctx, ttl, nil); err != nil {
						return false
					}
					until.Store(t.Add(ttl).UnixNano())
					return true
				}
				leadWithExtend(ctx, ttl, seq, out, extend, func() bool { return time.Now().UnixNano() < until.Load() })
				uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ttl)
				l.Release(uctx)
				cancel()
			}
			return nil
		},
	},
}

func candidateValue() string { return "candidate " + strconv.Itoa(os.Getpid()) }

func electContenderByName(name string) *electContender {
	for _, c := range electContenders {
		if c.name == name {
			return c
		}
	}
	return nil
}

// campaignLoop is a dlock candidate: Campaign, act while leading, resign, campaign again.
func campaignLoop(ctx context.Context, c *dlock.Client, name string, out *electOut) error {
	e := c.Election(name)
	out.printf("ready")
	for seq := 1; ctx.Err() == nil; seq++ {
		ld, err := e.Campaign(ctx, candidateValue())
		switch {
		case ctx.Err() != nil:
			if err == nil {
				ld.Resign(context.WithoutCancel(ctx))
			}
			return nil
		case errors.Is(err, dlock.ErrInvalid), errors.Is(err, dlock.ErrClosed):
			return err
		case err != nil:
			out.printf("note: campaign: %s", oneLine(err))
			pause(ctx, 50*time.Millisecond)
			continue
		}
		out.act(ld.Context(), seq, nil)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		ld.Resign(rctx) // ErrLost when the term ended by itself: nothing to do
		cancel()
	}
	return nil
}

// leadWithExtend is a peer's term: act while valid, extending every TTL/3 in the background;
// a failed extension ends the term.
func leadWithExtend(ctx context.Context, ttl time.Duration, seq int, out *electOut, extend func(context.Context) bool, valid func() bool) {
	lctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer cancel()
		t := time.NewTicker(ttl / 3)
		defer t.Stop()
		for {
			select {
			case <-lctx.Done():
				return
			case <-t.C:
			}
			ectx, ecancel := context.WithTimeout(lctx, ttl/3)
			ok := extend(ectx)
			ecancel()
			if !ok {
				return
			}
		}
	})
	out.act(lctx, seq, valid)
	cancel()
	wg.Wait()
}

// runElectWorker is a candidate process. Args: CONTENDER ADDR NAME TTL LIFE. It ends when its
// stdin closes, or after LIFE at the latest.
func runElectWorker(args []string) int {
	out := &electOut{w: bufio.NewWriter(os.Stdout)}
	if len(args) != 5 {
		out.printf("error: usage: %s CONTENDER ADDR NAME TTL LIFE", electWorkerFlag)
		return 2
	}
	c := electContenderByName(args[0])
	ttl, err1 := time.ParseDuration(args[3])
	life, err2 := time.ParseDuration(args[4])
	if c == nil || err1 != nil || err2 != nil {
		out.printf("error: bad contender, TTL or life: %q", args)
		return 2
	}
	time.AfterFunc(life+5*time.Second, func() { os.Exit(4) })
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), life)
	defer cancel()
	if err := c.run(ctx, args[1], args[2], ttl, out); err != nil && ctx.Err() == nil {
		out.printf("error: %s", oneLine(err))
		return 1
	}
	return 0
}

// electResult is one contender's run of scenario 12.
type electResult struct {
	recovery []time.Duration // per kill: the kill → the next leader's first action
	left     []time.Duration // per kill: the dead leader's lease left on the server (PTTL) at the kill; negative when there was none
	terms    int             // terms seen
	overlaps int             // terms that began before an earlier one's last action
	notes    []string        // what the candidates noted (transient errors), at most a few
	err      error           // what ended the run early
}

// electWorker is a running candidate process.
type electWorker struct {
	id     int
	cmd    *exec.Cmd
	in     io.WriteCloser
	exited chan struct{}
	ready  bool
	killed bool
	seq    int // the term of its last action
	term   int // index in terms of that term, -1 before any
}

type electEvent struct {
	w    *electWorker
	line string
	eof  bool
}

// electTerm is one term as its leader's actions showed it (wall-clock Unix ns).
type electTerm struct{ first, last int64 }

// electRun is the parent's side of one contender's run.
type electRun struct {
	c       *electContender
	srv     *server
	cfg     config
	name    string
	exe     string
	life    time.Duration
	events  chan electEvent
	quit    chan struct{}
	workers []*electWorker
	nextID  int
	terms   []electTerm
	lastW   *electWorker // the worker of the latest action
	lastAt  int64
	res     electResult
	// During a failover: the killed worker, when it was killed and the first later action of
	// another worker.
	killed   *electWorker
	killedAt int64
	newW     *electWorker
	newAt    int64
}

// spawn starts a candidate process.
func (r *electRun) spawn() error {
	cmd := exec.Command(r.exe, electWorkerFlag, r.c.name, r.srv.Addr, r.name, r.cfg.electTTL.String(), r.life.String())
	cmd.SysProcAttr = childAttr()
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	w := &electWorker{id: r.nextID, cmd: cmd, in: in, exited: make(chan struct{}), term: -1}
	r.nextID++
	r.workers = append(r.workers, w)
	go func() {
		defer close(w.exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case r.events <- electEvent{w: w, line: sc.Text()}:
			case <-r.quit:
			}
		}
		select {
		case r.events <- electEvent{w: w, eof: true}:
		case <-r.quit:
		}
		cmd.Wait()
	}()
	return nil
}

// stop ends every candidate and waits for them.
func (r *electRun) stop() {
	close(r.quit)
	for _, w := range r.workers {
		w.in.Close()
		w.cmd.Process.Kill()
	}
	for _, w := range r.workers {
		<-w.exited
	}
}

// handle takes one line of a candidate into account.
func (r *electRun) handle(e electEvent) error {
	w := e.w
	switch {
	case e.eof:
		if !w.killed {
			return fmt.Errorf("candidate %d exited", w.id)
		}
	case e.line == "ready":
		w.ready = true
	case strings.HasPrefix(e.line, "error:"):
		return fmt.Errorf("candidate %d: %s", w.id, strings.TrimSpace(e.line[6:]))
	case strings.HasPrefix(e.line, "note:"):
		if len(r.res.notes) < 5 {
			r.res.notes = append(r.res.notes, strings.TrimSpace(e.line[5:]))
		}
		r.cfg.logf("scenario 12, %s, candidate %d: %s", r.c.name, w.id, strings.TrimSpace(e.line[5:]))
	case strings.HasPrefix(e.line, "a "):
		f := strings.Fields(e.line)
		if len(f) != 3 {
			return fmt.Errorf("candidate %d: bad line %q", w.id, e.line)
		}
		seq, err1 := strconv.Atoi(f[1])
		at, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil {
			return fmt.Errorf("candidate %d: bad line %q", w.id, e.line)
		}
		if w.term < 0 || seq != w.seq {
			w.seq, w.term = seq, len(r.terms)
			r.terms = append(r.terms, electTerm{first: at, last: at})
		}
		r.terms[w.term].last = max(r.terms[w.term].last, at)
		if at >= r.lastAt {
			r.lastW, r.lastAt = w, at
		}
		if r.killed != nil && r.newW == nil && w != r.killed && at > r.killedAt {
			r.newW, r.newAt = w, at
		}
	default:
		return fmt.Errorf("candidate %d: unexpected line %q", w.id, e.line)
	}
	return nil
}

// waitFor handles the candidates' lines until done says so, or fails when deadline passes
// first (what says what was awaited). A nil done waits until the deadline, without failing.
func (r *electRun) waitFor(deadline time.Time, what string, done func() bool) error {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for done == nil || !done() {
		select {
		case e := <-r.events:
			if err := r.handle(e); err != nil {
				return err
			}
		case <-t.C:
			if done == nil {
				return nil
			}
			return errors.New(what)
		}
	}
	return nil
}

func (r *electRun) allReady() bool {
	for _, w := range r.workers {
		if !w.killed && !w.ready {
			return false
		}
	}
	return true
}

// electHold is how long the leader of kill k leads (from its first action) before the kill:
// from TTL/5 to TTL/5 + TTL/3, drawn the same for every contender, so that the kills fall at
// every point of the renewal period.
func electHold(ttl time.Duration, k int) time.Duration {
	r := rand.New(rand.NewPCG(12, uint64(k)))
	return ttl/5 + time.Duration(r.Int64N(int64(ttl/3)))
}

// electRunLimit bounds one contender's run: each kill's steps are bounded, and so is the whole.
func electRunLimit(cfg config) time.Duration {
	perKill := cfg.electTTL/5 + cfg.electTTL/3 + electReadyWithin + electFailoverLimit(cfg)
	return electReadyWithin + electFirstWithin + time.Duration(cfg.electKills)*perKill
}

// electFailoverLimit is how long a kill waits for the next leader before the run is given up.
func electFailoverLimit(cfg config) time.Duration { return 10*cfg.electTTL + 5*time.Second }

// runElection is one contender's run: electCandidates candidates, cfg.electKills kills of the
// leader.
func runElection(srv *server, c *electContender, cfg config, name string) electResult {
	r := &electRun{c: c, srv: srv, cfg: cfg, name: name, life: electRunLimit(cfg) + 30*time.Second,
		events: make(chan electEvent, 1<<14), quit: make(chan struct{})}
	exe, err := os.Executable()
	if err != nil {
		return electResult{err: err}
	}
	r.exe = exe
	defer r.stop()
	r.res.err = r.measure()
	r.res.terms = len(r.terms)
	r.res.overlaps = termOverlaps(r.terms)
	return r.res
}

func (r *electRun) measure() error {
	ttl := r.cfg.electTTL
	for range electCandidates {
		if err := r.spawn(); err != nil {
			return err
		}
	}
	if err := r.waitFor(time.Now().Add(electReadyWithin), fmt.Sprintf("the candidates were not ready within %v", electReadyWithin), r.allReady); err != nil {
		return err
	}
	if err := r.waitFor(time.Now().Add(electFirstWithin), fmt.Sprintf("no candidate led within %v", electFirstWithin), func() bool { return r.lastW != nil }); err != nil {
		return err
	}
	since := r.lastAt // the current leader's first action
	for k := range r.cfg.electKills {
		// The leader leads for the kill's hold, the candidates are all ready (a replacement
		// dials), and the leader is acting.
		if err := r.waitFor(time.Unix(0, since).Add(electHold(ttl, k)), "", nil); err != nil {
			return err
		}
		acting := func() bool {
			return r.allReady() && r.lastW != nil && time.Since(time.Unix(0, r.lastAt)) < electActingGap
		}
		if err := r.waitFor(time.Now().Add(electReadyWithin+electFailoverLimit(r.cfg)),
			fmt.Sprintf("kill %d: no leader acting with %d candidates ready", k+1, electCandidates), acting); err != nil {
			return err
		}
		leader := r.lastW
		leader.killed = true
		if err := leader.cmd.Process.Kill(); err != nil {
			return err
		}
		r.killed, r.killedAt, r.newW = leader, time.Now().UnixNano(), nil
		r.res.left = append(r.res.left, r.srv.pttl(r.c.key(r.name)))
		limit := electFailoverLimit(r.cfg)
		if err := r.waitFor(time.Unix(0, r.killedAt).Add(limit), fmt.Sprintf("kill %d: no new leader acted within %v", k+1, limit),
			func() bool { return r.newW != nil }); err != nil {
			r.res.left = r.res.left[:len(r.res.left)-1]
			return err
		}
		rec := time.Duration(r.newAt - r.killedAt)
		r.res.recovery = append(r.res.recovery, rec)
		r.cfg.logf("scenario 12, %-26s kill %2d: candidate %d → %d acts after %v (lease left at the kill %v)",
			r.c.name, k+1, leader.id, r.newW.id, rec.Round(100*time.Microsecond), r.res.left[len(r.res.left)-1].Round(time.Millisecond))
		since, r.killed = r.newAt, nil
		if err := r.spawn(); err != nil {
			return err
		}
	}
	return nil
}

// termOverlaps counts the terms whose first action came before an earlier term's last one:
// two leaders acting at once.
func termOverlaps(terms []electTerm) int {
	ts := slices.Clone(terms)
	slices.SortFunc(ts, func(a, b electTerm) int { return compareInt(a.first, b.first) })
	n := 0
	var last int64
	for i, t := range ts {
		if i > 0 && t.first <= last {
			n++
		}
		last = max(last, t.last)
	}
	return n
}

// measureElection is scenario 12: kill → the next leader acts, per contender.
func measureElection(srv *server, cfg config) (string, bool) {
	res := map[*electContender]electResult{}
	for i, c := range electContenders {
		srv.flush()
		stop := watchdog("scenario 12, "+c.name, electRunLimit(cfg)+time.Minute)
		r := runElection(srv, c, cfg, fmt.Sprintf("elect:%d", i))
		stop()
		if r.err != nil {
			cfg.logf("scenario 12, %s: %v", c.name, r.err)
		}
		res[c] = r
	}
	return electionTable(cfg, electContenders, res)
}

// electionTable writes scenario 12's table. ok is false when a dlock contender failed or had
// two leaders acting at once; a peer's failure or overlap is a finding in the table.
func electionTable(cfg config, cs []*electContender, res map[*electContender]electResult) (string, bool) {
	ttl := cfg.electTTL
	bound := ttl + electBoundSlack
	var b strings.Builder
	fmt.Fprintf(&b, "### 12. Leader failover: the leader process is SIGKILLed\n\n")
	fmt.Fprintf(&b, "%d candidate processes campaign on one name with a %v lease (the same TTL for every contender); "+
		"the leader acts every millisecond (a line with a wall-clock timestamp to the bench). The bench SIGKILLs "+
		"the leader %v to %v after its first action (the same draws for every contender) and measures the time "+
		"from the kill to the first action of the next leader; then it starts a new candidate in place of the dead one, "+
		"so that every kill finds %d candidates, %d waiting. %d kills per contender. **p99** is the nearest rank "+
		"(with 100 kills or fewer it is the worst). **Lease left** is the dead leader's lease on the "+
		"server at the kill (`PTTL`); **after expiry** is the kill → action time less that, the part the library "+
		"controls. **Overlaps**: terms whose first action came before another term's last.\n\n",
		electCandidates, leaseText(ttl), msText((ttl / 5).Round(time.Millisecond)), msText((ttl/5 + ttl/3).Round(time.Millisecond)),
		electCandidates, electCandidates-1, cfg.electKills)
	b.WriteString("| contender | kills | median | p99 | max | median ÷ TTL | lease left (median) | after expiry (median / max) | overlaps |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
	ok := true
	var met, unmet []string
	for _, c := range cs {
		r := res[c]
		if c.kind == kindDlock && (r.err != nil || r.overlaps > 0) {
			ok = false
		}
		overlaps := fmt.Sprintf("0 of %d terms", r.terms)
		if r.overlaps > 0 {
			overlaps = fmt.Sprintf("**%d of %d terms**", r.overlaps, r.terms)
		}
		if len(r.recovery) == 0 {
			fmt.Fprintf(&b, "| %s | 0 | error: %s | | | | | | %s |\n", c.name, oneLine(r.err), overlaps)
			unmet = append(unmet, c.name+" (no kill measured)")
			continue
		}
		var after []time.Duration
		var left []time.Duration
		for i, d := range r.recovery {
			if r.left[i] >= 0 {
				left = append(left, r.left[i])
				after = append(after, d-r.left[i])
			}
		}
		kills := strconv.Itoa(len(r.recovery))
		if r.err != nil {
			kills += " (then: " + oneLine(r.err) + ")"
		}
		med, worst := medianMs(r.recovery), percentile(r.recovery, 100)
		afterCell := "–"
		if len(after) > 0 {
			afterCell = fmt.Sprintf("%.0f / %.0f ms", medianMs(after), percentile(after, 100))
		}
		leftCell := "–"
		if len(left) > 0 {
			leftCell = fmt.Sprintf("%.0f ms", medianMs(left))
		}
		fmt.Fprintf(&b, "| %s | %s | %.0f ms | %.0f ms | %.0f ms | %.2f | %s | %s | %s |\n", c.name, kills, med,
			percentile(r.recovery, 99), worst, med/ms(ttl), leftCell, afterCell, overlaps)
		within := worst <= ms(bound) && r.err == nil
		if within {
			met = append(met, fmt.Sprintf("%s (max %.0f ms)", c.name, worst))
		} else {
			unmet = append(unmet, fmt.Sprintf("%s (max %.0f ms)", c.name, worst))
		}
		if c.kind == kindDlock {
			cfg.fig.target("12, "+c.name, fmt.Sprintf("a SIGKILLed leader's successor acts ≤ TTL + %s after the kill", msText(electBoundSlack)),
				within, "%.0f ms median, %.0f ms worst of %d kills (TTL %s)", med, worst, len(r.recovery), leaseText(ttl))
		}
	}
	fmt.Fprintf(&b, "\n**Bound:** the next leader acts within TTL + %s = %s of every kill: ", msText(electBoundSlack), msText(bound))
	switch {
	case len(unmet) == 0:
		fmt.Fprintf(&b, "met by every contender.\n")
	case len(met) == 0:
		fmt.Fprintf(&b, "met by none: %s.\n", strings.Join(unmet, ", "))
	default:
		fmt.Fprintf(&b, "met by %s; not met by %s.\n", strings.Join(met, ", "), strings.Join(unmet, ", "))
	}
	b.WriteString("\n")
	for _, c := range cs {
		fmt.Fprintf(&b, "- **%s**: %s.", c.name, c.config)
		if n := res[c].notes; len(n) > 0 {
			fmt.Fprintf(&b, " Its candidates noted: %s.", strings.Join(n, "; "))
		}
		b.WriteString("\n")
	}
	return b.String(), ok
}

// medianMs is the median of ds in milliseconds.
func medianMs(ds []time.Duration) float64 {
	xs := make([]float64, len(ds))
	for i, d := range ds {
		xs[i] = ms(d)
	}
	return median(xs)
}
