package dlock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

func evalStats(t *testing.T) (calls, usec float64) {
	out := redisDo(t, shared, "INFO", "commandstats")
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "cmdstat_evalsha:") {
			var c, u float64
			for _, f := range strings.Split(strings.TrimPrefix(strings.TrimSpace(l), "cmdstat_evalsha:"), ",") {
				k, v, _ := strings.Cut(f, "=")
				switch k {
				case "calls":
					c = atof(v)
				case "usec":
					u = atof(v)
				}
			}
			return c, u
		}
	}
	return 0, 0
}

func atof(s string) float64 {
	var f float64
	for _, ch := range s {
		if ch >= '0' && ch <= '9' {
			f = f*10 + float64(ch-'0')
		}
	}
	return f
}

func TestZZPerf(t *testing.T) {
	needShared(t)
	ctx := context.Background()
	c := transports[0].dial(t, shared.URL())
	name := uniqueName(t)
	measure := func(what string, f func()) {
		redisDo(t, shared, "CONFIG", "RESETSTAT")
		start := time.Now()
		for range 3000 {
			f()
		}
		el := time.Since(start)
		calls, usec := evalStats(t)
		t.Logf("%-10s %v per pair, server %.1f µs per script (%v calls)", what, el/3000, usec/calls, calls)
	}
	m := c.Mutex(name)
	measure("mutex", func() { l, _ := m.TryLock(ctx); l.Unlock(ctx) })
	s := c.Semaphore(name, 64)
	measure("sem", func() { l, _ := s.TryAcquire(ctx, 1); l.Unlock(ctx) })
	rw := c.RWMutex(name)
	measure("rlock", func() { l, _ := rw.TryRLock(ctx); l.Unlock(ctx) })
	var held []*dlock.Lease
	for range 30 {
		l, _ := s.TryAcquire(ctx, 1)
		held = append(held, l)
	}
	measure("sem+30", func() { l, _ := s.TryAcquire(ctx, 1); l.Unlock(ctx) })
	for _, l := range held {
		l.Unlock(ctx)
	}
}
