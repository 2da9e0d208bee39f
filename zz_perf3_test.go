package dlock_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

func TestZZPerf3(t *testing.T) {
	needShared(t)
	ctx := context.Background()
	c := transports[0].dial(t, shared.URL())
	name := uniqueName(t)
	run := func(what string, f func(g int) func() error) {
		var n atomic.Int64
		var wg sync.WaitGroup
		end := time.Now().Add(time.Second)
		for g := range 64 {
			fn := f(g)
			wg.Go(func() {
				for time.Now().Before(end) {
					if err := fn(); err != nil {
						t.Error(err)
						return
					}
					n.Add(1)
				}
			})
		}
		wg.Wait()
		t.Logf("%-8s %d pairs/s", what, n.Load())
	}
	for range 2 {
		run("mutexes", func(g int) func() error {
			m := c.Mutex(fmt.Sprintf("%s:%d", name, g))
			return func() error {
				l, err := m.Lock(ctx)
				if err != nil {
					return err
				}
				return l.Unlock(ctx)
			}
		})
		s := c.Semaphore(name, 64)
		run("sem", func(g int) func() error {
			return func() error {
				l, err := s.Acquire(ctx, 1)
				if err != nil {
					return err
				}
				return l.Unlock(ctx)
			}
		})
		info, _ := c.Inspect(ctx, name)
		t.Logf("after: %+v %+v", info, info.Shared)
	}
	_ = dlock.ErrLost
}
