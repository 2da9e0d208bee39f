package redistest

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSentinelFailover runs 3 failovers, or $REDISTEST_FAILOVERS (the fault checker needs 20 in
// one run: REDISTEST_FAILOVERS=20 go test -run TestSentinelFailover -v ./internal/redistest).
func TestSentinelFailover(t *testing.T) {
	n := 3
	if v, err := strconv.Atoi(os.Getenv("REDISTEST_FAILOVERS")); err == nil && v > 0 {
		n = v
	}
	g := NewSentinel(t)
	if got, want := g.URL(), "redis+sentinel://"+strings.Join(g.SentinelAddrs(), ",")+"/mymaster"; got != want || len(g.SentinelAddrs()) != 3 {
		t.Fatalf("URL = %q, want %q", got, want)
	}
	if len(g.Replicas()) != 2 {
		t.Fatalf("Replicas = %d, want 2", len(g.Replicas()))
	}
	var total, worst time.Duration
	defer func() {
		if n > 0 && !t.Failed() {
			t.Logf("%d failovers: mean %v, worst %v", n, total/time.Duration(n), worst)
		}
	}()
	for i := range n {
		m := g.Master()
		mustDo(t, m, "SET", "k", "v")
		if got := mustDo(t, m, "WAIT", "2", "5000"); got != "2" {
			t.Fatalf("WAIT 2 = %s, want both replicas in sync", got)
		}
		start := time.Now()
		old, promoted, err := g.Failover(ctxTimeout(t, 60*time.Second))
		if err != nil {
			t.Fatalf("failover %d: %v", i, err)
		}
		d := time.Since(start)
		total += d
		worst = max(worst, d)
		t.Logf("failover %d: %s -> %s in %v", i, old.Addr, promoted.Addr, d)
		if old != m || promoted == m || g.Master() != promoted {
			t.Fatalf("failover %d: old %s (master was %s), promoted %s, Master %s", i, old.Addr, m.Addr, promoted.Addr, g.Master().Addr)
		}
		// The write reached the promoted replica before the kill (it was in sync).
		if got := mustDo(t, promoted, "GET", "k"); got != "v" {
			t.Errorf("GET k on promoted = %q", got)
		}
		if r := mustDo(t, old, "ROLE"); !strings.HasPrefix(r, "slave") {
			t.Errorf("old master's ROLE = %q, want a replica", r)
		}
		for _, s := range g.Sentinels() {
			addr := strings.Replace(mustDo(t, s, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"), "\n", ":", 1)
			if addr != promoted.Addr {
				t.Errorf("sentinel %s names %s, want %s", s.Addr, addr, promoted.Addr)
			}
		}
	}
}
