package dlock_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// multiNames returns n lock names no other test uses, in the order every client takes the
// names of a multi-lock: by the Cluster slot of their keys, then by key.
func multiNames(t testing.TB, n int) []string {
	base := uniqueName(t)
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s:%c", base, 'a'+i)
	}
	slices.SortFunc(names, func(a, b string) int {
		if c := cmp.Compare(redistest.SlotOf(keyOf(a)), redistest.SlotOf(keyOf(b))); c != 0 {
			return c
		}
		return strings.Compare(keyOf(a), keyOf(b))
	})
	return names
}

// heldBy returns the owner field of name's lock value ("" when not held).
func heldBy(t testing.TB, name string) string {
	t.Helper()
	v := redisDo(t, shared, "GET", keyOf(name))
	if !heldValue(v) {
		return ""
	}
	owner, _, _ := strings.Cut(v, " ")
	return owner
}

// A multi-lock of names on one server is one script to take and one to release;
// it holds every name under one owner, with one fencing token each, and Token is the largest.
func TestMultiMutex_OneScriptAllNames(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL())
		warm, err := c.MultiMutex(multiNames(t, 2)).Lock(ctx) // the scripts are cached from here on
		if err != nil {
			t.Fatal(err)
		}
		warm.Unlock(ctx)
		names := multiNames(t, 4)
		mm := c.MultiMutex([]string{names[2], names[0], names[3], names[1]})
		before := evalCalls(t)
		l, err := mm.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n := evalCalls(t) - before; n != 1 {
			t.Errorf("Lock of 4 free names ran %d scripts, want 1", n)
		}
		owner := heldBy(t, names[0])
		tokens := l.Tokens()
		var largest uint64
		for _, n := range names {
			if o := heldBy(t, n); o == "" || o != owner {
				t.Errorf("%s held by %q, want the same owner as %s (%q)", n, o, names[0], owner)
			}
			if tok := lockValue(t, n)[1]; tok != fmt.Sprint(tokens[n]) {
				t.Errorf("%s: token %s on the server, Tokens says %d", n, tok, tokens[n])
			}
			largest = max(largest, tokens[n])
		}
		if len(tokens) != 4 || l.Token() != largest {
			t.Errorf("Tokens = %v, Token = %d; want 4 tokens and the largest", tokens, l.Token())
		}
		if got := l.Names(); !slices.Equal(got, []string{names[2], names[0], names[3], names[1]}) {
			t.Errorf("Names = %q, want the names as given", got)
		}
		if tok, ok := dlock.TokenFromContext(l.Context()); !ok || tok != largest {
			t.Errorf("TokenFromContext = %d, %v; want %d", tok, ok, largest)
		}
		if got, ok := dlock.TokensFromContext(l.Context()); !ok || len(got) != 4 || got[names[1]] != tokens[names[1]] {
			t.Errorf("TokensFromContext = %v, %v; want %v", got, ok, tokens)
		}
		before = evalCalls(t)
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if n := evalCalls(t) - before; n != 1 {
			t.Errorf("Unlock ran %d scripts, want 1 (every name released in one script)", n)
		}
		for _, n := range names {
			if o := heldBy(t, n); o != "" {
				t.Errorf("%s still held after Unlock", n)
			}
		}
		if l.Context().Err() == nil {
			t.Error("lease context live after Unlock")
		}
		if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) {
			t.Errorf("second Unlock = %v, want ErrNotHeld", err)
		}
	})
}

// TryLock takes all or none: with one name held by a plain Mutex, it fails naming that name
// and leaves every other name free. A multi-lock's hold blocks a Mutex of one of its names.
func TestMultiMutex_AllOrNothingWithMutex(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL())
		other := tr.dial(t, shared.URL())
		names := multiNames(t, 3)
		ml, err := other.Mutex(names[1]).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.MultiMutex(names).TryLock(ctx)
		var na *dlock.NotAcquiredError
		if !errors.As(err, &na) || na.Name != names[1] {
			t.Fatalf("TryLock with %s held = %v, want a NotAcquiredError naming it", names[1], err)
		}
		for _, n := range []string{names[0], names[2]} {
			if heldBy(t, n) != "" {
				t.Errorf("%s held after a failed TryLock", n)
			}
		}
		if err := ml.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		l, err := c.MultiMutex(names).TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Mutex(names[2]).TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Errorf("Mutex TryLock of a name the multi-lock holds = %v, want ErrNotAcquired", err)
		}
		got := lockInBackground(t, other, names[0])
		waitQueued(t, names[0], 1)
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case lm := <-got:
			if lm == nil {
				t.FailNow()
			}
			if lm.Token() <= l.Tokens()[names[0]] {
				t.Errorf("token %d after the multi-lock's %d", lm.Token(), l.Tokens()[names[0]])
			}
			lm.Unlock(ctx)
		case <-time.After(10 * time.Second):
			t.Fatal("a Mutex waiting for a name of a multi-lock was not given it at its Unlock")
		}
	})
}

// A waiting multi-lock holds nothing while the name that blocked it is busy (the other names
// stay free), is woken by that name's release (long before the holder's lease), and sends no
// commands while it waits.
func TestMultiMutex_WaitsWithoutHoldingWokenByRelease(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		holder := tr.dial(t, shared.URL(), dlock.WithTTL(30*time.Second))
		c := tr.dial(t, shared.URL())
		third := tr.dial(t, shared.URL())
		names := multiNames(t, 3)
		hl, err := holder.Mutex(names[1]).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan *dlock.Lease, 1)
		go func() {
			l, err := c.MultiMutex(names).Lock(ctx)
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		waitQueued(t, names[1], 1)
		waitSubscribed(t, names[1])
		before := evalCalls(t)
		for _, n := range []string{names[0], names[2]} {
			l, err := third.Mutex(n).TryLock(ctx)
			if err != nil {
				t.Fatalf("%s is not free while the multi-lock waits for %s: %v", n, names[1], err)
			}
			l.Unlock(ctx)
		}
		time.Sleep(300 * time.Millisecond) // the waiter is idle here; count what it sends
		if n := evalCalls(t) - before; n > 4+1 {
			t.Errorf("%d scripts in 300ms of waiting besides the third client's 4, want at most 1 (no polling)", n-4)
		}
		released := time.Now()
		if err := hl.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		l := <-got
		if l == nil {
			t.FailNow()
		}
		if wake := time.Since(released); wake > 2*time.Second {
			t.Errorf("the multi-lock got its names %v after the release (lease 30s)", wake)
		}
		if l.Tokens()[names[1]] <= hl.Token() {
			t.Errorf("token of %s %d, not above the Mutex's %d", names[1], l.Tokens()[names[1]], hl.Token())
		}
		l.Unlock(ctx)
	})
}

// A Lock whose wait ends (its context) holds nothing: the names it may have taken while it
// waited are released, and it says which name blocked it.
func TestMultiMutex_CancelledWaitReleasesAll(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		holder := tr.dial(t, shared.URL(), dlock.WithTTL(30*time.Second))
		c := tr.dial(t, shared.URL())
		names := multiNames(t, 4)
		// names[2] held for good; names[0] held briefly, so that the waiter is woken once
		// (after which it keeps the names before the one it waits for).
		hl, err := holder.Mutex(names[2]).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		h0, err := holder.Mutex(names[0]).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			l, err := c.MultiMutex(names).Lock(wctx)
			if err == nil {
				l.Unlock(ctx)
			}
			done <- err
		}()
		waitQueued(t, names[0], 1)
		h0.Unlock(ctx)
		// The waiter now holds names[0] and names[1] and queues for names[2].
		waitQueued(t, names[2], 1)
		waitFor(t, 10*time.Second, "the waiter to hold the names before the busy one", func(context.Context) error {
			if heldBy(t, names[0]) == "" || heldBy(t, names[1]) == "" {
				return errors.New("not yet")
			}
			return nil
		})
		if o := heldBy(t, names[3]); o != "" {
			t.Errorf("%s, after the busy name, is held while the waiter waits", names[3])
		}
		cancel()
		err = <-done
		var na *dlock.NotAcquiredError
		if !errors.As(err, &na) || na.Name != names[2] || !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Lock = %v, want a NotAcquiredError naming %s, and context.Canceled", err, names[2])
		}
		for _, n := range []string{names[0], names[1], names[3]} {
			if o := heldBy(t, n); o != "" {
				t.Errorf("%s still held after the cancelled Lock returned", n)
			}
		}
		waitQueued(t, names[2], 0)
		hl.Unlock(ctx)
	})
}

// The loss of one name cancels the lease context at once (well, at the next renewal), with a
// cause wrapping ErrLost that names it; Unlock then reports it and releases the others.
func TestMultiMutex_LossOfOneCancelsContext(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL(), dlock.WithTTL(600*time.Millisecond))
		admin := tr.dial(t, shared.URL())
		names := multiNames(t, 3)
		l, err := c.MultiMutex(names).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := admin.ForceUnlock(ctx, names[1]); err != nil {
			t.Fatal(err)
		}
		select {
		case <-l.Context().Done():
		case <-time.After(5 * time.Second):
			t.Fatal("lease context still live 5 s after one of its names was force-unlocked")
		}
		cause := context.Cause(l.Context())
		if !errors.Is(cause, dlock.ErrLost) || !strings.Contains(cause.Error(), names[1]) {
			t.Fatalf("cause = %v, want ErrLost naming %s", cause, names[1])
		}
		if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrLost) {
			t.Errorf("Unlock after the loss = %v, want ErrLost", err)
		}
		for _, n := range names {
			if heldBy(t, n) != "" {
				t.Errorf("%s still held after Unlock", n)
			}
		}
	})
}

// Every name of a multi-lock is renewed by the client's one loop: held through several leases.
func TestMultiMutex_Renewed(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL(), dlock.WithTTL(300*time.Millisecond))
		names := multiNames(t, 5)
		l, err := c.MultiMutex(names).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(time.Second)
		for time.Now().Before(deadline) {
			if err := l.Context().Err(); err != nil {
				t.Fatalf("lost while renewed: %v", context.Cause(l.Context()))
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := l.Extend(ctx, 2*time.Second); err != nil {
			t.Fatal(err)
		}
		d, err := l.TTL(ctx)
		if err != nil || d < time.Second || d > 2*time.Second {
			t.Errorf("TTL after Extend(2s) = %v, %v", d, err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := l.TTL(ctx); !errors.Is(err, dlock.ErrNotHeld) {
			t.Errorf("TTL after Unlock = %v, want ErrNotHeld", err)
		}
	})
}

// Re-entry per name: a multi-lock whose context carries a lease on one of its names re-enters
// it (same token) and takes the others; its Unlock drops that hold only. A Mutex of one of its
// names re-enters it through the multi-lock's context.
func TestMultiMutex_Reentry(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL())
		names := multiNames(t, 2)
		outer, err := c.Mutex(names[0]).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		l, err := c.MultiMutex(names).Lock(outer.Context())
		if err != nil {
			t.Fatal(err)
		}
		if l.Tokens()[names[0]] != outer.Token() {
			t.Errorf("re-entered token %d, outer %d", l.Tokens()[names[0]], outer.Token())
		}
		if holds := lockValue(t, names[0])[2]; holds != "2" {
			t.Errorf("holds of the re-entered name = %s, want 2", holds)
		}
		inner, err := c.Mutex(names[1]).Lock(l.Context())
		if err != nil {
			t.Fatal(err)
		}
		if inner.Token() != l.Tokens()[names[1]] {
			t.Errorf("Mutex in the multi-lock's context: token %d, want the multi-lock's %d", inner.Token(), l.Tokens()[names[1]])
		}
		if err := inner.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if heldBy(t, names[1]) != "" {
			t.Errorf("%s held after the multi-lock's Unlock", names[1])
		}
		if holds := lockValue(t, names[0])[2]; holds != "1" || outer.Context().Err() != nil {
			t.Errorf("outer lease after the multi-lock's Unlock: holds %s, context %v; want 1 and live", holds, outer.Context().Err())
		}
		if _, err := c.MultiMutex(names, dlock.WithTTL(3*time.Second)).Lock(outer.Context()); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("re-entry with another TTL = %v, want ErrInvalid", err)
		}
		if heldBy(t, names[1]) != "" {
			t.Errorf("%s held after a refused re-entry", names[1])
		}
		outer.Unlock(ctx)
	})
}

// Bad input is ErrInvalid, from Lock and TryLock alike.
func TestMultiMutex_InvalidInput(t *testing.T) {
	needShared(t)
	c := transports[0].dial(t, shared.URL())
	ctx := ctxT(t)
	many := make([]string, dlock.MaxMultiNames+1)
	for i := range many {
		many[i] = fmt.Sprint("n", i)
	}
	for what, names := range map[string][]string{
		"no names":  nil,
		"duplicate": {"x", "y", "x"},
		"too many":  many,
		"empty":     {"x", ""},
	} {
		if _, err := c.MultiMutex(names).Lock(ctx); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("%s: Lock = %v, want ErrInvalid", what, err)
		}
		if _, err := c.MultiMutex(names).TryLock(ctx); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("%s: TryLock = %v, want ErrInvalid", what, err)
		}
	}
	if err := c.DoMulti(ctx, []string{"x"}, nil); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("DoMulti with a nil function = %v, want ErrInvalid", err)
	}
	if _, err := c.MultiMutex([]string{"x"}, dlock.WithTTL(time.Millisecond)).Lock(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("bad option: %v, want ErrInvalid", err)
	}
	if _, err := c.MultiMutex([]string{"x", "y"}, dlock.WithAdaptiveTTL(time.Second, 10*time.Second)).Lock(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("adaptive lease: %v, want ErrInvalid", err)
	}
	ok := many[:dlock.MaxMultiNames]
	for i := range ok {
		ok[i] = fmt.Sprintf("%s-%d", uniqueName(t), i)
	}
	l, err := c.MultiMutex(ok).TryLock(ctx)
	if err != nil {
		t.Fatalf("MaxMultiNames names: %v", err)
	}
	l.Unlock(ctx)
}

// DoMulti runs fn with every name held; fn's context carries one token per name and is
// cancelled, with the cause naming the lock, when one is lost; the error says so.
func TestMultiMutex_DoMulti(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL(), dlock.WithTTL(600*time.Millisecond))
		admin := tr.dial(t, shared.URL())
		names := multiNames(t, 2)
		err := c.DoMulti(ctx, names, func(ctx context.Context) error {
			tokens, ok := dlock.TokensFromContext(ctx)
			if !ok || len(tokens) != 2 || tokens[names[0]] == 0 || tokens[names[1]] == 0 {
				t.Errorf("TokensFromContext = %v, %v", tokens, ok)
			}
			for _, n := range names {
				if heldBy(t, n) == "" {
					t.Errorf("%s not held inside DoMulti", n)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		err = c.DoMulti(ctx, names, func(fctx context.Context) error {
			if _, err := admin.ForceUnlock(ctx, names[0]); err != nil {
				return err
			}
			select {
			case <-fctx.Done():
				return context.Cause(fctx)
			case <-time.After(5 * time.Second):
				return errors.New("not cancelled")
			}
		})
		if !errors.Is(err, dlock.ErrLost) || !strings.Contains(err.Error(), names[0]) || !strings.Contains(err.Error(), "lost while fn ran") {
			t.Fatalf("DoMulti with a name lost = %v, want ErrLost naming %s", err, names[0])
		}
		for _, n := range names {
			if heldBy(t, n) != "" {
				t.Errorf("%s held after DoMulti returned", n)
			}
		}
	})
}

// Two transfers in opposite directions at once, again and again, both finish: the names are
// taken in one global order whatever order they are given in.
func TestMultiMutex_OppositeOrderTransfers(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		a, b := tr.dial(t, shared.URL()), tr.dial(t, shared.URL())
		names := multiNames(t, 2)
		var inside atomic.Int32
		var wg sync.WaitGroup
		for i, c := range []*dlock.Client{a, b, a, b} {
			order := slices.Clone(names)
			if i%2 == 1 {
				slices.Reverse(order)
			}
			wg.Go(func() {
				for range 50 {
					err := c.DoMulti(ctx, order, func(context.Context) error {
						if n := inside.Add(1); n != 1 {
							t.Errorf("%d transfers inside at once", n)
						}
						inside.Add(-1)
						return nil
					})
					if err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	})
}

// transferLoad is the random-pairs load: goroutines spread over clients move money between
// random pairs of accounts, each under a multi-lock of the two accounts, for about d. Each
// account's balance and "inside" mark are touched only under its lock (the race detector and
// the marks catch an overlap); the total must stay what it was.
func transferLoad(t *testing.T, clients []*dlock.Client, goroutines int, accounts []string, d time.Duration) (transfers int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second) // no deadlock: all finish well before
	defer cancel()
	balance := make(map[string]*int64, len(accounts))
	inside := make(map[string]*atomic.Int32, len(accounts))
	for _, a := range accounts {
		v := int64(1000)
		balance[a], inside[a] = &v, new(atomic.Int32)
	}
	stop := time.Now().Add(d)
	var done atomic.Int64
	each := make([]int, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		c := clients[g%len(clients)]
		rng := rand.New(rand.NewPCG(uint64(g), 7))
		wg.Go(func() {
			for time.Now().Before(stop) {
				i := rng.IntN(len(accounts))
				j := (i + 1 + rng.IntN(len(accounts)-1)) % len(accounts)
				from, to := accounts[i], accounts[j]
				err := c.DoMulti(ctx, []string{from, to}, func(context.Context) error {
					for _, a := range []string{from, to} {
						if n := inside[a].Add(1); n != 1 {
							t.Errorf("%s: %d holders at once", a, n)
						}
					}
					amount := rng.Int64N(10)
					*balance[from] -= amount
					*balance[to] += amount
					for _, a := range []string{from, to} {
						inside[a].Add(-1)
					}
					return nil
				})
				if err != nil {
					t.Errorf("transfer %s -> %s: %v", from, to, err)
					return
				}
				done.Add(1)
				each[g]++
			}
		})
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-ctx.Done():
		t.Fatalf("transfers still running %v after the end of the load: deadlock", 30*time.Second)
	}
	var total int64
	for _, a := range accounts {
		total += *balance[a]
	}
	if want := int64(1000 * len(accounts)); total != want {
		t.Errorf("total %d after the transfers, want %d", total, want)
	}
	t.Logf("transfers per goroutine: %v", each)
	if slices.Min(each) == 0 {
		t.Errorf("a goroutine made no transfer in %v (starved): %v", d, each)
	}
	return done.Load()
}

// multiLoadDuration is how long the random-pairs tests run: 2 s, or DLOCK_MULTI_LOAD (a
// duration) for a longer run.
func multiLoadDuration(t *testing.T) time.Duration {
	if v := os.Getenv("DLOCK_MULTI_LOAD"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("DLOCK_MULTI_LOAD: %v", err)
		}
		return d
	}
	return 2 * time.Second
}

// 8 goroutines over 3 clients, random pairs over 4 names: no deadlock, no overlap, money kept.
// Then 8 goroutines of one client, where names pass between them without the server.
func TestMultiMutex_RandomPairsNoDeadlockNoOverlap(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		clients := []*dlock.Client{tr.dial(t, shared.URL()), tr.dial(t, shared.URL()), tr.dial(t, shared.URL())}
		d := multiLoadDuration(t)
		n := transferLoad(t, clients, 8, multiNames(t, 4), d)
		t.Logf("%d transfers in %v over 3 clients", n, d)
		n = transferLoad(t, clients[:1], 8, multiNames(t, 4), d)
		t.Logf("%d transfers in %v in one client", n, d)
	})
}

// On a Redis Cluster: names that share a hash tag are one script on their slot's master; names
// on several slots are taken slot by slot, one script each, in the global order; random pairs
// over names of several slots neither deadlock nor overlap. A latch there is woken through
// sharded pub/sub.
func TestCluster_MultiMutexAndLatch(t *testing.T) {
	g := redistest.NewCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	clients := clusterClients(t, g)
	others := clusterClients(t, g)
	for _, tr := range []string{"rueidis", "goredis"} {
		t.Run(tr, func(t *testing.T) {
			c := clients[tr]
			base := uniqueName(t)
			// "<tag>}<rest>": the part before the first '}' is the hash tag (docs/PROTOCOL.md).
			tagged := []string{base + "}usd", base + "}eur", base + "}gbp"}
			slot := redistest.SlotOf(keyOf(tagged[0]))
			master, err := g.MasterOfSlot(ctx, slot)
			if err != nil {
				t.Fatal(err)
			}
			// Every master has the scripts cached from here on (a NOSCRIPT costs a second call).
			warm, err := c.MultiMutex([]string{base + "}warm1", base + "}warm2"}).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			warm.Unlock(ctx)
			for _, m := range g.Masters() {
				for _, s := range dlock.Scripts() {
					redisDo(t, m, "SCRIPT", "LOAD", s.Src)
				}
			}
			before := scriptCalls(t, master)
			l, err := c.MultiMutex(tagged).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if n := scriptCalls(t, master) - before; n != 1 {
				t.Errorf("Lock of 3 names sharing a hash tag ran %d scripts on their master, want 1", n)
			}
			if _, err := others[tr].Mutex(tagged[1]).TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
				t.Errorf("Mutex of a name the multi-lock holds = %v, want ErrNotAcquired", err)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}

			// Names on every shard.
			var spread []string
			slots := map[int]bool{}
			for i, m := range g.Masters() {
				for n := 0; ; n++ {
					cand := fmt.Sprintf("%s-shard%d-%d", base, i, n)
					if owner, err := g.MasterOfSlot(ctx, redistest.SlotOf(keyOf(cand))); err == nil && owner == m {
						spread = append(spread, cand)
						slots[redistest.SlotOf(keyOf(cand))] = true
						break
					}
				}
			}
			calls := func() (n int) {
				for _, m := range g.Masters() {
					n += scriptCalls(t, m)
				}
				return n
			}
			before = calls()
			l, err = c.MultiMutex(spread).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if n := calls() - before; n != len(slots) {
				t.Errorf("Lock of names on %d slots ran %d scripts, want one per slot", len(slots), n)
			}
			for _, n := range spread {
				if _, err := others[tr].Mutex(n).TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
					t.Errorf("Mutex of %s while the multi-lock holds it = %v, want ErrNotAcquired", n, err)
				}
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}

			accounts := append(spread, tagged[0]) // two of them share a slot with nothing else
			n := transferLoad(t, []*dlock.Client{c, others[tr]}, 6, accounts, multiLoadDuration(t))
			t.Logf("%d transfers over %d slots in %v", n, len(slots)+1, multiLoadDuration(t))

			name := base + "-latch"
			done := make(chan error, 1)
			go func() { done <- others[tr].Latch(name, 2).Wait(ctx) }()
			lt := c.Latch(name, 2)
			for range 2 {
				if err := lt.CountDown(ctx); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("latch waiter not woken on the Cluster")
			}
		})
	}
}

// Quorum mode: the names are taken one by one in the global order, each a quorum lock; the
// multi-lock excludes Mutex holders of its names and opposite-order transfers finish. Latches
// are refused there.
func TestQuorum_MultiMutex(t *testing.T) {
	srv := startN(t, 5)
	for _, tr := range quorumTransports {
		t.Run(tr.name, func(t *testing.T) {
			ctx := ctxT(t)
			a := tr.dial(t, serverAddrs(srv))
			b := tr.dial(t, serverAddrs(srv))
			names := multiNames(t, 3)
			l, err := a.MultiMutex(names).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range names {
				if h := holders(t, srv, n); h < 3 {
					t.Errorf("%s held on %d servers, want a majority", n, h)
				}
			}
			if _, err := b.Mutex(names[1]).TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
				t.Errorf("Mutex of a held name = %v, want ErrNotAcquired", err)
			}
			if _, err := b.MultiMutex(names[1:]).TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
				t.Errorf("MultiMutex TryLock of held names = %v, want ErrNotAcquired", err)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			// A release returns once a majority answered; the others follow.
			waitFor(t, 10*time.Second, "every server to release", func(context.Context) error {
				for _, n := range names {
					if h := holders(t, srv, n); h != 0 {
						return fmt.Errorf("%s held on %d servers after Unlock", n, h)
					}
				}
				return nil
			})
			var wg sync.WaitGroup
			var inside atomic.Int32
			for i, c := range []*dlock.Client{a, b} {
				order := slices.Clone(names[:2])
				if i == 1 {
					slices.Reverse(order)
				}
				wg.Go(func() {
					for range 20 {
						err := c.DoMulti(ctx, order, func(context.Context) error {
							if n := inside.Add(1); n != 1 {
								t.Errorf("%d inside", n)
							}
							inside.Add(-1)
							return nil
						})
						if err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			if err := a.Latch(uniqueName(t), 1).CountDown(ctx); !errors.Is(err, dlock.ErrInvalid) {
				t.Errorf("Latch in quorum mode = %v, want ErrInvalid", err)
			}
		})
	}
}

// A multi-lock's release publishes only where someone listens, as a single lock's does: an
// uncontended Lock and Unlock publish nothing; a subscriber of a pattern hears each name's
// release, with its token.
func TestMultiMutex_ReleasePublishesOnlyToListeners(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		s := redistest.Start(t)
		ctx := ctxT(t)
		c := tr.dial(t, s.URL())
		names := []string{"quiet:a", "quiet:b"}
		cycle := func() map[string]uint64 {
			l, err := c.MultiMutex(names).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			return l.Tokens()
		}
		cycle() // scripts loaded
		redisDo(t, s, "CONFIG", "RESETSTAT")
		cycle()
		if stats := redisDo(t, s, "INFO", "commandstats"); strings.Contains(stats, "cmdstat_publish:") {
			t.Errorf("an uncontended multi-lock published a message:\n%s", stats)
		}
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
		defer rdb.Close()
		sub := rdb.PSubscribe(ctx, "dlock:*")
		defer sub.Close()
		if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
			t.Fatal(err)
		}
		tokens := cycle()
		heard := map[string]string{}
		for range names {
			msg, err := sub.ReceiveMessage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			heard[msg.Channel] = msg.Payload
		}
		for _, n := range names {
			if got, want := heard[keyOf(n)+":rel"], fmt.Sprint(tokens[n]); got != want {
				t.Errorf("pattern subscriber heard %q on %s:rel, want the release of token %s", got, keyOf(n), want)
			}
		}
	})
}
