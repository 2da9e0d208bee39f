package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"

	"github.com/dlock-go/dlock"
)

// leaseSet is one way of holding many leases at once.
type leaseSet interface {
	// take acquires name (the lock is free); it is called from many goroutines at once.
	take(ctx context.Context, i int, name string) error
	// lost counts the leases the client itself considers lost.
	lost() int
	close()
}

// holder is a contender of scenario 5.
type holder struct {
	name   string
	config string
	open   func(ctx context.Context, addr string, ttl time.Duration, n int) (leaseSet, error)
	key    func(name string) string
}

var holders = []*holder{
	{
		name:   "dlock (rueidis)",
		config: "`dlock.Dial` with `WithTTL(ttl)`, `Mutex.TryLock` per name: one renewal loop per client that renews the due leases in batched script calls",
		open: func(ctx context.Context, addr string, ttl time.Duration, n int) (leaseSet, error) {
			c, err := dlock.Dial(ctx, "redis://"+addr+"/0", dlock.WithTTL(ttl))
			if err != nil {
				return nil, err
			}
			return &dlockLeases{c: c, leases: make([]*dlock.Lease, n)}, nil
		},
		key: func(name string) string { return dlock.DefaultPrefix + "{" + name + "}" },
	},
	{
		name: "one round trip per lease per period",
		config: "emulation of a per-lease watchdog (Redisson style): `SET NX PX` through rueidis, then one goroutine " +
			"with a ticker sends one plain `PEXPIRE` per held lease every ttl/3 (pipelined by rueidis). A real " +
			"watchdog also checks ownership (a script) and keeps a timer per lease: this is the floor of its cost",
		open: func(ctx context.Context, addr string, ttl time.Duration, n int) (leaseSet, error) {
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
			if err != nil {
				return nil, err
			}
			w := &watchdogLeases{c: c, ttl: ttl, held: make([]string, 0, n), quit: make(chan struct{}), done: make(chan struct{})}
			go w.loop()
			return w, nil
		},
		key: func(name string) string { return name },
	},
	{
		name: "rueidislock",
		config: "rueidis/rueidislock v1.0.79, `KeyMajority: 1`, `NoLoopTracking`, `KeyValidity: ttl`, " +
			"`ExtendInterval: ttl/3`, `TryWithContext` per name: it extends each key from a goroutine of its own",
		open: func(ctx context.Context, addr string, ttl time.Duration, n int) (leaseSet, error) {
			l, err := rueidislock.NewLocker(rueidislock.LockerOption{
				ClientOption:   rueidis.ClientOption{InitAddress: []string{addr}},
				KeyMajority:    1,
				NoLoopTracking: true,
				KeyValidity:    ttl,
				ExtendInterval: ttl / 3,
			})
			if err != nil {
				return nil, err
			}
			return &rueidislockLeases{l: l, ctxs: make([]context.Context, n), cancels: make([]context.CancelFunc, n)}, nil
		},
		key: func(name string) string { return "rueidislock:0:" + name },
	},
}

// --- dlock

type dlockLeases struct {
	c      *dlock.Client
	leases []*dlock.Lease
}

func (d *dlockLeases) take(ctx context.Context, i int, name string) error {
	l, err := d.c.Mutex(name).TryLock(ctx)
	if err != nil {
		return err
	}
	d.leases[i] = l
	return nil
}

func (d *dlockLeases) lost() int {
	n := 0
	for _, l := range d.leases {
		if l == nil || l.Context().Err() != nil {
			n++
		}
	}
	return n
}

func (d *dlockLeases) close() { d.c.Close() }

// --- per-lease watchdog emulation

type watchdogLeases struct {
	c        rueidis.Client
	ttl      time.Duration
	mu       sync.Mutex
	held     []string
	refused  atomic.Int64 // PEXPIRE answered 0 or failed
	quit     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

func (w *watchdogLeases) take(ctx context.Context, i int, name string) error {
	err := w.c.Do(ctx, w.c.B().Set().Key(name).Value("owner").Nx().PxMilliseconds(w.ttl.Milliseconds()).Build()).Error()
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.held = append(w.held, name)
	w.mu.Unlock()
	return nil
}

func (w *watchdogLeases) loop() {
	defer close(w.done)
	t := time.NewTicker(w.ttl / 3)
	defer t.Stop()
	ms := w.ttl.Milliseconds()
	for {
		select {
		case <-w.quit:
			return
		case <-t.C:
		}
		w.mu.Lock()
		keys := slices.Clone(w.held)
		w.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), w.ttl)
		cmds := make(rueidis.Commands, 0, len(keys))
		for _, k := range keys {
			cmds = append(cmds, w.c.B().Pexpire().Key(k).Milliseconds(ms).Build())
		}
		for _, r := range w.c.DoMulti(ctx, cmds...) {
			if n, err := r.AsInt64(); err != nil || n != 1 {
				w.refused.Add(1)
			}
		}
		cancel()
	}
}

func (w *watchdogLeases) lost() int { return int(w.refused.Load()) }

func (w *watchdogLeases) close() {
	w.stopOnce.Do(func() { close(w.quit) })
	<-w.done
	w.c.Close()
}

// --- rueidislock

type rueidislockLeases struct {
	l       rueidislock.Locker
	ctxs    []context.Context
	cancels []context.CancelFunc
}

func (r *rueidislockLeases) take(ctx context.Context, i int, name string) error {
	lctx, cancel, err := r.l.TryWithContext(ctx, name)
	if err != nil {
		return err
	}
	r.ctxs[i], r.cancels[i] = lctx, cancel
	return nil
}

func (r *rueidislockLeases) lost() int {
	n := 0
	for _, c := range r.ctxs {
		if c == nil || c.Err() != nil {
			n++
		}
	}
	return n
}

func (r *rueidislockLeases) close() {
	// Releasing one key is one round trip: release them in parallel before closing.
	var wg sync.WaitGroup
	ch := make(chan context.CancelFunc)
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range ch {
				c()
			}
		}()
	}
	for _, c := range r.cancels {
		if c != nil {
			ch <- c
		}
	}
	close(ch)
	wg.Wait()
	r.l.Close()
}

// s5Result is one measurement of scenario 5.
type s5Result struct {
	n           int
	cmdsPer     float64            // Redis commands per renewal period, those run by scripts included
	scriptsPer  float64            // script calls (EVAL, EVALSHA, FCALL) per renewal period
	byCmd       map[string]float64 // per period, by command
	cpuPer      time.Duration      // client CPU per renewal period
	heapPer     float64            // client heap bytes per lease
	goroutines  int
	lostClient  int // leases the client considers lost
	lostServer  int // keys gone from the server
	acquireTime time.Duration
	notMeasured string
	err         error
}

const s5Parallel = 64

// runMany holds n leases with h for cfg.s5Periods renewal periods of ttl/3 and measures the cost.
func runMany(srv *server, h *holder, cfg config, n int, tag string) s5Result {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("many:%s:%d", tag, i)
	}
	octx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	set, err := h.open(octx, srv.Addr, cfg.s5TTL, n)
	cancel()
	if err != nil {
		return s5Result{err: err}
	}
	defer set.close()

	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	g0 := runtime.NumGoroutine()

	actx, acancel := context.WithTimeout(context.Background(), cfg.s5Acquire)
	defer acancel()
	start := time.Now()
	var (
		next, taken atomic.Int64
		wg          sync.WaitGroup
		mu          sync.Mutex
		first       error
	)
	for g := 0; g < s5Parallel; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for actx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := set.take(actx, i, names[i]); err != nil {
					if actx.Err() == nil {
						mu.Lock()
						first = cmp(first, err)
						mu.Unlock()
					}
					return
				}
				taken.Add(1)
			}
		}()
	}
	wg.Wait()
	acquire := time.Since(start)
	if first != nil {
		return s5Result{err: fmt.Errorf("taking lease %d of %d: %w", taken.Load()+1, n, first)}
	}
	if int(taken.Load()) < n {
		return s5Result{notMeasured: fmt.Sprintf("took only %s of %s leases in %v", thousands(float64(taken.Load())), thousands(float64(n)), cfg.s5Acquire)}
	}

	runtime.GC()
	runtime.ReadMemStats(&m1)
	g1 := runtime.NumGoroutine()
	period := cfg.s5TTL / 3
	stats0, err := srv.commandStats()
	if err != nil {
		return s5Result{err: err}
	}
	cpu0 := processCPU()
	time.Sleep(time.Duration(cfg.s5Periods) * period)
	cpu1 := processCPU()
	stats1, err := srv.commandStats()
	if err != nil {
		return s5Result{err: err}
	}
	periods := float64(cfg.s5Periods)
	r := s5Result{n: n, acquireTime: acquire, byCmd: map[string]float64{}, goroutines: g1 - g0,
		heapPer: (float64(m1.HeapAlloc) - float64(m0.HeapAlloc)) / float64(n),
		cpuPer:  (cpu1 - cpu0) / time.Duration(cfg.s5Periods)}
	for k, v := range stats1 {
		if k == "info" {
			continue // the bench's own INFO
		}
		if d := float64(v-stats0[k]) / periods; d > 0 {
			r.byCmd[k] = d
			r.cmdsPer += d
			if strings.HasPrefix(k, "eval") || strings.HasPrefix(k, "fcall") {
				r.scriptsPer += d
			}
		}
	}
	r.lostClient = set.lost()
	keys := make([]string, n)
	for i, name := range names {
		keys[i] = h.key(name)
	}
	present, err := srv.countExisting(keys)
	if err != nil {
		return s5Result{err: err}
	}
	r.lostServer = n - present
	return r
}

// scenario5 measures the cost of holding many leases, for every holder, reps times.
func scenario5(srv *server, cfg config) (string, bool) {
	ok := true
	var b strings.Builder
	fmt.Fprintf(&b, "### 5. Many held locks: the cost of keeping leases alive\n\n")
	fmt.Fprintf(&b, "One client takes N free names (64 goroutines at a time), then holds them all for %d renewal "+
		"periods: TTL %v, renewed every %v. Measured over those periods only, median of %d repetitions: "+
		"Redis commands per period (deltas of `INFO commandstats` calls, the bench's own `INFO` excluded; "+
		"Redis counts the commands a script runs as well as the script call, so the breakdown shows which "+
		"are script calls and which ran inside them), "+
		"client CPU per period (`getrusage(RUSAGE_SELF)` user+system of the whole bench process, which "+
		"does nothing else meanwhile), client heap per lease (`HeapAlloc` after GC, all leases held, minus "+
		"before the first, / N; the bench's slice of handles is allocated before; a negative figure is GC noise around zero), goroutines added while holding. "+
		"Kept = leases that the client still considers held and whose key is still on the server at the end.\n\n",
		cfg.s5Periods, cfg.s5TTL, cfg.s5TTL/3, cfg.reps)
	b.WriteString("| contender | N | Redis commands / period (median) | per lease / period | script calls / period | commands | client CPU / period | client heap / lease | goroutines added | kept |\n")
	b.WriteString("|---|---:|---:|---:|---:|---|---:|---:|---:|---|\n")
	for _, n := range cfg.s5Leases {
		res := map[*holder][]s5Result{}
		for rep := 0; rep < cfg.reps; rep++ {
			for i := range holders {
				h := holders[(i+rep)%len(holders)]
				srv.flush()
				stop := watchdog(fmt.Sprintf("scenario 5, %d leases, %s", n, h.name), cfg.s5Acquire+cfg.s5TTL+90*time.Second)
				r := runMany(srv, h, cfg, n, fmt.Sprintf("%d:%d:%d", n, rep, i))
				stop()
				switch {
				case r.err != nil:
					ok = ok && !strings.HasPrefix(h.name, "dlock")
					cfg.logf("scenario 5, %d leases, rep %d, %s: %v", n, rep+1, h.name, r.err)
				case r.notMeasured != "":
					ok = ok && !strings.HasPrefix(h.name, "dlock")
					cfg.logf("scenario 5, %d leases, rep %d, %s: not measured: %s", n, rep+1, h.name, r.notMeasured)
				default:
					if strings.HasPrefix(h.name, "dlock") && (r.lostClient != 0 || r.lostServer != 0) {
						ok = false
					}
					cfg.logf("scenario 5, %d leases, rep %d, %-36s taken in %v, %.0f commands/period, CPU %v/period, %.0f B/lease, +%d goroutines, lost %d/%d",
						n, rep+1, h.name, r.acquireTime.Round(time.Millisecond), r.cmdsPer, r.cpuPer.Round(time.Microsecond), r.heapPer, r.goroutines, r.lostClient, r.lostServer)
				}
				res[h] = append(res[h], r)
			}
		}
		for _, h := range holders {
			var cmds, scripts, cpus, heaps, gs []float64
			by := map[string][]float64{}
			var lastErr, notMeasured string
			var lostC, lostS int
			for _, r := range res[h] {
				if r.err != nil {
					lastErr = oneLine(r.err)
					continue
				}
				if r.notMeasured != "" {
					notMeasured = r.notMeasured
					continue
				}
				cmds = append(cmds, r.cmdsPer)
				scripts = append(scripts, r.scriptsPer)
				cpus = append(cpus, ms(r.cpuPer))
				heaps = append(heaps, r.heapPer)
				gs = append(gs, float64(r.goroutines))
				for k, v := range r.byCmd {
					by[k] = append(by[k], v)
				}
				lostC, lostS = max(lostC, r.lostClient), max(lostS, r.lostServer)
			}
			if len(cmds) == 0 {
				why := notMeasured
				if why == "" {
					why = "error: " + lastErr
				}
				fmt.Fprintf(&b, "| %s | %s | not measured: %s | | | | | | | |\n", h.name, thousands(float64(n)), why)
				continue
			}
			type kv struct {
				k string
				v float64
			}
			var parts []kv
			for k, v := range by {
				if m := median(v); m >= 0.5 {
					parts = append(parts, kv{k, m})
				}
			}
			slices.SortFunc(parts, func(a, b kv) int { return compareInt(int64(b.v*1000), int64(a.v*1000)) })
			var cs []string
			for _, p := range parts {
				cs = append(cs, fmt.Sprintf("%s %s", strings.ToUpper(p.k), thousands(p.v)))
			}
			kept := "all"
			if lostC != 0 || lostS != 0 {
				kept = fmt.Sprintf("**lost** %d (client) / %d (server)", lostC, lostS)
			}
			mc := median(cmds)
			fmt.Fprintf(&b, "| %s | %s | %s | %.3f | %s | %s | %.1f ms | %s B | %s | %s |\n", h.name, thousands(float64(n)),
				thousands(mc), mc/float64(n), thousands(median(scripts)), strings.Join(cs, ", "), median(cpus), thousands(median(heaps)),
				thousands(median(gs)), kept)
		}
	}
	b.WriteString("\n")
	for _, h := range holders {
		fmt.Fprintf(&b, "- %s: %s.\n", h.name, h.config)
	}
	return b.String(), ok
}

// commandStats returns the calls of every command from INFO commandstats.
func (s *server) commandStats() (map[string]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := s.admin.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	m := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_")
		if !ok {
			continue
		}
		name, fields, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		for _, f := range strings.Split(fields, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				m[name] = n
			}
		}
	}
	if len(m) == 0 {
		return nil, errors.New("INFO commandstats: no cmdstat lines")
	}
	return m, nil
}

// countExisting returns how many of keys exist on the server.
func (s *server) countExisting(keys []string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	total := 0
	for len(keys) > 0 {
		k := keys[:min(len(keys), 1000)]
		keys = keys[len(k):]
		n, err := s.admin.Exists(ctx, k...).Result()
		if err != nil {
			return 0, err
		}
		total += int(n)
	}
	return total, nil
}
