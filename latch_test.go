package dlock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// latchKeyOf is the key of the latch called name under the default prefix (docs/PROTOCOL.md).
func latchKeyOf(name string) string { return keyOf(name) + ":latch" }

// The documented use: N workers count down as they finish their share, and waiters in other
// clients (several goroutines each) return when the last one does, woken by its count-down,
// not by polling; the latch then stays open.
func TestLatch_WorkersAndCoordinator(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		const workers = 5
		coord := tr.dial(t, shared.URL())
		other := tr.dial(t, shared.URL())
		var wg sync.WaitGroup
		woken := make(chan time.Time, 6)
		for _, c := range []*dlock.Client{coord, coord, coord, other, other, other} {
			wg.Go(func() {
				if err := c.Latch(name, workers, dlock.WithTTL(time.Minute)).Wait(ctx); err != nil {
					t.Error(err)
				}
				woken <- time.Now()
			})
		}
		waitFor(t, 10*time.Second, "both clients to subscribe", func(context.Context) error {
			if out := redisDo(t, shared, "PUBSUB", "NUMSUB", latchKeyOf(name)+":rel"); !strings.HasSuffix(out, "\n2") {
				return errors.New(out)
			}
			return nil
		})
		lt := tr.dial(t, shared.URL()).Latch(name, workers, dlock.WithTTL(time.Minute))
		for i := range workers - 1 {
			if err := lt.CountDown(ctx); err != nil {
				t.Fatal(err)
			}
			if n, err := lt.Count(ctx); err != nil || n != workers-1-i {
				t.Fatalf("Count after %d count-downs = %d, %v", i+1, n, err)
			}
		}
		before := evalCalls(t)
		time.Sleep(300 * time.Millisecond) // the waiters are idle here; count what they send
		if n := evalCalls(t) - before; n > 0 {
			t.Errorf("waiters sent %d scripts in 300ms, want none (no polling)", n)
		}
		if len(woken) > 0 {
			t.Fatal("a waiter returned before the count reached zero")
		}
		last := time.Now()
		if err := lt.CountDown(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		close(woken)
		for at := range woken {
			if d := at.Sub(last); d > 2*time.Second {
				t.Errorf("a waiter returned %v after the last count-down", d)
			}
		}
		// Open until its TTL: a late Wait returns at once; counting past zero is harmless.
		if err := lt.CountDown(ctx); err != nil {
			t.Errorf("CountDown past zero = %v, want nil", err)
		}
		if n, err := lt.Count(ctx); err != nil || n != 0 {
			t.Errorf("Count of an open latch = %d, %v", n, err)
		}
		if err := other.Latch(name, workers).Wait(ctx); err != nil {
			t.Errorf("late Wait = %v", err)
		}
	})
}

// A latch whose TTL runs out before it reaches zero: a Wait under way returns at the deadline
// with an error wrapping ErrExpired; later calls say so until the record goes (the token
// retention after the deadline); then the name is a new latch.
func TestLatch_ExpiredBeforeZero(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL(), dlock.WithTokenRetention(time.Second))
		lt := c.Latch(name, 3, dlock.WithTTL(500*time.Millisecond))
		if err := lt.CountDown(ctx); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err := lt.Wait(ctx)
		if !errors.Is(err, dlock.ErrExpired) || !strings.Contains(err.Error(), "2 of 3 left") {
			t.Fatalf("Wait on a latch that expires = %v, want ErrExpired with 2 of 3 left", err)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("Wait returned %v after it started (TTL 500ms)", d)
		}
		if err := lt.CountDown(ctx); !errors.Is(err, dlock.ErrExpired) {
			t.Errorf("CountDown of an expired latch = %v, want ErrExpired", err)
		}
		if _, err := lt.Count(ctx); !errors.Is(err, dlock.ErrExpired) {
			t.Errorf("Count of an expired latch = %v, want ErrExpired", err)
		}
		waitFor(t, 10*time.Second, "the expired latch's record to go", func(context.Context) error {
			if v := redisDo(t, shared, "EXISTS", latchKeyOf(name)); v != "0" {
				return errors.New("still there")
			}
			return nil
		})
		if n, err := lt.Count(ctx); err != nil || n != 3 {
			t.Errorf("Count once the record went = %d, %v; want a new latch of 3", n, err)
		}
	})
}

// CountDownAs counts once per id; CountDown once per call.
func TestLatch_CountDownAsIdempotent(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL())
		lt := c.Latch(uniqueName(t), 3)
		for range 3 {
			if err := lt.CountDownAs(ctx, "worker-1"); err != nil {
				t.Fatal(err)
			}
		}
		if n, _ := lt.Count(ctx); n != 2 {
			t.Fatalf("count after three CountDownAs of one id = %d, want 2", n)
		}
		if err := lt.CountDownAs(ctx, "worker-2"); err != nil {
			t.Fatal(err)
		}
		if err := lt.CountDown(ctx); err != nil {
			t.Fatal(err)
		}
		if n, _ := lt.Count(ctx); n != 0 {
			t.Fatalf("count = %d, want 0", n)
		}
		if err := lt.CountDownAs(ctx, ""); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("empty id = %v, want ErrInvalid", err)
		}
	})
}

// The latch lives on the server with its TTL, under <prefix>{<name>}:latch; a handle with
// another count is refused, one of count 0 uses the stored count, or says there is none.
func TestLatch_ServerStateAndCounts(t *testing.T) {
	needShared(t)
	ctx := ctxT(t)
	c := transports[0].dial(t, shared.URL())
	name := uniqueName(t)
	if _, err := c.Latch(name, 0).Count(ctx); !errors.Is(err, dlock.ErrNotFound) {
		t.Errorf("count-0 handle on no latch = %v, want ErrNotFound", err)
	}
	if err := c.Latch(name, 4, dlock.WithTTL(10*time.Second)).CountDown(ctx); err != nil {
		t.Fatal(err)
	}
	pttl, _ := strconv.Atoi(redisDo(t, shared, "PTTL", latchKeyOf(name)))
	if pttl <= 10000 || pttl > 10000+int(dlock.DefaultTokenRetention.Milliseconds()) {
		t.Errorf("PTTL of the latch key = %d, want its TTL plus the token retention", pttl)
	}
	if n, err := c.Latch(name, 0).Count(ctx); err != nil || n != 3 {
		t.Errorf("count-0 handle = %d, %v; want 3", n, err)
	}
	if _, err := c.Latch(name, 5).Count(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("handle with another count = %v, want ErrInvalid", err)
	}
	l, err := c.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatalf("a lock of the latch's name: %v", err)
	}
	l.Unlock(ctx)
}

// Options that mean nothing for a latch, bad counts and names are ErrInvalid.
func TestLatch_InvalidInput(t *testing.T) {
	needShared(t)
	ctx := ctxT(t)
	c := transports[0].dial(t, shared.URL())
	for what, lt := range map[string]*dlock.Latch{
		"negative count":  c.Latch("x", -1),
		"empty name":      c.Latch("", 1),
		"WithoutRenewal":  c.Latch("x", 1, dlock.WithoutRenewal()),
		"WithLabel":       c.Latch("x", 1, dlock.WithLabel("l")),
		"WithWait":        c.Latch("x", 1, dlock.WithWait(time.Second)),
		"WithAdaptiveTTL": c.Latch("x", 1, dlock.WithAdaptiveTTL(time.Second, time.Minute)),
		"TTL too long":    c.Latch("x", 1, dlock.WithTTL(dlock.MaxFixedTTL+time.Second)),
	} {
		if err := lt.Wait(ctx); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("%s: Wait = %v, want ErrInvalid", what, err)
		}
		if err := lt.CountDown(ctx); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("%s: CountDown = %v, want ErrInvalid", what, err)
		}
	}
}

// Wait ends with its context, with the count left; and with the client, with ErrClosed.
func TestLatch_WaitEnds(t *testing.T) {
	needShared(t)
	ctx := ctxT(t)
	c := transports[0].dial(t, shared.URL())
	lt := c.Latch(uniqueName(t), 2)
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := lt.Wait(wctx); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "2 of 2 left") {
		t.Errorf("Wait with a deadline = %v, want DeadlineExceeded with 2 of 2 left", err)
	}
	done := make(chan error, 1)
	go func() { done <- lt.Wait(ctx) }()
	time.Sleep(100 * time.Millisecond)
	c.Close()
	select {
	case err := <-done:
		if !errors.Is(err, dlock.ErrClosed) {
			t.Errorf("Wait when the client closed = %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait still running 5 s after Close")
	}
}

// Inspect reads a latch without creating it.
func TestLatch_Inspect(t *testing.T) {
	needShared(t)
	ctx := ctxT(t)
	c := transports[0].dial(t, shared.URL())
	name := uniqueName(t)
	lt := c.Latch(name, 3, dlock.WithTTL(time.Minute))
	if info, err := lt.Inspect(ctx); err != nil || info.Exists {
		t.Fatalf("Inspect of no latch = %+v, %v", info, err)
	}
	if v := redisDo(t, shared, "EXISTS", latchKeyOf(name)); v != "0" {
		t.Fatal("Inspect created the latch")
	}
	if err := lt.CountDown(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := c.Latch(name, 0).Inspect(ctx)
	if err != nil || !info.Exists || info.Left != 2 || info.Count != 3 || info.TTL <= 50*time.Second || info.Expired {
		t.Fatalf("Inspect = %+v, %v; want 2 of 3 left, about a minute", info, err)
	}
}
