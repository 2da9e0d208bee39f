package dlock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
)

func queueLen(e *engine, key string) int {
	s := e.waits.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.m[key]; q != nil {
		return len(q.waiters)
	}
	return 0
}

// waitUntil polls cond every millisecond until it holds, failing the test after 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// privateServer starts a redis-server for one test and returns it, a context that ends with
// the test (30 s at most) and a dial function whose clients close when the test ends.
func privateServer(t *testing.T) (*redistest.Server, context.Context, func(...Option) *Client) {
	t.Helper()
	s := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	dial := func(opts ...Option) *Client {
		t.Helper()
		c, err := Dial(ctx, s.URL(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	return s, ctx, dial
}

// Waiters of one client are served first-in first-out.
func TestLocalQueue_FIFO(t *testing.T) {
	_, ctx, dial := privateServer(t)
	c := dial()
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
		for queueLen(c.e, m.spec.key) != i+1 { // wait until waiter i is queued before starting i+1
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
	if queueLen(c.e, m.spec.key) != 0 {
		t.Fatal("queue not removed after the last waiter left")
	}
	c.e.notices.mu.Lock()
	subs := len(c.e.notices.subs)
	c.e.notices.mu.Unlock()
	if subs != 0 {
		t.Fatalf("%d release channels still routed after every waiter left", subs)
	}
}

// A queue registered on a channel whose subscription is still live (its previous queue just
// left and the unsubscribe was not sent yet) gets no confirmation of its own: add must wake its
// head, which made its attempt before registering and could otherwise sleep through a release
// in between until the holder's lease ran out.
func TestNotifier_AddOnLiveChannelWakes(t *testing.T) {
	_, ctx, dial := privateServer(t)
	c := dial()
	other := dial()
	m := c.Mutex("live")
	held, err := other.Mutex("live").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, stopWaiter := context.WithCancel(ctx)
	waiter := make(chan error, 1)
	go func() {
		_, err := m.Lock(wctx)
		waiter <- err
	}()
	live := func() bool {
		c.e.notices.mu.Lock()
		defer c.e.notices.mu.Unlock()
		return c.e.notices.live[m.spec.channel]
	}
	waitUntil(t, "the waiter's subscription to be confirmed", live)
	q2 := &queue{key: m.spec.key, channel: m.spec.channel, wake: make(chan struct{}, 1)}
	c.e.notices.add(m.spec.channel, q2)
	select {
	case <-q2.wake:
	default:
		t.Fatal("a queue registered on a live channel was not woken")
	}
	c.e.notices.remove(m.spec.channel, q2)
	stopWaiter()
	if err := <-waiter; !errors.Is(err, context.Canceled) {
		t.Fatalf("waiter: %v, want context.Canceled", err)
	}
	held.Unlock(ctx)

	// Once the unsubscribe is decided the channel is no longer live: a new queue then waits
	// for the confirmation of its own subscription.
	waitUntil(t, "the channel to stop being live after its last queue left", func() bool { return !live() })
}
