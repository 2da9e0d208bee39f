package redistest

import (
	"strings"
	"testing"
	"time"
)

func TestSentinelFailover(t *testing.T) {
	g := NewSentinel(t)
	if got, want := g.URL(), "redis+sentinel://"+strings.Join(g.SentinelAddrs(), ",")+"/mymaster"; got != want || len(g.SentinelAddrs()) != 3 {
		t.Fatalf("URL = %q, want %q", got, want)
	}
	if len(g.Replicas()) != 2 {
		t.Fatalf("Replicas = %d, want 2", len(g.Replicas()))
	}
	for i := range 3 {
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
		t.Logf("failover %d: %s -> %s in %v", i, old.Addr, promoted.Addr, time.Since(start))
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
