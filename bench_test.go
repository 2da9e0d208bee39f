package dlock_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/dlock-go/dlock"
)

// The benchmarks share the test binary's private redis-server (TestMain). Run them with
// `make bench-go`; docs/BENCHMARKS.md records the figures and the ratios between them.

// benchGoroutines is how many goroutines the parallel benchmarks run, whatever GOMAXPROCS is.
const benchGoroutines = 64

func setParallel(b *testing.B) {
	b.SetParallelism(max(1, benchGoroutines/runtimeGOMAXPROCS()))
}

var benchSeq atomic.Int64

// BenchmarkUncontended: Lock+Unlock pairs on distinct names from 64 goroutines, dlock through
// each adapter beside the raw floors (SET NX PX + DEL, no safety at all) of the same clients.
// redis-cpu-µs/op is the server's CPU time per pair.
func BenchmarkUncontended(b *testing.B) {
	needShared(b)
	ctx := context.Background()
	for _, tr := range transports {
		b.Run("dlock-"+tr.name, func(b *testing.B) {
			c := tr.dial(b, shared.URL())
			benchPairs(b, func() func() error {
				m := c.Mutex("bench:" + strconv.FormatInt(benchSeq.Add(1), 10))
				return func() error {
					l, err := m.Lock(ctx)
					if err != nil {
						return err
					}
					return l.Unlock(ctx)
				}
			})
		})
	}
	// The raw rueidis floor with rueidis's defaults, and with the flush delay dlock.Dial sets.
	// The raw floors log in as the suite's admin: the default user may only run dlock's commands
	// on dlock's keys (main_test.go), and DEL is not one of them.
	for _, flush := range []time.Duration{0, 20 * time.Microsecond} {
		name := "raw-rueidis"
		if flush > 0 {
			name += "-flush" + flush.String()
		}
		b.Run(name, func(b *testing.B) {
			rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{shared.Addr}, DisableCache: true, MaxFlushDelay: flush,
				Username: adminUser, Password: adminPassword})
			if err != nil {
				b.Fatal(err)
			}
			defer rc.Close()
			benchPairs(b, func() func() error {
				key := "raw:" + strconv.FormatInt(benchSeq.Add(1), 10)
				return func() error {
					if err := rc.Do(ctx, rc.B().Set().Key(key).Value("owner").Nx().PxMilliseconds(10000).Build()).Error(); err != nil {
						return err
					}
					return rc.Do(ctx, rc.B().Del().Key(key).Build()).Error()
				}
			})
		})
	}
	b.Run("raw-goredis", func(b *testing.B) {
		rc := redis.NewClient(&redis.Options{Addr: shared.Addr, PoolSize: benchGoroutines, Username: adminUser, Password: adminPassword})
		defer rc.Close()
		benchPairs(b, func() func() error {
			key := "raw:" + strconv.FormatInt(benchSeq.Add(1), 10)
			return func() error {
				if err := rc.SetNX(ctx, key, "owner", 10*time.Second).Err(); err != nil {
					return err
				}
				return rc.Del(ctx, key).Err()
			}
		})
	})
}

// benchPairs runs pair (made once per goroutine by newPair) from 64 goroutines and reports the
// server's CPU per pair beside the usual figures.
func benchPairs(b *testing.B, newPair func() func() error) {
	setParallel(b)
	b.ReportAllocs()
	before := serverCPU(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		pair := newPair()
		for pb.Next() {
			if err := pair(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64((serverCPU(b)-before).Nanoseconds())/1000/float64(b.N), "redis-cpu-µs/op")
}

// serverCPU returns the CPU time the shared redis-server has used so far.
func serverCPU(b *testing.B) time.Duration {
	b.Helper()
	var total float64
	for _, line := range strings.Split(redisDo(b, shared, "INFO", "cpu"), "\n") {
		line = strings.TrimSpace(line)
		for _, f := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, f); ok {
				x, _ := strconv.ParseFloat(v, 64)
				total += x
			}
		}
	}
	return time.Duration(total * float64(time.Second))
}

var _ = dlock.DefaultTTL

// noopObserver sets every event to a function that does nothing.
var noopObserver = dlock.Observer{
	AcquireDone:  func(context.Context, dlock.AcquireEvent) {},
	Waiting:      func(context.Context, dlock.WaitingEvent) {},
	Released:     func(context.Context, dlock.ReleaseEvent) {},
	Lost:         func(context.Context, dlock.LostEvent) {},
	Renewal:      func(dlock.RenewalEvent) {},
	Subscription: func(dlock.SubscriptionEvent) {},
	NodeError:    func(dlock.NodeErrorEvent) {},
}

// BenchmarkObserver: what WithObserver costs before the observer does any work of its own.
// Scenario 1 of the bench module (uncontended Lock+Unlock pairs on distinct names, by 1 and by
// 64 goroutines), per transport, through two clients of the same server, one without an
// observer and one with noopObserver, run side by side: in alternating slices of 200 ms (in the
// order none, noop, noop, none, … so that a drift of the machine's load favours neither), 60
// slices each, after a warm-up. It reports each one's pairs/s over its slices and their ratio,
// noop/none (1 = no cost), and the client's CPU time per pair; docs/BENCHMARKS.md, "Observer
// overhead". On a shared machine the
// slices' own figures vary; alternating them is what makes the two comparable. Run it once
// (-benchtime 1x): it does its fixed amount of work whatever b.N is.
func BenchmarkObserver(b *testing.B) {
	needShared(b)
	const (
		slice  = 200 * time.Millisecond
		slices = 60
	)
	ctx := context.Background()
	for _, tr := range transports {
		for _, goroutines := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/g%d", tr.name, goroutines), func(b *testing.B) {
				clients := [2]*dlock.Client{tr.dial(b, shared.URL()), tr.dial(b, shared.URL(), dlock.WithObserver(noopObserver))}
				var pairs [2]int64
				var spent, cpu [2]time.Duration
				run := func(c *dlock.Client, d time.Duration) int64 {
					var n atomic.Int64
					var wg sync.WaitGroup
					end := time.Now().Add(d)
					for range goroutines {
						wg.Add(1)
						go func() {
							defer wg.Done()
							m := c.Mutex("bench:" + strconv.FormatInt(benchSeq.Add(1), 10))
							for time.Now().Before(end) {
								l, err := m.Lock(ctx)
								if err != nil {
									b.Error(err)
									return
								}
								if err := l.Unlock(ctx); err != nil {
									b.Error(err)
									return
								}
								n.Add(1)
							}
						}()
					}
					wg.Wait()
					return n.Load()
				}
				run(clients[0], slice) // warm-up
				run(clients[1], slice)
				b.ResetTimer()
				for i := range 2 * slices {
					v := i % 2
					if (i/2)%2 == 1 {
						v = 1 - v // none, noop, noop, none, none, noop, …
					}
					start, cpu0 := time.Now(), processCPU()
					pairs[v] += run(clients[v], slice)
					spent[v] += time.Since(start)
					cpu[v] += processCPU() - cpu0
				}
				b.StopTimer()
				none := float64(pairs[0]) / spent[0].Seconds()
				noop := float64(pairs[1]) / spent[1].Seconds()
				b.ReportMetric(none, "none-pairs/s")
				b.ReportMetric(noop, "noop-pairs/s")
				b.ReportMetric(noop/none, "noop/none")
				// The client's own CPU per pair (this process: the redis-server is another one),
				// which the machine's other load disturbs less than the pairs/s.
				b.ReportMetric(float64(cpu[0].Microseconds())/float64(pairs[0]), "none-cpu-µs/pair")
				b.ReportMetric(float64(cpu[1].Microseconds())/float64(pairs[1]), "noop-cpu-µs/pair")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// processCPU returns the user and system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
