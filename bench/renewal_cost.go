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
	// inScript lists the commands that the contender's renewal script runs inside Redis (read
	// from the script's source): Redis counts them in INFO commandstats like the client's own
	// commands, so they are subtracted to count the commands the client sends.
	inScript []string
	// baseline marks the one-round-trip-per-lease emulation, the reference of the ratios.
	baseline bool
	// perKey marks a holder with a goroutine per lease.
	perKey bool
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
		key:      dlockKey,
		inScript: []string{"get", "pexpire"}, // internal/protocol/scripts/renew.lua
	},
	{
		name: "one round trip per lease per period", baseline: true,
		config: "emulation of a per-lease watchdog (Redisson style): `SET NX PX` through rueidis, then each lease " +
			"is renewed with one plain `PEXPIRE` ttl/3 after it was taken or last renewed (one goroutine sends the " +
			"due ones every ttl/300, pipelined by rueidis). A real watchdog also checks ownership (a script: " +
			"more commands executed) and keeps a timer per lease (more memory): this is the floor of its cost",
		open: func(ctx context.Context, addr string, ttl time.Duration, n int) (leaseSet, error) {
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
			if err != nil {
				return nil, err
			}
			w := &watchdogLeases{c: c, ttl: ttl, queue: make([]due, 0, n), quit: make(chan struct{}), done: make(chan struct{})}
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
		key:      func(name string) string { return "rueidislock:0:" + name },
		inScript: []string{"get", "pexpireat"}, // its extend script: GET, PEXPIREAT, GET
		perKey:   true,
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

// watchdogLeases renews every lease ttl/3 after it was taken or last renewed, as a per-lease
// timer would, but from one goroutine: every tick it sends one PEXPIRE for each lease now due
// (pipelined). Leases all have the same period, so a FIFO queue keeps them in due order.
type watchdogLeases struct {
	c        rueidis.Client
	ttl      time.Duration
	mu       sync.Mutex
	queue    []due        // in due order; renewed ones go back at the end
	refused  atomic.Int64 // PEXPIRE answered 0 or failed
	quit     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

type due struct {
	name string
	at   time.Time
}

func (w *watchdogLeases) take(ctx context.Context, i int, name string) error {
	err := w.c.Do(ctx, w.c.B().Set().Key(name).Value("owner").Nx().PxMilliseconds(w.ttl.Milliseconds()).Build()).Error()
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.queue = append(w.queue, due{name, time.Now().Add(w.ttl / 3)})
	w.mu.Unlock()
	return nil
}

func (w *watchdogLeases) loop() {
	defer close(w.done)
	period := w.ttl / 3
	t := time.NewTicker(max(period/100, time.Millisecond))
	defer t.Stop()
	ms := w.ttl.Milliseconds()
	for {
		select {
		case <-w.quit:
			return
		case <-t.C:
		}
		now := time.Now()
		w.mu.Lock()
		k := 0
		for k < len(w.queue) && !w.queue[k].at.After(now) {
			k++
		}
		batch := slices.Clone(w.queue[:k])
		w.queue = w.queue[k:]
		for _, d := range batch {
			w.queue = append(w.queue, due{d.name, d.at.Add(period)})
		}
		w.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), w.ttl)
		cmds := make(rueidis.Commands, 0, len(batch))
		for _, d := range batch {
			cmds = append(cmds, w.c.B().Pexpire().Key(d.name).Milliseconds(ms).Build())
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

// renewalResult is one measurement of scenario 5.
type renewalResult struct {
	n           int
	cmdsPer     float64            // Redis commands per renewal period, those run by scripts included
	sentPer     float64            // commands the client sent per renewal period (not those run by scripts)
	scriptsPer  float64            // script calls (EVAL, EVALSHA, FCALL) per renewal period
	byCmd       map[string]float64 // per period, by command
	cpuPer      time.Duration      // client CPU per renewal period
	redisCPUPer time.Duration      // server CPU per renewal period
	heapPer     float64            // client heap bytes per lease
	goroutines  int
	lostClient  int // leases the client considers lost
	lostServer  int // keys gone from the server
	acquireTime time.Duration
	notMeasured string
	err         error
}

const renewalTakeParallel = 64

// runMany holds n leases with h for cfg.renewalPeriods renewal periods of ttl/3 and measures the cost.
func runMany(srv *server, h *holder, cfg config, n int, tag string) renewalResult {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("many:%s:%d", tag, i)
	}
	octx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	set, err := h.open(octx, srv.Addr, cfg.renewalTTL, n)
	cancel()
	if err != nil {
		return renewalResult{err: err}
	}
	defer set.close()

	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	g0 := runtime.NumGoroutine()

	actx, acancel := context.WithTimeout(context.Background(), cfg.renewalAcquire)
	defer acancel()
	start := time.Now()
	var (
		next, taken atomic.Int64
		wg          sync.WaitGroup
		mu          sync.Mutex
		first       error
	)
	for g := 0; g < renewalTakeParallel; g++ {
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
		return renewalResult{err: fmt.Errorf("taking lease %d of %d: %w", taken.Load()+1, n, first)}
	}
	if int(taken.Load()) < n {
		return renewalResult{notMeasured: fmt.Sprintf("took only %s of %s leases in %v", thousands(float64(taken.Load())), thousands(float64(n)), cfg.renewalAcquire)}
	}

	runtime.GC()
	runtime.ReadMemStats(&m1)
	g1 := runtime.NumGoroutine()
	period := cfg.renewalTTL / 3
	stats0, err := srv.commandStats()
	if err != nil {
		return renewalResult{err: err}
	}
	cpu0, rcpu0 := processCPU(), srv.cpu()
	time.Sleep(time.Duration(cfg.renewalPeriods) * period)
	cpu1, rcpu1 := processCPU(), srv.cpu()
	stats1, err := srv.commandStats()
	if err != nil {
		return renewalResult{err: err}
	}
	periods := float64(cfg.renewalPeriods)
	r := renewalResult{n: n, acquireTime: acquire, byCmd: map[string]float64{}, goroutines: g1 - g0,
		heapPer:     (float64(m1.HeapAlloc) - float64(m0.HeapAlloc)) / float64(n),
		cpuPer:      (cpu1 - cpu0) / time.Duration(cfg.renewalPeriods),
		redisCPUPer: (rcpu1 - rcpu0) / time.Duration(cfg.renewalPeriods)}
	for k, v := range stats1 {
		if k == "info" {
			continue // the bench's own INFO
		}
		if d := float64(v-stats0[k]) / periods; d > 0 {
			r.byCmd[k] = d
			r.cmdsPer += d
			if !slices.Contains(h.inScript, k) {
				r.sentPer += d
			}
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
		return renewalResult{err: err}
	}
	r.lostServer = n - present
	return r
}

// renewalRow is one holder's line for one lease count: medians over the measured repetitions.
type renewalRow struct {
	n                                 int // measured repetitions
	sent, cmds, scripts, cpu, heap, g float64
	rcpu                              float64 // ms of Redis CPU per period
	by                                map[string]float64
	lostC, lostS                      int    // the most lost in one repetition
	keptAll                           int    // repetitions that lost none
	why                               string // why nothing was measured
}

func aggregateMany(rs []renewalResult) renewalRow {
	var sent, cmds, scripts, cpus, rcpus, heaps, gs []float64
	by := map[string][]float64{}
	var row renewalRow
	var lastErr string
	for _, r := range rs {
		if r.err != nil {
			lastErr = "error: " + oneLine(r.err)
			continue
		}
		if r.notMeasured != "" {
			row.why = r.notMeasured
			continue
		}
		sent = append(sent, r.sentPer)
		cmds = append(cmds, r.cmdsPer)
		scripts = append(scripts, r.scriptsPer)
		cpus = append(cpus, ms(r.cpuPer))
		rcpus = append(rcpus, ms(r.redisCPUPer))
		heaps = append(heaps, r.heapPer)
		gs = append(gs, float64(r.goroutines))
		for k, v := range r.byCmd {
			by[k] = append(by[k], v)
		}
		row.lostC, row.lostS = max(row.lostC, r.lostClient), max(row.lostS, r.lostServer)
		if r.lostClient == 0 && r.lostServer == 0 {
			row.keptAll++
		}
	}
	if row.why == "" {
		row.why = lastErr
	}
	row.n = len(cmds)
	if row.n > 0 {
		row.sent, row.cmds, row.scripts = median(sent), median(cmds), median(scripts)
		row.cpu, row.rcpu, row.heap, row.g = median(cpus), median(rcpus), median(heaps), median(gs)
		row.by = map[string]float64{}
		for k, v := range by {
			row.by[k] = median(v)
		}
	}
	return row
}

// renewalHeavy is the lease count from which a peer that failed a repetition is not repeated: one
// goroutine and one extension per key per period may not fit the machine at that size.
const renewalHeavy = 50_000

// measureRenewalCost is scenario 5: the cost of keeping many held leases alive (commands, CPU,
// memory per renewal period), for every holder, reps times.
func measureRenewalCost(srv *server, cfg config) (string, bool) {
	ok := true
	var b strings.Builder
	fmt.Fprintf(&b, "### 5. Many held locks: the cost of keeping leases alive\n\n")
	fmt.Fprintf(&b, "One client takes N free names (64 goroutines at a time), then holds them all for %d renewal "+
		"periods: TTL %v, renewed every %v. Measured over those periods only, median of %d repetitions "+
		"(contenders interleaved). "+
		"**Sent** = commands the client sent to Redis per period: deltas of `INFO commandstats` calls "+
		"(the bench's own `INFO` excluded) minus the commands run inside the contender's renewal script "+
		"(Redis counts those too; dlock's `renew.lua` runs GET and PEXPIRE per lease, rueidislock's "+
		"extend script GET, PEXPIREAT, GET). **Executed** = every command Redis ran, those inside scripts "+
		"included. Ratios (×) are to the one-round-trip-per-lease emulation in the same run. "+
		"Client CPU per period: `getrusage(RUSAGE_SELF)` user+system of the whole bench process, which "+
		"does nothing else meanwhile; Redis CPU: the server's `used_cpu_user` + `used_cpu_sys` deltas. Client heap per lease: `HeapAlloc` after GC with all leases held, minus "+
		"before the first, / N (the bench's slice of handles is allocated before; a negative figure is GC "+
		"noise around zero). Kept = leases that the client still considers held and whose key is still on "+
		"the server at the end.\n\n",
		cfg.renewalPeriods, cfg.renewalTTL, cfg.renewalTTL/3, cfg.reps)
	b.WriteString("| contender | N | sent / period (median) | % of one RT per lease | of which script calls | executed by Redis / period | % of one RT per lease | executed, by command | client CPU / period | Redis CPU / period | client heap / lease | goroutines added | kept |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|\n")
	var notes []string
	for _, n := range cfg.renewalLeases {
		res := map[*holder][]renewalResult{}
		skip := map[*holder]bool{}
		if cfg.quick && n >= renewalHeavy {
			// Quick mode skips the goroutine-per-key peer at sizes it cannot hold here (it fails
			// after seconds of trying); the full run measures that.
			for _, h := range holders {
				if h.perKey {
					skip[h] = true
					res[h] = []renewalResult{{notMeasured: "not run in quick mode at this size (make bench runs it)"}}
				}
			}
		}
		for rep := 0; rep < cfg.reps; rep++ {
			for i := range holders {
				h := holders[(i+rep)%len(holders)]
				if skip[h] {
					continue
				}
				srv.flush()
				stop := watchdog(fmt.Sprintf("scenario 5, %d leases, %s", n, h.name), cfg.renewalAcquire+cfg.renewalTTL+120*time.Second)
				r := runMany(srv, h, cfg, n, fmt.Sprintf("%d:%d:%d", n, rep, i))
				stop()
				isDlock := strings.HasPrefix(h.name, "dlock")
				switch {
				case r.err != nil:
					ok = ok && !isDlock
					cfg.logf("scenario 5, %d leases, rep %d, %s: %v", n, rep+1, h.name, r.err)
				case r.notMeasured != "":
					ok = ok && !isDlock
					cfg.logf("scenario 5, %d leases, rep %d, %s: not measured: %s", n, rep+1, h.name, r.notMeasured)
				default:
					if isDlock && (r.lostClient != 0 || r.lostServer != 0) {
						ok = false
					}
					cfg.logf("scenario 5, %d leases, rep %d, %-36s taken in %v, sent %.0f, executed %.0f commands/period, CPU %v/period, %.0f B/lease, +%d goroutines, lost %d/%d",
						n, rep+1, h.name, r.acquireTime.Round(time.Millisecond), r.sentPer, r.cmdsPer, r.cpuPer.Round(time.Microsecond), r.heapPer, r.goroutines, r.lostClient, r.lostServer)
				}
				if (r.err != nil || r.notMeasured != "") && !isDlock && n >= renewalHeavy {
					skip[h] = true
					notes = append(notes, fmt.Sprintf("%s at %s leases failed its repetition %d and was not repeated at that size (bounded: on this machine its per-key goroutines and extensions do not keep up).",
						h.name, thousands(float64(n)), rep+1))
				}
				res[h] = append(res[h], r)
			}
		}
		rows := map[*holder]renewalRow{}
		var base renewalRow
		for _, h := range holders {
			rows[h] = aggregateMany(res[h])
			if h.baseline {
				base = rows[h]
			}
		}
		for _, h := range holders {
			r := rows[h]
			if r.n == 0 {
				fmt.Fprintf(&b, "| %s | %s | not measured: %s | | | | | | | | | | |\n", h.name, thousands(float64(n)), r.why)
				continue
			}
			type kv struct {
				k string
				v float64
			}
			var parts []kv
			for k, v := range r.by {
				if v >= 0.5 {
					parts = append(parts, kv{k, v})
				}
			}
			slices.SortFunc(parts, func(a, b kv) int { return compareInt(int64(b.v*1000), int64(a.v*1000)) })
			var cs []string
			for _, p := range parts {
				cs = append(cs, fmt.Sprintf("%s %s", strings.ToUpper(p.k), thousands(p.v)))
			}
			kept := "all"
			if r.lostC != 0 || r.lostS != 0 {
				kept = fmt.Sprintf("**lost leases** in %d of %d repetitions, worst %s (client) / %s (server)", r.n-r.keptAll, r.n, thousands(float64(r.lostC)), thousands(float64(r.lostS)))
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %.1f ms | %.1f ms | %s B | %s | %s |\n", h.name, thousands(float64(n)),
				thousands(r.sent), pct(r.sent, base.sent), thousands(r.scripts), thousands(r.cmds), pct(r.cmds, base.cmds),
				strings.Join(cs, ", "), r.cpu, r.rcpu, thousands(r.heap), thousands(r.g), kept)
		}
		if d := rows[holders[0]]; d.n > 0 && base.n > 0 {
			sc := fmt.Sprintf("5, %s leases", thousands(float64(n)))
			cfg.fig.target(sc, "≤ 1% of the commands of one round trip per lease", d.sent <= base.sent/100,
				"%s sent (%s vs %s per period); executed by Redis, scripts' commands included: %s", pct(d.sent, base.sent), thousands(d.sent), thousands(base.sent), pct(d.cmds, base.cmds))
			cfg.fig.target(sc, "≤ 1 KiB client memory per lease", d.heap <= 1024, "%s B", thousands(d.heap))
			cfg.fig.target(sc, "(implied) every lease kept through the periods", d.lostC == 0 && d.lostS == 0,
				"%d of %d repetitions kept all; worst: %s lost (client) / %s (server)", d.keptAll, d.n, thousands(float64(d.lostC)), thousands(float64(d.lostS)))
			notes = append(notes, fmt.Sprintf("dlock at %s leases: sends **%s** of the commands of one round trip per lease "+
				"(target ≤ 1%%: %s); Redis executes %s as many commands (two per lease inside `renew.lua`: the ownership "+
				"check and the extension); client CPU %s, Redis CPU %s; client heap %s B per lease (target ≤ 1 KiB: %s).",
				thousands(float64(n)), pct(d.sent, base.sent), metUnmet(d.sent <= base.sent/100),
				ratio(d.cmds, base.cmds), ratio(d.cpu, base.cpu), ratio(d.rcpu, base.rcpu), thousands(d.heap), metUnmet(d.heap <= 1024)))
		}
	}
	b.WriteString("\n")
	for _, n := range notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	for _, h := range holders {
		fmt.Fprintf(&b, "- %s: %s.\n", h.name, h.config)
	}
	return b.String(), ok
}

// pct gives x as a percentage of base.
func pct(x, base float64) string {
	if base <= 0 {
		return "–"
	}
	p := 100 * x / base
	if p < 10 {
		return fmt.Sprintf("%.2f%%", p)
	}
	return fmt.Sprintf("%.0f%%", p)
}

func metUnmet(met bool) string {
	if met {
		return "met"
	}
	return "**not met**"
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
