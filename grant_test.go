package dlock_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// queuedClients is how many clients the lock's queue on the server holds.
func queuedClients(t *testing.T, name string) int {
	t.Helper()
	v, err := shared.Do(context.Background(), "ZCARD", keyOf(name)+":q")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitQueued polls until the lock's queue on the server holds n clients.
func waitQueued(t *testing.T, name string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := redistest.Poll(ctx, "clients to queue", func(context.Context) error {
		if got := queuedClients(t, name); got != n {
			return fmt.Errorf("%d queued, want %d", got, n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// lockInBackground takes name with c in a goroutine and reports the lease on the channel. A
// Lock still waiting when the test ends gives up quietly.
func lockInBackground(t *testing.T, c *dlock.Client, name string, opts ...dlock.Option) <-chan *dlock.Lease {
	ctx, cancel := context.WithCancel(ctxT(t))
	t.Cleanup(cancel)
	got := make(chan *dlock.Lease, 1)
	go func() {
		l, err := c.Mutex(name, opts...).Lock(ctx)
		if err != nil {
			if ctx.Err() == nil {
				t.Error(err)
			}
			close(got)
			return
		}
		got <- l
	}()
	return got
}

// Clients waiting for a lock are served in the order they queued: a release grants the lock
// to the first, with a larger token, and the queue on the server shrinks by one.
func TestGrant_QueueOrder(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		a, b, c := tr.dial(t, shared.URL()), tr.dial(t, shared.URL()), tr.dial(t, shared.URL())
		la, err := a.Mutex(name, dlock.WithTTL(20*time.Second)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		gotB := lockInBackground(t, b, name)
		waitQueued(t, name, 1)
		gotC := lockInBackground(t, c, name)
		waitQueued(t, name, 2)
		if err := la.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		var lb *dlock.Lease
		select {
		case lb = <-gotB:
		case lc := <-gotC:
			t.Fatalf("the client that queued second got the lock first (token %d)", lc.Token())
		case <-time.After(10 * time.Second):
			t.Fatal("nobody got the lock 10 s after its release")
		}
		if lb == nil || lb.Token() <= la.Token() {
			t.Fatalf("granted lease %v, token not above the previous holder's %d", lb, la.Token())
		}
		if n := queuedClients(t, name); n != 1 {
			t.Fatalf("%d clients queued after the grant, want 1", n)
		}
		if err := lb.Context().Err(); err != nil {
			t.Fatalf("granted lease already ended: %v", context.Cause(lb.Context()))
		}
		if err := lb.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		lc := <-gotC
		if lc == nil || lc.Token() <= lb.Token() {
			t.Fatalf("second grant %v, token not above %d", lc, lb.Token())
		}
		if err := lc.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// A granted lease is renewed to its TTL at once: it lives past the acceptance window.
func TestGrant_LeaseOutlivesTheWindow(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		a, b := tr.dial(t, shared.URL()), tr.dial(t, shared.URL())
		la, err := a.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		gotB := lockInBackground(t, b, name, dlock.WithTTL(3*time.Second))
		waitQueued(t, name, 1)
		la.Unlock(ctx)
		lb := <-gotB
		if lb == nil {
			t.FailNow()
		}
		ttl, err := lb.TTL(ctx)
		for i := 0; err == nil && ttl <= time.Second && i < 100; i++ { // renewed to 3 s right after the grant
			time.Sleep(10 * time.Millisecond)
			ttl, err = lb.TTL(ctx)
		}
		if err != nil || ttl <= time.Second {
			t.Fatalf("granted lease TTL %v, %v: want it renewed past the 1 s window", ttl, err)
		}
		if err := lb.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// A queued client whose connection hangs when the lock is granted to it cannot take it: the
// grant lapses after the acceptance window and the next queued client gets the lock, long
// before the previous holder's lease would have run out. When the hung client comes back, its
// lease (if the announcement reaches it) is already lost: never two holders.
func TestGrant_HungGranteeLosesIt(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		proxy := redistest.NewProxy(t, shared.Addr)
		holder := tr.dial(t, shared.URL())
		hung := tr.dial(t, strings.Replace(proxy.URL(), "://", "://"+testUser+":"+testPassword+"@", 1))
		next := tr.dial(t, shared.URL())
		l, err := holder.Mutex(name, dlock.WithTTL(30*time.Second)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		gotHung := lockInBackground(t, hung, name)
		waitQueued(t, name, 1)
		gotNext := lockInBackground(t, next, name)
		waitQueued(t, name, 2)
		proxy.Block()
		released := time.Now()
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		var ln *dlock.Lease
		select {
		case ln = <-gotNext:
		case <-time.After(8 * time.Second):
			t.Fatal("the next client did not get the lock within 8 s of the release (the holder's lease was 30 s)")
		}
		took := time.Since(released)
		t.Logf("the next client got the lock %v after the release granted it to the hung one", took)
		if took < 500*time.Millisecond {
			t.Fatalf("the next client got the lock after %v: the hung client's grant cannot have lapsed yet", took)
		}
		proxy.Unblock()
		select {
		case lh := <-gotHung:
			if lh != nil && lh.Context().Err() == nil && ln.Context().Err() == nil {
				t.Fatalf("two holders: the hung client (token %d) and the next (token %d)", lh.Token(), ln.Token())
			}
			if lh != nil {
				lh.Unlock(ctx)
			}
		default:
		}
		ln.Unlock(ctx)
	})
}

// A queued client killed while waiting (SIGKILL) delays the others by at most its acceptance
// window: a grant made to it lapses, or its entry expires first.
func TestGrant_KilledWaiterDelaysOthersAtMostItsWindow(t *testing.T) {
	ctx := ctxT(t)
	name := uniqueName(t)
	holder := transports[0].dial(t, shared.URL())
	next := transports[0].dial(t, shared.URL())
	l, err := holder.Mutex(name, dlock.WithTTL(30*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := spawnHelper(t, "hold", shared.URL(), name, 10*time.Second) // its window: 1 s
	waitQueued(t, name, 1)
	got := lockInBackground(t, next, name)
	waitQueued(t, name, 2)
	h.signal(t, syscall.SIGKILL)
	h.cmd.Wait()
	released := time.Now()
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case ln := <-got:
		took := time.Since(released)
		t.Logf("the next client got the lock %v after the release (the killed waiter's window is 1 s)", took)
		if ln != nil {
			ln.Unlock(ctx)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the next client did not get the lock within 5 s of the release (the killed waiter's window is 1 s, the holder's lease 30 s)")
	}
}

// Ten clients of one goroutine each on one lock are served in turn: after 300 holds, every
// client had close to its share (FIFO, not a race won by whoever is nearest).
func TestGrant_ClientsTakeTurns(t *testing.T) {
	const clients, total = 10, 300
	name := uniqueName(t)
	ctx := ctxT(t)
	var mu sync.Mutex
	holds := make([]int, clients)
	done := 0
	var wg sync.WaitGroup
	for i := range clients {
		c := transports[i%2].dial(t, shared.URL())
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := c.Mutex(name)
			for {
				l, err := m.Lock(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				stop := done >= total
				if !stop {
					done++
					holds[i]++
				}
				mu.Unlock()
				if err := l.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
				if stop {
					return
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("holds per client: %v", holds)
	for i, n := range holds {
		if n < total/clients/2 {
			t.Errorf("client %d held the lock %d times of %d, below half its share", i, n, total)
		}
	}
}
