package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/goredisconn"
	"github.com/dlock-go/dlock/internal/redistest"
)

// startN starts n independent redis-servers.
func startN(t *testing.T, n int) []*redistest.Server {
	t.Helper()
	redistest.Require(t)
	srv := make([]*redistest.Server, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range srv {
		wg.Add(1)
		go func() {
			defer wg.Done()
			srv[i], errs[i] = redistest.StartProcess()
		}()
	}
	wg.Wait()
	for i, s := range srv {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		t.Cleanup(func() { s.Close() })
	}
	return srv
}

func urlsOf(addrs ...string) []string {
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = "redis://" + a + "/0"
	}
	return out
}

func serverAddrs(srv []*redistest.Server) []string {
	out := make([]string, len(srv))
	for i, s := range srv {
		out[i] = s.Addr
	}
	return out
}

// quorumTransports make quorum clients through each adapter.
var quorumTransports = []struct {
	name string
	dial func(t testing.TB, addrs []string, opts ...dlock.ClientOption) *dlock.Client
}{
	{"rueidis", func(t testing.TB, addrs []string, opts ...dlock.ClientOption) *dlock.Client {
		t.Helper()
		c, err := dlock.DialQuorum(context.Background(), urlsOf(addrs...), opts...)
		if err != nil {
			t.Fatalf("DialQuorum: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}},
	{"goredis", func(t testing.TB, addrs []string, opts ...dlock.ClientOption) *dlock.Client {
		t.Helper()
		var conns []dlock.Conn
		var rcs []*redis.Client
		for _, a := range addrs {
			rc := redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true})
			rcs = append(rcs, rc)
			conns = append(conns, goredisconn.New(rc))
		}
		c, err := dlock.NewQuorum(conns, opts...)
		if err != nil {
			t.Fatalf("NewQuorum: %v", err)
		}
		t.Cleanup(func() {
			c.Close()
			for _, rc := range rcs {
				rc.Close()
			}
		})
		return c
	}},
}

// holders counts the servers on which name is held (a value that is not a release residue).
func holders(t *testing.T, srv []*redistest.Server, name string) int {
	t.Helper()
	n := 0
	for _, s := range srv {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		v, err := s.Do(ctx, "GET", keyOf(name))
		cancel()
		if err == nil && v != "" && !strings.HasPrefix(v, "- ") {
			n++
		}
	}
	return n
}

func TestQuorum_LockUnlockWakeAndReentry(t *testing.T) {
	srv := startN(t, 5)
	for _, tr := range quorumTransports {
		t.Run(tr.name, func(t *testing.T) {
			a := tr.dial(t, serverAddrs(srv), dlock.WithTTL(10*time.Second))
			b := tr.dial(t, serverAddrs(srv), dlock.WithTTL(10*time.Second))
			name := uniqueName(t)
			ctx := ctxT(t)
			l, err := a.Mutex(name).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if l.Token() == 0 {
				t.Fatal("token 0")
			}
			if n := holders(t, srv, name); n < 3 {
				t.Fatalf("held on %d servers, want a majority", n)
			}
			if _, err := b.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
				t.Fatalf("TryLock by another client = %v, want ErrNotAcquired", err)
			}
			// Re-entry: same token, the lock stays held after the inner unlock.
			inner, err := a.Mutex(name).Lock(l.Context())
			if err != nil {
				t.Fatalf("re-enter: %v", err)
			}
			if inner.Token() != l.Token() {
				t.Fatalf("re-entered token %d, want %d", inner.Token(), l.Token())
			}
			if err := inner.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if d, err := l.TTL(ctx); err != nil || d <= 0 || d > 10*time.Second {
				t.Fatalf("TTL after inner unlock = %v, %v", d, err)
			}
			// A waiter is woken by the release, long before the 10 s lease could run out.
			got := make(chan *dlock.Lease, 1)
			errc := make(chan error, 1)
			go func() {
				l2, err := b.Mutex(name).Lock(ctx)
				errc <- err
				got <- l2
			}()
			waitFor(t, 5*time.Second, "waiter subscribed", func(context.Context) error {
				if subscribers(t, srv[0], keyOf(name)+":rel:*") == 0 {
					return errors.New("no subscriber")
				}
				return nil
			})
			start := time.Now()
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			l2 := <-got
			if el := time.Since(start); el > 5*time.Second {
				t.Fatalf("waiter took %v after the release", el)
			}
			if l2.Token() <= l.Token() {
				t.Fatalf("next token %d not above %d", l2.Token(), l.Token())
			}
			if err := l2.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			// Unlock returns once a majority released; the others follow.
			waitFor(t, 5*time.Second, "released on every server", func(context.Context) error {
				if n := holders(t, srv, name); n != 0 {
					return fmt.Errorf("held on %d servers", n)
				}
				return nil
			})
		})
	}
}

func subscribers(t *testing.T, s *redistest.Server, pattern string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	out, err := s.Do(ctx, "PUBSUB", "CHANNELS", pattern)
	if err != nil {
		t.Fatal(err)
	}
	return len(strings.Fields(out))
}

func TestQuorum_MinorityDownStillWorksMajorityDownFailsFast(t *testing.T) {
	srv := startN(t, 5)
	c := quorumTransports[0].dial(t, serverAddrs(srv), dlock.WithTTL(300*time.Millisecond))
	ctx := ctxT(t)
	srv[0].Kill()
	srv[1].Kill()
	name := uniqueName(t)
	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatalf("Lock with 2 of 5 down: %v", err)
	}
	// Renewal keeps the lease on the remaining majority through several TTLs.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if err := l.Context().Err(); err != nil {
			t.Fatalf("lease lost with 3 of 5 up: %v", context.Cause(l.Context()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// A third server down: no majority. TryLock fails at once, saying so.
	srv[2].Kill()
	start := time.Now()
	_, err = c.Mutex(uniqueName(t)).TryLock(ctx)
	if !errors.Is(err, dlock.ErrNoQuorum) || errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryLock with 3 of 5 down = %v, want ErrNoQuorum", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("TryLock with 3 of 5 down took %v", el)
	}
	t.Logf("3 of 5 down: %v after %v", err, time.Since(start))
}

func TestQuorum_LostWhenMajorityCannotRenew(t *testing.T) {
	srv := startN(t, 5)
	c := quorumTransports[0].dial(t, serverAddrs(srv), dlock.WithTTL(300*time.Millisecond))
	ctx := ctxT(t)
	l, err := c.Mutex(uniqueName(t)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	for _, s := range srv[:3] {
		s.Kill()
	}
	select {
	case <-l.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("lease context not cancelled with 3 of 5 servers down")
	}
	if !errors.Is(context.Cause(l.Context()), dlock.ErrLost) {
		t.Fatalf("cause %v, want ErrLost", context.Cause(l.Context()))
	}
	t.Logf("lost %v after the majority went down (TTL 300ms)", time.Since(killed))
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Unlock after loss = %v, want ErrLost", err)
	}
}

// TestQuorum_SlowServer: one server 50 ms away does not slow acquisitions down: the majority
// of fast servers decides.
func TestQuorum_SlowServer(t *testing.T) {
	srv := startN(t, 5)
	p := redistest.NewProxy(t, srv[4].Addr)
	p.SetDelay(50 * time.Millisecond)
	addrs := append(serverAddrs(srv[:4]), p.Addr)
	c := quorumTransports[0].dial(t, addrs, dlock.WithTTL(5*time.Second))
	ctx := ctxT(t)
	var took []time.Duration
	for range 21 {
		name := uniqueName(t)
		start := time.Now()
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		took = append(took, time.Since(start))
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(took)
	t.Logf("acquire with one server delayed 50 ms: median %v, max %v", took[len(took)/2], took[len(took)-1])
	if took[len(took)/2] >= 50*time.Millisecond {
		t.Fatalf("median acquire %v: it waited for the slow server", took[len(took)/2])
	}
}

// TestQuorum_TokensIncreaseAcrossMajorities: the servers' tokens are unrelated (here one server
// behaves as if its clock were far ahead); a later acquisition through another majority must
// still get a larger token, because a release stores the lease's token on every server.
func TestQuorum_TokensIncreaseAcrossMajorities(t *testing.T) {
	srv := startN(t, 5)
	name := uniqueName(t)
	ahead := int64(9_000_000_000_000_000) // µs: a server clock centuries ahead
	redisDo(t, srv[0], "SET", keyOf(name), fmt.Sprintf("- %d 0", ahead), "PX", "60000")
	// a reaches servers 3 and 4 through 100 ms of delay, so the majority that decides its
	// acquisition is servers 0-2, and its token is server 0's.
	p3 := redistest.NewProxy(t, srv[3].Addr)
	p4 := redistest.NewProxy(t, srv[4].Addr)
	p3.SetDelay(100 * time.Millisecond)
	p4.SetDelay(100 * time.Millisecond)
	a := quorumTransports[0].dial(t, append(serverAddrs(srv[:3]), p3.Addr, p4.Addr))
	ctx := ctxT(t)
	la, err := a.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if la.Token() <= uint64(ahead) {
		t.Fatalf("token %d: the largest server token is %d", la.Token(), ahead)
	}
	if err := la.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// b never reaches server 0: its majority is servers 1-4.
	b := quorumTransports[1].dial(t, serverAddrs(srv[1:]))
	lb, err := b.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Unlock(ctx)
	if lb.Token() <= la.Token() {
		t.Fatalf("token through another majority %d, not above the previous %d", lb.Token(), la.Token())
	}
}

// TestQuorum_RestartEmpty shows the hazard the Redlock description warns about: a server that
// restarts without its data while a lock is held lets a second client take the lock through
// a majority that includes it. With a delayed restart (longer than the lease), the first
// holder learns it lost the lock before the second can take it.
func TestQuorum_RestartEmpty(t *testing.T) {
	for _, delayed := range []bool{false, true} {
		t.Run(map[bool]string{false: "immediate", true: "delayed"}[delayed], func(t *testing.T) {
			srv := startN(t, 5)
			ttl := 500 * time.Millisecond
			if !delayed {
				// The hazard shows while a's lease lasts: long enough for a restart and a new
				// client's Dial on a loaded machine.
				ttl = 3 * time.Second
			}
			// a reaches servers 3 and 4 only through proxies, cut while it takes the lock, so it
			// holds the lock on servers 0-2 only.
			p3 := redistest.NewProxy(t, srv[3].Addr)
			p4 := redistest.NewProxy(t, srv[4].Addr)
			a := quorumTransports[0].dial(t, append(serverAddrs(srv[:3]), p3.Addr, p4.Addr), dlock.WithTTL(ttl))
			ctx := ctxT(t)
			name := uniqueName(t)
			p3.Block()
			p4.Block()
			la, err := a.Mutex(name).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if n := holders(t, srv, name); n != 3 {
				t.Fatalf("held on %d servers, want 3", n)
			}
			if delayed {
				srv[2].Kill()
				// Stay down longer than the lease: a's lease can no longer be renewed on a
				// majority, so its context is cancelled.
				time.Sleep(ttl + 100*time.Millisecond)
				if err := srv[2].Restart(); err != nil {
					t.Fatal(err)
				}
			} else {
				srv[2].Kill()
				if err := srv[2].Restart(); err != nil {
					t.Fatal(err)
				}
			}
			b := quorumTransports[0].dial(t, serverAddrs(srv), dlock.WithTTL(ttl)) // after the restart: no stale connection
			lb, err := b.Mutex(name).TryLock(ctx)
			aLive := la.Context().Err() == nil
			if err == nil {
				defer lb.Unlock(ctx)
			}
			switch {
			case !delayed && (err != nil || !aLive):
				t.Fatalf("immediate restart: b.TryLock = %v, a live = %v; the hazard did not show", err, aLive)
			case !delayed:
				t.Logf("immediate restart without data: two holders at once (tokens %d and %d)", la.Token(), lb.Token())
			case aLive:
				t.Fatalf("delayed restart: a's lease still live when b tried (b: %v)", err)
			default:
				t.Logf("delayed restart: a lost its lease (%v) before b tried (b: %v)", context.Cause(la.Context()), err)
			}
			p3.Unblock()
			p4.Unblock()
		})
	}
}

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

// Quorum errors list every server on one line.
func TestErrors_OneLine(t *testing.T) {
	ctx := ctxT(t)
	_, err := dlock.DialQuorum(ctx, []string{"redis://127.0.0.1:1", "redis://127.0.0.1:2", "redis://127.0.0.1:3"})
	if err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("DialQuorum error %q: want one line", err)
	}
}

// Two clients take two names nested, again and again, each waiting for the other's grants:
// every lease holds until its Unlock. (A head's attempt that split the servers once gave its
// registration's owner back everywhere while a grant to that registration reached a majority:
// the lease made from the grant was then held nowhere.)
func TestQuorum_NestedPingPongKeepsLeases(t *testing.T) {
	srv := startN(t, 5)
	for _, tr := range quorumTransports {
		t.Run(tr.name, func(t *testing.T) {
			ctx := ctxT(t)
			a := tr.dial(t, serverAddrs(srv))
			b := tr.dial(t, serverAddrs(srv))
			outer, inner := uniqueName(t), uniqueName(t)
			var wg sync.WaitGroup
			var inside sync.Mutex
			for _, c := range []*dlock.Client{a, b} {
				wg.Go(func() {
					for range 40 {
						err := c.Do(ctx, outer, func(ctx context.Context) error {
							return c.Do(ctx, inner, func(context.Context) error {
								if !inside.TryLock() {
									t.Error("two holders at once")
									return nil
								}
								inside.Unlock()
								return nil
							})
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
}
