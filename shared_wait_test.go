package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// Waiting for a read-write lock or a semaphore costs what waiting for a Mutex costs: a waiter
// sends nothing but its queue entry's keep-alive while the holder lives, is woken by the
// release long before the holder's lease would run out, and many waiters add no connection.
func TestShared_WaitingWithoutPollingOrConnections(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		for _, kind := range []string{"rw", "sem"} {
			t.Run(kind, func(t *testing.T) {
				ctx := ctxT(t)
				name := uniqueName(t)
				holder := tr.dial(t, shared.URL(), dlock.WithTTL(30*time.Second))
				waiter := tr.dial(t, shared.URL())
				// take is what the waiters do; the holder keeps every unit meanwhile.
				var take func(ctx context.Context) (*dlock.Lease, error)
				var l *dlock.Lease
				var err error
				if kind == "rw" {
					l, err = holder.RWMutex(name).Lock(ctx)
					take = waiter.RWMutex(name).RLock
				} else {
					l, err = holder.Semaphore(name, 2).Acquire(ctx, 2)
					take = func(ctx context.Context) (*dlock.Lease, error) { return waiter.Semaphore(name, 2).Acquire(ctx, 1) }
				}
				if err != nil {
					t.Fatal(err)
				}
				got := make(chan *dlock.Lease, 1)
				go func() {
					lw, err := take(ctx)
					if err != nil {
						t.Error(err)
					}
					got <- lw
				}()
				channel := keyOf(name) + ":" + kind + ":rel"
				waitFor(t, 10*time.Second, "the waiter's subscription and queue entry", func(ctx context.Context) error {
					if out := redisDo(t, shared, "PUBSUB", "NUMSUB", channel); !strings.HasSuffix(out, "\n1") {
						return fmt.Errorf("PUBSUB NUMSUB %s: %q", channel, out)
					}
					if info, err := holder.Inspect(ctx, name); err != nil || info.Shared == nil || info.Shared.Queued != 1 {
						return errors.New("not queued yet")
					}
					return nil
				})
				before := evalCalls(t)
				time.Sleep(300 * time.Millisecond) // the waiter is idle here; count what it sends
				idle := evalCalls(t) - before
				// Many more waiters of one client: no connection each.
				base := connectedClients(t)
				wctx, cancel := context.WithCancel(ctx)
				var wg sync.WaitGroup
				errs := make(chan error, 100)
				for range 100 {
					wg.Go(func() {
						lw, err := take(wctx)
						if err == nil {
							lw.Unlock(ctx)
						}
						errs <- err
					})
				}
				waitFor(t, 20*time.Second, "101 callers queued", func(ctx context.Context) error {
					if info, err := holder.Inspect(ctx, name); err != nil || info.Shared == nil || info.Shared.Queued != 101 {
						return fmt.Errorf("%+v, %v", info.Shared, err)
					}
					return nil
				})
				// Each of them made an attempt of its own, so a pool may have opened a few
				// connections for that burst; a connection per waiter would be 100 more.
				if n := connectedClients(t); n > base+8 {
					t.Errorf("connections grew from %d to %d with 100 more waiters", base, n)
				} else {
					t.Logf("connections %d with 1 waiter, %d with 101", base, n)
				}
				cancel()
				wg.Wait()
				close(errs)
				for err := range errs {
					if !errors.Is(err, dlock.ErrNotAcquired) && !errors.Is(err, context.Canceled) {
						t.Errorf("a cancelled waiter: %v, want its context's end", err)
					}
				}
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
				t.Logf("%d scripts in 300 ms of waiting; granted %v after the release", idle, wake)
				// Allowed, as for a Mutex: the attempt after the subscription is confirmed and
				// the refreshes of the queue entry (one per third of its 1 s window).
				if idle > 3 {
					t.Errorf("the waiter sent %d scripts in 300ms of waiting, want at most 3 (no polling)", idle)
				}
				if wake > time.Second {
					t.Errorf("waiter granted %v after the release, want well under a second (lease was 30s)", wake)
				}
			})
		}
	})
}

// The holds of read-write locks and semaphores are renewed by the client's one loop, in
// batches: many held cost no goroutine each and a handful of script calls per period.
func TestShared_RenewalBatchedNoGoroutinePerHold(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		const (
			holds  = 1000
			ttl    = time.Second
			window = 3 * time.Second
		)
		ctx := ctxT(t)
		s := redistest.Start(t)
		// The client's log (renewal rounds at DEBUG, failed rounds at WARN) is shown if the
		// count is off: it says whether rounds failed and were retried.
		logs := &logBuffer{}
		// The renewals the loop sends (retries of a failed round included): each script call
		// must carry many of them, whatever the machine's load makes of the rounds.
		var sent atomic.Int64
		c := tr.dial(t, s.URL(), dlock.WithTTL(ttl),
			dlock.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))),
			dlock.WithObserver(dlock.Observer{Renewal: func(ev dlock.RenewalEvent) { sent.Add(int64(ev.Leases)) }}))
		held := make([]*dlock.Lease, 0, holds)
		for i := range holds / 2 {
			r, err := c.RWMutex(fmt.Sprintf("rw-%d", i%50)).TryRLock(ctx) // 10 readers on each of 50 locks
			if err != nil {
				t.Fatal(err)
			}
			p, err := c.Semaphore(fmt.Sprintf("sem-%d", i), 3).TryAcquire(ctx, 2)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, r, p)
		}
		if n := dlockGoroutines(); n < 2 || n > 3 {
			t.Errorf("%d dlock goroutines while holding %d read holds and permits, want the loop, its sender and at most the subscription", n, holds)
		}
		before, sentBefore := scriptCalls(t, s), sent.Load()
		time.Sleep(window)
		calls, renewals := scriptCalls(t, s)-before, sent.Load()-sentBefore
		periods := float64(window) / float64(ttl/3)
		perHundred := float64(calls) / (float64(renewals) / 100)
		t.Logf("%d holds, %v (%.0f periods): %d renewals sent in %d script calls = %.2f calls per 100 renewals", holds, window, periods, renewals, calls, perHundred)
		if renewals < holds {
			t.Errorf("%d renewals sent in %v, want at least one round of %d", renewals, window, holds)
		}
		if perHundred > 1 {
			lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
			var rounds []string
			for _, l := range lines {
				if strings.Contains(l, "renew") || strings.Contains(l, "level=WARN") {
					rounds = append(rounds, l)
				}
			}
			t.Errorf("%.2f renew calls per 100 renewals, want <= 1; the client's renewal log (last 40 lines):\n%s",
				perHundred, strings.Join(rounds[max(len(rounds)-40, 0):], "\n"))
		}
		for _, l := range held {
			if err := l.Context().Err(); err != nil {
				t.Fatalf("hold on %s lost while renewed in batches: %v", l.Name(), context.Cause(l.Context()))
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// WithPrefix applies to read-write locks and semaphores as to a Mutex: their keys and channel
// live under the client's prefix, and nothing under the default one.
func TestShared_Prefix(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		const prefix = "dlock:app7:"
		c := tr.dial(t, shared.URL(), dlock.WithPrefix(prefix))
		r, err := c.RWMutex(name).RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		p, err := c.Semaphore(name, 2).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		key := prefix + strings.TrimPrefix(keyOf(name), dlock.DefaultPrefix)
		if n := redisDo(t, shared, "EXISTS", key+":rw", key+":sem"); n != "2" {
			t.Errorf("%s of %s:rw and :sem exist, want both", n, key)
		}
		if n := redisDo(t, shared, "EXISTS", keyOf(name)+":rw", keyOf(name)+":sem"); n != "0" {
			t.Errorf("%s keys under the default prefix, want none", n)
		}
		if w, err := tr.dial(t, shared.URL()).RWMutex(name).TryLock(ctx); err != nil {
			t.Errorf("the same name under the default prefix is another lock: TryLock = %v", err)
		} else {
			w.Unlock(ctx)
		}
		if info, err := c.Inspect(ctx, name); err != nil || info.Shared == nil || info.Shared.Readers != 1 {
			t.Errorf("Inspect through the prefixed client: %+v, %v; want the read-write lock with 1 reader", info.Shared, err)
		}
		r.Unlock(ctx)
		p.Unlock(ctx)
	})
}

// WithWait bounds a read-write lock's or semaphore's wait as a Mutex's: a wait that runs out is
// a *NotAcquiredError (not a context error) naming the holder, and leaves no queue entry
// behind; WithWait(0) makes one attempt; a wait the caller's context ends is both busy and
// the context's error.
func TestShared_WithWait(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		for _, kind := range []string{"rw", "sem"} {
			t.Run(kind, func(t *testing.T) {
				ctx := ctxT(t)
				name := uniqueName(t)
				holder := tr.dial(t, shared.URL(), dlock.WithLabel("the-holder"))
				other := tr.dial(t, shared.URL())
				var l *dlock.Lease
				var err error
				take := func(opts ...dlock.Option) func(context.Context) (*dlock.Lease, error) {
					return other.RWMutex(name, opts...).RLock
				}
				if kind == "rw" {
					l, err = holder.RWMutex(name).Lock(ctx)
				} else {
					l, err = holder.Semaphore(name, 2).Acquire(ctx, 2)
					take = func(opts ...dlock.Option) func(context.Context) (*dlock.Lease, error) {
						return func(ctx context.Context) (*dlock.Lease, error) {
							return other.Semaphore(name, 2, opts...).Acquire(ctx, 1)
						}
					}
				}
				if err != nil {
					t.Fatal(err)
				}
				defer l.Unlock(ctx)
				start := time.Now()
				_, err = take(dlock.WithWait(200 * time.Millisecond))(ctx)
				took := time.Since(start)
				var na *dlock.NotAcquiredError
				if !errors.As(err, &na) || !errors.Is(err, dlock.ErrNotAcquired) || errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("WithWait(200ms) on a held %s = %v, want a *NotAcquiredError that is not a context error", kind, err)
				}
				if took < 200*time.Millisecond || took > 5*time.Second || na.Waited < 200*time.Millisecond {
					t.Fatalf("waited %v (error says %v), want about 200 ms", took, na.Waited)
				}
				if na.Holder.Holder.Label != "the-holder" || na.Holder.Token != l.Token() || !strings.Contains(err.Error(), "the-holder") {
					t.Fatalf("error %q (%+v): want the holder's label and token %d", err, na.Holder, l.Token())
				}
				waitFor(t, 10*time.Second, "the gone waiter's queue entry withdrawn", func(ctx context.Context) error {
					if info, err := holder.Inspect(ctx, name); err != nil || info.Shared == nil || info.Shared.Queued != 0 {
						return fmt.Errorf("%+v, %v", info.Shared, err)
					}
					return nil
				})
				start = time.Now()
				if _, err := take(dlock.WithWait(0))(ctx); !errors.Is(err, dlock.ErrNotAcquired) || time.Since(start) > 2*time.Second {
					t.Fatalf("WithWait(0) = %v after %v, want ErrNotAcquired at once", err, time.Since(start))
				}
				cctx, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
				_, err = take()(cctx)
				cancel()
				if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("a wait ended by its context = %v, want ErrNotAcquired and DeadlineExceeded", err)
				}
			})
		}
	})
}
