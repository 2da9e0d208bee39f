package dlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
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

// waitFor polls check with redistest.Poll until it returns nil, failing the test after within.
func waitFor(t *testing.T, within time.Duration, what string, check func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := redistest.Poll(ctx, what, check); err != nil {
		t.Fatal(err)
	}
}

// haveQueued is a check for waitFor: n callers of e wait in key's queue.
func haveQueued(e *engine, key string, n int) func(context.Context) error {
	return func(context.Context) error {
		if got := queueLen(e, key); got != n {
			return fmt.Errorf("%d queued", got)
		}
		return nil
	}
}

// isLive is a check for waitFor: the server confirmed (live) or dropped (!live) e's
// subscription to channel.
func isLive(e *engine, channel string, live bool) func(context.Context) error {
	return func(context.Context) error {
		if got := e.notices.isLive(channel); got != live {
			return fmt.Errorf("live = %v", got)
		}
		return nil
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
		waitFor(t, 10*time.Second, fmt.Sprintf("waiter %d to queue", i), haveQueued(c.e, m.spec.key, i+1)) // before starting i+1
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
	waitFor(t, 10*time.Second, "the waiter's subscription to be confirmed", isLive(c.e, m.spec.channel, true))
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
	waitFor(t, 10*time.Second, "the channel to stop being live after its last queue left", isLive(c.e, m.spec.channel, false))
}

// A release that no other client heard lets this client's next waiter try at once; one that
// another client's waiter heard makes it hold back (fairnessYield). Quorum mode, where every
// handoff among one client's waiters goes through the servers.
func TestRelease_AloneSkipsHoldBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		urls    []string
		servers []*redistest.Server
	)
	for range 3 {
		s := redistest.Start(t)
		servers = append(servers, s)
		urls = append(urls, s.URL())
	}
	// subscribed waits until every server counts n subscribers on the lock's release channel.
	subscribed := func(channel string, n int) {
		t.Helper()
		waitFor(t, 10*time.Second, strconv.Itoa(n)+" subscribers on "+channel+" on every server", func(ctx context.Context) error {
			for _, s := range servers {
				out, err := s.Do(ctx, "PUBSUB", "NUMSUB", channel)
				if err == nil && !strings.HasSuffix(out, "\n"+strconv.Itoa(n)) {
					err = fmt.Errorf("%s: PUBSUB NUMSUB: %q", s.Addr, out)
				}
				if err != nil {
					return err
				}
			}
			return nil
		})
	}
	dialQ := func() *Client {
		c, err := DialQuorum(ctx, urls)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c, other := dialQ(), dialQ()
	m := c.Mutex("alone")
	first, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Lease, 2)
	for range 2 { // the head, then one queued behind it: the queue outlives the first handoff
		go func() {
			l, err := m.Lock(ctx)
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
	}
	subscribed(m.spec.channel, 1)
	waitFor(t, 10*time.Second, "the waiters' subscription to be confirmed", isLive(c.e, m.spec.channel, true))
	// Both waiters must be queued before the first handoff, or the queue would end with it.
	waitFor(t, 10*time.Second, "the two waiters to queue", haveQueued(c.e, m.spec.key, 2))
	sh := c.e.waits.shard(m.spec.key)
	sh.mu.Lock()
	q := sh.m[m.spec.key]
	sh.mu.Unlock()
	q.lastEnd.Store(mono()) // as if this client had just released it after another client's hold
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if last := q.lastEnd.Load(); last != 0 {
		t.Fatalf("after a release no other client heard, lastEnd = %d, want 0 (no holding back)", last)
	}
	second := <-got

	// Now another client waits too: the next release is heard by it, so this client's head holds back.
	otherDone := make(chan error, 1)
	go func() {
		l, err := other.Mutex("alone").Lock(ctx)
		if err == nil {
			err = l.Unlock(ctx)
		}
		otherDone <- err
	}()
	subscribed(m.spec.channel, 2)
	if err := second.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if q.lastEnd.Load() == 0 {
		t.Fatal("after a release another client heard, lastEnd = 0: the head would not hold back")
	}
	third := <-got
	if err := third.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-otherDone; err != nil {
		t.Fatal(err)
	}
}
