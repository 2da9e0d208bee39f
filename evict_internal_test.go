package dlock

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

// The eviction guard's reading of INFO and its judgement of the readings, without a server
// (evict_test.go runs it against real ones).

// infoReply is what INFO memory stats says, in part, with the server's CRLF line ends.
const infoReply = "# Memory\r\nused_memory:1043472\r\nmaxmemory:67108864\r\nmaxmemory_human:64.00M\r\n" +
	"maxmemory_policy:allkeys-lru\r\n\r\n# Stats\r\nexpired_keys:12\r\nevicted_keys:5\r\nevicted_clients:0\r\n"

func TestParseMemoryInfo(t *testing.T) {
	m, err := parseMemoryInfo(infoReply)
	if err != nil || m != (serverMemory{maxmemory: 64 << 20, policy: "allkeys-lru", evicted: 5}) {
		t.Fatalf("parseMemoryInfo = %+v, %v; want 64 MiB, allkeys-lru, 5 evicted", m, err)
	}
	for _, tc := range []struct {
		info string
		want string // in the error
	}{
		{"maxmemory:0\r\nmaxmemory_policy:noeviction\r\n", "lacks"},
		{"", "lacks"},
		{"maxmemory:lots\r\nmaxmemory_policy:noeviction\r\nevicted_keys:0\r\n", "maxmemory"},
		{"maxmemory:0\r\nmaxmemory_policy:noeviction\r\nevicted_keys:-\r\n", "evicted_keys"},
	} {
		if m, err := parseMemoryInfo(tc.info); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseMemoryInfo(%q) = %+v, %v; want an error about %s", tc.info, m, err, tc.want)
		}
	}
}

// Only a memory limit with a policy other than noeviction can evict keys.
func TestServerMemory_MayEvict(t *testing.T) {
	for _, tc := range []struct {
		m    serverMemory
		want bool
	}{
		{serverMemory{maxmemory: 64 << 20, policy: "allkeys-lru"}, true},
		{serverMemory{maxmemory: 64 << 20, policy: "volatile-ttl"}, true},
		{serverMemory{maxmemory: 64 << 20, policy: "noeviction"}, false},
		{serverMemory{maxmemory: 0, policy: "allkeys-lru"}, false},
	} {
		if got := tc.m.mayEvict(); got != tc.want {
			t.Errorf("%+v: mayEvict = %v, want %v", tc.m, got, tc.want)
		}
	}
}

func guardForTest(allow bool) (*evictionGuard, *bytes.Buffer) {
	var logs bytes.Buffer
	return newEvictionGuard(nil, 1, allow, slog.New(slog.NewTextHandler(&logs, nil))), &logs
}

// A server that can evict, or that evicted keys since the previous reading, is a risk until a
// reading shows it safe; the error names the server, the setting and the fix.
func TestEvictionGuard_Assess(t *testing.T) {
	g, logs := guardForTest(false)
	safe := serverMemory{maxmemory: 64 << 20, policy: "noeviction"}
	lru := serverMemory{maxmemory: 64 << 20, policy: "allkeys-lru"}
	step := func(what string, mem map[string]serverMemory, want ...string) {
		t.Helper()
		err := g.assess(mem)
		if len(want) == 0 {
			if err != nil || g.atRisk.Load() {
				t.Fatalf("%s: %v (at risk %v), want no risk", what, err, g.atRisk.Load())
			}
			return
		}
		if !errors.Is(err, ErrEvictionPolicy) || !g.atRisk.Load() || g.risk != err {
			t.Fatalf("%s: %v (at risk %v), want a risk wrapping ErrEvictionPolicy, kept for refusal", what, err, g.atRisk.Load())
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("%s: %q does not say %q", what, err, w)
			}
		}
	}
	step("safe", map[string]serverMemory{"a:1": safe})
	step("evicting policy", map[string]serverMemory{"a:1": safe, "b:2": lru}, "b:2", "allkeys-lru", "maxmemory-policy noeviction", "WithUnsafeEviction")
	step("fixed", map[string]serverMemory{"a:1": safe, "b:2": safe})
	safe.evicted = 3
	step("evicted keys under noeviction (the policy changed and changed back)", map[string]serverMemory{"a:1": safe}, "a:1", "evicted 3 keys")
	safe.evicted = 0
	step("a counter that went down: the server restarted", map[string]serverMemory{"a:1": safe})
	step("a new server that evicted before it was first read", map[string]serverMemory{"c:3": {policy: "noeviction", evicted: 9}})
	if logs.Len() != 0 {
		t.Errorf("logged without WithUnsafeEviction: %s", logs)
	}
}

// With WithUnsafeEviction nothing is a risk: a server that can evict is logged once as a
// warning, noted when it is safe again, and warned about again when it evicted keys since.
func TestEvictionGuard_AssessUnsafeAllowed(t *testing.T) {
	g, logs := guardForTest(true)
	lru := serverMemory{maxmemory: 64 << 20, policy: "allkeys-lru"}
	for range 3 {
		if err := g.assess(map[string]serverMemory{"b:2": lru}); err != nil || g.atRisk.Load() {
			t.Fatalf("allowed: %v (at risk %v), want no risk", err, g.atRisk.Load())
		}
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), "allkeys-lru") {
		t.Fatalf("after three readings of an evicting server, log:\n%s\nwant one warning naming the policy", logs)
	}
	g.assess(map[string]serverMemory{"b:2": {maxmemory: 64 << 20, policy: "noeviction"}})
	if !strings.Contains(logs.String(), "level=INFO") || !strings.Contains(logs.String(), "no longer evicts") {
		t.Fatalf("no note that the server is safe again:\n%s", logs)
	}
	g.assess(map[string]serverMemory{"b:2": {maxmemory: 64 << 20, policy: "noeviction", evicted: 4}})
	if n := strings.Count(logs.String(), "level=WARN"); n != 2 {
		t.Fatalf("keys evicted since the last reading: %d warnings, want a second one:\n%s", n, logs)
	}
}
