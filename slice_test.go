package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// lockFree reports whether the lock called name is free on s (no key, or the released value).
func lockFree(t testing.TB, s *redistest.Server, name string) error {
	v := redisDo(t, s, "GET", dlock.DefaultPrefix+"{"+name+"}")
	if v == "" || strings.HasPrefix(v, "- ") {
		return nil
	}
	return fmt.Errorf("held: %q", v)
}

// With a turn slice, a Lock of the same name right after its Unlock takes the lock back with
// no command (the next token, the same owner on the server), and the lock is released on the
// server once the slice has passed since the turn began.
func TestTurnSlice_RelockIsLocal(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		s := redistest.Start(t)
		ctx := ctxT(t)
		c := tr.dial(t, s.URL())
		m := c.Mutex("turn", dlock.WithTurnSlice(300*time.Millisecond))
		l, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		redisDo(t, s, "CONFIG", "RESETSTAT")
		start := time.Now()
		prev := l.Token()
		for i := range 5 {
			l2, err := m.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if l2.Token() != prev+1 {
				t.Fatalf("re-Lock %d within the slice: token %d, want %d (the next one, locally)", i, l2.Token(), prev+1)
			}
			prev = l2.Token()
			if err := l2.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if n := scriptCalls(t, s); n != 0 && time.Since(start) < 300*time.Millisecond {
			t.Errorf("5 re-Locks within the slice ran %d scripts, want none", n)
		}
		if lockFree(t, s, "turn") == nil && time.Since(start) < 250*time.Millisecond {
			t.Errorf("the lock was free on the server within the turn slice")
		}
		waitFor(t, 5*time.Second, "the lock released after the slice", func(context.Context) error { return lockFree(t, s, "turn") })
		// The next Lock goes to the server again, with a server token above the local ones.
		l3, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if l3.Token() <= prev {
			t.Errorf("token after the turn %d, want above %d", l3.Token(), prev)
		}
		if err := l3.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// Another client waiting for the lock gets it once the turn's slice is over, however often the
// turn's client locks it again, and the tokens of both keep increasing: a turn holds the others
// back by at most its slice.
func TestTurnSlice_OtherClientServedAfterTheTurn(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		s := redistest.Start(t)
		ctx := ctxT(t)
		const slice = 100 * time.Millisecond
		a, b := tr.dial(t, s.URL()), tr.dial(t, s.URL())
		ma := a.Mutex("turns", dlock.WithTurnSlice(slice))
		var mu sync.Mutex
		var tokens []uint64 // in the order the holds began, each ended before the next began
		hold := func(l *dlock.Lease) {
			mu.Lock()
			tokens = append(tokens, l.Token())
			mu.Unlock()
		}
		first, err := ma.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		hold(first)
		got := make(chan error, 1)
		var waited time.Duration
		go func() {
			start := time.Now()
			l, err := b.Mutex("turns").Lock(ctx)
			if err == nil {
				waited = time.Since(start)
				hold(l)
				err = l.Unlock(ctx)
			}
			got <- err
		}()
		waitFor(t, 10*time.Second, "b queued on the server", func(context.Context) error {
			if n := redisDo(t, s, "ZCARD", dlock.DefaultPrefix+"{turns}:q"); n != "1" {
				return fmt.Errorf("%s queued", n)
			}
			return nil
		})
		if err := first.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		// a re-locks as fast as it can: locally while its turn lasts, then queued behind b.
		deadline := time.Now().Add(10 * time.Second)
		for done := false; !done && time.Now().Before(deadline); {
			l, err := ma.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			hold(l)
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-got:
				if err != nil {
					t.Fatal(err)
				}
				done = true
			default:
			}
		}
		if waited == 0 {
			t.Fatal("b never got the lock")
		}
		if waited > slice+2*time.Second {
			t.Errorf("b waited %v behind a turn of %v", waited, slice)
		}
		mu.Lock()
		defer mu.Unlock()
		for i := 1; i < len(tokens); i++ {
			if tokens[i] <= tokens[i-1] {
				t.Fatalf("token %d after %d (hold %d of %d)", tokens[i], tokens[i-1], i, len(tokens))
			}
		}
	})
}

// Closing a client whose lock is parked for its turn releases it at once.
func TestTurnSlice_CloseReleases(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		s := redistest.Start(t)
		ctx := ctxT(t)
		c := tr.dial(t, s.URL())
		l, err := c.Mutex("parked", dlock.WithTurnSlice(time.Second)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if lockFree(t, s, "parked") == nil {
			t.Fatal("the lock was released at Unlock, not parked")
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if err := lockFree(t, s, "parked"); err != nil {
			t.Errorf("after Close: %v", err)
		}
	})
}

// A turn slice the Mutex cannot honour is refused when the lock is taken.
func TestTurnSlice_Invalid(t *testing.T) {
	needShared(t)
	ctx := ctxT(t)
	c := transports[0].dial(t, shared.URL())
	for _, tc := range []struct {
		what string
		opts []dlock.Option
	}{
		{"negative", []dlock.Option{dlock.WithTurnSlice(-time.Millisecond)}},
		{"above MaxTurnSlice", []dlock.Option{dlock.WithTurnSlice(dlock.MaxTurnSlice + time.Millisecond)}},
		{"without renewal", []dlock.Option{dlock.WithTurnSlice(time.Millisecond), dlock.WithoutRenewal()}},
		{"with replica acknowledgement", []dlock.Option{dlock.WithTurnSlice(time.Millisecond), dlock.WithReplicaAck(1, time.Second)}},
		{"adaptive", []dlock.Option{dlock.WithTurnSlice(time.Millisecond), dlock.WithAdaptiveTTL(time.Second, 10*time.Second)}},
	} {
		_, err := c.Mutex(uniqueName(t), tc.opts...).Lock(ctx)
		if !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "WithTurnSlice") {
			t.Errorf("%s: %v, want ErrInvalid naming WithTurnSlice", tc.what, err)
		}
	}
	// Passed to a lock of a kind that takes no turns, it is refused; as a client's default it
	// applies to its Mutexes and leaves the other kinds alone.
	turn := dlock.WithTurnSlice(time.Millisecond)
	for what, lock := range map[string]func() error{
		"RWMutex":   func() error { _, err := c.RWMutex(uniqueName(t), turn).Lock(ctx); return err },
		"Semaphore": func() error { _, err := c.Semaphore(uniqueName(t), 2, turn).Acquire(ctx, 1); return err },
		"MultiMutex": func() error {
			_, err := c.MultiMutex([]string{uniqueName(t) + "a", uniqueName(t) + "b"}, turn).Lock(ctx)
			return err
		},
	} {
		if err := lock(); !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "WithTurnSlice") {
			t.Errorf("%s with WithTurnSlice: %v, want ErrInvalid naming WithTurnSlice", what, err)
		}
	}
	d := transports[0].dial(t, shared.URL(), turn)
	for what, lock := range map[string]func() (*dlock.Lease, error){
		"RWMutex":   func() (*dlock.Lease, error) { return d.RWMutex(uniqueName(t)).Lock(ctx) },
		"Semaphore": func() (*dlock.Lease, error) { return d.Semaphore(uniqueName(t), 2).Acquire(ctx, 1) },
		"MultiMutex": func() (*dlock.Lease, error) {
			return d.MultiMutex([]string{uniqueName(t) + "a", uniqueName(t) + "b"}).Lock(ctx)
		},
	} {
		l, err := lock()
		if err != nil {
			t.Errorf("%s of a client with a default turn slice: %v", what, err)
			continue
		}
		if err := l.Unlock(ctx); err != nil {
			t.Error(err)
		}
	}
}

// A client that waited for the lock gets a turn too: the turn begins when the grant reaches it,
// not when it queued, so its re-Lock right after its Unlock is local (the next token).
func TestTurnSlice_GrantedClientGetsItsTurn(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		s := redistest.Start(t)
		ctx := ctxT(t)
		turn := dlock.WithTurnSlice(500 * time.Millisecond)
		a, b := tr.dial(t, s.URL()), tr.dial(t, s.URL())
		held, err := a.Mutex("granted-turn", dlock.WithTurnSlice(0)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mb := b.Mutex("granted-turn", turn)
		got := make(chan *dlock.Lease, 1)
		errs := make(chan error, 1)
		go func() {
			l, err := mb.Lock(ctx)
			if err != nil {
				errs <- err
				return
			}
			got <- l
		}()
		waitFor(t, 10*time.Second, "b queued on the server", func(context.Context) error {
			if n := redisDo(t, s, "ZCARD", dlock.DefaultPrefix+"{granted-turn}:q"); n != "1" {
				return fmt.Errorf("%s queued", n)
			}
			return nil
		})
		// A wait longer than the slice before the grant: the turn must not count it.
		time.Sleep(600 * time.Millisecond)
		if err := held.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		var l *dlock.Lease
		select {
		case l = <-got:
		case err := <-errs:
			t.Fatal(err)
		case <-ctx.Done():
			t.Fatal("b never got the lock")
		}
		start := time.Now()
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		l2, err := mb.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if time.Since(start) < 400*time.Millisecond && l2.Token() != l.Token()+1 {
			t.Errorf("re-Lock after a granted hold: token %d, want %d (taken back within the turn)", l2.Token(), l.Token()+1)
		}
		if err := l2.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
