package dlock_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/dlock-go/dlock"
)

// BenchmarkDataModel: what each data model costs the server for one uncontended hold, the
// figure behind docs/PROTOCOL.md's "One data model?". A Mutex keeps a plain string value; a
// read-write lock and a semaphore keep a hash of holders (shared.lua). A writer of a
// RWMutex is an exclusive hold in the hash model: Mutex against RWMutex-writer is what
// serving every kind from the hash would cost the Mutex. Each sub-benchmark takes and releases
// a hold of its kind on its own names (one goroutine, the rueidis transport) and reports the
// scripts' time inside the server per pair (INFO commandstats: EVALSHA's usec over its calls,
// the scripts' own commands included) and the server commands per pair.
//
//	go test -run XXX -bench BenchmarkDataModel -count 5 .
func BenchmarkDataModel(b *testing.B) {
	needShared(b)
	ctx := context.Background()
	c := transports[0].dial(b, shared.URL())
	kinds := []struct {
		name string
		pair func(name string) func() error
	}{
		{"mutex", func(name string) func() error {
			m := c.Mutex(name)
			return func() error { return lockUnlock(ctx, m.Lock) }
		}},
		{"rwmutex-writer", func(name string) func() error {
			m := c.RWMutex(name)
			return func() error { return lockUnlock(ctx, m.Lock) }
		}},
		{"rwmutex-reader", func(name string) func() error {
			m := c.RWMutex(name)
			return func() error { return lockUnlock(ctx, m.RLock) }
		}},
		{"semaphore-1-of-3", func(name string) func() error {
			s := c.Semaphore(name, 3)
			return func() error {
				return lockUnlock(ctx, func(ctx context.Context) (*dlock.Lease, error) { return s.Acquire(ctx, 1) })
			}
		}},
	}
	for _, k := range kinds {
		b.Run(k.name, func(b *testing.B) {
			pairs := make([]func() error, 8)
			for i := range pairs {
				pairs[i] = k.pair("model:" + k.name + ":" + strconv.FormatInt(benchSeq.Add(1), 10))
				if err := pairs[i](); err != nil { // scripts loaded, each name released once
					b.Fatal(err)
				}
			}
			before := commandStats(b, shared)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := pairs[i%len(pairs)](); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			after := commandStats(b, shared)
			ev := after["evalsha"].sub(before["evalsha"])
			var inner int64
			for cmd, st := range after {
				if cmd != "evalsha" && cmd != "info" {
					inner += st.sub(before[cmd]).calls
				}
			}
			b.ReportMetric(float64(ev.usec)/float64(b.N), "script-µs/pair")
			b.ReportMetric(float64(inner)/float64(b.N), "commands/pair")
		})
	}
}

func lockUnlock(ctx context.Context, lock func(context.Context) (*dlock.Lease, error)) error {
	l, err := lock(ctx)
	if err != nil {
		return err
	}
	return l.Unlock(ctx)
}

// BenchmarkHandoff_ServerWork: the server's work per hold when clients take turns on one name,
// each handoff a grant from the server: 10 clients (each its own Client, as 10 processes
// would have, in this one process) × 1 goroutine lock and unlock one name for b.N holds in all.
// It reports the scripts' time inside the server and the commands they ran per hold (INFO
// commandstats, as BenchmarkDataModel), and the messages published per hold.
//
//	go test -run XXX -bench BenchmarkHandoff_ServerWork -count 5 .
func BenchmarkHandoff_ServerWork(b *testing.B) {
	needShared(b)
	ctx := context.Background()
	name := "handoff:" + strconv.FormatInt(benchSeq.Add(1), 10)
	const clients = 10
	ms := make([]*dlock.Mutex, clients)
	for i := range ms {
		ms[i] = transports[0].dial(b, shared.URL()).Mutex(name)
		if err := lockUnlock(ctx, ms[i].Lock); err != nil { // scripts loaded, subscriptions made
			b.Fatal(err)
		}
	}
	var left atomic.Int64
	left.Store(int64(b.N))
	before := commandStats(b, shared)
	b.ResetTimer()
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if err := lockUnlock(ctx, m.Lock); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	after := commandStats(b, shared)
	var inner int64
	for cmd, st := range after {
		if cmd != "evalsha" && cmd != "info" && cmd != "ping" {
			inner += st.sub(before[cmd]).calls
		}
	}
	b.ReportMetric(float64(after["evalsha"].sub(before["evalsha"]).usec)/float64(b.N), "script-µs/hold")
	b.ReportMetric(float64(inner)/float64(b.N), "commands/hold")
	b.ReportMetric(float64(after["publish"].sub(before["publish"]).calls)/float64(b.N), "messages/hold")
}
