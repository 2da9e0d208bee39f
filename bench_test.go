package dlock_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/dlock-go/dlock"
)

// The benchmarks share the test binary's private redis-server (TestMain). Run them with
// `make bench`; docs/BENCHMARKS.md records the figures and the ratios between them.

const benchParallelism = 64 // goroutines = benchParallelism × GOMAXPROCS / GOMAXPROCS: see setParallel

// setParallel makes RunParallel use 64 goroutines in all, whatever GOMAXPROCS is.
func setParallel(b *testing.B) {
	p := benchParallelism / testingProcs()
	if p < 1 {
		p = 1
	}
	b.SetParallelism(p)
}

var benchSeq atomic.Int64

// BenchmarkUncontended: Lock+Unlock pairs on distinct names from 64 goroutines, dlock through
// each adapter beside the raw floors (SET NX PX + DEL, no safety at all) of the same clients.
func BenchmarkUncontended(b *testing.B) {
	ctx := context.Background()
	b.Run("dlock-rueidis", func(b *testing.B) {
		c := transports[0].dial(b, shared.URL())
		benchDlock(b, ctx, c)
	})
	b.Run("dlock-goredis", func(b *testing.B) {
		c := transports[1].dial(b, shared.URL())
		benchDlock(b, ctx, c)
	})
	b.Run("raw-rueidis", func(b *testing.B) {
		rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{shared.Addr}, DisableCache: true})
		if err != nil {
			b.Fatal(err)
		}
		defer rc.Close()
		setParallel(b)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			key := "raw:" + strconv.FormatInt(benchSeq.Add(1), 10)
			for pb.Next() {
				if err := rc.Do(ctx, rc.B().Set().Key(key).Value("owner").Nx().PxMilliseconds(10000).Build()).Error(); err != nil {
					b.Error(err)
					return
				}
				if err := rc.Do(ctx, rc.B().Del().Key(key).Build()).Error(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("raw-goredis", func(b *testing.B) {
		rc := redis.NewClient(&redis.Options{Addr: shared.Addr, PoolSize: benchParallelism})
		defer rc.Close()
		setParallel(b)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			key := "raw:" + strconv.FormatInt(benchSeq.Add(1), 10)
			for pb.Next() {
				if err := rc.SetNX(ctx, key, "owner", 10*time.Second).Err(); err != nil {
					b.Error(err)
					return
				}
				if err := rc.Del(ctx, key).Err(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

func benchDlock(b *testing.B, ctx context.Context, c *dlock.Client) {
	setParallel(b)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		m := c.Mutex("bench:" + strconv.FormatInt(benchSeq.Add(1), 10))
		for pb.Next() {
			l, err := m.Lock(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			if err := l.Unlock(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func testingProcs() int {
	return max(1, runtimeGOMAXPROCS())
}

var _ = fmt.Sprint
