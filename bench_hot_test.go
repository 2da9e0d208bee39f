package dlock_test

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// acquisition is one hold of the hot lock: who, which token, when taken and released (wall
// clock in ns, shared by every process on the machine).
type acquisition struct {
	worker   string
	token    uint64
	acquired int64
	released int64
}

// hotLoop has goroutines of one client take and release one lock, with an empty critical
// section, until the duration ends. A plain counter checks mutual exclusion within the process.
func hotLoop(c *dlock.Client, name, tag string, goroutines int, d time.Duration) ([]acquisition, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var (
		mu     sync.Mutex
		all    []acquisition
		inside int
		errs   []error
		wg     sync.WaitGroup
	)
	m := c.Mutex(name)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []acquisition
			for ctx.Err() == nil {
				l, err := m.Lock(ctx)
				if err != nil {
					if ctx.Err() == nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
					break
				}
				a := acquisition{worker: fmt.Sprintf("%s/%d", tag, g), token: l.Token(), acquired: time.Now().UnixNano()}
				inside++ // unsynchronised on purpose: the lock must make this safe
				if inside != 1 {
					panic("two holders at once")
				}
				inside--
				a.released = time.Now().UnixNano()
				if err := l.Unlock(context.Background()); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					break
				}
				mine = append(mine, a)
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return all, errs[0]
	}
	return all, nil
}

// runHotHelper is the "hot" helper role: hotLoop in its own process, one line per acquisition.
func runHotHelper() int {
	g, _ := strconv.Atoi(os.Getenv("DLOCK_GOROUTINES"))
	d, _ := time.ParseDuration(os.Getenv("DLOCK_DURATION"))
	c, err := dlock.Dial(context.Background(), os.Getenv("DLOCK_URL"))
	if err != nil {
		fmt.Println("error", err)
		return 2
	}
	defer c.Close()
	all, err := hotLoop(c, os.Getenv("DLOCK_NAME"), os.Getenv("DLOCK_TAG"), g, d)
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	for _, a := range all {
		fmt.Fprintf(w, "acq %s %d %d %d\n", a.worker, a.token, a.acquired, a.released)
	}
	if err != nil {
		fmt.Fprintln(w, "error", err)
		return 1
	}
	return 0
}

// hotStats are the figures of a hot-lock run.
type hotStats struct {
	handoffsPerSec   float64
	handoffP50       time.Duration // release → next holder acquired
	handoffP99       time.Duration
	jain             float64 // Jain fairness over workers' acquisition counts (1 = perfectly even)
	minShare         float64 // fewest acquisitions of a worker / fair share
	waitP50, waitP99 time.Duration
}

func hotFigures(all []acquisition, workers int, d time.Duration) (hotStats, error) {
	slices.SortFunc(all, func(a, b acquisition) int { return int(int64(a.token - b.token)) })
	var hs hotStats
	if len(all) < 2 {
		return hs, fmt.Errorf("only %d acquisitions", len(all))
	}
	handoffs := make([]time.Duration, 0, len(all))
	for i := 1; i < len(all); i++ {
		if all[i].token == all[i-1].token {
			return hs, fmt.Errorf("token %d handed out twice", all[i].token)
		}
		if all[i].acquired < all[i-1].released {
			return hs, fmt.Errorf("token %d acquired %v before token %d was released",
				all[i].token, time.Duration(all[i-1].released-all[i].acquired), all[i-1].token)
		}
		handoffs = append(handoffs, time.Duration(all[i].acquired-all[i-1].released))
	}
	slices.Sort(handoffs)
	hs.handoffsPerSec = float64(len(all)) / d.Seconds()
	hs.handoffP50 = handoffs[len(handoffs)/2]
	hs.handoffP99 = handoffs[len(handoffs)*99/100]
	counts := map[string]float64{}
	for _, a := range all {
		counts[a.worker]++
	}
	var sum, sumSq float64
	minC := math.Inf(1)
	for _, n := range counts {
		sum += n
		sumSq += n * n
		minC = min(minC, n)
	}
	if len(counts) < workers {
		minC = 0
	}
	hs.jain = sum * sum / (float64(workers) * sumSq)
	hs.minShare = minC / (sum / float64(workers))
	return hs, nil
}

func (hs hotStats) report(b *testing.B) {
	b.ReportMetric(hs.handoffsPerSec, "handoffs/s")
	b.ReportMetric(float64(hs.handoffP50.Microseconds())/1000, "handoff-p50-ms")
	b.ReportMetric(float64(hs.handoffP99.Microseconds())/1000, "handoff-p99-ms")
	b.ReportMetric(hs.jain, "jain")
	b.ReportMetric(hs.minShare, "min-share")
	b.Logf("handoffs/s %.0f, handoff p50 %v p99 %v, Jain %.3f, least-served worker %.2f of its fair share",
		hs.handoffsPerSec, hs.handoffP50, hs.handoffP99, hs.jain, hs.minShare)
}

const hotDuration = 3 * time.Second

// BenchmarkHotName: one lock, empty critical section, every goroutine contending. It runs a
// fixed 3 s whatever b.N is; the figures are custom metrics.
func BenchmarkHotName(b *testing.B) {
	b.Run("1proc-64g", func(b *testing.B) {
		s := redistest.Start(b)
		c := transports[0].dial(b, s.URL())
		var all []acquisition
		for i := 0; i < b.N; i++ {
			var err error
			if all, err = hotLoop(c, "hot", "p0", 64, hotDuration); err != nil {
				b.Fatal(err)
			}
		}
		hs, err := hotFigures(all, 64, hotDuration)
		if err != nil {
			b.Fatal(err)
		}
		hs.report(b)
	})
	b.Run("4procs-16g", func(b *testing.B) {
		s := redistest.Start(b)
		var all []acquisition
		for i := 0; i < b.N; i++ {
			all = hotProcesses(b, s.URL(), 4, 16, hotDuration)
		}
		hs, err := hotFigures(all, 64, hotDuration)
		if err != nil {
			b.Fatal(err)
		}
		hs.report(b)
	})
}

func hotProcesses(b *testing.B, url string, procs, goroutines int, d time.Duration) []acquisition {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	var (
		mu  sync.Mutex
		all []acquisition
		wg  sync.WaitGroup
	)
	for p := 0; p < procs; p++ {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"=hot", "DLOCK_URL="+url, "DLOCK_NAME=hot",
			"DLOCK_TAG=p"+strconv.Itoa(p), "DLOCK_GOROUTINES="+strconv.Itoa(goroutines), "DLOCK_DURATION="+d.String())
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []acquisition
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				if len(f) == 5 && f[0] == "acq" {
					tok, _ := strconv.ParseUint(f[2], 10, 64)
					acq, _ := strconv.ParseInt(f[3], 10, 64)
					rel, _ := strconv.ParseInt(f[4], 10, 64)
					mine = append(mine, acquisition{worker: f[1], token: tok, acquired: acq, released: rel})
				} else {
					b.Errorf("helper: %s", sc.Text())
				}
			}
			if err := cmd.Wait(); err != nil {
				b.Errorf("helper: %v", err)
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return all
}

// BenchmarkHeldLeases: 10,000 leases held for three renewal periods: renew script calls per
// 100 leases per period, and client memory per held lease.
func BenchmarkHeldLeases(b *testing.B) {
	const (
		leases = 10000
		ttl    = 600 * time.Millisecond
	)
	for i := 0; i < b.N; i++ {
		s := redistest.Start(b)
		c := transports[0].dial(b, s.URL(), dlock.WithTTL(ttl))
		ctx := context.Background()
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		goroutines := runtime.NumGoroutine()
		held := make([]*dlock.Lease, leases)
		var wg sync.WaitGroup
		for w := 0; w < 16; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := w; j < leases; j += 16 {
					l, err := c.Mutex("held:" + strconv.Itoa(j)).TryLock(ctx)
					if err != nil {
						b.Error(err)
						return
					}
					held[j] = l
				}
			}()
		}
		wg.Wait()
		runtime.GC()
		runtime.ReadMemStats(&after)
		extraG := runtime.NumGoroutine() - goroutines
		base := scriptCalls(b, s)
		time.Sleep(3 * ttl / 3 * 3) // three renewal periods of ttl/3 each, three times over
		calls := scriptCalls(b, s) - base
		periods := 9.0
		lost := 0
		for _, l := range held {
			if l.Context().Err() != nil {
				lost++
			}
			l.Unlock(ctx)
		}
		if lost > 0 {
			b.Fatalf("%d leases lost while held", lost)
		}
		perHundred := float64(calls) / periods / (leases / 100)
		perLease := float64(after.HeapAlloc-before.HeapAlloc) / leases
		b.ReportMetric(perHundred, "calls/100leases/period")
		b.ReportMetric(perLease, "heap-B/lease")
		b.ReportMetric(float64(extraG), "goroutines")
		b.Logf("%d leases: %.3f renew calls per 100 leases per period (one round trip per lease per period would be 100), %.0f B heap per lease, %d extra goroutines",
			leases, perHundred, perLease, extraG)
	}
}
