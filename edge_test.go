package dlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// A Lock whose context ends while its acquire is on the wire leaves nothing behind: if the
// script did run, the client releases that lock itself instead of letting it sit for a TTL.
func TestLock_AbandonedAcquireIsReleased(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		name := uniqueName(t)
		proxy := redistest.NewProxy(t, shared.Addr)
		slow := tr.dial(t, proxy.URL(), dlock.WithTTL(30*time.Second))
		other := tr.dial(t, shared.URL())
		proxy.SetDelay(150 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if _, err := slow.Mutex(name).Lock(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock with a 50ms context over a 150ms link: got %v, want DeadlineExceeded", err)
		}
		// The acquire reached the server; the orphan release follows it. Well before the 30 s
		// lease, another client gets the lock.
		wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer wcancel()
		l, err := other.Mutex(name).Lock(wctx)
		if err != nil {
			t.Fatalf("lock left behind by the abandoned acquire: %v", err)
		}
		l.Unlock(wctx)
	})
}

// Lock names are arbitrary bytes: spaces, braces, newlines and non-UTF-8 all lock and release.
func FuzzLockName(f *testing.F) {
	for _, s := range []string{"a", "orders:42", "with space", "{tag}", "a}b{c", "}", "{", "line\nbreak", "\xff\xfe", "ключ", strings.Repeat("z", dlock.MaxNameLen)} {
		f.Add(s)
	}
	c, err := dlock.Dial(context.Background(), shared.URL(), dlock.WithTTL(time.Second))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { c.Close() })
	f.Fuzz(func(t *testing.T, name string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		m := c.Mutex(name)
		l, err := m.TryLock(ctx)
		if name == "" || len(name) > dlock.MaxNameLen {
			if !errors.Is(err, dlock.ErrInvalid) {
				t.Fatalf("name %q: got %v, want ErrInvalid", name, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("name %q: %v", name, err)
		}
		if _, err := m.TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("name %q held, second TryLock: got %v", name, err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("name %q: unlock: %v", name, err)
		}
		l2, err := m.TryLock(ctx)
		if err != nil {
			t.Fatalf("name %q after release: %v", name, err)
		}
		if l2.Token() <= l.Token() {
			t.Fatalf("name %q: token %d after %d", name, l2.Token(), l.Token())
		}
		l2.Unlock(ctx)
	})
}
