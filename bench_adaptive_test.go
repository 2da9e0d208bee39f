package dlock_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// BenchmarkAdaptive: what the adaptive lease costs the server. redis-cpu-µs/op is the shared
// redis-server's CPU time per operation (INFO cpu), beside the usual figures; for releases,
// script-µs/op is the time the server spent inside release.lua (INFO commandstats).
//
//   - release-*: Unlock alone (release.lua) of b.N leases taken before the timer starts, from
//     64 goroutines: a fixed lease, and an adaptive one, whose release also records the hold
//     (TIME, GET and SET of the hold record).
//   - pair-*: Lock+Unlock pairs on distinct names, as BenchmarkUncontended: the adaptive
//     acquisition also reads the hold record.
//
// Names recur across the benchmark's rounds (name i in every round), so that most adaptive
// releases update a record, as for a lock in steady use; the first round creates them.
func BenchmarkAdaptive(b *testing.B) {
	needShared(b)
	ctx := context.Background()
	kinds := []struct {
		name string
		opt  dlock.Option
	}{
		{"fixed", dlock.WithTTL(time.Minute)},
		{"adaptive", dlock.WithAdaptiveTTL(time.Minute, time.Minute)}, // the same lease, chosen by the server
	}
	for _, k := range kinds {
		b.Run("release-"+k.name, func(b *testing.B) {
			c := transports[0].dial(b, shared.URL(), k.opt)
			leases := make([]*dlock.Lease, b.N)
			parallel(b, b.N, func(i int) error {
				var err error
				leases[i], err = c.Mutex("bench-release-" + k.name + ":" + strconv.Itoa(i)).TryLock(ctx)
				return err
			})
			before, usec := serverCPU(b), commandStats(b, shared)["evalsha"].usec
			b.ResetTimer()
			parallel(b, b.N, func(i int) error { return leases[i].Unlock(ctx) })
			b.StopTimer()
			b.ReportMetric(float64((serverCPU(b)-before).Nanoseconds())/1000/float64(b.N), "redis-cpu-µs/op")
			b.ReportMetric(float64(commandStats(b, shared)["evalsha"].usec-usec)/float64(b.N), "script-µs/op")
		})
	}
	for _, k := range kinds {
		b.Run("pair-"+k.name, func(b *testing.B) {
			c := transports[0].dial(b, shared.URL(), k.opt)
			var seq sync.Mutex
			next := 0
			benchPairs(b, func() func() error {
				seq.Lock()
				m := c.Mutex("bench-pair-" + k.name + ":" + strconv.Itoa(next))
				next++
				seq.Unlock()
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

// parallel runs f(0) … f(n-1) from benchGoroutines goroutines, failing b on the first error.
func parallel(b *testing.B, n int, f func(i int) error) {
	b.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	work := make(chan int, benchGoroutines)
	for range benchGoroutines {
		wg.Go(func() {
			for i := range work {
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	if first != nil {
		b.Fatal(first)
	}
}

// holdRecordBurst is how many distinct names BenchmarkHoldRecords locks and unlocks once each.
const holdRecordBurst = 50_000

// BenchmarkHoldRecords: the memory of the hold records. Distinct names are locked and unlocked
// once each on a private server, with a fixed lease and with the adaptive lease; bytes-per-name
// is the server's used_memory per name right after (the released value, kept for the token
// retention, and for the adaptive lease its hold record too): the difference is the record's.
// Run alone: go test -run '^$' -bench HoldRecords -benchtime 1x .
func BenchmarkHoldRecords(b *testing.B) {
	s := redistest.Start(b)
	ctx := context.Background()
	for _, k := range []struct {
		name string
		opt  dlock.Option
	}{
		{"fixed", dlock.WithTTL(10 * time.Second)},
		{"adaptive", dlock.WithAdaptiveTTL(100*time.Millisecond, 10*time.Second)},
	} {
		b.Run(k.name, func(b *testing.B) {
			c, err := dlock.Dial(ctx, s.URL(), k.opt)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			for i := range b.N {
				if _, err := s.Do(ctx, "FLUSHALL"); err != nil {
					b.Fatal(err)
				}
				before := usedMemory(b, s)
				parallel(b, holdRecordBurst, func(n int) error {
					l, err := c.Mutex("order:" + strconv.Itoa(i) + ":" + strconv.Itoa(n)).Lock(ctx)
					if err == nil {
						err = l.Unlock(ctx)
					}
					return err
				})
				b.ReportMetric(float64(usedMemory(b, s)-before)/holdRecordBurst, "bytes-per-name")
			}
		})
	}
}
