package dlock

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
)

func queueLen(c *Client, key string) int {
	s := c.queues.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.m[key]; q != nil {
		return len(q.waiters)
	}
	return 0
}

// Waiters of one client are served first-in first-out.
func TestLocalQueue_FIFO(t *testing.T) {
	s := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := c.Mutex("fifo")
	holder, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := m.Lock(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			l.Unlock(ctx)
		}()
		for queueLen(c, m.key) != i+1 { // wait until waiter i is queued before starting i+1
			time.Sleep(time.Millisecond)
		}
	}
	holder.Unlock(ctx)
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("acquisition order %v, want 0..%d in order", order, n-1)
		}
	}
	if queueLen(c, m.key) != 0 {
		t.Fatal("queue not removed after the last waiter left")
	}
	c.notifier.mu.Lock()
	subs := len(c.notifier.subs)
	c.notifier.mu.Unlock()
	if subs != 0 {
		t.Fatalf("%d release channels still routed after every waiter left", subs)
	}
}
