package dlock_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// Renewal is batched: many held leases cost one loop, no goroutine each, and a handful of
// script calls per renewal period.
func TestRenewal_BatchedOneLoopNoGoroutinePerLease(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		const (
			leases = 2000
			ttl    = 600 * time.Millisecond
			window = 1800 * time.Millisecond
		)
		ctx := ctxT(t)
		s := redistest.Start(t)
		c := tr.dial(t, s.URL(), dlock.WithTTL(ttl))
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
		before := scriptCalls(t, s)
		time.Sleep(window)
		calls := scriptCalls(t, s) - before
		periods := float64(window) / float64(ttl/3)
		perHundred := float64(calls) / periods / (leases / 100)
		t.Logf("%d leases, %v: %d renew calls in %.0f periods = %.2f calls per 100 leases per period", leases, window, calls, periods, perHundred)
		if perHundred > 1 {
			t.Errorf("%.2f renew calls per 100 leases per period, want <= 1", perHundred)
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
	t.Helper()
	n := 0
	for _, line := range strings.Split(redisDo(t, s, "INFO", "commandstats"), "\n") {
		if strings.HasPrefix(line, "cmdstat_evalsha:") || strings.HasPrefix(line, "cmdstat_eval:") {
			f := strings.TrimPrefix(line[strings.Index(line, ":")+1:], "calls=")
			v, _ := strconv.Atoi(f[:strings.Index(f, ",")])
			n += v
		}
	}
	return n
}

// Close returns while renewals are in flight (a batch handed to the sender as the client
// closes must still be answered, or Close would wait forever).
func TestClose_DuringRenewals(t *testing.T) {
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
