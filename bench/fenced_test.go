package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

// TestHarnessFenced runs scenario 11, which is not in the default list (so TestHarness does not
// run it), with tiny durations: the harness and its table work, and every fenced increment was
// counted exactly once.
func TestHarnessFenced(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	cfg := defaultConfig(true)
	cfg.scenarios = []int{11}
	cfg.reps = 2 // both orders of the interleaving
	cfg.warmUp = 50 * time.Millisecond
	cfg.fencedDuration = 100 * time.Millisecond
	cfg.log = io.Discard
	out, ok, err := runScenarios(cfg, "go test")
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out)
	if !ok {
		t.Fatal("a fenced measurement failed, or the fenced counter did not add up")
	}
	for _, want := range []string{"### 11.", "| rueidis | 16 | incr by 1 |", "| rueidis | 1 | get |", "| go-redis | 16 | incr by 1 |", "| go-redis | 1 | get |", "| rueidis | 16 | incr by 1: a bare two-command script (the floor) |", "| go-redis | 16 | incr by 1: a bare two-command script (the floor) |"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
