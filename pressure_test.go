package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/goredisconn"
	"github.com/dlock-go/dlock/internal/redistest"
)

// outOfMemory puts s over its memory limit (some data, then a maxmemory below what it uses, its
// policy noeviction) until the test ends, and checks that a plain write is refused.
func outOfMemory(t *testing.T, s *redistest.Server) {
	t.Helper()
	ctx := ctxT(t)
	for i := range 32 {
		if _, err := s.Do(ctx, "SET", fmt.Sprintf("filler:%d", i), strings.Repeat("x", 64<<10)); err != nil {
			t.Fatal(err)
		}
	}
	info, err := s.Do(ctx, "INFO", "memory")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Do(ctx, "CONFIG", "SET", "maxmemory", strconv.Itoa(infoField(t, info, "used_memory")/2)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Do(context.Background(), "CONFIG", "SET", "maxmemory", "0") })
	if _, err := s.Do(ctx, "SET", "one-more", "x"); err == nil || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("a write on the full server: %v, want OOM", err)
	}
}

// Out of memory under noeviction, every kind of release still works: a read hold and a write
// hold of read-write locks, a semaphore's permits, a multi-lock, and a Mutex's release that
// grants the lock to the client queued for it (whose waiting Lock then gets it: it could not
// have taken it itself, acquisitions being refused). Nothing stays held.
func TestOOM_EveryReleaseWorks(t *testing.T) {
	s := redistest.Start(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		if _, err := s.Do(ctx, "FLUSHALL"); err != nil {
			t.Fatal(err)
		}
		c, waiter := tr.dial(t, s.URL()), tr.dial(t, s.URL())
		base := uniqueName(t)
		held := map[string]*dlock.Lease{}
		take := func(name string) func(*dlock.Lease, error) {
			return func(l *dlock.Lease, err error) {
				t.Helper()
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				held[name] = l
			}
		}
		take("read")(c.RWMutex(base + "-read").RLock(ctx))
		take("write")(c.RWMutex(base + "-write").Lock(ctx))
		take("semaphore")(c.Semaphore(base+"-sem", 2).Acquire(ctx, 1))
		take("multi")(c.MultiMutex([]string{base + "-m1", base + "-m2"}).Lock(ctx))
		queued := base + "-queued"
		l, err := c.Mutex(queued, dlock.WithTTL(30*time.Second)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			wl, err := waiter.Mutex(queued).Lock(ctx)
			if err == nil {
				if uerr := wl.Unlock(ctx); uerr != nil && !errors.Is(uerr, dlock.ErrLost) {
					err = uerr
				}
			}
			got <- err
		}()
		waitFor(t, 10*time.Second, "the waiter to queue", func(ctx context.Context) error {
			if n, err := s.Do(ctx, "ZCARD", keyOf(queued)+":q"); err != nil || n != "1" {
				return fmt.Errorf("queue of %s: %s, %v", queued, n, err)
			}
			return nil
		})

		outOfMemory(t, s)
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("Unlock of a lock a client waits for, out of memory: %v", err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("the queued client, granted the lock by a release out of memory: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the queued client did not get the lock within 10 s of its release out of memory (lease 30 s)")
		}
		for what, l := range held {
			if err := l.Unlock(ctx); err != nil {
				t.Fatalf("Unlock of the %s hold out of memory: %v", what, err)
			}
		}
		for _, name := range []string{base + "-read", base + "-write", base + "-sem", base + "-m1", base + "-m2", queued} {
			if info, err := c.Inspect(ctx, name); err != nil || info.Held {
				t.Errorf("%s after its Unlock out of memory: %+v, %v; want free", name, info, err)
			}
		}
		if _, err := s.Do(ctx, "CONFIG", "SET", "maxmemory", "0"); err != nil {
			t.Fatal(err)
		}
	})
}

// A release that failed on the network is retried in the background, and a waiter of the
// same client gets the lock once the retry succeeds, long before the holder's lease would
// have run out. (The waiter asks for another lease, so the lock passes through the server,
// not by a local handoff, which needs no network.)
func TestUnlock_RetriedReleaseWakesThisClientsWaiter(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		proxy := redistest.NewProxy(t, shared.Addr)
		c := tr.dial(t, strings.Replace(proxy.URL(), "://", "://"+testUser+":"+testPassword+"@", 1))
		name := uniqueName(t)
		l, err := c.Mutex(name, dlock.WithTTL(30*time.Second)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			w, err := c.Mutex(name, dlock.WithTTL(20*time.Second)).Lock(ctx)
			if err == nil {
				err = w.Unlock(ctx)
			}
			got <- err
		}()
		waitQueued(t, name, 1)
		proxy.Block()
		uctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err = l.Unlock(uctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "retrying") {
			t.Fatalf("Unlock through a hung connection = %v, want an error naming %q that says it is retried", err, name)
		}
		proxy.Unblock()
		unblocked := time.Now()
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("the waiter of the same client: %v", err)
			}
			t.Logf("the waiter of the same client got the lock %v after the connection came back", time.Since(unblocked))
		case <-time.After(10 * time.Second):
			t.Fatal("the waiter of the same client did not get the lock within 10 s of the connection coming back (lease 30 s)")
		}
	})
}

// In quorum mode every server's memory policy is checked: one server of three that can evict
// keys makes DialQuorum and NewQuorum refuse, naming it, unless WithUnsafeEviction.
func TestEviction_QuorumChecksEveryServer(t *testing.T) {
	srv := startN(t, 3)
	ctx := ctxT(t)
	bad := srv[1]
	for _, args := range [][]string{{"CONFIG", "SET", "maxmemory", "64mb"}, {"CONFIG", "SET", "maxmemory-policy", "allkeys-lru"}} {
		if _, err := bad.Do(ctx, args...); err != nil {
			t.Fatal(err)
		}
	}
	addrs := serverAddrs(srv)
	newQuorum := func(opts ...dlock.ClientOption) (*dlock.Client, error) {
		var conns []dlock.Conn
		for _, a := range addrs {
			rc := redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true})
			t.Cleanup(func() { rc.Close() })
			conns = append(conns, goredisconn.New(rc))
		}
		return dlock.NewQuorum(conns, opts...)
	}
	dials := map[string]func(...dlock.ClientOption) (*dlock.Client, error){
		"DialQuorum": func(opts ...dlock.ClientOption) (*dlock.Client, error) {
			return dlock.DialQuorum(ctx, urlsOf(addrs...), opts...)
		},
		"NewQuorum": newQuorum,
	}
	for what, dial := range dials {
		c, err := dial()
		if err == nil {
			c.Close()
		}
		if !errors.Is(err, dlock.ErrEvictionPolicy) || !strings.Contains(err.Error(), bad.Addr) || !strings.Contains(err.Error(), "allkeys-lru") {
			t.Errorf("%s with one server that can evict = %v, want ErrEvictionPolicy naming %s and its policy", what, err, bad.Addr)
		}
		c, err = dial(dlock.WithUnsafeEviction(), dlock.WithLogger(new(logBuffer).logger()))
		if err != nil {
			t.Errorf("%s with WithUnsafeEviction: %v", what, err)
			continue
		}
		c.Close()
	}
}
