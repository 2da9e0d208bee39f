package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// semKey is the hash of the semaphore called name under the default prefix (docs/PROTOCOL.md).
func semKey(name string) string { return keyOf(name) + ":sem" }

// Four processes (two through each transport) of 16 goroutines each take 1 or 2 permits of a
// semaphore of 5 over and over; inside the critical section each adds its permits to a counter
// in Redis and checks it: the count never exceeds the size.
func TestSemaphore_NeverOverSize(t *testing.T) {
	needShared(t)
	const size, procs, goroutines, rounds = 5, 4, 16, 12
	name := uniqueName(t)
	var hs []*helperProc
	for i := range procs {
		tr := "rueidis"
		if i%2 == 1 {
			tr = "goredis"
		}
		hs = append(hs, spawnHelper(t, "sem-stress", shared.URL(), name, 10*time.Second,
			"DLOCK_TRANSPORT="+tr, "DLOCK_ADMIN_URL="+shared.URLAs(adminUser, adminPassword),
			"DLOCK_SIZE="+strconv.Itoa(size), "DLOCK_MAXN=2", "DLOCK_GOROUTINES="+strconv.Itoa(goroutines),
			"DLOCK_ROUNDS="+strconv.Itoa(rounds)))
	}
	start := time.Now()
	var holds, top int
	for i, h := range hs {
		for {
			line := h.next(t, 3*time.Minute)
			if line == "ready" {
				continue
			}
			var n, m int
			if _, err := fmt.Sscanf(line, "done %d %d", &n, &m); err == nil {
				holds += n
				top = max(top, m)
				break
			}
			t.Errorf("process %d: %s", i, line) // over, lost or error
		}
	}
	t.Logf("%d holds by %d processes × %d goroutines in %v; at most %d of %d permits counted at once",
		holds, procs, goroutines, time.Since(start).Round(time.Millisecond), top, size)
	if holds != procs*goroutines*rounds {
		t.Errorf("%d holds, want %d", holds, procs*goroutines*rounds)
	}
	if top > size || top < 2 {
		t.Errorf("at most %d permits counted at once, want between 2 and %d", top, size)
	}
	if v := redisDo(t, shared, "GET", name+":count"); v != "0" {
		t.Errorf("counter left at %s, want 0", v)
	}
}

// FIFO: a request for every permit, made while a stream of single-permit holds keeps the
// semaphore busy, is served within a bound (later small requests wait behind it), and
// TryAcquire fails while it waits.
func TestSemaphore_LargeRequestNotStarved(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		const size = 4
		ctx := ctxT(t)
		name := uniqueName(t)
		small := []*dlock.Client{tr.dial(t, shared.URL()), tr.dial(t, shared.URL())}
		big := tr.dial(t, shared.URL())
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var smallHolds atomic.Int64
		for i := range 8 {
			wg.Go(func() {
				s := small[i%2].Semaphore(name, size)
				for {
					select {
					case <-stop:
						return
					default:
					}
					l, err := s.Acquire(ctx, 1)
					if err != nil {
						t.Error(err)
						return
					}
					smallHolds.Add(1)
					time.Sleep(20 * time.Millisecond)
					l.Unlock(ctx)
				}
			})
		}
		defer func() {
			close(stop)
			wg.Wait()
		}()
		waitFor(t, 10*time.Second, "the stream of small holds", func(context.Context) error {
			if smallHolds.Load() < 20 {
				return errors.New("fewer than 20 holds yet")
			}
			return nil
		})
		start := time.Now()
		got := make(chan *dlock.Lease, 1)
		go func() {
			l, err := big.Semaphore(name, size).Acquire(ctx, size)
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		select {
		case l := <-got:
			if l == nil {
				t.FailNow()
			}
			t.Logf("a request for all %d permits waited %v under a stream of 8 single-permit holders", size, time.Since(start))
			if l.Permits() != size {
				t.Errorf("lease holds %d permits, want %d", l.Permits(), size)
			}
			if _, err := big.Semaphore(name, size).TryAcquire(ctx, 1); !errors.Is(err, dlock.ErrNotAcquired) {
				t.Errorf("TryAcquire while every permit is held = %v, want ErrNotAcquired", err)
			}
			l.Unlock(ctx)
		case <-time.After(20 * time.Second):
			t.Fatal("the request for every permit waited more than 20 s: starved")
		}
	})
}

// Waiting callers are served in the order they came: a request that does not fit keeps the
// smaller ones behind it waiting, and when permits free up they go to the first in line.
func TestSemaphore_FIFO(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL())
		s := c.Semaphore(name, 3)
		a, err := s.Acquire(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		b, err := s.Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var order []string
		var wg sync.WaitGroup
		leases := make(chan *dlock.Lease, 3)
		for i, n := range []int{3, 1, 1} {
			wg.Go(func() {
				l, err := tr.dial(t, shared.URL()).Semaphore(name, 3).Acquire(ctx, n)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				order = append(order, fmt.Sprintf("%d:%d", i, n))
				mu.Unlock()
				leases <- l
			})
			waitFor(t, 10*time.Second, "the request queued", func(ctx context.Context) error {
				if info, err := c.Inspect(ctx, name); err != nil || info.Shared == nil || info.Shared.Queued != i+1 {
					return fmt.Errorf("not %d queued yet", i+1)
				}
				return nil
			})
		}
		b.Unlock(ctx) // one permit free: the request for 3 is first and does not fit, so nobody moves
		if info, err := c.Inspect(ctx, name); err != nil || info.Shared.Queued != 3 || info.Shared.Permits != 2 {
			t.Fatalf("after one permit freed: %+v, %v; want 3 still queued and 2 permits held", info.Shared, err)
		}
		a.Unlock(ctx) // the request for 3 goes first, then both others together
		l := <-leases
		l.Unlock(ctx)
		(<-leases).Unlock(ctx)
		(<-leases).Unlock(ctx)
		wg.Wait()
		if order[0] != "0:3" {
			t.Errorf("served in the order %v, want the request for 3 first", order)
		}
	})
}

// A permit holder killed while holding (SIGKILL) frees its permits within its TTL; another
// holder's permits, renewed, stay held.
func TestSemaphore_KilledHolderFreesPermits(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		const ttl = 500 * time.Millisecond
		ctx := ctxT(t)
		name := uniqueName(t)
		h, _ := startSharedHelper(t, "sem-hold", name, ttl, "DLOCK_SIZE=3", "DLOCK_N=2")
		c := tr.dial(t, shared.URL(), dlock.WithTTL(2*time.Second)) // the live holder: a lease a busy machine cannot miss
		mine, err := c.Semaphore(name, 3).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer mine.Unlock(ctx)
		got := make(chan time.Time, 1)
		go func() {
			l, err := tr.dial(t, shared.URL()).Semaphore(name, 3).Acquire(ctx, 2)
			if err != nil {
				t.Error(err)
				got <- time.Time{}
				return
			}
			got <- time.Now()
			l.Unlock(ctx)
		}()
		waitFor(t, 10*time.Second, "the request queued", func(ctx context.Context) error {
			if info, err := c.Inspect(ctx, name); err != nil || info.Shared == nil || info.Shared.Queued != 1 {
				return errors.New("not queued yet")
			}
			return nil
		})
		h.signal(t, syscall.SIGKILL)
		killed := time.Now()
		at := <-got
		if at.IsZero() {
			t.FailNow()
		}
		waited := at.Sub(killed)
		t.Logf("the waiter got the killed holder's permits %v after the SIGKILL (ttl %v)", waited, ttl)
		if waited > ttl+250*time.Millisecond {
			t.Errorf("permits freed %v after the crash, want <= ttl + 250ms = %v", waited, ttl+250*time.Millisecond)
		}
		if mine.Context().Err() != nil {
			t.Errorf("the live holder lost its permit: %v", context.Cause(mine.Context()))
		}
	})
}

// startHelper with extra environment: the lease token from its "locked" line.
func startSharedHelper(t *testing.T, role, name string, ttl time.Duration, env ...string) (*helperProc, uint64) {
	t.Helper()
	h := spawnHelper(t, role, shared.URL(), name, ttl, env...)
	return h, h.locked(t, 20*time.Second)
}

// A SIGSTOPped holder of every permit loses its lease before anyone else can take one: the
// next holder gets a permit only once the paused lease ran out, and when the paused process
// resumes it learns of the loss before its next protected step.
func TestSemaphore_PausedHolderLosesLeaseFirst(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		const ttl = 300 * time.Millisecond
		ctx := ctxT(t)
		name := uniqueName(t)
		h, token := startSharedHelper(t, "sem-work", name, ttl, "DLOCK_SIZE=3")
		c := tr.dial(t, shared.URL())
		waitForWrites(t, name, 3)
		h.signal(t, syscall.SIGSTOP)
		l, err := c.Semaphore(name, 3).Acquire(ctx, 1) // waits out the paused holder's lease
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(context.Background())
		if l.Token() <= token {
			t.Fatalf("next holder's token %d, want > the paused holder's %d", l.Token(), token)
		}
		marker := "next-holder:" + strconv.FormatUint(l.Token(), 10)
		redisDo(t, shared, "RPUSH", name+":writes", marker)
		h.signal(t, syscall.SIGCONT)
		if line := h.next(t, 10*time.Second); !strings.HasPrefix(line, "lost "+dlock.ErrLost.Error()) {
			t.Fatalf("resumed holder said %q, want %q…", line, "lost "+dlock.ErrLost.Error())
		}
		// As for a Mutex: one write whose check came just before the SIGSTOP may land after the
		// resume (fencing tokens are for that one); never a second.
		writes := strings.Split(redisDo(t, shared, "LRANGE", name+":writes", "0", "-1"), "\n")
		for i, w := range writes {
			if w == marker && len(writes)-1-i > 1 {
				t.Fatalf("paused holder wrote %v after the next holder acquired", writes[i+1:])
			}
		}
	})
}

// Tokens of a semaphore are unique and increase with each acquisition, also when many are
// taken at once.
func TestSemaphore_Tokens(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL())
		s := c.Semaphore(name, 8)
		var mu sync.Mutex
		var tokens []uint64
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				var last uint64
				for range 10 {
					l, err := s.Acquire(ctx, 1)
					if err != nil {
						t.Error(err)
						return
					}
					if l.Token() <= last {
						t.Errorf("token %d after %d in one goroutine", l.Token(), last)
					}
					last = l.Token()
					mu.Lock()
					tokens = append(tokens, l.Token())
					mu.Unlock()
					l.Unlock(ctx)
				}
			})
		}
		wg.Wait()
		slices.Sort(tokens)
		if len(slices.Compact(slices.Clone(tokens))) != len(tokens) {
			t.Errorf("tokens repeat: %v", tokens)
		}
	})
}

// The size: a request above it fails at once (ErrInvalid), as do sizes out of range; a handle
// that declares another size than the one stored follows the stored one; ResizeSemaphore
// changes it and grants what now fits to the callers waiting.
func TestSemaphore_SizeAndResize(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL())
		for what, f := range map[string]func() error{
			"n > size":   func() error { _, err := c.Semaphore(name, 2).Acquire(ctx, 3); return err },
			"n = 0":      func() error { _, err := c.Semaphore(name, 2).TryAcquire(ctx, 0); return err },
			"size 0":     func() error { _, err := c.Semaphore(name, 0).Acquire(ctx, 1); return err },
			"huge size":  func() error { _, err := c.Semaphore(name, dlock.MaxSemaphoreSize+1).Acquire(ctx, 1); return err },
			"empty name": func() error { _, err := c.Semaphore("", 2).Acquire(ctx, 1); return err },
			"nil fn":     func() error { return c.DoAcquire(ctx, name, 2, 1, nil) },
			"resize 0":   func() error { _, err := c.ResizeSemaphore(ctx, name, 0); return err },
		} {
			if err := f(); !errors.Is(err, dlock.ErrInvalid) {
				t.Errorf("%s: %v, want ErrInvalid", what, err)
			}
		}
		var nilSem *dlock.Semaphore
		if _, err := nilSem.Acquire(ctx, 1); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("nil semaphore: %v, want ErrInvalid", err)
		}
		l, err := c.Semaphore(name, 2).Acquire(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		// A handle declaring 3 while 2 is stored follows the stored size: no third permit.
		if _, err := c.Semaphore(name, 3).TryAcquire(ctx, 1); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("a handle declaring 3 while 2 is stored and held: %v, want ErrNotAcquired", err)
		}
		if _, err := c.Semaphore(name, 3).TryAcquire(ctx, 3); !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "size of 2 on the server") {
			t.Fatalf("3 permits of a semaphore stored with 2: %v, want ErrInvalid naming the stored size", err)
		}
		got := make(chan *dlock.Lease, 1)
		go func() {
			l, err := tr.dial(t, shared.URL()).Semaphore(name, 2).Acquire(ctx, 1)
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		waitFor(t, 10*time.Second, "the request queued", func(ctx context.Context) error {
			if info, err := c.Inspect(ctx, name); err != nil || info.Shared == nil || info.Shared.Queued != 1 {
				return errors.New("not queued yet")
			}
			return nil
		})
		r, err := c.ResizeSemaphore(ctx, name, 3)
		if err != nil || r.Old != 2 || r.OldSticky || r.Size != 3 || !r.Sticky {
			t.Fatalf("ResizeSemaphore = %+v, %v; want 2 → 3, sticky", r, err)
		}
		waiter := <-got // granted by the resize: 2 + 1 fit in 3
		if waiter == nil {
			t.Fatal("the waiting request was not granted by the resize")
		}
		info, err := c.Inspect(ctx, name)
		if err != nil || info.Kind != dlock.KindSemaphore || info.Shared.Size != 3 || !info.Shared.SizeSticky || info.Shared.Permits != 3 {
			t.Fatalf("after the resize: %+v %+v, %v; want size 3, sticky, with 3 permits held", info, info.Shared, err)
		}
		waiter.Unlock(ctx)
		l.Unlock(ctx)
		l3, err := c.Semaphore(name, 2).TryAcquire(ctx, 3) // declared 2, stored 3: 3 fit
		if err != nil {
			t.Fatalf("3 permits through a handle declaring the old size: %v", err)
		}
		l3.Unlock(ctx)
	})
}

// A resized size is sticky: it outlives the last release (the hash has no expiry) where a size
// stored by use lapses with the token retention; ResetSemaphoreSize makes it ordinary again:
// at once gone when nobody holds the semaphore, else lapsing after the last release.
func TestSemaphore_StickySizeAndReset(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL(), dlock.WithTokenRetention(time.Second))
		name := uniqueName(t)
		r, err := c.ResizeSemaphore(ctx, name, 4) // nobody holds it yet
		if err != nil || r.Old != 0 || r.Size != 4 || r.Holders != 0 {
			t.Fatalf("ResizeSemaphore of a new name = %+v, %v; want created with 4, no holder", r, err)
		}
		l, err := c.Semaphore(name, 2).Acquire(ctx, 3) // declared 2: follows the stored 4
		if err != nil {
			t.Fatalf("3 permits under a sticky size of 4: %v", err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if pttl := redisDo(t, shared, "PTTL", semKey(name)); pttl != "-1" {
			t.Fatalf("PTTL of an idle semaphore with a sticky size = %s, want -1 (no expiry)", pttl)
		}
		info, err := c.Inspect(ctx, name)
		if err != nil || info.Shared == nil || info.Shared.Size != 4 || !info.Shared.SizeSticky {
			t.Fatalf("idle sticky semaphore: %+v, %v; want size 4, sticky", info.Shared, err)
		}
		r, err = c.ResizeSemaphore(ctx, name, 5)
		if err != nil || r.Old != 4 || !r.OldSticky || r.Size != 5 {
			t.Fatalf("second resize = %+v, %v; want 4 (sticky) → 5", r, err)
		}
		r, err = c.ResetSemaphoreSize(ctx, name)
		if err != nil || r.Old != 5 || r.Size != 0 || r.Sticky {
			t.Fatalf("reset of an idle semaphore = %+v, %v; want 5 → none", r, err)
		}
		if pttl, _ := strconv.Atoi(redisDo(t, shared, "PTTL", semKey(name))); pttl <= 0 || pttl > 1000 {
			t.Fatalf("PTTL after the reset = %d ms, want in (0, 1000] (the retention)", pttl)
		}
		if _, err := c.Semaphore(name, 2).TryAcquire(ctx, 3); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("3 permits after the reset, declared 2: %v, want ErrInvalid (the declared size counts again)", err)
		}
		// Reset while held: the size stays with the holder, then lapses as one stored by use.
		if _, err := c.ResizeSemaphore(ctx, name, 3); err != nil {
			t.Fatal(err)
		}
		l, err = c.Semaphore(name, 3).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		r, err = c.ResetSemaphoreSize(ctx, name)
		if err != nil || r.Old != 3 || r.Size != 3 || r.Sticky || r.Holders != 1 || r.Permits != 1 {
			t.Fatalf("reset of a held semaphore = %+v, %v; want size 3 kept, not sticky, 1 holder", r, err)
		}
		if pttl, _ := strconv.Atoi(redisDo(t, shared, "PTTL", semKey(name))); pttl <= 0 {
			t.Fatalf("PTTL after a reset while held = %d, want an expiry again", pttl)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if pttl, _ := strconv.Atoi(redisDo(t, shared, "PTTL", semKey(name))); pttl <= 0 || pttl > 1000 {
			t.Fatalf("PTTL after the last release = %d ms, want in (0, 1000] (the retention)", pttl)
		}
		if r, err := c.ResetSemaphoreSize(ctx, name); err != nil || r.OldSticky || r.Size != 3 {
			t.Fatalf("reset of a size stored by use = %+v, %v; want it left as it is", r, err)
		}
	})
}

// A live resize across processes: holders and waiters in helper processes whose handles declare
// the size of their start. Growing grants the waiters at once; shrinking below the permits held
// takes nothing from the holders, and no new acquisition is granted until the held ones fit;
// a handle declaring the old size keeps working.
func TestSemaphore_LiveResizeAcrossProcesses(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		const ttl = 500 * time.Millisecond
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL())
		env := func(size, n int) []string {
			return []string{"DLOCK_TRANSPORT=" + tr.name, "DLOCK_SIZE=" + strconv.Itoa(size), "DLOCK_N=" + strconv.Itoa(n)}
		}
		held := func(want int) {
			t.Helper()
			waitFor(t, 10*time.Second, fmt.Sprintf("%d permits held", want), func(ctx context.Context) error {
				info, err := c.Inspect(ctx, name)
				if err != nil || info.Shared == nil || info.Shared.Permits != want {
					return fmt.Errorf("%+v, %v", info.Shared, err)
				}
				return nil
			})
		}
		queued := func(want int) {
			t.Helper()
			waitFor(t, 10*time.Second, fmt.Sprintf("%d queued", want), func(ctx context.Context) error {
				info, err := c.Inspect(ctx, name)
				if err != nil || info.Shared == nil || info.Shared.Queued != want {
					return fmt.Errorf("%+v, %v", info.Shared, err)
				}
				return nil
			})
		}
		a, _ := startSharedHelper(t, "sem-hold", name, ttl, env(2, 2)...) // every permit of 2
		w1 := spawnHelper(t, "sem-hold", shared.URL(), name, ttl, env(2, 1)...)
		w2 := spawnHelper(t, "sem-hold", shared.URL(), name, ttl, env(2, 1)...)
		queued(2)

		// Grow: both waiters, declaring 2, are granted by the resize to 4.
		r, err := c.ResizeSemaphore(ctx, name, 4)
		if err != nil || r.Old != 2 || r.Size != 4 {
			t.Fatalf("grow = %+v, %v; want 2 → 4", r, err)
		}
		w1.locked(t, 10*time.Second)
		w2.locked(t, 10*time.Second)
		held(4)

		// Shrink to 2 under 4 held: the holders keep their permits.
		if r, err = c.ResizeSemaphore(ctx, name, 2); err != nil || r.Old != 4 || r.Permits != 4 || r.Holders != 3 {
			t.Fatalf("shrink = %+v, %v; want 4 → 2 with 4 permits held by 3 holders", r, err)
		}
		info, err := c.Inspect(ctx, name)
		if err != nil || info.Shared.Size != 2 || info.Shared.Permits != 4 {
			t.Fatalf("after the shrink: %+v, %v; want size 2, 4 permits still held", info.Shared, err)
		}
		// A new acquisition, through a handle declaring the old size 4 in another process, waits.
		late := spawnHelper(t, "sem-hold", shared.URL(), name, ttl, env(4, 1)...)
		queued(1)
		w1.signal(t, syscall.SIGKILL)
		w2.signal(t, syscall.SIGKILL)
		held(2) // their leases ran out: 2 held, the whole new size
		if _, err := c.Semaphore(name, 4).TryAcquire(ctx, 1); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("TryAcquire with 2 of 2 held after the shrink: %v, want ErrNotAcquired", err)
		}
		queued(1) // still waiting: 2 held + 1 do not fit in 2
		select {
		case line := <-late.lines:
			t.Fatalf("the late request said %q while the held permits fill the new size", line)
		default:
		}
		a.signal(t, syscall.SIGKILL)
		late.locked(t, 10*time.Second) // granted once the held permits fit
		held(1)
	})
}

// A semaphore left alone costs Redis nothing after the token retention: the holders' keys go
// with the last release, the hash (its last token and size) expires.
func TestSemaphore_StateExpires(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL(), dlock.WithTokenRetention(time.Second))
		l, err := c.Semaphore(name, 2).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if pttl, _ := strconv.Atoi(redisDo(t, shared, "PTTL", semKey(name))); pttl <= 0 {
			t.Fatalf("PTTL of a held semaphore = %d, want an expiry from the start", pttl)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if n := redisDo(t, shared, "EXISTS", semKey(name)+":e", semKey(name)+":q", semKey(name)+":w"); n != "0" {
			t.Errorf("%s of the holder and queue keys outlive the last release", n)
		}
		pttl, _ := strconv.Atoi(redisDo(t, shared, "PTTL", semKey(name)))
		if pttl <= 0 || pttl > 1000 {
			t.Errorf("PTTL of a released semaphore = %d ms, want in (0, 1000] (the retention)", pttl)
		}
	})
}

// DoAcquire runs fn with the permits held and gives them back after.
func TestSemaphore_DoAcquire(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL())
		err := c.DoAcquire(ctx, name, 2, 2, func(ctx context.Context) error {
			if _, err := c.Semaphore(name, 2).TryAcquire(ctx, 1); !errors.Is(err, dlock.ErrNotAcquired) {
				t.Errorf("TryAcquire inside DoAcquire = %v, want ErrNotAcquired", err)
			}
			return errors.New("fn's own error")
		})
		if err == nil || err.Error() != "fn's own error" {
			t.Fatalf("DoAcquire = %v, want fn's error", err)
		}
		l, err := c.Semaphore(name, 2).TryAcquire(ctx, 2)
		if err != nil {
			t.Fatalf("TryAcquire after DoAcquire: %v", err)
		}
		l.Unlock(ctx)
	})
}
