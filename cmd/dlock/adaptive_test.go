package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
)

// dlock run --adaptive: the runs of a name teach the server how long they hold it, the next
// run's lease follows (three times the longest recent hold, between --min-ttl and --ttl),
// status and list show what was recorded, and a run killed with SIGKILL blocks the name for
// its short lease, not for --ttl.
func TestRun_Adaptive(t *testing.T) {
	s := redistest.Start(t)
	name := "adaptive-job"
	run := []string{"run", "--redis", s.URL(), "--adaptive", "--min-ttl", "100ms", "--ttl", "10s", name, "--"}
	for range 3 {
		if _, errOut, code := dlockCmd(t, append(run, "sh", "-c", "sleep 0.2")...); code != 0 {
			t.Fatalf("dlock run --adaptive: exit %d, stderr %s", code, errOut)
		}
	}
	out, errOut, code := dlockCmd(t, "status", "--json", "--redis", s.URL(), name)
	if code != 0 {
		t.Fatalf("status: exit %d, stderr %s", code, errOut)
	}
	var st struct {
		Held  bool `json:"held"`
		Holds *struct {
			Count     int64   `json:"count"`
			TypicalMS float64 `json:"typical_ms"`
			HighMS    float64 `json:"high_ms"`
			LastMS    float64 `json:"last_ms"`
			ExpiresMS int64   `json:"expires_ms"`
		} `json:"hold_stats"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Holds == nil {
		t.Fatalf("status --json: %v, no hold_stats\n%s", err, out)
	}
	h := *st.Holds
	if h.Count != 3 || h.LastMS < 200 || h.HighMS < h.LastMS || h.TypicalMS < 200 || h.ExpiresMS <= 0 {
		t.Fatalf("hold_stats %+v, want 3 holds of at least 200ms, the high-water mark at least the last, kept a while", h)
	}
	// The lease the next run gets: 3 × the high-water mark, rounded up to the millisecond.
	lease := time.Duration(3*h.HighMS*1000+999) / 1000 * time.Millisecond
	if lease > 5*time.Second {
		t.Fatalf("high-water mark %vms: lease %v", h.HighMS, lease)
	}
	out, _, code = dlockCmd(t, "status", "--redis", s.URL(), name)
	if code != 0 || !strings.Contains(out, "holds measured: 3") || !strings.Contains(out, "adaptive lease:") ||
		!strings.Contains(out, "kept within the lock's min and max") || strings.Contains(out, "before its bounds") {
		t.Errorf("status: exit %d, want the holds measured and the adaptive lease:\n%s", code, out)
	}

	holder := startDlock(t, append(run, "sleep", "60")...)
	waitFor(t, 10*time.Second, "the run to hold the lock", func(context.Context) error {
		if heldToken(t, s, name) == 0 {
			return fmt.Errorf("not held yet; stderr %q", holder.stderr.String())
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pttl, err := s.Do(ctx, "PTTL", keyOf(name))
	if ms, _ := strconv.Atoi(pttl); err != nil || ms <= 0 || time.Duration(ms)*time.Millisecond > lease {
		t.Fatalf("PTTL of the held lock %s (%v), want at most the adaptive lease %v (not --ttl 10s)", pttl, err, lease)
	}
	out, errOut, code = dlockCmd(t, "list", "--json", "--redis", s.URL())
	if code != 0 || !strings.Contains(out, `"hold_stats"`) || !strings.Contains(out, `"count": 3`) {
		t.Errorf("list --json: exit %d, want the hold statistics\n%s%s", code, out, errOut)
	}
	first := heldToken(t, s, name)
	killed := time.Now()
	holder.signal(t, syscall.SIGKILL)
	waitFor(t, 15*time.Second, "another run to take the lock", func(ctx context.Context) error {
		_, _, code := dlockCmd(t, append([]string{"run", "--redis", s.URL(), "--wait", "0", name, "--"}, "true")...)
		if code != 0 {
			return fmt.Errorf("dlock run --wait 0: exit %d", code)
		}
		return nil
	})
	if d := time.Since(killed); d > 10*time.Second {
		t.Errorf("the name was blocked %v after the kill, as long as --ttl; want about its adaptive lease %v", d, lease)
	} else {
		t.Logf("the name was free again %v after the SIGKILL (adaptive lease %v, --ttl 10s)", d, lease)
	}
	if next := heldToken(t, s, name); next != 0 && next <= first {
		t.Errorf("token %d after the kill, want > %d", next, first)
	}

	for _, bad := range [][]string{{"--min-ttl", "20s", "--ttl", "10s"}, {"--min-ttl", "1ms"}} {
		args := append(append([]string{"run", "--redis", s.URL(), "--adaptive"}, bad...), name, "--", "true")
		if _, errOut, code := dlockCmd(t, args...); code != exitUsage || !strings.Contains(errOut, "--min-ttl") {
			t.Errorf("dlock %v: exit %d, stderr %q; want 2 naming --min-ttl", args, code, errOut)
		}
	}
}
