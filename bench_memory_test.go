package dlock_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// releasedBurst is how many distinct names BenchmarkReleasedNames locks and unlocks once each.
const releasedBurst = 200_000

// BenchmarkReleasedNames: what a burst of distinct names (per-order locks) leaves in Redis.
// Each name is locked and unlocked once, on a private server; the released names keep their
// last token for the client's token retention. Reported: the server's used_memory per
// released name right after the burst (bytes-per-name), the total (MB-retained), and, for the
// short retention, how long after the burst the server was back to its memory before it
// (s-to-reclaim). Run alone: go test -run '^$' -bench ReleasedNames -benchtime 1x .
func BenchmarkReleasedNames(b *testing.B) {
	s := redistest.Start(b)
	ctx := context.Background()
	for _, retention := range []time.Duration{dlock.DefaultTokenRetention, dlock.MinTokenRetention} {
		b.Run("retention-"+retention.String(), func(b *testing.B) {
			c, err := dlock.Dial(ctx, s.URL(), dlock.WithTokenRetention(retention))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			for i := range b.N {
				if _, err := s.Do(ctx, "FLUSHALL"); err != nil {
					b.Fatal(err)
				}
				before := usedMemory(b, s)
				start := time.Now()
				var wg sync.WaitGroup
				errs := make(chan error, 64)
				for g := range 64 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for n := g; n < releasedBurst; n += 64 {
							l, err := c.Mutex(fmt.Sprintf("order:%d:%d", i, n)).Lock(ctx)
							if err == nil {
								err = l.Unlock(ctx)
							}
							if err != nil {
								errs <- err
								return
							}
						}
					}()
				}
				wg.Wait()
				close(errs)
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
				burst := time.Since(start)
				after := usedMemory(b, s)
				b.ReportMetric(float64(after-before)/releasedBurst, "bytes-per-name")
				b.ReportMetric(float64(after-before)/1e6, "MB-retained")
				b.ReportMetric(releasedBurst/burst.Seconds(), "names/s")
				if retention > 10*time.Second {
					continue
				}
				// Expired keys are reclaimed by the server's active expiry; wait for it, bounded.
				deadline := time.Now().Add(retention + 30*time.Second)
				for usedMemory(b, s) > before+(after-before)/100 {
					if time.Now().After(deadline) {
						b.Fatalf("memory not reclaimed %v after the burst", time.Since(start))
					}
					time.Sleep(50 * time.Millisecond)
				}
				b.ReportMetric(time.Since(start.Add(burst)).Seconds(), "s-to-reclaim")
			}
		})
	}
}

// usedMemory is the server's INFO used_memory.
func usedMemory(tb testing.TB, s *redistest.Server) int64 {
	tb.Helper()
	info, err := s.Do(context.Background(), "INFO", "memory")
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				tb.Fatal(err)
			}
			return n
		}
	}
	tb.Fatal("INFO has no used_memory")
	return 0
}
