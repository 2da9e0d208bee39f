package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// WithReplicaAck on read-write locks and semaphores, through Sentinel: a hold counts once a
// replica has it; with the replicas paused, held leases are lost (their renewals are not
// acknowledged) and new holds fail with ErrReplicaAck, leaving nothing held on the master; a
// grant to a waiter is acknowledged before it counts.
func TestReplicaAck_RWMutexAndSemaphore(t *testing.T) {
	g := redistest.NewSentinel(t)
	ctx := ctxT(t)
	for _, tr := range sentinelTransports[1:] {
		t.Run(tr.name, func(t *testing.T) {
			c := tr.dial(t, g, dlock.WithTTL(600*time.Millisecond), dlock.WithReplicaAck(1, 100*time.Millisecond))
			name := uniqueName(t)
			r, err := c.RWMutex(name).RLock(ctx)
			if err != nil {
				t.Fatalf("RLock with replicas up: %v", err)
			}
			// A writer waits; the reader's release grants it, acknowledged before it counts.
			got := make(chan error, 1)
			go func() {
				w, err := c.RWMutex(name).Lock(ctx)
				if err == nil {
					err = w.Unlock(ctx)
				}
				got <- err
			}()
			waitFor(t, 10*time.Second, "the writer queued", func(ctx context.Context) error {
				if info, err := c.Inspect(ctx, name); err != nil || info.Shared == nil || info.Shared.WritersQueued != 1 {
					return errors.New("no writer queued yet")
				}
				return nil
			})
			if err := r.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Fatalf("the granted writer: %v", err)
			}
			p, err := c.Semaphore(name, 2).Acquire(ctx, 1)
			if err != nil {
				t.Fatalf("Acquire with replicas up: %v", err)
			}
			for _, rp := range g.Replicas() {
				if err := rp.Pause(); err != nil {
					t.Fatal(err)
				}
			}
			resumed := false
			resume := func() {
				if !resumed {
					resumed = true
					for _, rp := range g.Replicas() {
						rp.Resume()
					}
				}
			}
			defer resume()
			select {
			case <-p.Context().Done():
			case <-time.After(5 * time.Second):
				t.Fatal("permits with unacknowledged renewals not lost")
			}
			if !errors.Is(context.Cause(p.Context()), dlock.ErrLost) {
				t.Fatalf("cause %v, want ErrLost", context.Cause(p.Context()))
			}
			p.Unlock(ctx)
			other := uniqueName(t)
			if _, err := c.Semaphore(other, 2).Acquire(ctx, 1); !errors.Is(err, dlock.ErrReplicaAck) {
				t.Fatalf("Acquire with replicas paused = %v, want ErrReplicaAck", err)
			}
			if _, err := c.RWMutex(other).TryLock(ctx); !errors.Is(err, dlock.ErrReplicaAck) {
				t.Fatalf("TryLock with replicas paused = %v, want ErrReplicaAck", err)
			}
			if info, err := c.Inspect(ctx, other); err != nil || info.Held {
				t.Fatalf("unacknowledged hold left on the master: %+v, %v", info, err)
			}
			resume()
			l, err := c.Semaphore(other, 2).Acquire(ctx, 2)
			if err != nil {
				t.Fatalf("Acquire after the replicas resumed: %v", err)
			}
			l.Unlock(ctx)
		})
	}
}
