package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// Row "waiters exhausting connections" and "no polling": a waiter is woken by the release,
// long before the holder's lease would run out, and sends no commands while it waits.
func TestWaiting_WakesOnReleaseWithoutPolling(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		holder := tr.dial(t, shared.URL(), dlock.WithTTL(30*time.Second))
		waiter := tr.dial(t, shared.URL())
		l, err := holder.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan *dlock.Lease, 1)
		go func() {
			lw, err := waiter.Mutex(name).Lock(ctx)
			if err != nil {
				t.Error(err)
			}
			got <- lw
		}()
		waitSubscribed(t, name)
		before := evalCalls(t)
		time.Sleep(300 * time.Millisecond) // the waiter is idle here; count what it sends
		idle := evalCalls(t) - before
		released := time.Now()
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		lw := <-got
		if lw == nil {
			t.FailNow()
		}
		wake := time.Since(released)
		lw.Unlock(ctx)
		if idle > 1 {
			t.Errorf("the waiter sent %d scripts in 300ms of waiting, want at most 1 (no polling)", idle)
		}
		if wake > time.Second {
			t.Errorf("waiter woke %v after the release, want well under a second (lease was 30s)", wake)
		}
	})
}

// waitSubscribed waits until some client subscribes to the lock's release channel.
func waitSubscribed(t *testing.T, name string) {
	t.Helper()
	waitFor(t, 10*time.Second, "a subscription to the release channel", func(context.Context) error {
		if out := redisDo(t, shared, "PUBSUB", "NUMSUB", keyOf(name)+":rel"); !strings.HasSuffix(out, "\n1") {
			return fmt.Errorf("PUBSUB NUMSUB: %q", out)
		}
		return nil
	})
}

// evalCalls counts scripts run on the shared server so far.
func evalCalls(t *testing.T) int { return scriptCalls(t, shared) }

// Row "waiters exhausting connections": many waiters cost no connection each.
func TestWaiting_HoldsNoConnection(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		holder := tr.dial(t, shared.URL())
		waiter := tr.dial(t, shared.URL())
		l, err := holder.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Warm the waiter's connections with one waiter, then count the server's clients.
		wctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		results := make(chan error, 200)
		start := func(n int) {
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					lw, err := waiter.Mutex(name).Lock(wctx)
					if err == nil {
						lw.Unlock(ctx)
					}
					results <- err
				}()
			}
		}
		start(1)
		waitSubscribed(t, name)
		base := connectedClients(t)
		start(199)
		time.Sleep(200 * time.Millisecond)
		if n := connectedClients(t); n > base {
			t.Errorf("connections grew from %d to %d with 199 more waiters", base, n)
		}
		cancel()
		wg.Wait()
		close(results)
		for err := range results {
			if !errors.Is(err, context.Canceled) {
				t.Errorf("waiter: got %v, want context.Canceled", err)
			}
		}
		l.Unlock(ctx)
	})
}

func connectedClients(t *testing.T) int {
	for _, line := range strings.Split(redisDo(t, shared, "INFO", "clients"), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_clients:"); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	t.Fatal("no connected_clients in INFO")
	return 0
}

// TestHandover_TokensAndExclusion: an Unlock with a waiter of the same client passes the lock
// straight to it (handover.lua). Every hold still gets a new, larger token and holds never
// overlap.
func TestHandover_TokensAndExclusion(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		c := tr.dial(t, shared.URL())
		name := uniqueName(t)
		ctx := ctxT(t)
		var (
			mu     sync.Mutex
			tokens []uint64
			inside int
			bad    int
		)
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 40 {
					l, err := c.Mutex(name).Lock(ctx)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					inside++
					if inside != 1 {
						bad++
					}
					tokens = append(tokens, l.Token())
					inside--
					mu.Unlock()
					if err := l.Unlock(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if bad != 0 {
			t.Fatalf("%d overlapping holds", bad)
		}
		if len(tokens) != 320 {
			t.Fatalf("%d holds, want 320", len(tokens))
		}
		for i := 1; i < len(tokens); i++ {
			if tokens[i] <= tokens[i-1] {
				t.Fatalf("hold %d got token %d after %d", i, tokens[i], tokens[i-1])
			}
		}
		if v := redisDo(t, shared, "GET", keyOf(name)); heldValue(v) {
			t.Fatalf("lock not released at the end: %q", v)
		}
	})
}

// TestHandover_OtherClientNotStarved: a client whose goroutines always wait for a lock may pass
// it among them only a few times in a row while another client waits; that client gets it.
func TestHandover_OtherClientNotStarved(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		a := tr.dial(t, shared.URL())
		b := tr.dial(t, shared.URL())
		name := uniqueName(t)
		ctx := ctxT(t)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var aHolds sync.Map
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n := 0
				for {
					select {
					case <-stop:
						aHolds.Store(g, n)
						return
					default:
					}
					l, err := a.Mutex(name).Lock(ctx)
					if err != nil {
						t.Error(err)
						return
					}
					n++
					l.Unlock(ctx)
				}
			}()
		}
		// Let a's goroutines hand the lock among themselves, then ask from b.
		waitFor(t, 5*time.Second, "a's goroutines take turns", func(context.Context) error {
			if v := redisDo(t, shared, "GET", keyOf(name)); !heldValue(v) {
				return fmt.Errorf("value %q", v)
			}
			return nil
		})
		start := time.Now()
		bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		l, err := b.Mutex(name).Lock(bctx)
		cancel()
		took := time.Since(start)
		if err == nil {
			l.Unlock(ctx)
		}
		close(stop)
		wg.Wait()
		if err != nil {
			t.Fatalf("client b starved while client a's goroutines passed the lock around: %v", err)
		}
		t.Logf("client b got the lock after %v", took)
	})
}

// TestHandover_WaitersGivingUp: waiters whose contexts end at random moments, some while the
// lock is being handed to them, never leave the lock held by nobody.
func TestHandover_WaitersGivingUp(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		c := tr.dial(t, shared.URL(), dlock.WithTTL(30*time.Second))
		name := uniqueName(t)
		ctx := ctxT(t)
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(g), 7))
				for range 30 {
					wctx, cancel := context.WithTimeout(ctx, time.Duration(r.IntN(2000))*time.Microsecond)
					l, err := c.Mutex(name).Lock(wctx)
					cancel()
					if err == nil {
						if err := l.Unlock(ctx); err != nil {
							t.Errorf("Unlock: %v", err)
						}
					}
				}
			}()
		}
		wg.Wait()
		// With a 30 s lease, a lock left held by nobody would block this for 30 s.
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		l, err := c.Mutex(name).Lock(lctx)
		if err != nil {
			t.Fatalf("lock still held after every waiter left: %v (value %q)", err, redisDo(t, shared, "GET", keyOf(name)))
		}
		l.Unlock(ctx)
	})
}
