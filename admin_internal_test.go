package dlock

import (
	"testing"
	"time"
)

// Inspection decodes the values of docs/PROTOCOL.md ("<owner> <token> <holds> <description>"
// while held, "- <token> 0" once released) and refuses what is not one.
func TestParseLock(t *testing.T) {
	const desc = `{"host":"web-3","pid":4711,"start":1796000000,"label":"billing"}`
	for _, tc := range []struct {
		what        string
		value, pttl any
		want        Info
	}{
		{"no key", nil, int64(-2), Info{Name: "n", Waiters: -1, WaitingGoroutines: -1}},
		{"held", "secret:1 1700000000000000 2 " + desc, int64(1500), Info{Name: "n", Waiters: -1, WaitingGoroutines: -1, Held: true,
			Token: 1700000000000000, Holds: 2, TTL: 1500 * time.Millisecond,
			Holder: Holder{Host: "web-3", PID: 4711, Start: time.Unix(1796000000, 0), Label: "billing"}}},
		{"owner beginning with '-'", "-xyz:1 42 1 " + desc, int64(10), Info{Name: "n", Waiters: -1, WaitingGoroutines: -1, Held: true,
			Token: 42, Holds: 1, TTL: 10 * time.Millisecond,
			Holder: Holder{Host: "web-3", PID: 4711, Start: time.Unix(1796000000, 0), Label: "billing"}}},
		{"held, description not JSON", "secret:1 42 1 {oops", int64(10), Info{Name: "n", Waiters: -1, WaitingGoroutines: -1, Held: true,
			Token: 42, Holds: 1, TTL: 10 * time.Millisecond}},
		{"held without expiry", "secret:1 42 1 {}", int64(-1), Info{Name: "n", Waiters: -1, WaitingGoroutines: -1, Held: true, Token: 42, Holds: 1}},
		{"released", "- 42 0", int64(59000), Info{Name: "n", Waiters: -1, WaitingGoroutines: -1, Token: 42}},
	} {
		got, err := parseLock("n", tc.value, tc.pttl)
		if err != nil || got != tc.want {
			t.Errorf("%s: parseLock(%q, %v) = %+v, %v; want %+v", tc.what, tc.value, tc.pttl, got, err, tc.want)
		}
	}
	for _, bad := range []any{"hello", "a b", "owner x 1", "owner 1 x", int64(7)} {
		if got, err := parseLock("n", bad, int64(10)); err == nil {
			t.Errorf("parseLock(%v) = %+v, want an error: not a lock value", bad, got)
		}
	}
}
