package main

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// uncontendedResult is one measurement of scenario 1.
type uncontendedResult struct {
	pairs       int64
	elapsed     time.Duration
	allocs      float64 // per pair
	bytes       float64 // per pair
	redisCPUPer time.Duration
	halts       float64 // vCPU halts per pair, every CPU of the machine (floor.go)
	haltsOK     bool    // the machine has cpuidle counters
	err         error
}

func (r uncontendedResult) rate() float64 { return float64(r.pairs) / r.elapsed.Seconds() }

// maxPairsPerGoroutine bounds every load loop by count as well as by time.
const maxPairsPerGoroutine = 5_000_000

// runUncontended runs Lock+Unlock pairs from g goroutines, each on its own name, for d after a
// short warm-up, and measures pairs/s, client allocations and server CPU per pair.
func runUncontended(srv *server, c *contender, g int, d, warm, pairTimeout time.Duration, tag string) uncontendedResult {
	ctx := context.Background()
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	cl, err := c.open(octx, srv.Addr, 10*time.Second)
	cancel()
	if err != nil {
		return uncontendedResult{err: err}
	}
	defer cl.close()

	locks := make([]lockFunc, g)
	for i := range locks {
		locks[i] = cl.mutex(fmt.Sprintf("s1:%s:%d", tag, i))
	}
	// pass runs every goroutine until stop is closed or its count bound is reached.
	pass := func(stop <-chan struct{}, counts []int64) error {
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			first error
		)
		for i := 0; i < g; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				lock := locks[i]
				var n int64
				for n < maxPairsPerGoroutine {
					select {
					case <-stop:
						counts[i] = n
						return
					default:
					}
					lctx, cancel := context.WithTimeout(ctx, pairTimeout)
					unlock, err := lock(lctx)
					if err == nil {
						err = unlock(lctx)
					}
					if err != nil && lctx.Err() != nil {
						err = fmt.Errorf("a Lock+Unlock pair on a free name stalled for %v: %w", pairTimeout, err)
					}
					cancel()
					if err != nil {
						mu.Lock()
						if first == nil {
							first = err
						}
						mu.Unlock()
						break
					}
					n++
				}
				counts[i] = n
			}()
		}
		wg.Wait()
		return first
	}
	timed := func(d time.Duration, counts []int64) error {
		stop := make(chan struct{})
		t := time.AfterFunc(d, func() { close(stop) })
		defer t.Stop()
		return pass(stop, counts)
	}

	counts := make([]int64, g)
	if err := timed(warm, counts); err != nil {
		return uncontendedResult{err: fmt.Errorf("warm-up: %w", err)}
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	cpu0 := srv.cpu()
	h0, hok0 := vcpuHalts()
	start := time.Now()
	err = timed(d, counts)
	elapsed := time.Since(start)
	h1, hok1 := vcpuHalts()
	runtime.ReadMemStats(&after)
	cpu1 := srv.cpu()
	if err != nil {
		return uncontendedResult{err: err}
	}
	var pairs int64
	for _, n := range counts {
		pairs += n
	}
	if pairs == 0 {
		return uncontendedResult{err: fmt.Errorf("no pair completed")}
	}
	halts, haltsOK := haltsPer(h0, h1, hok0 && hok1, pairs)
	return uncontendedResult{
		pairs:       pairs,
		elapsed:     elapsed,
		allocs:      float64(after.Mallocs-before.Mallocs) / float64(pairs),
		bytes:       float64(after.TotalAlloc-before.TotalAlloc) / float64(pairs),
		redisCPUPer: (cpu1 - cpu0) / time.Duration(pairs),
		halts:       halts,
		haltsOK:     haltsOK,
	}
}

// measureUncontended is scenario 1: Lock+Unlock pairs on distinct names. It measures every
// contender at each goroutine count, reps times, rotating the order of contenders from one
// repetition to the next.
func measureUncontended(srv *server, cfg config) (string, bool) {
	var b strings.Builder
	fmt.Fprintf(&b, "### 1. Uncontended: Lock+Unlock pairs on distinct names\n\n")
	fmt.Fprintf(&b, "Each goroutine locks and unlocks its own name in a loop for %v (after a %v warm-up); "+
		"median of %d repetitions, contenders interleaved. Allocations and bytes are the whole "+
		"process's (client library and its background goroutines) per pair; redis CPU is the "+
		"server's user+system time per pair.\n\n", cfg.uncontendedDuration, cfg.warmUp, cfg.reps)
	ok := true
	for _, g := range cfg.uncontendedGoroutines {
		res := map[*contender][]uncontendedResult{}
		// The goroutine counts of cfg.floor.awakeGoroutines are measured in both CPU states, each
		// repetition idle then awake (floor_awake.go).
		awake := slices.Contains(cfg.floor.awakeGoroutines, g)
		resAwake := map[*contender][]uncontendedResult{}
		pass := func(rep int, state string, res map[*contender][]uncontendedResult) {
			for i := range contenders {
				c := contenders[(i+rep)%len(contenders)]
				srv.flush()
				stop := watchdog(fmt.Sprintf("scenario 1, %d goroutines%s, %s", g, state, c.name), cfg.uncontendedDuration+cfg.warmUp+30*time.Second)
				r := runUncontended(srv, c, g, cfg.uncontendedDuration, cfg.warmUp, cfg.pairTimeout, fmt.Sprintf("%d:%d:%d%s", g, rep, i, state))
				stop()
				if r.err != nil {
					// A peer's failure is a finding for the table; dlock's fails the run.
					ok = ok && c.kind != kindDlock
					cfg.logf("scenario 1, %d goroutines%s, rep %d, %s: %v", g, state, rep+1, c.name, r.err)
				} else {
					cfg.logf("scenario 1, %d goroutines%s, rep %d, %-26s %9.0f pairs/s, %.2f vCPU halts/pair", g, state, rep+1, c.name, r.rate(), r.halts)
				}
				res[c] = append(res[c], r)
			}
		}
		var awakeErr error
		for rep := 0; rep < cfg.reps; rep++ {
			pass(rep, "", res)
			if awake {
				sp, err := startSpinner(cfg.floor.spinners)
				if err != nil {
					awakeErr = err
					cfg.logf("scenario 1, %d goroutines, awake: %v", g, err)
					continue
				}
				pass(rep, ", awake", resAwake)
				sp.stop()
			}
		}
		fig := cfg.fig // every count's targets (idle vCPUs where both states are measured)
		if !awake {
			b.WriteString(uncontendedTable(g, "", res, fig))
		} else {
			b.WriteString(uncontendedTable(g, "idle vCPUs", res, fig))
			if awakeErr != nil {
				fmt.Fprintf(&b, "\n**%d goroutine%s, awake vCPUs**: not measured: %s.\n", g, plural(g), oneLine(awakeErr))
			} else {
				b.WriteString(uncontendedTable(g, fmt.Sprintf("awake vCPUs (%d nice 19 spinners)", cfg.floor.spinners), resAwake, nil))
			}
		}
		if cfg.fig != nil {
			m := map[*contender]float64{}
			for c, rs := range res {
				var rates []float64
				for _, x := range rs {
					if x.err == nil {
						rates = append(rates, x.rate())
					}
				}
				m[c] = median(rates)
			}
			cfg.fig.uncontendedGoroutines = append(cfg.fig.uncontendedGoroutines, g)
			cfg.fig.uncontended[g] = m
		}
	}
	b.WriteString(awakeNote(cfg))
	b.WriteString("\nContenders:\n\n")
	for _, c := range contenders {
		fmt.Fprintf(&b, "- **%s**: %s\n", c.name, c.config)
	}
	return b.String(), ok
}

// uncontendedTable writes the table for g goroutines; with fig, it also records how dlock fared
// against its performance targets.
func uncontendedTable(g int, state string, res map[*contender][]uncontendedResult, fig *figures) string {
	type row struct {
		rate, allocs, bytes, cpu, halts float64
		n, failed                       int
		haltsOK                         bool
		err                             error
	}
	rows := map[*contender]row{}
	var bestPeer float64
	var bestPeerName string
	for _, c := range contenders {
		var rates, allocs, bytes, cpu, halts []float64
		var r row
		r.haltsOK = true
		for _, x := range res[c] {
			if x.err != nil {
				r.err = x.err
				r.failed++
				continue
			}
			rates = append(rates, x.rate())
			allocs = append(allocs, x.allocs)
			bytes = append(bytes, x.bytes)
			cpu = append(cpu, float64(x.redisCPUPer.Nanoseconds())/1000)
			halts = append(halts, x.halts)
			r.haltsOK = r.haltsOK && x.haltsOK
		}
		r.n = len(rates)
		if r.n > 0 {
			r.rate, r.allocs, r.bytes, r.cpu, r.halts = median(rates), median(allocs), median(bytes), median(cpu), median(halts)
		}
		rows[c] = r
		if c.kind == kindPeer && r.rate > bestPeer {
			bestPeer, bestPeerName = r.rate, c.name
		}
	}
	var b strings.Builder
	title := fmt.Sprintf("%d goroutine%s", g, plural(g))
	if state != "" {
		title += ", " + state
	}
	fmt.Fprintf(&b, "\n**%s**\n\n", title)
	b.WriteString("| contender | pairs/s (median) | × best peer | allocs/pair | B/pair | redis CPU µs/pair | vCPU halts/pair |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range contenders {
		r := rows[c]
		if r.n == 0 {
			fmt.Fprintf(&b, "| %s | error: %s | | | | | |\n", c.name, oneLine(r.err))
			continue
		}
		name := c.name
		if r.failed > 0 {
			name += fmt.Sprintf(" (%d of %d repetitions failed)", r.failed, r.failed+r.n)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %.1f | %s | %.1f | %s |\n", name, thousands(r.rate),
			ratio(r.rate, bestPeer), r.allocs, thousands(r.bytes), r.cpu, haltsCell(r.halts, r.haltsOK))
	}
	b.WriteString("\n")
	for _, c := range contenders {
		if r := rows[c]; r.err != nil {
			fmt.Fprintf(&b, "- %s failed: %s.\n", c.name, oneLine(r.err))
		}
	}
	d := rows[contenderByName("dlock (rueidis)")]
	dg := rows[contenderByName("dlock (go-redis)")]
	if fig != nil && d.rate > 0 {
		sc := fmt.Sprintf("1, %d goroutines", g)
		want := 1.3 // the best peer, by goroutines: 0.9× at 1, 1.0× at 4, 1.3× from 16 on
		switch {
		case g <= 1:
			want = 0.9
		case g <= 4:
			want = 1.0
		}
		if bestPeer > 0 {
			fig.target(sc, fmt.Sprintf("≥ %.1f× the best peer", want), d.rate >= want*bestPeer, "%s (%s)", ratio(d.rate, bestPeer), bestPeerName)
		}
		rr := rows[contenderByName("raw rueidis")]
		if g == 1 && rr.rate > 0 {
			fig.target(sc, "≥ 0.6× raw SET NX PX + DEL (rueidis)", d.rate >= 0.6*rr.rate, "%s (%s vs %s pairs/s)", ratio(d.rate, rr.rate), thousands(d.rate), thousands(rr.rate))
		}
		if d.cpu > 0 && rr.cpu > 0 {
			fig.target(sc, "Redis CPU per pair ≤ 1.7× the raw rueidis floor's", d.cpu <= 1.7*rr.cpu, "%.1f vs %.1f µs (%s)", d.cpu, rr.cpu, ratio(d.cpu, rr.cpu))
		}
		fig.target(sc, "allocations per pair ≤ 13 (the loop's WithTimeout included)", d.allocs <= 13, "%.1f", d.allocs)
		if dg.rate > 0 {
			fig.target(sc, "go-redis transport ≥ 0.9× the rueidis one", dg.rate >= 0.9*d.rate, "%s", ratio(dg.rate, d.rate))
		}
	}
	if bestPeer > 0 && d.rate > 0 {
		fmt.Fprintf(&b, "- dlock (rueidis) = **%s** the best peer (%s)", ratio(d.rate, bestPeer), bestPeerName)
		if rr := rows[contenderByName("raw rueidis")]; rr.rate > 0 {
			fmt.Fprintf(&b, ", %s the raw rueidis floor", ratio(d.rate, rr.rate))
		}
		b.WriteString(".\n")
	}
	if dg.rate > 0 {
		if rg := rows[contenderByName("raw go-redis")]; rg.rate > 0 {
			fmt.Fprintf(&b, "- dlock (go-redis) = %s the raw go-redis floor", ratio(dg.rate, rg.rate))
			if bestPeer > 0 {
				fmt.Fprintf(&b, ", %s the best peer", ratio(dg.rate, bestPeer))
			}
			b.WriteString(".\n")
		}
	}
	return b.String()
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func oneLine(err error) string {
	if err == nil {
		return ""
	}
	s := strings.ReplaceAll(err.Error(), "\n", " ")
	s = strings.ReplaceAll(s, "|", "/")
	if r := []rune(s); len(r) > 120 {
		s = string(r[:120]) + "…" // cut between characters, not inside one
	}
	return s
}

// thousands formats x rounded to an integer with comma separators.
func thousands(x float64) string {
	if x < 0 {
		return "−" + thousands(-x)
	}
	s := strconv.FormatInt(int64(x+0.5), 10)
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

func ratio(x, best float64) string {
	if best <= 0 || x <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", x/best)
}
