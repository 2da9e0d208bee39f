package dlock_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// Bad input gets a clear error, never a panic and never a silent success.
func TestBadInput(t *testing.T) {
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
		{"prefix with braces", func() error { _, err := c.Mutex("n", dlock.WithPrefix("a{b}")).Lock(ctx); return err }, dlock.ErrInvalid},
		{"nil fn", func() error { return c.Do(ctx, "n", nil) }, dlock.ErrInvalid},
		{"nil lease Unlock", func() error { var l *dlock.Lease; return l.Unlock(ctx) }, dlock.ErrNotHeld},
		{"nil lease Extend", func() error { var l *dlock.Lease; return l.Extend(ctx, time.Second) }, dlock.ErrNotHeld},
		{"nil lease TTL", func() error { var l *dlock.Lease; _, err := l.TTL(ctx); return err }, dlock.ErrNotHeld},
		{"nil client", func() error { var nc *dlock.Client; _, err := nc.Mutex("n").Lock(ctx); return err }, dlock.ErrInvalid},
		{"nil conn", func() error { _, err := dlock.New(nil); return err }, dlock.ErrInvalid},
		{"bad url", func() error { _, err := dlock.Dial(ctx, "http://x"); return err }, nil},
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

func TestExtendAndTTL(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL(), dlock.WithTTL(time.Second), dlock.WithoutRenewal())
		l, err := c.Mutex(uniqueName(t)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(ctx)
		if err := l.Extend(ctx, 5*time.Millisecond); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("Extend below MinTTL: got %v, want ErrInvalid", err)
		}
		if err := l.Extend(ctx, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		d, err := l.TTL(ctx)
		if err != nil || d <= 10*time.Second || d > 20*time.Second {
			t.Fatalf("TTL after Extend(20s) = %v, %v", d, err)
		}
	})
}

// An unreachable server fails fast, and the error names the address.
func TestUnreachableServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	start := time.Now()
	_, err = dlock.Dial(ctxT(t), "redis://"+addr+"/0")
	if err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Dial to a closed port: got %v, want an error naming %s", err, addr)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Dial took %v to fail", d)
	}

	// A server that goes away after Dial: calls fail with the address, they do not hang.
	eachTransport(t, func(t *testing.T, tr transport) {
		s := redistest.Start(t)
		c := tr.dial(t, s.URL())
		s.Kill()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := c.Mutex("n").Lock(ctx)
		if err == nil || !strings.Contains(err.Error(), s.Addr) {
			t.Fatalf("Lock on a dead server: got %v, want an error naming %s", err, s.Addr)
		}
		if ctx.Err() != nil {
			t.Fatal("Lock on a dead server waited for the context instead of failing")
		}
	})
}

// Close releases what the client holds, ends waiting calls, and refuses new ones.
func TestClose(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL())
		other := tr.dial(t, shared.URL())
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		lo, err := other.Mutex(name + "-other").Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		waitErr := make(chan error, 1)
		go func() {
			_, err := c.Mutex(name + "-other").Lock(ctx)
			waitErr <- err
		}()
		waitSubscribed(t, name+"-other")
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-waitErr; !errors.Is(err, dlock.ErrClosed) {
			t.Fatalf("waiting Lock after Close: got %v, want ErrClosed", err)
		}
		if !errors.Is(context.Cause(l.Context()), dlock.ErrClosed) {
			t.Fatalf("lease cause after Close = %v, want ErrClosed", context.Cause(l.Context()))
		}
		if v := lockValue(t, name); v[0] != "-" {
			t.Fatalf("Close did not release the lock: value %q", v)
		}
		if _, err := c.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrClosed) {
			t.Fatalf("TryLock after Close: got %v, want ErrClosed", err)
		}
		if err := c.Do(ctx, name, func(context.Context) error { return nil }); !errors.Is(err, dlock.ErrClosed) {
			t.Fatalf("Do after Close: got %v, want ErrClosed", err)
		}
		if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrClosed) {
			t.Fatalf("Unlock after Close: got %v, want ErrClosed", err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		lo.Unlock(ctx)
	})
}

// The pinned script hashes are what the server computes, and a flushed script cache is
// refilled transparently (NOSCRIPT fallback).
func TestScripts_SHAAndNoScriptFallback(t *testing.T) {
	for _, s := range dlock.Scripts() {
		if got := redisDo(t, shared, "SCRIPT", "LOAD", s.Src); got != s.SHA {
			t.Errorf("%s: SCRIPT LOAD = %s, pinned %s", s.Name, got, s.SHA)
		}
	}
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL(), dlock.WithTTL(400*time.Millisecond))
		redisDo(t, shared, "SCRIPT", "FLUSH")
		l, err := c.Mutex(uniqueName(t)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		redisDo(t, shared, "SCRIPT", "FLUSH")
		time.Sleep(300 * time.Millisecond) // at least one renewal (every 133ms) after the flush
		if err := l.Context().Err(); err != nil {
			t.Fatalf("lease lost after SCRIPT FLUSH: %v", context.Cause(l.Context()))
		}
		redisDo(t, shared, "SCRIPT", "FLUSH")
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
