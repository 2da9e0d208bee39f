package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// Readers of three clients hold at once; writers hold alone. Every holder checks, inside its
// critical section, counters of the holders there with it.
func TestRWMutex_ReadersShareWritersExclude(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		var clients []*dlock.Client
		for range 3 {
			clients = append(clients, tr.dial(t, shared.URL()))
		}
		var readers, writers, maxReaders, overlaps, reads, writes atomic.Int64
		var wg sync.WaitGroup
		for i := range 12 {
			wg.Go(func() {
				rw := clients[i%3].RWMutex(name)
				for j := range 15 {
					write := (i+j)%5 == 0
					var l *dlock.Lease
					var err error
					if write {
						l, err = rw.Lock(ctx)
					} else {
						l, err = rw.RLock(ctx)
					}
					if err != nil {
						t.Error(err)
						return
					}
					if write {
						if writers.Add(1) != 1 || readers.Load() != 0 {
							overlaps.Add(1)
						}
						time.Sleep(time.Millisecond)
						writers.Add(-1)
						writes.Add(1)
					} else {
						n := readers.Add(1)
						if writers.Load() != 0 {
							overlaps.Add(1)
						}
						for {
							if m := maxReaders.Load(); n <= m || maxReaders.CompareAndSwap(m, n) {
								break
							}
						}
						time.Sleep(3 * time.Millisecond)
						readers.Add(-1)
						reads.Add(1)
					}
					if err := l.Unlock(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		t.Logf("%d reads, %d writes; at most %d readers at once", reads.Load(), writes.Load(), maxReaders.Load())
		if overlaps.Load() != 0 {
			t.Fatalf("%d times a writer held with another holder", overlaps.Load())
		}
		if maxReaders.Load() < 2 {
			t.Errorf("readers never held at once (at most %d)", maxReaders.Load())
		}
		if reads.Load()+writes.Load() != 12*15 {
			t.Errorf("%d holds, want %d", reads.Load()+writes.Load(), 12*15)
		}
	})
}

// A writer that waits is served before readers that come after it: while a continuous stream of
// overlapping readers (from two clients) holds the lock, a writer still gets it, within a bound
// far below the stream's length, and new readers are refused while it waits.
func TestRWMutex_WriterNotStarved(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		readerClients := []*dlock.Client{tr.dial(t, shared.URL()), tr.dial(t, shared.URL())}
		writer := tr.dial(t, shared.URL())
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var reads atomic.Int64
		for i := range 8 {
			wg.Go(func() {
				rw := readerClients[i%2].RWMutex(name)
				for {
					select {
					case <-stop:
						return
					default:
					}
					l, err := rw.RLock(ctx)
					if err != nil {
						t.Error(err)
						return
					}
					reads.Add(1)
					time.Sleep(20 * time.Millisecond) // overlapping holds: never a moment without a reader
					l.Unlock(ctx)
				}
			})
		}
		defer func() {
			close(stop)
			wg.Wait()
		}()
		waitFor(t, 10*time.Second, "the reader stream", func(context.Context) error {
			if reads.Load() < 20 {
				return errors.New("fewer than 20 reads yet")
			}
			return nil
		})
		start := time.Now()
		got := make(chan *dlock.Lease, 1)
		go func() {
			l, err := writer.RWMutex(name).Lock(ctx)
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		select {
		case l := <-got:
			t.Logf("the writer waited %v under a stream of 8 readers holding 20 ms each (%d reads so far)", time.Since(start), reads.Load())
			if l == nil {
				t.FailNow()
			}
			if _, err := writer.RWMutex(name).TryRLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
				t.Errorf("TryRLock while the writer holds = %v, want ErrNotAcquired", err)
			}
			l.Unlock(ctx)
		case <-time.After(20 * time.Second):
			t.Fatal("the writer waited more than 20 s under the reader stream: starved")
		}
		// A reader that comes while a writer waits waits behind it.
		hold, err := readerClients[0].RWMutex(name).RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		close(stop)
		wg.Wait()
		stop = make(chan struct{})
		go func() {
			l, err := writer.RWMutex(name).Lock(ctx)
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		waitFor(t, 10*time.Second, "the writer queued", func(ctx context.Context) error {
			info, err := writer.Inspect(ctx, name)
			if err != nil || info.Shared == nil || info.Shared.WritersQueued != 1 {
				return errors.New("no writer in the queue yet")
			}
			return nil
		})
		if _, err := readerClients[1].RWMutex(name).TryRLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("TryRLock while a writer waits = %v, want ErrNotAcquired", err)
		} else if !strings.Contains(err.Error(), "1 waiting (1 writer)") {
			t.Errorf("TryRLock's error does not say a writer waits: %v", err)
		}
		hold.Unlock(ctx)
		if l := <-got; l != nil {
			l.Unlock(ctx)
		}
	})
}

// A writer takes read holds under its write hold (downgrade): at once, with its token; once the
// write hold is unlocked the read hold remains, and other readers (not writers) join it.
func TestRWMutex_Downgrade(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c, other := tr.dial(t, shared.URL()), tr.dial(t, shared.URL())
		w, err := c.RWMutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r, err := c.RWMutex(name).RLock(w.Context())
		if err != nil {
			t.Fatalf("RLock under the write lock: %v", err)
		}
		if r.Token() != w.Token() {
			t.Errorf("read hold under the writer has token %d, want the writer's %d", r.Token(), w.Token())
		}
		if _, err := other.RWMutex(name).TryRLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("another client's TryRLock while the writer holds = %v, want ErrNotAcquired", err)
		}
		if err := w.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if r.Context().Err() != nil {
			t.Fatalf("the read hold ended with the write hold: %v", context.Cause(r.Context()))
		}
		ro, err := other.RWMutex(name).TryRLock(ctx)
		if err != nil {
			t.Fatalf("another reader after the downgrade: %v", err)
		}
		if _, err := other.RWMutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("TryLock while the downgraded reader holds = %v, want ErrNotAcquired", err)
		}
		ro.Unlock(ctx)
		if err := r.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if l, err := other.RWMutex(name).TryLock(ctx); err != nil {
			t.Fatalf("TryLock once every reader left: %v", err)
		} else {
			l.Unlock(ctx)
		}
	})
}

// A read hold asking to write through its context fails at once (it would deadlock with
// another reader doing the same), with ErrInvalid and a message that says why.
func TestRWMutex_UpgradeRefused(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL())
		r, err := c.RWMutex(name).RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Unlock(ctx)
		for what, lock := range map[string]func(context.Context) (*dlock.Lease, error){
			"Lock": c.RWMutex(name).Lock, "TryLock": c.RWMutex(name).TryLock,
		} {
			_, err := lock(r.Context())
			if !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "upgraded") {
				t.Errorf("%s through a read lease's context = %v, want ErrInvalid saying it cannot be upgraded", what, err)
			}
		}
		if err := c.DoWrite(r.Context(), name, func(context.Context) error { return nil }); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("DoWrite through a read lease's context = %v, want ErrInvalid", err)
		}
	})
}

// Re-entry through a lease's context: same token, one more hold; the lock is free after the
// last Unlock. A re-entry asking for another lease is ErrInvalid.
func TestRWMutex_Reentry(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c, other := tr.dial(t, shared.URL()), tr.dial(t, shared.URL())
		for _, write := range []bool{false, true} {
			lock := c.RWMutex(name).RLock
			if write {
				lock = c.RWMutex(name).Lock
			}
			outer, err := lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			inner, err := lock(outer.Context())
			if err != nil {
				t.Fatal(err)
			}
			if inner.Token() != outer.Token() {
				t.Errorf("write=%v: re-entered token %d, want %d", write, inner.Token(), outer.Token())
			}
			if _, err := c.RWMutex(name, dlock.WithTTL(time.Minute)).RLock(outer.Context()); !errors.Is(err, dlock.ErrInvalid) {
				t.Errorf("write=%v: re-entry with another TTL = %v, want ErrInvalid", write, err)
			}
			if err := outer.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := other.RWMutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
				t.Fatalf("write=%v: TryLock with one hold left = %v, want ErrNotAcquired", write, err)
			}
			if err := inner.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			l, err := other.RWMutex(name).TryLock(ctx)
			if err != nil {
				t.Fatalf("write=%v: TryLock after the last Unlock: %v", write, err)
			}
			l.Unlock(ctx)
		}
	})
}

// Fencing tokens: every writer's token is larger than every earlier writer's and reader's; a
// reader's token is that of the last writer before it.
func TestRWMutex_Tokens(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL())
		rw := c.RWMutex(name)
		var lastWrite, highest uint64
		for i := range 20 {
			if i%4 == 0 {
				w, err := rw.Lock(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if w.Token() <= highest {
					t.Fatalf("writer token %d, want > every earlier token (%d)", w.Token(), highest)
				}
				lastWrite, highest = w.Token(), w.Token()
				w.Unlock(ctx)
				continue
			}
			r1, err := rw.RLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			r2, err := rw.RLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if r1.Token() != lastWrite || r2.Token() != lastWrite {
				t.Fatalf("reader tokens %d, %d, want the last writer's %d", r1.Token(), r2.Token(), lastWrite)
			}
			r1.Unlock(ctx)
			r2.Unlock(ctx)
		}
	})
}

// Each hold is renewed by the client's renewal loop through several lease periods, and a lost
// hold (force-unlocked) cancels its lease context with ErrLost.
func TestRWMutex_RenewedAndLost(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL(), dlock.WithTTL(500*time.Millisecond))
		rw := c.RWMutex(name)
		r1, err := rw.RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := rw.RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(1700 * time.Millisecond) // five renewal periods
		for time.Now().Before(deadline) {
			if r1.Context().Err() != nil || r2.Context().Err() != nil {
				t.Fatalf("a read hold was lost while its client renewed it: %v %v", context.Cause(r1.Context()), context.Cause(r2.Context()))
			}
			time.Sleep(20 * time.Millisecond)
		}
		if _, err := c.ForceUnlock(ctx, name); err != nil {
			t.Fatalf("%v (the hash: %q)", err, redisDo(t, shared, "HGETALL", keyOf(name)+":rw"))
		}
		for _, l := range []*dlock.Lease{r1, r2} {
			select {
			case <-l.Context().Done():
				if !errors.Is(context.Cause(l.Context()), dlock.ErrLost) {
					t.Errorf("cause %v, want ErrLost", context.Cause(l.Context()))
				}
			case <-time.After(5 * time.Second):
				t.Fatal("a force-unlocked read hold's context was not cancelled")
			}
			if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrLost) {
				t.Errorf("Unlock of a lost hold = %v, want ErrLost", err)
			}
		}
	})
}

// A reader killed while holding (SIGKILL) frees its share within its TTL: a writer gets the lock
// then, while another reader's hold, renewed, is untouched.
func TestRWMutex_KilledReaderFreesItsShare(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		const ttl = 500 * time.Millisecond
		ctx := ctxT(t)
		name := uniqueName(t)
		h, _ := startHelper(t, "rw-read", shared.URL(), name, ttl)
		c := tr.dial(t, shared.URL(), dlock.WithTTL(2*time.Second)) // the live reader: a lease a busy machine cannot miss
		r, err := c.RWMutex(name).RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan time.Time, 1)
		go func() {
			w, err := tr.dial(t, shared.URL()).RWMutex(name).Lock(ctx)
			if err != nil {
				t.Error(err)
				got <- time.Time{}
				return
			}
			got <- time.Now()
			w.Unlock(ctx)
		}()
		waitFor(t, 10*time.Second, "the writer queued", func(ctx context.Context) error {
			if info, err := c.Inspect(ctx, name); err != nil || info.Shared == nil || info.Shared.WritersQueued != 1 {
				return errors.New("no writer queued yet")
			}
			return nil
		})
		h.signal(t, syscall.SIGKILL)
		killed := time.Now()
		waitFor(t, 10*time.Second, "the killed reader's share freed", func(ctx context.Context) error {
			if info, err := c.Inspect(ctx, name); err != nil || info.Shared == nil || info.Shared.Readers != 1 {
				return fmt.Errorf("%+v, %v", info.Shared, err)
			}
			return nil
		})
		freed := time.Since(killed)
		t.Logf("the killed reader's share was gone %v after the SIGKILL (ttl %v)", freed, ttl)
		if freed > ttl+250*time.Millisecond {
			t.Errorf("share freed %v after the crash, want <= ttl + 250ms = %v", freed, ttl+250*time.Millisecond)
		}
		if r.Context().Err() != nil {
			t.Fatalf("the live reader lost its hold: %v", context.Cause(r.Context()))
		}
		r.Unlock(ctx) // the writer, queued, gets it now
		if at := <-got; at.IsZero() {
			t.FailNow()
		}
	})
}

// Bad input is refused with ErrInvalid before any I/O: names, TTLs, a nil client, nil
// functions; a quorum client has no read-write locks, semaphores or latches, and every call on
// one says so at once.
func TestRWMutex_BadInput(t *testing.T) {
	ctx := context.Background()
	var nilClient *dlock.Client
	if _, err := nilClient.RWMutex("x").RLock(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("nil client: %v, want ErrInvalid", err)
	}
	var nilRW *dlock.RWMutex
	if _, err := nilRW.Lock(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("nil RWMutex: %v, want ErrInvalid", err)
	}
	needShared(t)
	c := transports[0].dial(t, shared.URL())
	for what, rw := range map[string]*dlock.RWMutex{
		"empty name":     c.RWMutex(""),
		"long name":      c.RWMutex(strings.Repeat("x", dlock.MaxNameLen+1)),
		"short TTL":      c.RWMutex("x", dlock.WithTTL(time.Millisecond)),
		"long TTL":       c.RWMutex("x", dlock.WithTTL(time.Hour)),
		"negative wait":  c.RWMutex("x", dlock.WithWait(-1)),
		"long label":     c.RWMutex("x", dlock.WithLabel(strings.Repeat("l", 300))),
		"replica ack 0s": c.RWMutex("x", dlock.WithReplicaAck(1, 0)),
		"adaptive lease": c.RWMutex("x", dlock.WithAdaptiveTTL(100*time.Millisecond, time.Second)),
	} {
		for _, lock := range []func(context.Context) (*dlock.Lease, error){rw.RLock, rw.TryRLock, rw.Lock, rw.TryLock} {
			if _, err := lock(ctx); !errors.Is(err, dlock.ErrInvalid) {
				t.Errorf("%s: %v, want ErrInvalid", what, err)
			}
		}
	}
	if err := c.DoRead(ctx, "x", nil); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("DoRead(nil fn) = %v, want ErrInvalid", err)
	}
	if err := c.DoWrite(ctx, "x", nil); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("DoWrite(nil fn) = %v, want ErrInvalid", err)
	}
	c.Close()
	if _, err := c.RWMutex("x").RLock(ctx); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("closed client: %v, want ErrClosed", err)
	}
	q, err := dlock.DialQuorum(ctx, urlsOf(serverAddrs(startN(t, 3))...))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	for what, f := range map[string]func() error{
		"RLock":           func() error { _, err := q.RWMutex("x").RLock(ctx); return err },
		"TryLock":         func() error { _, err := q.RWMutex("x").TryLock(ctx); return err },
		"DoWrite":         func() error { return q.DoWrite(ctx, "x", func(context.Context) error { return nil }) },
		"Acquire":         func() error { _, err := q.Semaphore("x", 2).Acquire(ctx, 1); return err },
		"DoAcquire":       func() error { return q.DoAcquire(ctx, "x", 2, 1, func(context.Context) error { return nil }) },
		"ResizeSemaphore": func() error { _, err := q.ResizeSemaphore(ctx, "x", 3); return err },
		"Latch.CountDown": func() error { return q.Latch("x", 2).CountDown(ctx) },
		"Latch.Wait":      func() error { return q.Latch("x", 2).Wait(ctx) },
	} {
		if err := f(); !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "quorum") {
			t.Errorf("quorum mode, %s: %v, want ErrInvalid naming quorum mode", what, err)
		}
	}
}

// DoRead and DoWrite run fn under the hold and release it after; a read inside a write (through
// fn's context) is a downgrade.
func TestRWMutex_DoReadDoWrite(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c, other := tr.dial(t, shared.URL()), tr.dial(t, shared.URL())
		ran := 0
		err := c.DoWrite(ctx, name, func(ctx context.Context) error {
			ran++
			if _, err := other.RWMutex(name).TryRLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
				t.Errorf("TryRLock inside DoWrite = %v, want ErrNotAcquired", err)
			}
			return c.DoRead(ctx, name, func(ctx context.Context) error {
				ran++
				if _, ok := dlock.TokenFromContext(ctx); !ok {
					t.Error("no token in DoRead's context")
				}
				return nil
			})
		})
		if err != nil || ran != 2 {
			t.Fatalf("DoWrite = %v after %d functions ran, want nil after 2", err, ran)
		}
		if l, err := other.RWMutex(name).TryLock(ctx); err != nil {
			t.Fatalf("TryLock after DoWrite: %v", err)
		} else {
			l.Unlock(ctx)
		}
	})
}
