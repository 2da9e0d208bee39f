package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// waiters is a check for waitFor: Inspect through c counts n waiters for name.
func waiters(c *dlock.Client, name string, n int) func(context.Context) error {
	return func(ctx context.Context) error {
		info, err := c.Inspect(ctx, name)
		if err == nil && info.Waiters != n {
			err = fmt.Errorf("%d waiters", info.Waiters)
		}
		return err
	}
}

// lockAsync starts Lock in a goroutine; the lease (or error) arrives on the channel.
func lockAsync(ctx context.Context, m *dlock.Mutex) <-chan lockResult {
	ch := make(chan lockResult, 1)
	go func() {
		l, err := m.Lock(ctx)
		ch <- lockResult{l, err}
	}()
	return ch
}

type lockResult struct {
	l   *dlock.Lease
	err error
}

func TestInspect(t *testing.T) {
	needShared(t)
	host, _ := os.Hostname()
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL(), dlock.WithTTL(5*time.Second), dlock.WithLabel("inspect-test"))
		other := tr.dial(t, shared.URL())
		name := uniqueName(t)

		info, err := c.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if info.Held || info.Token != 0 || info.Holds != 0 || info.Name != name || info.Waiters != 0 {
			t.Fatalf("never locked: %+v, want free, token 0, no waiters", info)
		}

		before := time.Now()
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		redisDo(t, shared, "SCRIPT", "FLUSH") // Inspect falls back on EVAL
		info, err = other.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if !info.Held || info.Token != l.Token() || info.Holds != 1 {
			t.Fatalf("held: %+v, want held, token %d, 1 hold", info, l.Token())
		}
		if info.TTL <= 0 || info.TTL > 5*time.Second {
			t.Errorf("TTL %v, want in (0, 5s]", info.TTL)
		}
		h := info.Holder
		if h.Host != host || h.PID != os.Getpid() || h.Label != "inspect-test" || h.Start.IsZero() || h.Start.After(time.Now()) {
			t.Errorf("holder %+v, want host %q, pid %d, label inspect-test, a start in the past", h, host, os.Getpid())
		}
		if tt := info.TokenTime(); tt.Before(before.Add(-time.Second)) || tt.After(time.Now().Add(time.Second)) {
			t.Errorf("TokenTime %v, want about the acquisition (%v)", tt, before)
		}

		// Re-entry counts as a hold.
		l2, err := c.Mutex(name).Lock(l.Context())
		if err != nil {
			t.Fatal(err)
		}
		if info, err = c.Inspect(ctx, name); err != nil || info.Holds != 2 || info.Token != l.Token() {
			t.Fatalf("re-entered: %+v, %v; want 2 holds, same token", info, err)
		}

		// A client waiting for the lock shows as a waiter.
		waiting := lockAsync(ctx, other.Mutex(name))
		waitFor(t, 5*time.Second, "one waiter", waiters(c, name, 1))
		if err := l2.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		r := <-waiting
		if r.err != nil {
			t.Fatal(r.err)
		}
		if err := r.l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		info, err = c.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if info.Held || info.Token != r.l.Token() || info.TTL != 0 || info.Holder != (dlock.Holder{}) {
			t.Fatalf("released: %+v, want free with the last token %d", info, r.l.Token())
		}
	})
}

func TestInspect_Errors(t *testing.T) {
	needShared(t)
	ctx := ctxT(t)
	c := transports[0].dial(t, shared.URL())
	if _, err := c.Inspect(ctx, ""); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Inspect(\"\"): %v, want ErrInvalid", err)
	}
	if _, err := c.ForceUnlock(ctx, string(make([]byte, dlock.MaxNameLen+1))); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("ForceUnlock(long name): %v, want ErrInvalid", err)
	}
	name := uniqueName(t)
	redisDo(t, shared, "SET", keyOf(name), "not a lock")
	if _, err := c.Inspect(ctx, name); err == nil {
		t.Error("Inspect of a key that is not a lock: no error")
	}
	c.Close()
	if _, err := c.Inspect(ctx, name); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("Inspect after Close: %v, want ErrClosed", err)
	}
	if _, err := c.List(ctx, ""); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("List after Close: %v, want ErrClosed", err)
	}
	if _, err := c.ForceUnlock(ctx, name); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("ForceUnlock after Close: %v, want ErrClosed", err)
	}
}

func TestList(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL(), dlock.WithTTL(5*time.Second))
		base := uniqueName(t) + "/"
		var leases []*dlock.Lease
		for _, n := range []string{"b", "a", "[x", "released"} {
			l, err := c.Mutex(base + n).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			leases = append(leases, l)
		}
		if err := leases[3].Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		// Keys under the prefix that are not locks are skipped.
		redisDo(t, shared, "SET", keyOf(base+"junk"), "hello")
		redisDo(t, shared, "HSET", keyOf(base+"hash"), "f", "v")

		got, err := c.List(ctx, base)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{base + "[x", base + "a", base + "b"}
		if len(got) != len(want) {
			t.Fatalf("List(%q) = %+v, want %v", base, got, want)
		}
		for i, info := range got {
			if info.Name != want[i] || !info.Held || info.Holds != 1 || info.TTL <= 0 || info.Waiters != 0 ||
				info.Holder.PID != os.Getpid() {
				t.Errorf("List[%d] = %+v, want %s held by this process", i, info, want[i])
			}
		}
		if got[1].Token != leases[1].Token() {
			t.Errorf("token of %s: %d, want %d", got[1].Name, got[1].Token, leases[1].Token())
		}
		// The name prefix is not a pattern: "[" matches itself only.
		got, err = c.List(ctx, base+"[")
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Name != base+"[x" {
			t.Errorf("List(%q) = %+v, want only %s", base+"[", got, base+"[x")
		}
		// All locks: this test's are among them.
		all, err := c.List(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		var mine int
		for _, info := range all {
			if len(info.Name) > len(base) && info.Name[:len(base)] == base {
				mine++
			}
		}
		if mine != 3 {
			t.Errorf("List(\"\") has %d of this test's locks, want 3", mine)
		}
		for _, l := range leases[:3] {
			l.Unlock(ctx)
		}
	})
}

func TestForceUnlock(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		holder := tr.dial(t, shared.URL(), dlock.WithTTL(600*time.Millisecond))
		waiter := tr.dial(t, shared.URL())
		admin := tr.dial(t, shared.URL())
		name := uniqueName(t)

		if _, err := admin.ForceUnlock(ctx, name); !errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("ForceUnlock of a free lock: %v, want ErrNotHeld", err)
		}

		l, err := holder.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		waiting := lockAsync(ctx, waiter.Mutex(name))
		waitFor(t, 5*time.Second, "one waiter", waiters(admin, name, 1))
		waitSubscribed(t, name) // queued first, then subscribed: the notice must reach it

		info, err := admin.ForceUnlock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if !info.Held || info.Token != l.Token() || info.Holds != 1 || info.Holder.PID != os.Getpid() || info.Waiters != 1 {
			t.Fatalf("ForceUnlock returned %+v, want the holder's lock (token %d) and 1 client woken", info, l.Token())
		}

		// The waiter of the other client gets the lock, with a larger token.
		var next *dlock.Lease
		select {
		case r := <-waiting:
			if r.err != nil {
				t.Fatal(r.err)
			}
			next = r.l
		case <-time.After(5 * time.Second):
			t.Fatal("the waiter was not woken by the forced unlock")
		}
		if next.Token() <= l.Token() {
			t.Errorf("next token %d, want > %d", next.Token(), l.Token())
		}

		// The old holder learns of the loss at its next renewal (every 200 ms).
		select {
		case <-l.Context().Done():
			if cause := context.Cause(l.Context()); !errors.Is(cause, dlock.ErrLost) {
				t.Errorf("old lease ended with %v, want ErrLost", cause)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("the old holder's lease context was not cancelled")
		}
		if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrLost) {
			t.Errorf("old holder's Unlock: %v, want ErrLost", err)
		}
		if info, err := admin.Inspect(ctx, name); err != nil || info.Token != next.Token() || !info.Held {
			t.Errorf("after: %+v, %v; want held by the waiter", info, err)
		}
		if err := next.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		info, err = admin.ForceUnlock(ctx, name)
		if !errors.Is(err, dlock.ErrNotHeld) || info.Held || info.Token != next.Token() {
			t.Errorf("ForceUnlock after release: %+v, %v; want ErrNotHeld and the last token", info, err)
		}
	})
}

// Waiting goroutines are told from waiting clients: two clients with 5 and 3 goroutines waiting
// read as 2 waiters and 8 waiting goroutines, from any client; the client that inspects also
// counts its own waiting goroutines exactly, without the server. List says the same.
func TestInspect_WaitingGoroutines(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		holder := tr.dial(t, shared.URL())
		b := tr.dial(t, shared.URL())
		c := tr.dial(t, shared.URL())
		name := uniqueName(t)
		l, err := holder.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		var waits []<-chan lockResult
		for range 5 {
			waits = append(waits, lockAsync(wctx, b.Mutex(name)))
		}
		for range 3 {
			waits = append(waits, lockAsync(wctx, c.Mutex(name)))
		}
		check := func(from *dlock.Client, local int) func(context.Context) error {
			return func(ctx context.Context) error {
				info, err := from.Inspect(ctx, name)
				if err != nil {
					return err
				}
				if info.Waiters != 2 || info.WaitingGoroutines != 8 || info.LocalWaiters != local {
					return fmt.Errorf("waiters %d, goroutines %d, local %d", info.Waiters, info.WaitingGoroutines, info.LocalWaiters)
				}
				list, err := from.List(ctx, name)
				if err != nil {
					return err
				}
				if len(list) != 1 || list[0].WaitingGoroutines != 8 || list[0].LocalWaiters != local {
					return fmt.Errorf("List: %+v", list)
				}
				return nil
			}
		}
		waitFor(t, 10*time.Second, "2 clients, 8 goroutines waiting, 5 of this client's", check(b, 5))
		waitFor(t, 10*time.Second, "3 of this client's", check(c, 3))
		waitFor(t, 10*time.Second, "none of the holder's", check(holder, 0))
		cancel()
		for _, w := range waits {
			if r := <-w; r.err == nil {
				r.l.Unlock(ctx)
			}
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if info, err := b.Inspect(ctx, name); err != nil || info.LocalWaiters != 0 {
			t.Fatalf("after the waits ended: %+v, %v; want no local waiter", info, err)
		}
	})
}
