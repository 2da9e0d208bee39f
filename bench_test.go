package dlock_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
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

// BenchmarkObserver: the uncontended pairs of BenchmarkUncontended (64 goroutines, distinct
// names) without an observer and with one whose every function does nothing, side by side, per
// transport: what WithObserver costs before the observer does any work of its own
// (docs/BENCHMARKS.md, "Observer overhead"). Run with -count N: the variants then alternate.
func BenchmarkObserver(b *testing.B) {
	needShared(b)
	ctx := context.Background()
	noop := dlock.Observer{
		AcquireDone:  func(context.Context, dlock.AcquireEvent) {},
		Waiting:      func(context.Context, dlock.WaitingEvent) {},
		Released:     func(context.Context, dlock.ReleaseEvent) {},
		Lost:         func(context.Context, dlock.LostEvent) {},
		Renewal:      func(dlock.RenewalEvent) {},
		Subscription: func(dlock.SubscriptionEvent) {},
		NodeError:    func(dlock.NodeErrorEvent) {},
	}
	for _, tr := range transports {
		for _, v := range []struct {
			name string
			opts []dlock.ClientOption
		}{{"none", nil}, {"noop", []dlock.ClientOption{dlock.WithObserver(noop)}}} {
			b.Run(tr.name+"/"+v.name, func(b *testing.B) {
				c := tr.dial(b, shared.URL(), v.opts...)
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
	}
}
