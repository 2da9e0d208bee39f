package dlock_test

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/dlock-go/dlock/internal/redistest"
)

// On a Cluster, where the keys of one script call must share a slot, a client's concurrent
// acquisitions and releases are not batched: each goes as a script call of its own, and every
// lock is exclusive with increasing tokens.
func TestBatch_ClusterCallsAlone(t *testing.T) {
	g := redistest.NewCluster(t)
	ctx := ctxT(t)
	for _, m := range g.Masters() {
		if _, err := m.Do(ctx, "CONFIG", "RESETSTAT"); err != nil {
			t.Fatal(err)
		}
	}
	const goroutines, pairs = 32, 10
	for tr, c := range clusterClients(t, g) {
		t.Run(tr, func(t *testing.T) {
			var wg sync.WaitGroup
			errs := make(chan error, goroutines)
			for i := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					m := c.Mutex(fmt.Sprintf("%s-%d", uniqueName(t), i))
					var last uint64
					for range pairs {
						l, err := m.Lock(ctx)
						if err != nil {
							errs <- err
							return
						}
						if l.Token() <= last {
							errs <- fmt.Errorf("%s: token %d after %d", m.Name(), l.Token(), last)
						}
						last = l.Token()
						if err := l.Unlock(ctx); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
		})
	}
	// Every acquisition and release was a call of its own: one EVALSHA (or EVAL) each.
	calls := 0
	for _, m := range g.Masters() {
		out, err := m.Do(ctx, "INFO", "commandstats")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(out, "\n") {
			for _, cmd := range []string{"evalsha", "eval"} {
				if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
					n, _ := strconv.Atoi(strings.Split(rest, ",")[0])
					calls += n
				}
			}
		}
	}
	if want := 2 * 2 * goroutines * pairs; calls < want {
		t.Fatalf("%d script calls for %d acquisitions and releases: some went in batches", calls, want)
	}
}
