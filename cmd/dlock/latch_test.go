package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
)

// dlock run with several names holds them all while the command runs, and gives it one token
// per name (DLOCK_TOKEN in the command line's order, DLOCK_TOKENS as JSON, DLOCK_NAME one name
// per line); a second run that needs one of them is busy; both are free after.
func TestRun_SeveralNames(t *testing.T) {
	dlockBin(t)
	s := redistest.Start(t)
	dir := t.TempDir()
	env, gate := filepath.Join(dir, "env"), filepath.Join(dir, "gate")
	script := `printf '%s|%s|%s\n' "$DLOCK_TOKEN" "$DLOCK_TOKENS" "$DLOCK_NAME" > "$0.tmp"; mv "$0.tmp" "$0"; while [ ! -e "$1" ]; do sleep 0.05; done`
	p := startDlock(t, "run", "--redis", s.URL(), "acct:bob", "acct:alice", "--", "sh", "-c", script, env, gate)
	var line string
	waitFor(t, 20*time.Second, "the command to write its environment", func(context.Context) error {
		b, err := os.ReadFile(env)
		line = string(b)
		return err
	})
	f := strings.SplitN(strings.TrimSuffix(line, "\n"), "|", 3)
	if len(f) != 3 {
		t.Fatalf("environment line %q", line)
	}
	bob, alice := heldToken(t, s, "acct:bob"), heldToken(t, s, "acct:alice")
	if bob == 0 || alice == 0 {
		t.Fatalf("tokens held: bob %d, alice %d; want both held", bob, alice)
	}
	if want := fmt.Sprintf("%d %d", bob, alice); f[0] != want {
		t.Errorf("DLOCK_TOKEN = %q, want %q (the names' order on the command line)", f[0], want)
	}
	var tokens map[string]uint64
	if err := json.Unmarshal([]byte(f[1]), &tokens); err != nil || tokens["acct:bob"] != bob || tokens["acct:alice"] != alice {
		t.Errorf("DLOCK_TOKENS = %q (%v), want both tokens by name", f[1], err)
	}
	if f[2] != "acct:bob\nacct:alice" {
		t.Errorf("DLOCK_NAME = %q, want the names one per line", f[2])
	}
	_, stderr, code := dlockCmd(t, "run", "--redis", s.URL(), "--wait", "0", "acct:carol", "acct:alice", "--", "true")
	if code != exitBusy || !strings.Contains(stderr, `"acct:alice" is busy`) {
		t.Errorf("second run on a held name: exit %d, %q; want 75 naming acct:alice", code, stderr)
	}
	if tok := heldToken(t, s, "acct:carol"); tok != 0 {
		t.Error("acct:carol held after a run that could not take all its names")
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("run exited %d: %s", code, p.stderr.String())
	}
	if heldToken(t, s, "acct:bob") != 0 || heldToken(t, s, "acct:alice") != 0 {
		t.Error("names still held after the run")
	}
	stdout, _, code := dlockCmd(t, "run", "--redis", s.URL(), "one", "--", "sh", "-c", `printf '%s' "$DLOCK_TOKENS"`)
	if code != 0 || !strings.HasPrefix(stdout, `{"one":`) {
		t.Errorf("DLOCK_TOKENS of one name = %q (exit %d)", stdout, code)
	}
}

// dlock latch: a waiter returns when count-downs (one id counting once) reach zero; status
// shows the count; missing latches, timeouts and expiry have their exit codes.
func TestLatch_Commands(t *testing.T) {
	dlockBin(t)
	s := redistest.Start(t)
	url := s.URL()
	stdout, _, code := dlockCmd(t, "latch", "status", "--redis", url, "batch")
	if code != 0 || stdout != "batch: no latch\n" {
		t.Errorf("status of no latch: %q, exit %d", stdout, code)
	}
	if _, stderr, code := dlockCmd(t, "latch", "wait", "--redis", url, "batch"); code != exitFailure || !strings.Contains(stderr, "does not exist") {
		t.Errorf("wait without --count on no latch: exit %d, %q; want 1", code, stderr)
	}
	w := startDlock(t, "latch", "wait", "--redis", url, "--count", "2", "--ttl", "1m", "batch")
	waitFor(t, 20*time.Second, "the latch to exist", func(context.Context) error {
		if out, _, _ := dlockCmd(t, "latch", "status", "--redis", url, "batch"); !strings.HasPrefix(out, "batch: 2 of 2 left") {
			return fmt.Errorf("status %q", out)
		}
		return nil
	})
	for range 2 {
		if _, stderr, code := dlockCmd(t, "latch", "count-down", "--redis", url, "--count", "2", "--id", "w1", "batch"); code != 0 {
			t.Fatalf("count-down: exit %d, %s", code, stderr)
		}
	}
	if out, _, _ := dlockCmd(t, "latch", "status", "--redis", url, "batch"); !strings.HasPrefix(out, "batch: 1 of 2 left, expires in ") {
		t.Errorf("status after one id counted twice: %q", out)
	}
	select {
	case <-w.done:
		t.Fatal("wait returned before zero")
	default:
	}
	if _, stderr, code := dlockCmd(t, "latch", "count-down", "--redis", url, "batch"); code != 0 {
		t.Fatalf("count-down: exit %d, %s", code, stderr)
	}
	if code := w.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("wait exited %d: %s", code, w.stderr.String())
	}
	out, _, code := dlockCmd(t, "latch", "status", "--json", "--redis", url, "batch")
	var j jsonLatch
	if err := json.Unmarshal([]byte(out), &j); err != nil || code != 0 || !j.Open || j.Count != 2 || j.Left != 0 || j.TTLms <= 0 {
		t.Errorf("status --json of an open latch: %q (%v), exit %d", out, err, code)
	}
	if _, _, code := dlockCmd(t, "latch", "wait", "--redis", url, "--count", "3", "--timeout", "200ms", "other"); code != exitBusy {
		t.Errorf("wait with --timeout: exit %d, want 75", code)
	}
	if _, stderr, code := dlockCmd(t, "latch", "wait", "--redis", url, "--count", "2", "--ttl", "300ms", "short"); code != exitFailure || !strings.Contains(stderr, "expired before reaching zero") {
		t.Errorf("wait on a latch that expires: exit %d, %q; want 1", code, stderr)
	}
	if _, _, code := dlockCmd(t, "latch", "count-down", "--redis", url, "--count", "3", "batch"); code != exitUsage {
		t.Errorf("count-down with another count: exit %d, want 2", code)
	}
	if _, _, code := dlockCmd(t, "latch", "frobnicate", "batch"); code != exitUsage {
		t.Errorf("unknown subcommand: exit %d, want 2", code)
	}
}
