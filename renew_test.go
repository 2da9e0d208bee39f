package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/goredisconn"
	"github.com/dlock-go/dlock/internal/redistest"
)

// Renewal is batched: many held leases cost one loop, no goroutine each, and a handful of
// script calls per renewal period.
func TestRenewal_BatchedOneLoopNoGoroutinePerLease(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		const (
			leases = 2000
			ttl    = time.Second // a round of 2000 renewals has 2/3 s to land on a busy machine
			window = 3 * time.Second
		)
		ctx := ctxT(t)
		s := redistest.Start(t)
		// The renewals the loop sends (retries of a failed round included): each script call
		// must carry many of them, whatever the machine's load makes of the rounds.
		var sent atomic.Int64
		c := tr.dial(t, s.URL(), dlock.WithTTL(ttl), dlock.WithObserver(dlock.Observer{Renewal: func(ev dlock.RenewalEvent) {
			sent.Add(int64(ev.Leases))
		}}))
		held := make([]*dlock.Lease, leases)
		for i := range held {
			l, err := c.Mutex(fmt.Sprintf("lease-%d", i)).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			held[i] = l
		}
		// The client's own goroutines: the renewal loop, its sender, the subscription. (The
		// transport starts connection goroutines of its own when it pleases; they are not counted.)
		if n := dlockGoroutines(); n < 2 || n > 3 {
			t.Errorf("%d dlock goroutines while holding %d leases, want the loop, its sender and at most the subscription", n, leases)
		}
		before, sentBefore := scriptCalls(t, s), sent.Load()
		time.Sleep(window)
		calls, renewals := scriptCalls(t, s)-before, sent.Load()-sentBefore
		periods := float64(window) / float64(ttl/3)
		perHundred := float64(calls) / (float64(renewals) / 100)
		t.Logf("%d leases, %v (%.0f periods): %d renewals sent in %d script calls = %.2f calls per 100 renewals", leases, window, periods, renewals, calls, perHundred)
		if renewals < leases {
			t.Errorf("%d renewals sent in %v, want at least one round of %d", renewals, window, leases)
		}
		if perHundred > 1 {
			t.Errorf("%.2f renew calls per 100 renewals, want <= 1", perHundred)
		}
		for _, l := range held {
			if err := l.Context().Err(); err != nil {
				t.Fatalf("lease lost while renewed in batches: %v", context.Cause(l.Context()))
			}
			l.Unlock(ctx)
		}
	})
}

// dlockGoroutines counts the goroutines running dlock's own code (tests excluded).
func dlockGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "github.com/dlock-go/dlock.") && !strings.Contains(g, "_test.go") {
			count++
		}
	}
	return count
}

func scriptCalls(t testing.TB, s *redistest.Server) int {
	st := commandStats(t, s)
	return int(st["evalsha"].calls + st["eval"].calls)
}

// cmdStat is one command's line of INFO commandstats: its calls and the µs spent in them.
type cmdStat struct{ calls, usec int64 }

func (s cmdStat) sub(o cmdStat) cmdStat { return cmdStat{s.calls - o.calls, s.usec - o.usec} }

// commandStats reads s's INFO commandstats: calls and usec per command (scripts' own commands
// included), by command name as INFO writes it ("evalsha", "pubsub|numsub").
func commandStats(t testing.TB, s *redistest.Server) map[string]cmdStat {
	t.Helper()
	out := map[string]cmdStat{}
	for _, line := range strings.Split(redisDo(t, s, "INFO", "commandstats"), "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st cmdStat
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				st.calls = n
			case "usec":
				st.usec = n
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return out
}

// Close returns while renewals are in flight (a batch handed to the sender as the client
// closes must still be answered, or Close would wait forever).
func TestClose_DuringRenewals(t *testing.T) {
	needShared(t)
	ctx := ctxT(t)
	for i := 0; i < 30; i++ {
		c, err := dlock.Dial(ctx, shared.URL(), dlock.WithTTL(dlock.MinTTL))
		if err != nil {
			t.Fatal(err)
		}
		for j := 0; j < 20; j++ {
			if _, err := c.Mutex(fmt.Sprintf("%s-%d-%d", uniqueName(t), i, j)).TryLock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Duration(i%5) * time.Millisecond) // renewals every ~3 ms
		done := make(chan error, 1)
		go func() { done <- c.Close() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("Close did not return (iteration %d)", i)
		}
	}
}

// Row "lease shorter than the work": renewal keeps a 500 ms lease held through 3 s of work (six
// leases long; shorter leases measure the machine's load more than the renewal loop).
func TestRenewal_KeepsShortLeaseThroughLongWork(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL(), dlock.WithTTL(500*time.Millisecond))
		other := tr.dial(t, shared.URL())
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); <-tick.C {
			if err := l.Context().Err(); err != nil {
				t.Fatalf("lease ended during the work: %v", context.Cause(l.Context()))
			}
			if _, err := other.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
				t.Fatalf("another client's TryLock during the work: got %v, want ErrNotAcquired", err)
			}
		}
		if d, err := l.TTL(ctx); err != nil || d <= 0 || d > 500*time.Millisecond {
			t.Fatalf("TTL after 3s = %v, %v; want in (0, 500ms]", d, err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(context.Cause(l.Context()), context.Canceled) {
			t.Fatalf("cause after Unlock = %v, want context.Canceled", context.Cause(l.Context()))
		}
	})
}

// Row "lease shorter than the work" (the told-when-lost half): a holder cut off from Redis
// has its lease context cancelled with ErrLost before anyone else can take the lock.
func TestLostSignal_PartitionedHolder(t *testing.T) {
	needShared(t)
	// Also through a go-redis client left at its defaults, whose calls ignore context
	// deadlines: the renewal loop must keep its deadlines anyway.
	plain := transport{"goredis-default-timeouts", func(t testing.TB, url string, opts ...dlock.ClientOption) *dlock.Client {
		o, err := redis.ParseURL(url)
		if err != nil {
			t.Fatal(err)
		}
		rc := redis.NewClient(o)
		c, err := dlock.New(goredisconn.New(rc), opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			c.Close()
			rc.Close()
		})
		return c
	}}
	for _, tr := range append(transports[:len(transports):len(transports)], plain) {
		t.Run(tr.name, func(t *testing.T) { testLostSignalPartitioned(t, tr) })
	}
}

func testLostSignalPartitioned(t *testing.T, tr transport) {
	const ttl = 300 * time.Millisecond
	ctx := ctxT(t)
	name := uniqueName(t)
	proxy := redistest.NewProxy(t, shared.Addr)
	cut := tr.dial(t, proxy.URL(), dlock.WithTTL(ttl))
	other := tr.dial(t, shared.URL())
	l, err := cut.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lostAt := make(chan time.Time, 1)
	go func() {
		<-l.Context().Done()
		lostAt <- time.Now()
	}()
	proxy.Block()
	defer proxy.Unblock()
	l2, err := other.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	acquiredAt := time.Now()
	defer l2.Unlock(ctx)
	select {
	case <-l.Context().Done(): // closed by the renewal loop, not by a check of Err
	default:
		t.Fatal("second holder acquired while the partitioned lease context was live")
	}
	select {
	case at := <-lostAt:
		t.Logf("lost signal %v before the second holder acquired", acquiredAt.Sub(at))
		if !at.Before(acquiredAt) {
			t.Logf("the watching goroutine ran %v after the second holder acquired (scheduling); Done was closed before", at.Sub(acquiredAt))
		}
	case <-time.After(time.Second):
		t.Fatal("no lost signal")
	}
	if !errors.Is(context.Cause(l.Context()), dlock.ErrLost) {
		t.Fatalf("cause = %v, want ErrLost", context.Cause(l.Context()))
	}
}

// Lost signal when the lock is taken away on the server (key deleted by an admin).
func TestLostSignal_KeyRemoved(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL(), dlock.WithTTL(300*time.Millisecond))
		var fnErr error
		err := c.Do(ctx, name, func(ctx context.Context) error {
			redisDo(t, shared, "DEL", keyOf(name))
			<-ctx.Done()
			fnErr = ctx.Err()
			return ctx.Err()
		})
		if !errors.Is(err, dlock.ErrLost) {
			t.Fatalf("Do after the key was removed: got %v, want ErrLost", err)
		}
		if !errors.Is(fnErr, context.Canceled) {
			t.Fatalf("fn's ctx.Err() = %v, want context.Canceled", fnErr)
		}
	})
}

// An Unlock whose release never reached the server (the connection hung) is retried in the
// background: the lock frees long before its lease would run out, and the error names it.
func TestUnlock_FailedReleaseIsRetried(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		proxy := redistest.NewProxy(t, shared.Addr)
		url := strings.Replace(proxy.URL(), "://", "://"+testUser+":"+testPassword+"@", 1)
		holder := tr.dial(t, url)
		other := tr.dial(t, shared.URL())
		name := uniqueName(t)
		l, err := holder.Mutex(name, dlock.WithTTL(30*time.Second)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		proxy.Block()
		uctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err = l.Unlock(uctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Fatalf("Unlock through a hung connection = %v, want an error naming %q", err, name)
		}
		t.Logf("Unlock: %v", err)
		proxy.Unblock()
		start := time.Now()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		l2, err := other.Mutex(name).Lock(wctx)
		if err != nil {
			t.Fatalf("the lock was not released within 10 s of the connection coming back (lease 30 s): %v", err)
		}
		t.Logf("another client got the lock %v after the connection came back", time.Since(start))
		if err := l2.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// A renewal that succeeds on the server after the client declared the lease lost (its reply
// came after the lease's deadline) leaves the lock held under the lost lease's owner for a
// whole TTL from that renewal, unless the client releases it when the reply comes: it must, at
// once (the lock is then released, not left to expire), so that the next holder is not kept
// waiting.
func TestRenewal_SuccessAfterLossReleases(t *testing.T) {
	needShared(t)
	const ttl = 3 * time.Second // renewed after 1 s; lost at its deadline, 3 s less the drift
	// The renewal reaches the server at once and extends the lock there to about 4 s; its reply
	// comes back at about 3.4 s, after the client's deadline (go-redis reads time out at 3 s).
	const replyDelay = 2400 * time.Millisecond
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		proxy := redistest.NewProxy(t, shared.Addr)
		c := tr.dial(t, proxy.URL(), dlock.WithTTL(ttl))
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// renew.lua's first use on the server costs a NOSCRIPT answer and a second call: made
		// here, before the replies are slow, so that the renewal below is one call.
		if err := l.Extend(ctx, ttl); err != nil {
			t.Fatal(err)
		}
		proxy.SetReplyDelay(replyDelay)
		select {
		case <-l.Context().Done():
		case <-time.After(2 * ttl):
			t.Fatalf("the lease was not declared lost within %v with replies delayed by %v", 2*ttl, replyDelay)
		}
		lostAt := time.Now()
		proxy.SetReplyDelay(0) // the late reply is on its way
		if !errors.Is(context.Cause(l.Context()), dlock.ErrLost) {
			t.Fatalf("cause %v, want ErrLost", context.Cause(l.Context()))
		}
		pttl := redisDo(t, shared, "PTTL", keyOf(name))
		if v := redisDo(t, shared, "GET", keyOf(name)); !heldValue(v) {
			t.Fatalf("at the loss the server has %q for the lock; want it held (the late renewal extended it)", v)
		}
		var v string
		waitFor(t, 2*ttl, "the lock to be free on the server", func(ctx context.Context) error {
			var err error
			v, err = shared.Do(ctx, "GET", keyOf(name))
			if err == nil && heldValue(v) {
				err = fmt.Errorf("held: %q", v)
			}
			return err
		})
		took := time.Since(lostAt)
		t.Logf("the lock was free on the server %v after the client declared the lease lost (it then had %s ms left there)", took, pttl)
		if !strings.HasPrefix(v, "- ") {
			t.Errorf("the lock expired on the server %v after the loss (value %q), after the late renewal's full TTL: it was not released when the renewal's success came", took, v)
		}
		if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrLost) {
			t.Errorf("Unlock of the lost lease: %v, want ErrLost", err)
		}
	})
}
