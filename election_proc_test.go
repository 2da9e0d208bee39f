package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

func init() { moreHelpers["elect"] = electHelper }

// electHelper is a candidate of the election DLOCK_NAME (lease DLOCK_TTL, value DLOCK_VALUE):
// it campaigns (with DLOCK_ELECT_MODE=run, through RunElected instead), and while it leads it
// checks its leadership's context (RunElected's: the context fn gets) every millisecond,
// printing "lead <term>" when a term begins, "held <term> <first> <last>" every 10 ms and when
// the term ends (the first and last instants, Unix ns, at which the context was live: taken
// before each check, so a pause between the two cannot stretch them), then "lost <term>" or,
// after SIGUSR1, "resigned <term>", and campaigns again.
func electHelper() int {
	ttl, err := time.ParseDuration(os.Getenv("DLOCK_TTL"))
	if err != nil {
		fmt.Println("bad DLOCK_TTL:", err)
		return 2
	}
	c, closeClient, err := helperClient(dlock.WithTTL(ttl))
	if err != nil {
		fmt.Println("dial:", err)
		return 2
	}
	defer closeClient()
	resign := make(chan os.Signal, 1)
	signal.Notify(resign, syscall.SIGUSR1)
	ctx := context.Background()
	name, value := os.Getenv("DLOCK_NAME"), os.Getenv("DLOCK_VALUE")
	if os.Getenv("DLOCK_ELECT_MODE") == "run" {
		err := c.RunElected(ctx, name, value, func(lctx context.Context) error {
			term, _ := dlock.TokenFromContext(lctx)
			fmt.Printf("lead %d\n", term)
			end := believe(lctx, term, resign)
			fmt.Printf("%s %d\n", end, term)
			return nil // resigned, or lost: RunElected steps down and campaigns again
		})
		fmt.Println("RunElected:", err)
		return 2
	}
	e := c.Election(name)
	for {
		ld, err := e.Campaign(ctx, value)
		if err != nil {
			fmt.Println("campaign:", err)
			return 2
		}
		fmt.Printf("lead %d\n", ld.Term())
		end := believe(ld.Context(), ld.Term(), resign)
		if end == "resigned" {
			ld.Resign(ctx)
		}
		fmt.Printf("%s %d\n", end, ld.Term())
	}
}

// believe checks lctx every millisecond while it is live, printing the "held" lines of
// electHelper, until it ends ("lost") or a SIGUSR1 comes ("resigned").
func believe(lctx context.Context, term uint64, resign <-chan os.Signal) string {
	var first, last int64
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	defer func() { fmt.Printf("held %d %d %d\n", term, first, last) }()
	for n := 0; ; n++ {
		t0 := time.Now().UnixNano()
		if lctx.Err() != nil {
			return "lost"
		}
		if first == 0 {
			first = t0
		}
		last = t0
		if n%10 == 0 {
			fmt.Printf("held %d %d %d\n", term, first, last)
		}
		select {
		case <-tick.C:
		case <-resign:
			return "resigned"
		}
	}
}

// termSpan is when one process believed it led for one term.
type termSpan struct {
	proc        int
	term        uint64
	first, last int64
}

// candidates follows the lines of the election helpers.
type candidates struct {
	mu    sync.Mutex
	spans map[uint64]*termSpan
	leads chan [2]uint64 // {proc, term} at each "lead"
	ended chan [2]uint64 // {proc, term} at each "lost" or "resigned"
}

// merged returns every term's span, in the order they began, and fails t where two processes
// believed they led at once or a later term has a smaller token.
func (cs *candidates) merged(t *testing.T) []*termSpan {
	t.Helper()
	cs.mu.Lock()
	defer cs.mu.Unlock()
	var spans []*termSpan
	for _, s := range cs.spans {
		spans = append(spans, s)
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].first < spans[j].first })
	for i := 1; i < len(spans); i++ {
		a, b := spans[i-1], spans[i]
		if a.last >= b.first {
			t.Errorf("process %d believed it led (term %d) until %d, %v after process %d began term %d at %d",
				a.proc, a.term, a.last, time.Duration(a.last-b.first), b.proc, b.term, b.first)
		}
		if b.term <= a.term {
			t.Errorf("term %d began after term %d", b.term, a.term)
		}
	}
	return spans
}

func (cs *candidates) follow(proc int, h *helperProc) {
	for line := range h.lines {
		var term uint64
		var first, last int64
		switch {
		case strings.HasPrefix(line, "lead "):
			fmt.Sscanf(line, "lead %d", &term)
			cs.leads <- [2]uint64{uint64(proc), term}
		case strings.HasPrefix(line, "held "):
			fmt.Sscanf(line, "held %d %d %d", &term, &first, &last)
			cs.mu.Lock()
			if first > 0 {
				cs.spans[term] = &termSpan{proc: proc, term: term, first: first, last: last}
			}
			cs.mu.Unlock()
		case strings.HasPrefix(line, "lost "), strings.HasPrefix(line, "resigned "):
			fmt.Sscanf(line[strings.IndexByte(line, ' ')+1:], "%d", &term)
			cs.ended <- [2]uint64{uint64(proc), term}
		}
	}
}

// Five processes campaign on one election, in a known order. The leader is killed, then
// paused past its lease, then resigns, then is force-unlocked: each time the next candidate in
// campaign order leads, both Observe streams (one per transport) see every new term in order,
// and, merging what every process recorded, no two ever believed they led at once.
func TestElection_FiveProcesses(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		const ttl = time.Second
		admin := tr.dial(t, shared.URL())
		streams := []<-chan dlock.LeaderInfo{
			transports[0].dial(t, shared.URL()).Election(name).Observe(ctx),
			transports[1].dial(t, shared.URL()).Election(name).Observe(ctx),
		}
		for _, s := range streams {
			observed(t, s, 5*time.Second, "no leader at first", nobody)
		}
		seeAll := func(what string, term uint64) {
			t.Helper()
			for _, s := range streams {
				observed(t, s, 5*time.Second, what, func(i dlock.LeaderInfo) bool {
					if i.Term > term {
						t.Fatalf("%s: observed term %d, past %d", what, i.Term, term)
					}
					return i.Term == term
				})
			}
		}
		cs := &candidates{spans: map[uint64]*termSpan{}, leads: make(chan [2]uint64, 64), ended: make(chan [2]uint64, 64)}
		var procs []*helperProc
		nextLead := func(what string, within time.Duration) (int, uint64) {
			t.Helper()
			select {
			case l := <-cs.leads:
				return int(l[0]), l[1]
			case <-time.After(within):
				t.Fatalf("%s: no new leader within %v", what, within)
			}
			return 0, 0
		}
		var (
			leader    int
			term      uint64
			following sync.WaitGroup // the helpers' lines, read to the end
		)
		for i := range 5 {
			h := spawnHelper(t, "elect", shared.URL(), name, ttl, "DLOCK_TRANSPORT="+tr.name, fmt.Sprintf("DLOCK_VALUE=p%d", i))
			procs = append(procs, h)
			following.Add(1)
			go func() { defer following.Done(); cs.follow(i, h) }()
			if i == 0 {
				leader, term = nextLead("the first leader", 20*time.Second)
				continue
			}
			waitQueued(t, name, i)
		}
		if leader != 0 {
			t.Fatalf("process %d leads first, want 0 (the first to campaign)", leader)
		}
		seeAll("the first leader", term)
		terms := []uint64{term}
		step := func(what string, want int, within time.Duration, act func()) {
			t.Helper()
			start := time.Now()
			act()
			p, tm := nextLead(what, within)
			t.Logf("%s: process %d leads %v later", what, p, time.Since(start).Round(time.Millisecond))
			if p != want {
				t.Fatalf("%s: process %d leads, want %d (campaign order)", what, p, want)
			}
			if tm <= terms[len(terms)-1] {
				t.Fatalf("%s: term %d after %d", what, tm, terms[len(terms)-1])
			}
			terms = append(terms, tm)
			seeAll(what, tm)
		}
		// Killed: the next leads within the lease (plus the acceptance of the grant).
		step("leader killed", 1, ttl+750*time.Millisecond, func() { procs[0].signal(t, syscall.SIGKILL) })
		// Paused past its lease: the next leads; resumed, the old leader finds its term over.
		step("leader paused", 2, ttl+750*time.Millisecond, func() { procs[1].signal(t, syscall.SIGSTOP) })
		procs[1].signal(t, syscall.SIGCONT)
		select {
		case e := <-cs.ended:
			if e[0] != 1 || e[1] != terms[1] {
				t.Fatalf("after the resume, %v ended, want process 1's term %d", e, terms[1])
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the resumed leader did not report its term over")
		}
		// Resigned: the next leads within a round trip or two.
		step("leader resigned", 3, 2*time.Second, func() { procs[2].signal(t, syscall.SIGUSR1) })
		// Force-unlocked: the next leads.
		step("leader force-unlocked", 4, 2*time.Second, func() {
			if _, err := admin.ForceUnlock(ctx, name); err != nil {
				t.Fatal(err)
			}
		})
		for _, h := range procs {
			h.signal(t, syscall.SIGKILL)
		}
		for _, h := range procs {
			h.cmd.Wait()
		}
		following.Wait() // every line each helper printed is taken into account
		spans := cs.merged(t)
		if len(spans) < len(terms) {
			t.Errorf("%d terms recorded, want at least %d", len(spans), len(terms))
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			t.Fatal("ran out of time")
		}
	})
}

// A candidate that dies while queued holds up the candidate behind it at most one acceptance
// window (a second) once the leader resigns: the grant that lapses on the dead one passes on.
func TestElection_DeadCandidateCostsAWindow(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		a, b := tr.dial(t, shared.URL()), tr.dial(t, shared.URL())
		la, err := a.Election(name).Campaign(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		dead := spawnHelper(t, "elect", shared.URL(), name, 10*time.Second, "DLOCK_TRANSPORT="+tr.name, "DLOCK_VALUE=dead")
		waitQueued(t, name, 1)
		bled := make(chan *dlock.Leadership, 1)
		go func() {
			lb, err := b.Election(name).Campaign(ctx, "b")
			if err != nil {
				t.Error(err)
			}
			bled <- lb
		}()
		waitQueued(t, name, 2)
		dead.signal(t, syscall.SIGKILL)
		dead.cmd.Wait()
		start := time.Now()
		if err := la.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		var lb *dlock.Leadership
		select {
		case lb = <-bled:
		case <-time.After(10 * time.Second):
			t.Fatal("b does not lead 10 s after the resign")
		}
		if lb == nil {
			t.FailNow()
		}
		waited := time.Since(start)
		t.Logf("b leads %v after the resign, behind a dead candidate", waited.Round(time.Millisecond))
		if waited > 1500*time.Millisecond {
			t.Fatalf("b led %v after the resign; a dead candidate may cost at most its window (1 s)", waited)
		}
		lb.Resign(ctx)
	})
}

// RunElected's leader paused past its lease: fn's context says the leadership is over as soon
// as the process runs again (it checks the lease's deadline itself, as a lease's context does),
// before the next leader's term could overlap with its belief; then it campaigns again.
func TestElection_PausedRunElectedLeader(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		name := uniqueName(t)
		const ttl = time.Second
		cs := &candidates{spans: map[uint64]*termSpan{}, leads: make(chan [2]uint64, 64), ended: make(chan [2]uint64, 64)}
		var following sync.WaitGroup
		var procs []*helperProc
		nextLead := func(what string) (int, uint64) {
			t.Helper()
			select {
			case l := <-cs.leads:
				return int(l[0]), l[1]
			case <-time.After(20 * time.Second):
				t.Fatalf("%s: no new leader", what)
			}
			return 0, 0
		}
		for i := range 2 {
			h := spawnHelper(t, "elect", shared.URL(), name, ttl, "DLOCK_TRANSPORT="+tr.name, "DLOCK_ELECT_MODE=run", fmt.Sprintf("DLOCK_VALUE=p%d", i))
			procs = append(procs, h)
			following.Add(1)
			go func() { defer following.Done(); cs.follow(i, h) }()
			if i == 0 {
				if p, _ := nextLead("the first leader"); p != 0 {
					t.Fatalf("process %d leads first, want 0", p)
				}
			}
		}
		waitQueued(t, name, 1)
		for round := range 2 { // each process paused once while leading
			paused := round % 2
			procs[paused].signal(t, syscall.SIGSTOP)
			if p, _ := nextLead("after the pause"); p != 1-paused {
				t.Fatalf("process %d leads after process %d's pause", p, paused)
			}
			procs[paused].signal(t, syscall.SIGCONT)
			select {
			case e := <-cs.ended:
				if int(e[0]) != paused {
					t.Fatalf("process %d's term ended, want the resumed process %d's", e[0], paused)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the resumed leader did not find its term over")
			}
			waitQueued(t, name, 1)
		}
		for _, h := range procs {
			h.signal(t, syscall.SIGKILL)
			h.cmd.Wait()
		}
		following.Wait()
		if spans := cs.merged(t); len(spans) < 3 {
			t.Errorf("%d terms recorded, want 3", len(spans))
		}
	})
}
