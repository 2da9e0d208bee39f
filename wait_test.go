package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// Row "waiters exhausting connections" and "no polling": a waiter is woken by the release,
// long before the holder's lease would run out, and sends no commands while it waits.
func TestWaiting_WakesOnReleaseWithoutPolling(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		holder := tr.dial(t, shared.URL(), dlock.WithTTL(30*time.Second))
		waiter := tr.dial(t, shared.URL())
		l, err := holder.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan *dlock.Lease, 1)
		go func() {
			lw, err := waiter.Mutex(name).Lock(ctx)
			if err != nil {
				t.Error(err)
			}
			got <- lw
		}()
		waitSubscribed(t, name)
		before := evalCalls(t)
		time.Sleep(300 * time.Millisecond) // the waiter is idle here; count what it sends
		idle := evalCalls(t) - before
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
		// Allowed: one attempt after its subscription is confirmed, and the refreshes of its
		// queue entry (one every third of its 1 s acceptance window: one in 300 ms, two when a
		// busy machine delayed one). Polling would be many more.
		if idle > 3 {
			t.Errorf("the waiter sent %d scripts in 300ms of waiting, want at most 3 (no polling)", idle)
		}
		if wake > time.Second {
			t.Errorf("waiter woke %v after the release, want well under a second (lease was 30s)", wake)
		}
	})
}

// waitSubscribed waits until some client subscribes to its own channel of the lock (a waiting
// client's, <key>:rel:<client id>).
func waitSubscribed(t *testing.T, name string) {
	t.Helper()
	waitFor(t, 10*time.Second, "a waiting client's subscription", func(context.Context) error {
		if out := redisDo(t, shared, "PUBSUB", "CHANNELS", keyOf(name)+":rel:*"); strings.TrimSpace(out) == "" {
			return errors.New("no waiting client's channel subscribed")
		}
		return nil
	})
}

// evalCalls counts scripts run on the shared server so far.
func evalCalls(t *testing.T) int { return scriptCalls(t, shared) }

// Row "waiters exhausting connections": many waiters cost no connection each.
func TestWaiting_HoldsNoConnection(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		holder := tr.dial(t, shared.URL())
		waiter := tr.dial(t, shared.URL())
		l, err := holder.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Warm the waiter's connections with one waiter, then count the server's clients.
		wctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		results := make(chan error, 200)
		start := func(n int) {
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					lw, err := waiter.Mutex(name).Lock(wctx)
					if err == nil {
						lw.Unlock(ctx)
					}
					results <- err
				}()
			}
		}
		start(1)
		waitSubscribed(t, name)
		base := connectedClients(t)
		start(199)
		time.Sleep(200 * time.Millisecond)
		if n := connectedClients(t); n > base {
			t.Errorf("connections grew from %d to %d with 199 more waiters", base, n)
		}
		cancel()
		wg.Wait()
		close(results)
		for err := range results {
			if !errors.Is(err, context.Canceled) {
				t.Errorf("waiter: got %v, want context.Canceled", err)
			}
		}
		l.Unlock(ctx)
	})
}

func connectedClients(t *testing.T) int {
	for _, line := range strings.Split(redisDo(t, shared, "INFO", "clients"), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_clients:"); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	t.Fatal("no connected_clients in INFO")
	return 0
}

// TestHandover_TokensAndExclusion: an Unlock with a waiter of the same client passes the lock
// straight to it (handover.lua). Every hold still gets a new, larger token and holds never
// overlap.
func TestHandover_TokensAndExclusion(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		c := tr.dial(t, shared.URL())
		name := uniqueName(t)
		ctx := ctxT(t)
		var (
			mu     sync.Mutex
			tokens []uint64
			inside int
			bad    int
		)
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 40 {
					l, err := c.Mutex(name).Lock(ctx)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					inside++
					if inside != 1 {
						bad++
					}
					tokens = append(tokens, l.Token())
					inside--
					mu.Unlock()
					if err := l.Unlock(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if bad != 0 {
			t.Fatalf("%d overlapping holds", bad)
		}
		if len(tokens) != 320 {
			t.Fatalf("%d holds, want 320", len(tokens))
		}
		for i := 1; i < len(tokens); i++ {
			if tokens[i] <= tokens[i-1] {
				t.Fatalf("hold %d got token %d after %d", i, tokens[i], tokens[i-1])
			}
		}
		if v := redisDo(t, shared, "GET", keyOf(name)); heldValue(v) {
			t.Fatalf("lock not released at the end: %q", v)
		}
	})
}

// TestHandover_OtherClientNotStarved: a client whose goroutines always wait for a lock may pass
// it among them only a few times in a row while another client waits; that client gets it.
func TestHandover_OtherClientNotStarved(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		a := tr.dial(t, shared.URL())
		b := tr.dial(t, shared.URL())
		name := uniqueName(t)
		ctx := ctxT(t)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var aHolds sync.Map
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n := 0
				for {
					select {
					case <-stop:
						aHolds.Store(g, n)
						return
					default:
					}
					l, err := a.Mutex(name).Lock(ctx)
					if err != nil {
						t.Error(err)
						return
					}
					n++
					l.Unlock(ctx)
				}
			}()
		}
		// Let a's goroutines hand the lock among themselves, then ask from b.
		waitFor(t, 5*time.Second, "a's goroutines take turns", func(context.Context) error {
			if v := redisDo(t, shared, "GET", keyOf(name)); !heldValue(v) {
				return fmt.Errorf("value %q", v)
			}
			return nil
		})
		start := time.Now()
		bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		l, err := b.Mutex(name).Lock(bctx)
		cancel()
		took := time.Since(start)
		if err == nil {
			l.Unlock(ctx)
		}
		close(stop)
		wg.Wait()
		if err != nil {
			t.Fatalf("client b starved while client a's goroutines passed the lock around: %v", err)
		}
		t.Logf("client b got the lock after %v", took)
	})
}

// TestHandover_WaitersGivingUp: waiters whose contexts end at random moments, some while the
// lock is being handed to them, never leave the lock held by nobody.
func TestHandover_WaitersGivingUp(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		c := tr.dial(t, shared.URL(), dlock.WithTTL(30*time.Second))
		name := uniqueName(t)
		ctx := ctxT(t)
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(g), 7))
				for range 30 {
					wctx, cancel := context.WithTimeout(ctx, time.Duration(r.IntN(2000))*time.Microsecond)
					l, err := c.Mutex(name).Lock(wctx)
					cancel()
					if err == nil {
						if err := l.Unlock(ctx); err != nil {
							t.Errorf("Unlock: %v", err)
						}
					}
				}
			}()
		}
		wg.Wait()
		// With a 30 s lease, a lock left held by nobody would block this for 30 s.
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		l, err := c.Mutex(name).Lock(lctx)
		if err != nil {
			t.Fatalf("lock still held after every waiter left: %v (value %q)", err, redisDo(t, shared, "GET", keyOf(name)))
		}
		l.Unlock(ctx)
	})
}

// queuedClients is how many clients the lock's queue on the server holds.
func queuedClients(t *testing.T, name string) int {
	t.Helper()
	v, err := shared.Do(context.Background(), "ZCARD", keyOf(name)+":q")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitQueued polls until the lock's queue on the server holds n clients.
func waitQueued(t *testing.T, name string, n int) {
	t.Helper()
	waitFor(t, 10*time.Second, "clients to queue", func(context.Context) error {
		if got := queuedClients(t, name); got != n {
			return fmt.Errorf("%d queued, want %d", got, n)
		}
		return nil
	})
}

// lockInBackground takes name with c in a goroutine and reports the lease on the channel. A
// Lock still waiting when the test ends gives up quietly.
func lockInBackground(t *testing.T, c *dlock.Client, name string, opts ...dlock.Option) <-chan *dlock.Lease {
	ctx, cancel := context.WithCancel(ctxT(t))
	t.Cleanup(cancel)
	got := make(chan *dlock.Lease, 1)
	go func() {
		l, err := c.Mutex(name, opts...).Lock(ctx)
		if err != nil {
			if ctx.Err() == nil {
				t.Error(err)
			}
			close(got)
			return
		}
		got <- l
	}()
	return got
}

// Clients waiting for a lock are served in the order they queued: a release grants the lock
// to the first, with a larger token, and the queue on the server shrinks by one.
func TestGrant_QueueOrder(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		a, b, c := tr.dial(t, shared.URL()), tr.dial(t, shared.URL()), tr.dial(t, shared.URL())
		la, err := a.Mutex(name, dlock.WithTTL(20*time.Second)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		gotB := lockInBackground(t, b, name)
		waitQueued(t, name, 1)
		gotC := lockInBackground(t, c, name)
		waitQueued(t, name, 2)
		if err := la.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		var lb *dlock.Lease
		select {
		case lb = <-gotB:
		case lc := <-gotC:
			t.Fatalf("the client that queued second got the lock first (token %d)", lc.Token())
		case <-time.After(10 * time.Second):
			t.Fatal("nobody got the lock 10 s after its release")
		}
		if lb == nil || lb.Token() <= la.Token() {
			t.Fatalf("granted lease %v, token not above the previous holder's %d", lb, la.Token())
		}
		if n := queuedClients(t, name); n != 1 {
			t.Fatalf("%d clients queued after the grant, want 1", n)
		}
		if err := lb.Context().Err(); err != nil {
			t.Fatalf("granted lease already ended: %v", context.Cause(lb.Context()))
		}
		if err := lb.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		lc := <-gotC
		if lc == nil || lc.Token() <= lb.Token() {
			t.Fatalf("second grant %v, token not above %d", lc, lb.Token())
		}
		if err := lc.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// A granted lease is renewed to its TTL at once: it lives past the acceptance window.
func TestGrant_LeaseOutlivesTheWindow(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		a, b := tr.dial(t, shared.URL()), tr.dial(t, shared.URL())
		la, err := a.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		gotB := lockInBackground(t, b, name, dlock.WithTTL(3*time.Second))
		waitQueued(t, name, 1)
		la.Unlock(ctx)
		lb := <-gotB
		if lb == nil {
			t.FailNow()
		}
		// Renewed to 3 s right after the grant.
		waitFor(t, time.Second, "the granted lease renewed past the 1 s window", func(ctx context.Context) error {
			ttl, err := lb.TTL(ctx)
			if err == nil && ttl <= time.Second {
				err = fmt.Errorf("TTL %v", ttl)
			}
			return err
		})
		if err := lb.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// A queued client whose connection hangs when the lock is granted to it cannot take it: the
// grant lapses after the acceptance window and the next queued client gets the lock, long
// before the previous holder's lease would have run out. When the hung client comes back, its
// lease (if the announcement reaches it) is already lost: never two holders.
func TestGrant_HungGranteeLosesIt(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		proxy := redistest.NewProxy(t, shared.Addr)
		holder := tr.dial(t, shared.URL())
		hung := tr.dial(t, strings.Replace(proxy.URL(), "://", "://"+testUser+":"+testPassword+"@", 1))
		next := tr.dial(t, shared.URL())
		l, err := holder.Mutex(name, dlock.WithTTL(30*time.Second)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		gotHung := lockInBackground(t, hung, name)
		waitQueued(t, name, 1)
		gotNext := lockInBackground(t, next, name)
		waitQueued(t, name, 2)
		proxy.Block()
		released := time.Now()
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		var ln *dlock.Lease
		select {
		case ln = <-gotNext:
		case <-time.After(8 * time.Second):
			t.Fatal("the next client did not get the lock within 8 s of the release (the holder's lease was 30 s)")
		}
		took := time.Since(released)
		t.Logf("the next client got the lock %v after the release granted it to the hung one", took)
		if took < 500*time.Millisecond {
			t.Fatalf("the next client got the lock after %v: the hung client's grant cannot have lapsed yet", took)
		}
		proxy.Unblock()
		select {
		case lh := <-gotHung:
			if lh != nil && lh.Context().Err() == nil && ln.Context().Err() == nil {
				t.Fatalf("two holders: the hung client (token %d) and the next (token %d)", lh.Token(), ln.Token())
			}
			if lh != nil {
				lh.Unlock(ctx)
			}
		default:
		}
		ln.Unlock(ctx)
	})
}

// A queued client killed while waiting (SIGKILL) delays the others by at most its acceptance
// window: a grant made to it lapses, or its entry expires first.
func TestGrant_KilledWaiterDelaysOthersAtMostItsWindow(t *testing.T) {
	needShared(t)
	ctx := ctxT(t)
	name := uniqueName(t)
	holder := transports[0].dial(t, shared.URL())
	next := transports[0].dial(t, shared.URL())
	l, err := holder.Mutex(name, dlock.WithTTL(30*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := spawnHelper(t, "hold", shared.URL(), name, 10*time.Second) // its window: 1 s
	waitQueued(t, name, 1)
	got := lockInBackground(t, next, name)
	waitQueued(t, name, 2)
	h.signal(t, syscall.SIGKILL)
	h.cmd.Wait()
	released := time.Now()
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case ln := <-got:
		took := time.Since(released)
		t.Logf("the next client got the lock %v after the release (the killed waiter's window is 1 s)", took)
		if ln != nil {
			ln.Unlock(ctx)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the next client did not get the lock within 5 s of the release (the killed waiter's window is 1 s, the holder's lease 30 s)")
	}
}

// A grant to a waiter whose client died lasts only as long as its queue entry would have: a
// release late in the dead entry's life hands the lock to it until the entry's end, not for a
// whole acceptance window more (which, with the holder's lease, could keep the lock out of
// reach for the TTL and a window).
func TestGrant_ToADeadWaiterEndsWithItsEntry(t *testing.T) {
	needShared(t)
	ctx := ctxT(t)
	name := uniqueName(t)
	holder := transports[0].dial(t, shared.URL())
	l, err := holder.Mutex(name, dlock.WithTTL(30*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := spawnHelper(t, "hold", shared.URL(), name, 10*time.Second) // its window: 1 s
	waitQueued(t, name, 1)
	h.signal(t, syscall.SIGKILL)
	h.cmd.Wait()
	// The dead client refreshes its entry no more: wait until less than 600 ms of it is left.
	serverMS := func() int64 {
		v, err := shared.Do(ctx, "TIME")
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(v)
		sec, _ := strconv.ParseInt(strings.Trim(f[0], "[]"), 10, 64)
		us, _ := strconv.ParseInt(strings.Trim(f[1], "[]"), 10, 64)
		return sec*1000 + us/1000
	}
	entryLeft := func() int64 {
		ids, err := shared.Do(ctx, "ZRANGE", keyOf(name)+":q", "0", "0")
		if err != nil {
			t.Fatal(err)
		}
		id := strings.Trim(ids, "[]")
		e, err := shared.Do(ctx, "HGET", keyOf(name)+":w", id)
		if err != nil {
			t.Fatal(err)
		}
		exp, err := strconv.ParseInt(strings.Fields(e)[0], 10, 64)
		if err != nil {
			t.Fatalf("entry %q: %v", e, err)
		}
		return exp - serverMS()
	}
	waitFor(t, 5*time.Second, "the dead waiter's entry to have less than 600 ms left", func(context.Context) error {
		if left := entryLeft(); left >= 600 {
			return fmt.Errorf("%d ms left", left)
		}
		return nil
	})
	left := entryLeft()
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	v, err := shared.Do(ctx, "PTTL", keyOf(name))
	if err != nil {
		t.Fatal(err)
	}
	pttl, _ := strconv.ParseInt(v, 10, 64)
	if pttl <= 0 || pttl > left {
		t.Fatalf("the grant to the dead waiter lasts %d ms; its entry had %d ms left (its window: 1000 ms)", pttl, left)
	}
	t.Logf("granted to the dead waiter for %d ms (its entry had %d ms left; its window is 1000 ms)", pttl, left)
}

// Ten clients of one goroutine each on one lock are served in turn: after 300 holds, every
// client had close to its share (FIFO, not a race won by whoever is nearest).
func TestGrant_ClientsTakeTurns(t *testing.T) {
	needShared(t)
	const clients, total = 10, 300
	name := uniqueName(t)
	ctx := ctxT(t)
	var mu sync.Mutex
	holds := make([]int, clients)
	done := 0
	var wg sync.WaitGroup
	for i := range clients {
		c := transports[i%2].dial(t, shared.URL())
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := c.Mutex(name)
			for {
				l, err := m.Lock(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				stop := done >= total
				if !stop {
					done++
					holds[i]++
				}
				mu.Unlock()
				if err := l.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
				if stop {
					return
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("holds per client: %v", holds)
	for i, n := range holds {
		if n < total/clients/2 {
			t.Errorf("client %d held the lock %d times of %d, below half its share", i, n, total)
		}
	}
}

// A release publishes only where someone listens: an uncontended Lock and Unlock publish
// nothing; a subscriber of a pattern (an inspection tool's PSUBSCRIBE) hears the release.
func TestRelease_PublishesOnlyToListeners(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		s := redistest.Start(t)
		ctx := ctxT(t)
		c := tr.dial(t, s.URL())
		cycle := func() uint64 {
			l, err := c.Mutex("quiet").Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			return l.Token()
		}
		cycle() // scripts loaded
		redisDo(t, s, "CONFIG", "RESETSTAT")
		cycle()
		if stats := redisDo(t, s, "INFO", "commandstats"); strings.Contains(stats, "cmdstat_publish:") {
			t.Errorf("an uncontended lock and unlock published a message:\n%s", stats)
		}
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
		defer rdb.Close()
		sub := rdb.PSubscribe(ctx, "dlock:*")
		defer sub.Close()
		if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
			t.Fatal(err)
		}
		token := cycle()
		msg, err := sub.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if msg.Channel != "dlock:{quiet}:rel" || msg.Payload != strconv.FormatUint(token, 10) {
			t.Errorf("pattern subscriber heard %q on %q, want the release of token %d on dlock:{quiet}:rel", msg.Payload, msg.Channel, token)
		}
	})
}

// Two waiters whose processes die (SIGKILL) or freeze (SIGSTOP) at the head of the queue,
// with a live waiter behind them and no other client coming: the release grants the lock to
// the first dead one, whose grant lapses with its entry, and the live waiter must get the lock
// within about one acceptance window of the release, not when the holder's lease (10 s) would
// have run out.
func TestGrant_DeadWaitersAtTheHeadDelayTheNextAtMostAWindow(t *testing.T) {
	needShared(t)
	const ttl = 10 * time.Second // every window: 1 s
	window := time.Second
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGSTOP} {
		t.Run(sig.String(), func(t *testing.T) {
			eachTransport(t, func(t *testing.T, tr transport) {
				ctx := ctxT(t)
				name := uniqueName(t)
				holder := tr.dial(t, shared.URL())
				live := tr.dial(t, shared.URL())
				l, err := holder.Mutex(name, dlock.WithTTL(ttl)).Lock(ctx)
				if err != nil {
					t.Fatal(err)
				}
				dead := []*helperProc{spawnHelper(t, "hold", shared.URL(), name, ttl)}
				waitQueued(t, name, 1)
				dead = append(dead, spawnHelper(t, "hold", shared.URL(), name, ttl))
				waitQueued(t, name, 2)
				got := lockInBackground(t, live, name, dlock.WithTTL(ttl))
				waitQueued(t, name, 3)
				// Every waiting client is subscribed to its own channel of the lock: the live
				// one's subscription confirmation (which makes it attempt again) is not what wakes
				// it after the release.
				waitFor(t, 10*time.Second, "the three waiting clients to subscribe", func(ctx context.Context) error {
					v, err := shared.Do(ctx, "PUBSUB", "CHANNELS", keyOf(name)+":rel:*")
					if err != nil {
						return err
					}
					if n := len(strings.Fields(strings.Trim(v, "[]"))); n != 3 {
						return fmt.Errorf("%d subscribed: %s", n, v)
					}
					return nil
				})
				for _, h := range dead {
					h.signal(t, sig)
				}
				if sig == syscall.SIGKILL {
					for _, h := range dead {
						h.cmd.Wait()
					}
				}
				released := time.Now()
				if err := l.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
				select {
				case ln := <-got:
					took := time.Since(released)
					t.Logf("the live waiter got the lock %v after the release (two dead waiters ahead of it, windows of %v, the holder's lease %v)", took, window, ttl)
					if ln == nil {
						t.FailNow()
					}
					if limit := window + time.Second; took > limit {
						t.Errorf("the live waiter got the lock %v after the release, over %v (one window and a second of slack)", took, limit)
					}
					ln.Unlock(ctx)
				case <-time.After(ttl + 5*time.Second):
					t.Fatalf("the live waiter did not get the lock within %v of the release", ttl+5*time.Second)
				}
			})
		})
	}
}

// A waiter whose process is paused (SIGSTOP) while the lock is granted to it, and resumed
// after the grant's acceptance window, finds the announcement waiting: the lease it would make
// from it has run out (the grant lapsed on the server). Its Lock must not return that lease (a
// nil error with an already cancelled context): it discards it and takes the lock afresh.
func TestGrant_ResumedPastTheWindowGetsALiveLease(t *testing.T) {
	needShared(t)
	const ttl = 10 * time.Second // the waiter's window: 1 s
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		holder := tr.dial(t, shared.URL())
		l, err := holder.Mutex(name, dlock.WithTTL(ttl)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		h := spawnHelper(t, "check", shared.URL(), name, ttl, "DLOCK_TRANSPORT="+tr.name)
		waitQueued(t, name, 1)
		waitFor(t, 10*time.Second, "the waiter to subscribe", func(ctx context.Context) error {
			v, err := shared.Do(ctx, "PUBSUB", "CHANNELS", keyOf(name)+":rel:*")
			if err == nil && strings.Trim(v, "[]") == "" {
				err = errors.New("not yet")
			}
			return err
		})
		h.signal(t, syscall.SIGSTOP)
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		v, err := shared.Do(ctx, "GET", keyOf(name))
		if err != nil || !heldValue(v) {
			t.Fatalf("after the release: %q, %v; want the lock granted to the paused waiter", v, err)
		}
		// The grant lapses with the paused waiter's entry, a window after its last refresh.
		waitFor(t, 5*time.Second, "the grant to the paused waiter to lapse", func(ctx context.Context) error {
			v, err := shared.Do(ctx, "EXISTS", keyOf(name))
			if err == nil && v != "0" {
				err = fmt.Errorf("EXISTS %s", v)
			}
			return err
		})
		h.signal(t, syscall.SIGCONT)
		token := h.locked(t, 10*time.Second)
		if state := h.next(t, 5*time.Second); state != "live" {
			t.Fatalf("the resumed waiter's Lock returned a lease (token %d) that had %s; want a live lease", token, state)
		}
		if token <= l.Token() {
			t.Fatalf("the resumed waiter holds token %d, not above the previous holder's %d", token, l.Token())
		}
		v, err = shared.Do(ctx, "GET", keyOf(name))
		if err != nil || !heldValue(v) || !strings.Contains(v, " "+strconv.FormatUint(token, 10)+" ") {
			t.Fatalf("the server has %q (%v) for the lock; want it held with the resumed waiter's token %d", v, err, token)
		}
	})
}

// An uncontended Lock and Unlock do the least server work a fenced, queued lock can: two script
// calls whose commands are, all told, GET, TIME, SET (the acquisition: the lock is released,
// so nobody queues) and GET, EXISTS, SET, PUBSUB NUMPAT, PUBSUB NUMSUB (the release: no queue
// to grant from, nobody listening), counted by the server's INFO commandstats. No queue entry,
// no hold record, no renewal, no message.
func TestUncontendedPair_ServerWork(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		s := redistest.Start(t)
		ctx := ctxT(t)
		c := tr.dial(t, s.URL())
		const pairs = 50
		cycle := func(i int) {
			l, err := c.Mutex("fast:" + strconv.Itoa(i%5)).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 5 {
			cycle(i) // scripts loaded, the client's subscription made, each name released once
		}
		redisDo(t, s, "CONFIG", "RESETSTAT")
		for i := range pairs {
			cycle(i)
		}
		got := map[string]int{}
		for cmd, st := range commandStats(t, s) {
			got[cmd] = int(st.calls)
		}
		delete(got, "info")
		delete(got, "config|resetstat")
		// A released name is known to have no queue (acquire.lua): only the release asks EXISTS.
		want := map[string]int{"evalsha": 2 * pairs, "get": 2 * pairs, "exists": pairs, "time": pairs, "set": 2 * pairs,
			"pubsub|numpat": pairs, "pubsub|numsub": pairs}
		for cmd, n := range want {
			if got[cmd] != n {
				t.Errorf("%s ran %d times for %d pairs, want %d", cmd, got[cmd], pairs, n)
			}
		}
		for cmd, n := range got {
			if _, ok := want[cmd]; !ok {
				t.Errorf("%s ran %d times for %d uncontended pairs, want none", cmd, n, pairs)
			}
		}
	})
}
