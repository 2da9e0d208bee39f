package dlock_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// Row "mutual exclusion across processes": one holder per name, whichever client asks.
func TestMutualExclusion(t *testing.T) {
	needShared(t)
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
	needShared(t)
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
	needShared(t)
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

// Row "reentrancy (lockCount)": the same owner re-enters; released at the last Unlock.
func TestReentrancy(t *testing.T) {
	needShared(t)
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
	needShared(t)
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

// Do runs fn under the lock, releases it, and returns fn's error.
func TestDo(t *testing.T) {
	needShared(t)
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

// Lock gives up when its context does, with an error that wraps ctx.Err().
func TestLock_ContextDeadline(t *testing.T) {
	needShared(t)
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

// WithWait bounds the wait, not the work: a Lock that waits longer than d returns an error
// that matches ErrNotAcquired (not a context error) and names the holder; WithWait(0) makes
// one attempt; Do runs fn past d once it has the lock.
func TestWithWait(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		holder := tr.dial(t, shared.URL(), dlock.WithLabel("the-holder"))
		other := tr.dial(t, shared.URL())
		l, err := holder.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = other.Mutex(name, dlock.WithWait(200*time.Millisecond)).Lock(ctx)
		took := time.Since(start)
		var na *dlock.NotAcquiredError
		if !errors.As(err, &na) || !errors.Is(err, dlock.ErrNotAcquired) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock with WithWait(200ms) on a held lock = %v, want a *NotAcquiredError that is not a context error", err)
		}
		if took < 200*time.Millisecond || took > 5*time.Second {
			t.Fatalf("waited %v, want about 200 ms", took)
		}
		host, _ := os.Hostname()
		if na.Mine || na.Holder.Holder.Label != "the-holder" || na.Holder.Holder.PID != os.Getpid() || na.Holder.Token != l.Token() || na.Waited < 200*time.Millisecond {
			t.Fatalf("error %+v: want the holder described (label, pid, token) and the wait", na)
		}
		for _, want := range []string{name, host, "the-holder", "lease", "waited"} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q lacks %q", err, want)
			}
		}
		// WithWait(0): one attempt.
		start = time.Now()
		if _, err := other.Mutex(name, dlock.WithWait(0)).Lock(ctx); !errors.Is(err, dlock.ErrNotAcquired) || time.Since(start) > 2*time.Second {
			t.Fatalf("WithWait(0) = %v after %v, want ErrNotAcquired at once", err, time.Since(start))
		}
		// The caller's context ending the wait: both busy and the context's error.
		cctx, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
		_, err = other.Mutex(name).Lock(cctx)
		cancel()
		if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock ended by its context = %v, want ErrNotAcquired and DeadlineExceeded", err)
		}
		// The same client holding it: said so.
		_, err = holder.Mutex(name).TryLock(ctx)
		if !errors.As(err, &na) || !na.Mine || !strings.Contains(err.Error(), "this client") {
			t.Fatalf("TryLock by the holder's own client = %v, want it to say the holder is this client", err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		// Do: WithWait bounds the wait only; fn runs as long as it needs.
		err = other.Do(ctx, name, func(ctx context.Context) error {
			time.Sleep(300 * time.Millisecond)
			return ctx.Err()
		}, dlock.WithWait(100*time.Millisecond))
		if err != nil {
			t.Fatalf("Do with WithWait(100ms) and 300 ms of work: %v", err)
		}
	})
}
