package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/redistest"
)

// One run: one scenario in one mode. It starts what the scenario's row of the table
// (scenario.go) says (a redis-server, five for Redlock, or a Sentinel group; with a memory
// limit, and the filler that loads it as a cache, where the row sets them: memory.go), the
// resource server and the worker processes, plays the row's fault on a seeded schedule until
// enough writes were applied and faults played out, and gathers the records the analysis
// reads. The faults themselves are in faults.go. Where the row expects the workers' Dial
// refused, the run is that refusal: no traffic, no fault.

// runConf is one run: one scenario in one mode.
type runConf struct {
	Scenario   string // a name in the scenario table
	Fenced     bool
	Seed       uint64
	Workers    int
	Goroutines int // per worker process, sharing its Client; each goroutine is a participant of its own
	TTL        time.Duration
	Cycles     int           // stop once this many writes were applied...
	MinFaults  int           // ...and at least this many faults played out
	MaxRun     time.Duration // or after this long, whichever comes first
	Short      bool          // CI: gaps between faults halved
	Dir        string        // run directory: worker logs
	Logf       func(format string, args ...any)
}

// mode names the run's mode in the report: fenced or unfenced, or dial-only where the
// scenario expects every Dial refused (no traffic: the resource's mode does not matter).
func (c runConf) mode() string {
	if s, ok := scenarioNamed(c.Scenario); ok && s.dialRefused != "" {
		return "dial-only"
	}
	if c.Fenced {
		return "fenced"
	}
	return "unfenced"
}

// faultRec is one injected fault. Times are CLOCK_MONOTONIC ns. A fault hits a worker process
// (all its goroutines); Slot, Inc and G name the goroutine whose request sprang it, the holder.
type faultRec struct {
	Kind    string `json:"kind"` // the scenario's name
	Variant string `json:"variant,omitempty"`
	Slot    int    `json:"slot"`
	Inc     int    `json:"inc"`
	G       int    `json:"g"`
	Token   uint64 `json:"token"` // the lease of the goroutine the fault hit
	Start   int64  `json:"start"`
	End     int64  `json:"end"`
	// Waiter is the process a waiter fault hit (waiter.go): queued for the lock, not holding
	// it. The fields above then name the holder whose read sprang the trap.
	Waiter *waiterHit `json:"waiter,omitempty"`
}

func (f faultRec) who() who { return who{f.Slot, f.Inc, f.G} }

// runData is everything a run leaves for analysis.
type runData struct {
	conf   runConf
	final  int64
	ops    []opRecord
	events []event
	faults []faultRec
	clocks []clockSample // CLOCK_MONOTONIC/CLOCK_REALTIME pairs through the run
	start  int64         // first applied write (a refused Dial: the workers' start)
	end    int64
	infra  []string  // problems of the harness itself (not of dlock)
	mem    memRecord // a scenario with a memory limit: the server's evictions
	// announcements heard on the lock's release channel, where the scenario hits waiters
	// (waiter.go): the grants the analysis places the hit waiters' turns with.
	announcements []announcement
	waiterMisses  int64         // waiter-fault traps that found no other process queued, and waited for the next read
	transfers     *transferData // a multi-lock scenario's ledger (transfers.go)
	// fenceMismatches: a store row, fenced: requests the store's fence decided otherwise than
	// the resource server's comparison of tokens (resource.fenceMismatches).
	fenceMismatches []string
}

// slot is one worker position: its own fault proxies, one in front of each Redis server, and
// the worker process currently running in it (a killed worker is replaced by a new
// incarnation).
type slot struct {
	i       int
	proxies []*redistest.Proxy // proxies[k] leads to srvs[k]

	mu   sync.Mutex
	inc  int
	cmd  *exec.Cmd
	done chan struct{}
}

// runner is one run under way.
type runner struct {
	conf   runConf
	sc     *scenario                // conf.Scenario's row of the table
	srvs   []*redistest.Server      // sc.deploy.servers() of them: one, or five for quorum
	group  *redistest.SentinelGroup // or a Sentinel group
	res    *resource
	filler *filler // an evicting server's cache load (memory.go), or nil
	slots  []*slot
	exe    string
	lock   string
	// keys reads the lock's keys on the server directly (not through a proxy), where the
	// scenario hits waiters (waiter.go) or takes turns (turns.go); else nil.
	keys         *redis.Client
	waiterMisses atomic.Int64

	ending chan struct{} // closed when the run is winding down: no respawns

	mu     sync.Mutex
	faults []faultRec
	infra  []string

	faultWG sync.WaitGroup // faults still playing out
	procWG  sync.WaitGroup // worker waiters
}

func (r *runner) infraf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.infra = append(r.infra, msg)
	r.mu.Unlock()
	r.conf.Logf("  harness: %s", msg)
}

// run executes one run and returns its data; an error means the harness could not run it.
func run(conf runConf) (*runData, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(conf.Dir, 0o755); err != nil {
		return nil, err
	}
	sc, ok := scenarioNamed(conf.Scenario)
	if !ok {
		return nil, fmt.Errorf("unknown scenario %q", conf.Scenario)
	}
	if sc.accounts > 0 {
		return runTransfers(conf, sc, exe)
	}
	r := &runner{conf: conf, sc: sc, exe: exe, lock: "check-" + conf.Scenario, ending: make(chan struct{})}
	if sc.deploy == sentinelGroup {
		r.group, err = redistest.StartSentinel()
		if err != nil {
			return nil, err
		}
		defer r.group.Close()
	}
	for k := range sc.deploy.servers() {
		args := sc.memory.args()
		if sc.persist {
			dir := filepath.Join(conf.Dir, fmt.Sprintf("redis-%d-data", k))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, err
			}
			args = append(args, persistArgs(dir)...)
		}
		srv, err := redistest.StartProcess(redistest.WithArgs(args...))
		if err != nil {
			return nil, err
		}
		defer srv.Close()
		r.srvs = append(r.srvs, srv)
	}
	st, err := openStore(sc.store, conf.Dir) // the register's store (store.go): nil keeps it in the resource server
	if err != nil {
		return nil, err
	}
	r.res, err = startResource(conf.Fenced, st)
	if err != nil {
		if st != nil {
			_ = st.close()
		}
		return nil, err
	}
	resClosed := false
	defer func() {
		if !resClosed {
			r.res.Close()
		}
	}()
	for i := range conf.Workers {
		s := &slot{i: i}
		for _, srv := range r.srvs {
			p, err := redistest.StartProxy(srv.Addr)
			if err != nil {
				return nil, err
			}
			defer p.Close()
			s.proxies = append(s.proxies, p)
		}
		r.slots = append(r.slots, s)
	}
	data := &runData{conf: conf}
	if sc.memory.filler {
		// The cache is in use, and full, before the workers come.
		if r.filler, err = startFiller(r.srvs[0].Addr, dlockKey(r.lock)); err != nil {
			return nil, err
		}
		defer func() { // before the server is closed (deferred above)
			data.mem.LockEvictions, data.mem.FillerKeys = r.filler.close()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			var err error
			if data.mem.EvictedKeys, err = infoField(ctx, r.srvs[0], "stats", "evicted_keys"); err != nil {
				data.infra = append(data.infra, fmt.Sprintf("read evicted_keys: %v", err))
			}
			if b, err := json.MarshalIndent(data.mem, "", "  "); err == nil {
				_ = os.WriteFile(filepath.Join(conf.Dir, "memory.json"), b, 0o644)
			}
		}()
		for range 60 {
			if err := r.filler.write(context.Background()); err != nil {
				return nil, fmt.Errorf("filler: %w", err)
			}
		}
	}
	if sc.turnSlice > 0 { // turns.go: where a between-holds fault left the lock
		r.keys = redis.NewClient(&redis.Options{Addr: r.srvs[0].Addr})
		defer r.keys.Close()
	}
	if sc.hitsWaiters() {
		r.keys = redis.NewClient(&redis.Options{Addr: r.srvs[0].Addr})
		defer r.keys.Close()
		l, err := listen(r.keys, sc.lockKey(r.lock)+":rel")
		if err != nil {
			return nil, err
		}
		defer func() { // before the server is closed (deferred above)
			data.announcements = l.close()
			data.waiterMisses = r.waiterMisses.Load()
			saveAnnouncements(conf.Dir, data.announcements)
		}()
	}
	for _, s := range r.slots {
		if err := r.spawn(s); err != nil {
			r.stopWorkers()
			return nil, err
		}
	}
	if sc.dialRefused != "" {
		return r.refusedDials(data)
	}
	// Clock samples every 50 ms, to place tokens (Redis TIME) on the monotonic timeline.
	stopClocks := make(chan struct{})
	clocksDone := make(chan []clockSample)
	go func() {
		samples := []clockSample{sampleClocks()}
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				samples = append(samples, sampleClocks())
			case <-stopClocks:
				clocksDone <- append(samples, sampleClocks())
				return
			}
		}
	}()
	defer func() {
		if stopClocks != nil {
			close(stopClocks)
			<-clocksDone
		}
	}()

	// Traffic has started once a write is applied.
	startBy := time.Now().Add(30 * time.Second)
	for r.res.acceptedWrites() == 0 {
		if time.Now().After(startBy) {
			r.stopWorkers()
			return nil, fmt.Errorf("no write reached the resource within 30 s: workers did not start (see %s)", conf.Dir)
		}
		time.Sleep(10 * time.Millisecond)
	}
	data.start = mono()
	deadline := time.Now().Add(conf.MaxRun)

	// The fault schedule: the first fault ~1 s into traffic, then one at a time with a seeded
	// gap. A seed fixes kinds, variants, gaps and durations; which worker process a fault hits
	// is the one whose goroutine holds the lock when the trap springs.
	sched := newSchedule(conf)
	ctx, stopSched := context.WithCancel(context.Background())
	var schedDone = make(chan int)
	go func() { schedDone <- r.schedule(ctx, sched) }()

	tick := time.NewTicker(20 * time.Millisecond)
	for {
		<-tick.C
		if time.Now().After(deadline) {
			break
		}
		r.mu.Lock()
		faultsDone := 0
		for _, f := range r.faults {
			if f.End != 0 {
				faultsDone++
			}
		}
		r.mu.Unlock()
		if r.res.acceptedWrites() >= conf.Cycles && faultsDone >= conf.MinFaults {
			break
		}
	}
	stopSched()
	<-schedDone      // a fault under way plays out first (SIGCONT, Unblock, Redis back up)
	r.faultWG.Wait() // and whatever it started (a respawn)
	// Let traffic recover from the last fault, so that its recovery is in the record: wait for
	// a few more applied writes (bounded: a run whose traffic never recovers says so). Where the
	// fault hits a waiter, the holder's process goes on writing (its goroutines pass the lock
	// among themselves) until it releases, which grants the lock to the hit waiter for its
	// acceptance window: the writes that show recovery come after that window.
	if r.sc.hitsWaiters() {
		time.Sleep(acceptWindow(conf.TTL) + killRecoverySlack)
	}
	w0 := r.res.acceptedWrites()
	recoverBy := time.Now().Add(3*conf.TTL + 15*time.Second)
	for r.res.acceptedWrites() < w0+5 {
		if time.Now().After(recoverBy) {
			r.infraf("traffic did not recover within %v of the last fault", 3*conf.TTL+15*time.Second)
			break
		}
		<-tick.C
	}
	tick.Stop()
	close(r.ending)
	r.stopWorkers()
	data.end = mono()
	close(stopClocks)
	data.clocks = <-clocksDone
	stopClocks = nil
	r.res.Close()
	resClosed = true

	data.final, data.ops = r.res.snapshot()
	data.infra = append(data.infra, r.res.storeProblems()...)
	data.fenceMismatches = r.res.fenceMismatches()
	r.mu.Lock()
	data.faults = append([]faultRec(nil), r.faults...)
	data.infra = append(data.infra, r.infra...)
	r.mu.Unlock()
	if data.faults == nil && conf.MinFaults > 0 {
		data.infra = append(data.infra, "no fault was injected")
	}
	if b, err := json.MarshalIndent(data.faults, "", "  "); err == nil {
		_ = os.WriteFile(filepath.Join(conf.Dir, "faults.json"), b, 0o644)
	}
	data.events, err = readEvents(conf.Dir)
	if err != nil {
		return nil, err
	}
	return data, nil
}

// refusedDials completes a run whose workers' Dial the scenario expects refused: it waits for
// every worker to exit (bounded), and gathers their logs; analyze checks what they say.
func (r *runner) refusedDials(data *runData) (*runData, error) {
	data.start = mono()
	all := make(chan struct{})
	go func() { r.procWG.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(20 * time.Second):
		r.infraf("workers still running 20 s after they started, although their Dial should have been refused")
	}
	close(r.ending)
	r.stopWorkers()
	data.end = mono()
	data.final, data.ops = r.res.snapshot()
	r.mu.Lock()
	data.infra = append(data.infra, r.infra...)
	r.mu.Unlock()
	var err error
	data.events, err = readEvents(r.conf.Dir)
	return data, err
}

// spawn starts the next incarnation of a slot's worker.
func (r *runner) spawn(s *slot) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inc++
	var urls []string
	for _, p := range s.proxies {
		urls = append(urls, p.URL())
	}
	conf := workerConf{
		Slot: s.i, Inc: s.inc, RedisURLs: urls, Resource: r.res.Addr(), Lock: r.lock,
		TTL: r.conf.TTL, Log: filepath.Join(r.conf.Dir, fmt.Sprintf("worker-%d.%d.jsonl", s.i, s.inc)),
		MaxRun:     r.conf.MaxRun + time.Minute,
		Goroutines: r.conf.Goroutines,
		Poll:       s.i == len(r.slots)-1 && !r.sc.noPoll, // one goroutine of one worker does not wait in Lock
	}
	if r.group != nil {
		conf.Sentinels, conf.Master = r.group.SentinelAddrs(), r.group.MasterName()
	}
	if r.sc.replicaAck > 0 {
		conf.AckN, conf.AckWait = r.sc.replicaAck, replicaAckWait
	}
	conf.UnsafeEviction = r.sc.unsafeEviction
	conf.ReadBack = r.sc.outOfMemory
	conf.Shared = string(r.sc.shared)
	conf.Permits = r.sc.permits
	conf.Accounts = r.sc.accounts
	if r.sc.adaptive {
		conf.AdaptiveMin = adaptiveMin
	}
	conf.TurnSlice = r.sc.turnSlice
	conf.Election = r.sc.election
	b, _ := json.Marshal(conf)
	cmd := exec.Command(r.exe)
	cmd.Env = append(os.Environ(), roleEnv+"=worker", confEnv+"="+string(b))
	out, err := os.OpenFile(filepath.Join(r.conf.Dir, fmt.Sprintf("worker-%d.%d.stderr", s.i, s.inc)), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	_ = out.Close()
	if err != nil {
		return err
	}
	done := make(chan struct{})
	s.cmd, s.done = cmd, done
	r.procWG.Add(1)
	go func() {
		defer r.procWG.Done()
		_ = cmd.Wait()
		close(done)
	}()
	return nil
}

// current returns the running incarnation's number, pid and exit channel.
func (s *slot) current() (int, int, chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inc, s.cmd.Process.Pid, s.done
}

// stopWorkers asks every worker to stop (SIGTERM: it finishes its cycle, unlocks, closes its
// client) and kills the ones still running after 10 s.
func (r *runner) stopWorkers() {
	for _, s := range r.slots {
		s.mu.Lock()
		if s.cmd != nil {
			_ = s.cmd.Process.Signal(syscall.SIGCONT) // never leave one stopped
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
		}
		s.mu.Unlock()
	}
	all := make(chan struct{})
	go func() { r.procWG.Wait(); close(all) }()
	select {
	case <-all:
		return
	case <-time.After(10 * time.Second):
	}
	for _, s := range r.slots {
		s.mu.Lock()
		select {
		case <-s.done:
		default:
			r.infraf("worker %d.%d did not stop within 10 s of SIGTERM: killed", s.i, s.inc)
			_ = s.cmd.Process.Kill()
		}
		s.mu.Unlock()
	}
	<-all
}

// readEvents loads every worker log of the run.
func readEvents(dir string) ([]event, error) {
	files, err := filepath.Glob(filepath.Join(dir, "worker-*.jsonl"))
	if err != nil {
		return nil, err
	}
	var evs []event
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var e event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				continue // a line cut short by SIGKILL cannot happen (one write each), but be lenient
			}
			evs = append(evs, e)
		}
		err = errors.Join(sc.Err(), f.Close())
		if err != nil {
			return nil, err
		}
	}
	return evs, nil
}

// plannedFault is one entry of the seeded schedule.
type plannedFault struct {
	servers []int         // Redis servers involved, in the quorum scenarios (a permutation of 0..4)
	gap     time.Duration // wait before arming, after the previous fault ended
	variant string
	dur     time.Duration // how long the fault lasts
	work    time.Duration // work handed to the hit holder inside its critical section
}

type schedule struct {
	rng   *rand.Rand
	n     int
	short bool
}

func newSchedule(conf runConf) *schedule {
	// The same seed gives the same schedule in both modes, so fenced and unfenced runs of a
	// scenario face the same faults.
	h := uint64(0)
	for _, c := range conf.Scenario {
		h = h*131 + uint64(c)
	}
	return &schedule{rng: rand.New(rand.NewPCG(conf.Seed, h)), short: conf.Short}
}

// next plans the next fault of kind f: a seeded gap (shorter before the first fault, halved
// in short runs), then what f draws for itself.
func (s *schedule) next(f fault, ttl time.Duration) plannedFault {
	rng := s.rng
	p := plannedFault{gap: time.Second + time.Duration(rng.Int64N(int64(time.Second)))}
	switch {
	case s.n == 0:
		p.gap = time.Second + time.Duration(rng.Int64N(int64(200*time.Millisecond)))
	case s.short:
		p.gap /= 2
	}
	f.plan(&p, rng, s.n, ttl)
	s.n++
	return p
}

// schedule injects faults until ctx ends; it returns the number injected.
func (r *runner) schedule(ctx context.Context, s *schedule) int {
	n := 0
	for {
		p := s.next(r.sc.fault, r.conf.TTL)
		select {
		case <-ctx.Done():
			return n
		case <-time.After(p.gap):
		}
		in := newInjection(r)
		r.res.arm(r.sc.fault.inject(r, p, in))
		select {
		case <-in.fired:
		case <-ctx.Done():
			if r.res.disarm() {
				return n
			}
			<-in.fired // it sprang meanwhile
		case <-time.After(10 * time.Second):
			if r.res.disarm() {
				r.infraf("a %s trap did not spring within 10 s", r.conf.Scenario)
				continue
			}
			<-in.fired
		}
		n++
		select {
		case <-in.done:
		case <-ctx.Done():
			<-in.done // faults always finish: the run waits for them
			return n
		}
	}
}
