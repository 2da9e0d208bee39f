package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// hotResult is one measurement of scenario 2.
type hotResult struct {
	handoffs    int64
	elapsed     time.Duration
	waitP50     time.Duration
	waitP99     time.Duration
	waitMax     time.Duration // the longest wait (set by the multi-process measurements)
	jain        float64
	minShare    float64
	changes     int64 // holds by a different goroutine than the previous hold
	lostUpdates int64 // counter increments lost: mutual exclusion broken
	overlaps    int64 // times a holder found another holder inside
	err         error
}

func (r hotResult) rate() float64 { return float64(r.handoffs) / r.elapsed.Seconds() }

// maxHoldsPerGoroutine bounds the hot loop by count as well as by time.
const maxHoldsPerGoroutine = 1_000_000

// runHot has g goroutines of one client take and release one name, with an empty critical
// section, for d. The critical section increments a shared counter with a separate load and
// store (no read-modify-write atomicity): only mutual exclusion keeps it exact.
func runHot(srv *server, c *contender, g int, d time.Duration, name string) hotResult {
	octx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	cl, err := c.open(octx, srv.Addr, 10*time.Second)
	cancel()
	if err != nil {
		return hotResult{err: err}
	}
	defer cl.close()

	var (
		counter  atomic.Int64 // loaded and stored separately: see above
		inside   atomic.Int32
		overlaps atomic.Int64
		wg       sync.WaitGroup
		mu       sync.Mutex
		first    error
		waits    = make([][]time.Duration, g)
		counts   = make([]int64, g) // holds that began before the end: the figures
		holds    atomic.Int64       // every hold: what counter must equal
		last     atomic.Int32       // goroutine of the previous hold (written inside the lock)
		changes  atomic.Int64
	)
	last.Store(-1)
	start := time.Now()
	end := start.Add(d)
	// Waiting stops at end; the grace lets a holder release after it.
	runCtx, cancelRun := context.WithDeadline(context.Background(), end)
	defer cancelRun()
	for i := 0; i < g; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lock := cl.mutex(name)
			mine := make([]time.Duration, 0, 1024)
			var n int64
			for n < maxHoldsPerGoroutine && runCtx.Err() == nil {
				t0 := time.Now()
				unlock, err := lock(runCtx)
				if err != nil {
					if runCtx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
						mu.Lock()
						if first == nil {
							first = fmt.Errorf("lock: %w", err)
						}
						mu.Unlock()
					}
					break
				}
				held := time.Now()
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				v := counter.Load()
				counter.Store(v + 1)
				inside.Add(-1)
				holds.Add(1)
				changed := last.Swap(int32(i)) != int32(i)
				uctx, ucancel := context.WithTimeout(context.Background(), 10*time.Second)
				err = unlock(uctx)
				ucancel()
				if err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("unlock: %w", err)
					}
					mu.Unlock()
					break
				}
				if held.Before(end) {
					mine = append(mine, held.Sub(t0))
					n++
					if changed {
						changes.Add(1)
					}
				}
			}
			waits[i] = mine
			counts[i] = n
		}()
	}
	wg.Wait()
	elapsed := min(time.Since(start), d)
	var all []time.Duration
	var total int64
	for i := range waits {
		all = append(all, waits[i]...)
		total += counts[i]
	}
	r := hotResult{err: first, elapsed: elapsed, handoffs: total, overlaps: overlaps.Load(), changes: changes.Load()}
	r.lostUpdates = holds.Load() - counter.Load()
	if len(all) == 0 {
		if r.err == nil {
			r.err = errors.New("no acquisition")
		}
		return r
	}
	slices.Sort(all)
	r.waitP50 = all[len(all)/2]
	r.waitP99 = all[len(all)*99/100]
	r.jain, r.minShare = jain(counts)
	return r
}

// jain returns Jain's fairness index over counts (1 = even) and the smallest count over the mean.
func jain(counts []int64) (float64, float64) {
	var sum, sumSq float64
	minC := float64(counts[0])
	for _, n := range counts {
		x := float64(n)
		sum += x
		sumSq += x * x
		minC = min(minC, x)
	}
	if sumSq == 0 {
		return 0, 0
	}
	return sum * sum / (float64(len(counts)) * sumSq), minC / (sum / float64(len(counts)))
}

// measureHotName is scenario 2: 64 goroutines of one process on one name (handoffs/s, waits,
// fairness, mutual exclusion), for every lock (not the raw floors), reps times.
func measureHotName(srv *server, cfg config) (string, bool) {
	const g = 64
	var locks []*contender
	for _, c := range contenders {
		if c.kind != kindRaw {
			locks = append(locks, c)
		}
	}
	res := map[*contender][]hotResult{}
	ok := true
	for rep := 0; rep < cfg.reps; rep++ {
		for i := range locks {
			c := locks[(i+rep)%len(locks)]
			srv.flush()
			stop := watchdog("scenario 2, "+c.name, cfg.hotDuration+30*time.Second)
			r := runHot(srv, c, g, cfg.hotDuration, fmt.Sprintf("hot:%d:%d", rep, i))
			stop()
			if r.err != nil {
				ok = ok && c.kind != kindDlock
				cfg.logf("scenario 2, rep %d, %s: %v", rep+1, c.name, r.err)
			}
			if r.lostUpdates != 0 || r.overlaps != 0 {
				// A peer's overlap is a finding for the table; only dlock's fails the run.
				ok = ok && c.kind != kindDlock
				cfg.logf("scenario 2, %s: MUTUAL EXCLUSION BROKEN: %d lost updates, %d overlapping holds", c.name, r.lostUpdates, r.overlaps)
			}
			cfg.logf("scenario 2, rep %d, %-18s %7.0f handoffs/s, wait p50 %v p99 %v, Jain %.3f",
				rep+1, c.name, r.rate(), r.waitP50.Round(time.Microsecond), r.waitP99.Round(time.Microsecond), r.jain)
			res[c] = append(res[c], r)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "### 2. Hot name, one process: %d goroutines, one name, empty critical section\n\n", g)
	fmt.Fprintf(&b, "%v per measurement, median of %d repetitions, contenders interleaved. Wait = from "+
		"calling Lock to holding the lock. Jain's index is over the %d goroutines' acquisition counts "+
		"(1 = perfectly even); \"to another goroutine\" counts only holds whose holder differs from "+
		"the previous one (a goroutine re-taking the lock it just released is a handoff to itself); least served = fewest acquisitions of a goroutine / the mean. "+
		"Mutual exclusion: the critical section increments a counter with a separate load and store; "+
		"it must end equal to the number of holds, and no holder may find another inside.\n\n",
		cfg.hotDuration, cfg.reps, g)
	rows := map[*contender]hotRow{}
	for _, c := range locks {
		rows[c] = aggregateHot(res[c])
	}
	if cfg.fig != nil {
		cfg.fig.hotLocks, cfg.fig.hot = locks, rows
	}
	writeHotTable(&b, locks, rows, func(_ *contender, r hotRow) string {
		if r.lost != 0 || r.overlaps != 0 {
			return fmt.Sprintf("**BROKEN**: %d lost updates, %d overlaps", r.lost, r.overlaps)
		}
		return "exact"
	}, cfg.fig, "2, 1 process × 64 goroutines", g)
	return b.String(), ok
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
