package dlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// The pinned script hashes are what the server computes, and a flushed script cache is
// refilled transparently (NOSCRIPT fallback).
func TestScripts_SHAAndNoScriptFallback(t *testing.T) {
	needShared(t)
	for _, s := range dlock.Scripts() {
		if got := redisDo(t, shared, "SCRIPT", "LOAD", s.Src); got != s.SHA {
			t.Errorf("%s: SCRIPT LOAD = %s, pinned %s", s.Name, got, s.SHA)
		}
	}
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL(), dlock.WithTTL(400*time.Millisecond))
		redisDo(t, shared, "SCRIPT", "FLUSH")
		l, err := c.Mutex(uniqueName(t)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		redisDo(t, shared, "SCRIPT", "FLUSH")
		time.Sleep(300 * time.Millisecond) // at least one renewal (every 133ms) after the flush
		if err := l.Context().Err(); err != nil {
			t.Fatalf("lease lost after SCRIPT FLUSH: %v", context.Cause(l.Context()))
		}
		redisDo(t, shared, "SCRIPT", "FLUSH")
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
