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
			ttl    = 300 * time.Millisecond
			window = 1500 * time.Millisecond
		)
		ctx := ctxT(t)
		s := redistest.Start(t)
		c := tr.dial(t, s.URL(), dlock.WithTTL(ttl))
		held := make([]*dlock.Lease, leases)
		var goroutines int
		for i := range held {
			if i == leases/2 { // the transport's own goroutines are all running by now
				goroutines = runtime.NumGoroutine()
			}
			l, err := c.Mutex(fmt.Sprintf("lease-%d", i)).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			held[i] = l
		}
		if extra := runtime.NumGoroutine() - goroutines; extra > 2 {
			t.Errorf("%d goroutines more holding %d leases than holding %d, want none per lease", extra, leases, leases/2)
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
