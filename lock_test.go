package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/goredisconn"
	"github.com/dlock-go/dlock/internal/redistest"
)

// Row "mutual exclusion across processes": one holder per name, whichever client asks.
func TestMutualExclusion(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		clients := []*dlock.Client{
			tr.dial(t, shared.URL()), tr.dial(t, shared.URL()), tr.dial(t, shared.URL()),
		}
		var (
			inside  int // touched only under the lock; the race detector checks the rest
			counter int
			wg      sync.WaitGroup
		)
		for _, c := range clients {
			for g := 0; g < 8; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 25; i++ {
						err := c.Do(ctx, name, func(context.Context) error {
							inside++
							if inside != 1 {
								t.Errorf("%d holders inside the critical section", inside)
							}
							counter++
							inside--
							return nil
						})
						if err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
		}
		wg.Wait()
		if want := 3 * 8 * 25; counter != want {
			t.Fatalf("counter = %d, want %d", counter, want)
		}
	})
}

// Row "crash → deadlock": a holder killed while holding frees the lock within its lease.
func TestCrashedHolder_LockFreesWithinTTL(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		const ttl = 500 * time.Millisecond
		name := uniqueName(t)
		h, token := startHelper(t, "hold", shared.URL(), name, ttl)
		c := tr.dial(t, shared.URL())
		if _, err := c.Mutex(name).TryLock(ctxT(t)); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("TryLock while the helper holds: got %v, want ErrNotAcquired", err)
		}
		h.signal(t, syscall.SIGKILL)
		killed := time.Now()
		l, err := c.Mutex(name).Lock(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(context.Background())
		waited := time.Since(killed)
		t.Logf("next holder acquired %v after SIGKILL of the holder (ttl %v)", waited, ttl)
		if waited > ttl+250*time.Millisecond {
			t.Errorf("next holder got the lock %v after the crash, want <= ttl + 250ms = %v", waited, ttl+250*time.Millisecond)
		}
		if l.Token() <= token {
			t.Errorf("token %d after crash, want > the crashed holder's %d", l.Token(), token)
		}
	})
}

// Row "SETNX+EXPIRE not atomic": the lock key never exists without an expiry.
func TestAcquire_KeyHasExpiryFromTheStart(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		c := tr.dial(t, shared.URL(), dlock.WithTTL(3*time.Second))
		name := uniqueName(t)
		l, err := c.Mutex(name).Lock(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(context.Background())
		pttl, _ := strconv.Atoi(redisDo(t, shared, "PTTL", keyOf(name)))
		if pttl <= 0 || pttl > 3000 {
			t.Fatalf("PTTL right after acquire = %d, want in (0, 3000]", pttl)
		}
	})
}

// Row "releasing someone else's lock": an expired holder's Unlock cannot free the next
// holder's lock, and neither can any other owner.
func TestForeignRelease_Impossible(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		a := tr.dial(t, shared.URL())
		b := tr.dial(t, shared.URL())
		la, err := a.Mutex(name, dlock.WithTTL(100*time.Millisecond), dlock.WithoutRenewal()).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		<-la.Context().Done() // the fixed lease runs out
		lb, err := b.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer lb.Unlock(context.Background())
		err = la.Unlock(ctx)
		if !errors.Is(err, dlock.ErrLost) || !errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("stale Unlock: got %v, want ErrLost and ErrNotHeld", err)
		}
		if err := la.Extend(ctx, time.Second); !errors.Is(err, dlock.ErrLost) {
			t.Fatalf("stale Extend: got %v, want ErrLost", err)
		}
		if _, err := a.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("after the stale Unlock the lock must still be b's: TryLock got %v", err)
		}
		if lb.Context().Err() != nil {
			t.Fatalf("b's lease ended: %v", context.Cause(lb.Context()))
		}
	})
}

// Row "lease shorter than the work": renewal keeps a 200 ms lease held through 2 s of work.
func TestRenewal_KeepsShortLeaseThroughLongWork(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL(), dlock.WithTTL(200*time.Millisecond))
		other := tr.dial(t, shared.URL())
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); <-tick.C {
			if err := l.Context().Err(); err != nil {
				t.Fatalf("lease ended during the work: %v", context.Cause(l.Context()))
			}
			if _, err := other.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
				t.Fatalf("another client's TryLock during the work: got %v, want ErrNotAcquired", err)
			}
		}
		if d, err := l.TTL(ctx); err != nil || d <= 0 || d > 200*time.Millisecond {
			t.Fatalf("TTL after 2s = %v, %v; want in (0, 200ms]", d, err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(context.Cause(l.Context()), context.Canceled) {
			t.Fatalf("cause after Unlock = %v, want context.Canceled", context.Cause(l.Context()))
		}
	})
}

// Row "holder paused past its lease": a SIGSTOPped holder learns of the loss the moment it
// runs again, before it can do one more protected step, and the next holder's token is larger.
func TestPausedHolder_LearnsLossBeforeSecondHolder(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		const ttl = 300 * time.Millisecond
		ctx := ctxT(t)
		name := uniqueName(t)
		h, token := startHelper(t, "work", shared.URL(), name, ttl)
		c := tr.dial(t, shared.URL())
		waitForWrites(t, name, 3)
		h.signal(t, syscall.SIGSTOP)
		l, err := c.Mutex(name).Lock(ctx) // waits out the paused holder's lease
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(context.Background())
		if l.Token() <= token {
			t.Fatalf("second holder's token %d, want > paused holder's %d", l.Token(), token)
		}
		marker := "second-holder:" + strconv.FormatUint(l.Token(), 10)
		redisDo(t, shared, "RPUSH", name+":writes", marker)
		h.signal(t, syscall.SIGCONT)
		if line := h.next(t, 10*time.Second); line != "lost "+dlock.ErrLost.Error() {
			t.Fatalf("resumed holder said %q, want %q", line, "lost "+dlock.ErrLost.Error())
		}
		// A write whose context check came just before the SIGSTOP is sent after the resume:
		// that one write is the case fencing exists for. Every check after the resume must
		// report the loss, so there is never a second.
		writes := strings.Split(redisDo(t, shared, "LRANGE", name+":writes", "0", "-1"), "\n")
		for i, w := range writes {
			if w == marker && len(writes)-1-i > 1 {
				t.Fatalf("paused holder wrote %v after the second holder acquired", writes[i+1:])
			}
		}
	})
}

func waitForWrites(t *testing.T, name string, n int) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("the helper to write %d times", n), func(context.Context) error {
		if got, _ := strconv.Atoi(redisDo(t, shared, "LLEN", name+":writes")); got < n {
			return fmt.Errorf("%d writes", got)
		}
		return nil
	})
}

// Row "waiters exhausting connections" and "no polling": a waiter is woken by the release,
// long before the holder's lease would run out, and sends no commands while it waits.
func TestWaiting_WakesOnReleaseWithoutPolling(t *testing.T) {
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

// Row "reentrancy (lockCount)": the same owner re-enters; released at the last Unlock.
func TestReentrancy(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL())
		other := tr.dial(t, shared.URL())
		m := c.Mutex(name)
		outer, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		inner, err := m.Lock(outer.Context())
		if err != nil {
			t.Fatal(err)
		}
		if inner.Token() != outer.Token() {
			t.Fatalf("re-entry token %d, want %d", inner.Token(), outer.Token())
		}
		if v := lockValue(t, name); v[2] != "2" {
			t.Fatalf("hold count in Redis = %q, want 2", v[2])
		}
		if tok, ok := dlock.TokenFromContext(inner.Context()); !ok || tok != outer.Token() {
			t.Fatalf("TokenFromContext = %d, %v; want %d", tok, ok, outer.Token())
		}
		if _, ok := dlock.TokenFromContext(ctx); ok {
			t.Fatal("TokenFromContext found a token in a context without a lease")
		}
		var depth int
		err = c.Do(inner.Context(), name, func(ctx context.Context) error {
			if tok, ok := dlock.TokenFromContext(ctx); !ok || tok != outer.Token() {
				t.Errorf("TokenFromContext inside Do = %d, %v; want %d", tok, ok, outer.Token())
			}
			return c.Do(ctx, name, func(ctx context.Context) error {
				l, err := m.TryLock(ctx)
				if err != nil {
					return err
				}
				depth = 5
				return l.Unlock(ctx)
			})
		})
		if err != nil || depth != 5 {
			t.Fatalf("nested Do: %v (depth %d)", err, depth)
		}
		// Another goroutine of the same client without the lease in its context must wait.
		if _, err := m.TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("TryLock without the lease in ctx: got %v, want ErrNotAcquired", err)
		}
		if err := inner.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := inner.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("second Unlock of a hold: got %v, want ErrNotHeld", err)
		}
		if outer.Context().Err() != nil {
			t.Fatal("outer lease ended when an inner hold was unlocked")
		}
		if _, err := other.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("lock free while the outer hold remains: %v", err)
		}
		if err := outer.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		l, err := other.Mutex(name).TryLock(ctx)
		if err != nil {
			t.Fatalf("after the last Unlock: %v", err)
		}
		l.Unlock(ctx)
		if _, err := m.Lock(outer.Context()); err == nil {
			t.Fatal("re-entry through an ended lease's context succeeded")
		}
	})
}

// Row "holder paused past its lease" (the token half): tokens strictly increase across
// clients, releases, crashes (expiry) and the loss of all state for the name.
func TestFencingToken_StrictlyIncreasing(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		a := tr.dial(t, shared.URL())
		b := tr.dial(t, shared.URL(), dlock.WithTTL(50*time.Millisecond), dlock.WithoutRenewal())
		var last uint64
		check := func(l *dlock.Lease, how string) {
			t.Helper()
			if l.Token() <= last {
				t.Fatalf("%s: token %d, want > %d", how, l.Token(), last)
			}
			last = l.Token()
		}
		for i := 0; i < 50; i++ {
			l, err := a.Mutex(name).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			check(l, "after release")
			l.Unlock(ctx)
		}
		l, err := b.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		check(l, "other client")
		<-l.Context().Done() // expires: the crash case
		if l, err = a.Mutex(name).Lock(ctx); err != nil {
			t.Fatal(err)
		}
		check(l, "after expiry")
		l.Unlock(ctx)
		redisDo(t, shared, "DEL", keyOf(name)) // all state gone, as after the retention window
		if l, err = a.Mutex(name).Lock(ctx); err != nil {
			t.Fatal(err)
		}
		check(l, "after the name's state expired")
		l.Unlock(ctx)
	})
}

// Memory stays bounded: what a name leaves behind after release expires.
func TestFencingToken_StateExpiresAfterRelease(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL())
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		l.Unlock(ctx)
		pttl, _ := strconv.Atoi(redisDo(t, shared, "PTTL", keyOf(name)))
		if pttl <= 0 || pttl > int(time.Minute/time.Millisecond) {
			t.Fatalf("PTTL of a released name = %d ms, want in (0, 60000]", pttl)
		}
		if v := lockValue(t, name); len(v) != 3 || v[0] != "-" || v[2] != "0" {
			t.Fatalf("value kept after release = %q, want only the token", v)
		}
	})
}

// Row "lease shorter than the work" (the told-when-lost half): a holder cut off from Redis
// has its lease context cancelled with ErrLost before anyone else can take the lock.
func TestLostSignal_PartitionedHolder(t *testing.T) {
	// Also through a go-redis client left at its defaults, whose calls ignore context
	// deadlines: the renewal loop must keep its deadlines anyway.
	plain := transport{"goredis-default-timeouts", func(t testing.TB, url string, opts ...dlock.Option) *dlock.Client {
		o, err := redis.ParseURL(url)
		if err != nil {
			t.Fatal(err)
		}
		rc := redis.NewClient(o)
		c, err := dlock.New(goredisconn.New(rc), opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			c.Close()
			rc.Close()
		})
		return c
	}}
	for _, tr := range append(transports[:len(transports):len(transports)], plain) {
		t.Run(tr.name, func(t *testing.T) { testLostSignalPartitioned(t, tr) })
	}
}

func testLostSignalPartitioned(t *testing.T, tr transport) {
	const ttl = 300 * time.Millisecond
	ctx := ctxT(t)
	name := uniqueName(t)
	proxy := redistest.NewProxy(t, shared.Addr)
	cut := tr.dial(t, proxy.URL(), dlock.WithTTL(ttl))
	other := tr.dial(t, shared.URL())
	l, err := cut.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lostAt := make(chan time.Time, 1)
	go func() {
		<-l.Context().Done()
		lostAt <- time.Now()
	}()
	proxy.Block()
	defer proxy.Unblock()
	l2, err := other.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	acquiredAt := time.Now()
	defer l2.Unlock(ctx)
	select {
	case <-l.Context().Done(): // closed by the renewal loop, not by a check of Err
	default:
		t.Fatal("second holder acquired while the partitioned lease context was live")
	}
	select {
	case at := <-lostAt:
		t.Logf("lost signal %v before the second holder acquired", acquiredAt.Sub(at))
		if !at.Before(acquiredAt) {
			t.Logf("the watching goroutine ran %v after the second holder acquired (scheduling); Done was closed before", at.Sub(acquiredAt))
		}
	case <-time.After(time.Second):
		t.Fatal("no lost signal")
	}
	if !errors.Is(context.Cause(l.Context()), dlock.ErrLost) {
		t.Fatalf("cause = %v, want ErrLost", context.Cause(l.Context()))
	}
}

// Lost signal when the lock is taken away on the server (key deleted by an admin).
func TestLostSignal_KeyRemoved(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL(), dlock.WithTTL(300*time.Millisecond))
		var fnErr error
		err := c.Do(ctx, name, func(ctx context.Context) error {
			redisDo(t, shared, "DEL", keyOf(name))
			<-ctx.Done()
			fnErr = ctx.Err()
			return ctx.Err()
		})
		if !errors.Is(err, dlock.ErrLost) {
			t.Fatalf("Do after the key was removed: got %v, want ErrLost", err)
		}
		if !errors.Is(fnErr, context.Canceled) {
			t.Fatalf("fn's ctx.Err() = %v, want context.Canceled", fnErr)
		}
	})
}

// Do runs fn under the lock, releases it, and returns fn's error.
func TestDo(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL())
		boom := errors.New("boom")
		if err := c.Do(ctx, name, func(context.Context) error { return boom }); !errors.Is(err, boom) {
			t.Fatalf("Do: got %v, want fn's error", err)
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("panic not propagated")
				}
			}()
			c.Do(ctx, name, func(context.Context) error { panic("fn panics") })
		}()
		l, err := c.Mutex(name).TryLock(ctx)
		if err != nil {
			t.Fatalf("lock not released after fn's error and panic: %v", err)
		}
		l.Unlock(ctx)
	})
}

// A deferred Unlock with the request's cancelled context still releases the lock.
func TestUnlock_WithCancelledContextStillReleases(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		c := tr.dial(t, shared.URL())
		name := uniqueName(t)
		reqCtx, cancel := context.WithCancel(context.Background())
		l, err := c.Mutex(name).Lock(reqCtx)
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		if err := l.Unlock(reqCtx); err != nil {
			t.Fatal(err)
		}
		if v := lockValue(t, name); v[0] != "-" {
			t.Fatalf("lock still held after Unlock with a cancelled context: value %q", v)
		}
	})
}

// Lock gives up when its context does, with an error that wraps ctx.Err().
func TestLock_ContextDeadline(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		name := uniqueName(t)
		c := tr.dial(t, shared.URL())
		l, err := c.Mutex(name).Lock(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(context.Background())
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err = tr.dial(t, shared.URL()).Mutex(name).Lock(ctx)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want an error wrapping context.DeadlineExceeded", err)
		}
	})
}
