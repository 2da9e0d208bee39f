package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// Three of five servers frozen (SIGSTOP: their connections hang): TryLock fails fast with an
// error that says the servers did not answer, whatever the TTL, and within the caller's
// context; a waiting Lock keeps waiting and succeeds once the servers answer again. With two
// frozen, locking works.
func TestQuorum_FrozenMajority(t *testing.T) {
	for _, tr := range quorumTransports {
		t.Run(tr.name, func(t *testing.T) {
			srv := startN(t, 5)
			ctx := ctxT(t)
			c := tr.dial(t, serverAddrs(srv))
			srv[3].Pause()
			srv[4].Pause()
			t.Cleanup(func() {
				for _, s := range srv {
					s.Resume()
				}
			})
			l, err := c.Mutex(uniqueName(t), dlock.WithTTL(3*time.Second)).TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock with 2 of 5 frozen: %v", err)
			}
			l.Unlock(ctx)

			srv[2].Pause()
			for _, ttl := range []time.Duration{3 * time.Second, 30 * time.Second} {
				start := time.Now()
				_, err := c.Mutex(uniqueName(t), dlock.WithTTL(ttl)).TryLock(ctx)
				took := time.Since(start)
				if !errors.Is(err, dlock.ErrNoQuorum) {
					t.Fatalf("TryLock (TTL %v) with 3 of 5 frozen = %v, want ErrNoQuorum", ttl, err)
				}
				t.Logf("TTL %v: failed after %v: %v", ttl, took, err)
				if took > time.Second {
					t.Fatalf("TryLock (TTL %v) with 3 of 5 frozen took %v to fail", ttl, took)
				}
			}
			short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			start := time.Now()
			_, err = c.Mutex(uniqueName(t), dlock.WithTTL(30*time.Second)).Lock(short)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Lock under a 300 ms context with 3 of 5 frozen = %v, want the deadline", err)
			}
			if took := time.Since(start); took > 2*time.Second {
				t.Fatalf("Lock under a 300 ms context returned after %v", took)
			}

			name := uniqueName(t)
			got := make(chan error, 1)
			go func() {
				l, err := c.Mutex(name).Lock(ctx)
				if err == nil {
					err = l.Unlock(ctx)
				}
				got <- err
			}()
			select {
			case err := <-got:
				t.Fatalf("Lock returned %v with 3 of 5 frozen, want it to wait", err)
			case <-time.After(300 * time.Millisecond):
			}
			srv[2].Resume()
			select {
			case err := <-got:
				if err != nil {
					t.Fatalf("Lock after a server came back: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Lock still waiting 10 s after a majority answered again")
			}
		})
	}
}
