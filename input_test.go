package dlock_test

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// Bad input gets a clear error, never a panic and never a silent success.
func TestBadInput(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) { testBadInput(t, tr.dial(t, shared.URL())) })
}

func testBadInput(t *testing.T, c *dlock.Client) {
	ctx := ctxT(t)
	cases := []struct {
		name string
		err  func() error
		want error
	}{
		{"empty name", func() error { _, err := c.Mutex("").Lock(ctx); return err }, dlock.ErrInvalid},
		{"oversized name", func() error { _, err := c.Mutex(strings.Repeat("x", dlock.MaxNameLen+1)).TryLock(ctx); return err }, dlock.ErrInvalid},
		{"ttl below minimum", func() error { _, err := c.Mutex("n", dlock.WithTTL(9*time.Millisecond)).Lock(ctx); return err }, dlock.ErrInvalid},
		{"negative ttl", func() error { _, err := c.Mutex("n", dlock.WithTTL(-time.Second)).Lock(ctx); return err }, dlock.ErrInvalid},
		{"zero ttl in Do", func() error { return c.Do(ctx, "n", func(context.Context) error { return nil }, dlock.WithTTL(0)) }, dlock.ErrInvalid},
		{"prefix with braces", func() error { _, err := dlock.Dial(ctx, "redis://127.0.0.1:1", dlock.WithPrefix("a{b}")); return err }, dlock.ErrInvalid},
		{"empty prefix", func() error { _, err := dlock.Dial(ctx, "redis://127.0.0.1:1", dlock.WithPrefix("")); return err }, dlock.ErrInvalid},
		{"nil fn", func() error { return c.Do(ctx, "n", nil) }, dlock.ErrInvalid},
		{"nil lease Unlock", func() error { var l *dlock.Lease; return l.Unlock(ctx) }, dlock.ErrNotHeld},
		{"nil lease Extend", func() error { var l *dlock.Lease; return l.Extend(ctx, time.Second) }, dlock.ErrNotHeld},
		{"nil lease TTL", func() error { var l *dlock.Lease; _, err := l.TTL(ctx); return err }, dlock.ErrNotHeld},
		{"nil client", func() error { var nc *dlock.Client; _, err := nc.Mutex("n").Lock(ctx); return err }, dlock.ErrInvalid},
		{"nil conn", func() error { _, err := dlock.New(nil); return err }, dlock.ErrInvalid},
		{"bad url", func() error { _, err := dlock.Dial(ctx, "http://x"); return err }, dlock.ErrInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.err()
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("got %v, want an error wrapping %v", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "dlock: ") {
				t.Errorf("error %q does not say it comes from dlock", err)
			}
		})
	}
	var l *dlock.Lease
	if l.Token() != 0 || l.Context().Err() == nil {
		t.Error("a nil lease must have token 0 and a cancelled context")
	}
}

// A Lock whose context ends while its acquire is on the wire leaves nothing behind: if the
// script did run, the client releases that lock itself instead of letting it sit for a TTL.
func TestLock_AbandonedAcquireIsReleased(t *testing.T) {
	needShared(t)
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
	needShared(f)
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

// Re-entry with another lease than the held one is refused; TTLs beyond the limits are
// refused; a renewed TTL within MaxTTL and a long fixed lease are accepted.
func TestOptions_Limits(t *testing.T) {
	needShared(t)
	ctx := ctxT(t)
	c := transports[0].dial(t, shared.URL())
	name := uniqueName(t)
	l, err := c.Mutex(name, dlock.WithTTL(5*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)
	for _, opt := range []dlock.Option{dlock.WithTTL(6 * time.Second), dlock.WithoutRenewal(), dlock.WithLabel("other")} {
		if _, err := c.Mutex(name, dlock.WithTTL(5*time.Second), opt).Lock(l.Context()); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("re-entry with another lease = %v, want ErrInvalid", err)
		}
	}
	for _, opts := range [][]dlock.Option{
		{dlock.WithTTL(dlock.MaxTTL + time.Second)},
		{dlock.WithTTL(dlock.MaxFixedTTL + time.Second), dlock.WithoutRenewal()},
		{dlock.WithWait(-time.Second)},
	} {
		if _, err := c.Mutex(uniqueName(t), opts...).TryLock(ctx); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("TryLock with %d bad options = %v, want ErrInvalid", len(opts), err)
		}
	}
	fixed, err := c.Mutex(uniqueName(t), dlock.WithTTL(24*time.Hour), dlock.WithoutRenewal()).TryLock(ctx)
	if err != nil {
		t.Fatalf("a fixed lease of a day: %v", err)
	}
	if err := fixed.Extend(ctx, dlock.MaxFixedTTL+time.Hour); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("Extend past MaxFixedTTL = %v, want ErrInvalid", err)
	}
	fixed.Unlock(ctx)
}

// Options that only make sense for a whole client are ClientOptions, not Options: a lock's
// options cannot carry them. Every Option still works as a client default.
func TestOptions_Scopes(t *testing.T) {
	lockOpt := reflect.TypeFor[dlock.Option]()
	for name, o := range map[string]dlock.ClientOption{
		"WithPrefix":         dlock.WithPrefix("p:"),
		"WithTLSConfig":      dlock.WithTLSConfig(&tls.Config{}),
		"WithCAFile":         dlock.WithCAFile("/nonexistent"),
		"WithLogger":         dlock.WithLogger(slog.Default()),
		"WithObserver":       dlock.WithObserver(dlock.Observer{}),
		"WithUnsafeEviction": dlock.WithUnsafeEviction(),
		"WithTokenRetention": dlock.WithTokenRetention(time.Minute),
	} {
		if reflect.TypeOf(o).AssignableTo(lockOpt) {
			t.Errorf("%s can be passed to a lock", name)
		}
	}
	for _, o := range []dlock.Option{dlock.WithTTL(time.Second), dlock.WithoutRenewal(), dlock.WithLabel("x"), dlock.WithWait(0), dlock.WithReplicaAck(1, time.Second)} {
		var _ dlock.ClientOption = o // compiles: a lock option is a client default
	}
}
