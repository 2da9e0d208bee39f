package dlock

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/protocol"
)

// The adaptive lease's arguments and replies, as acquire.lua and release.lua lay them out,
// checked without a server. A lock without the option sends exactly what it sent before
// (TestAcquireArgs_Call, TestReleaseArgs_Call).

// acquire.lua: with the adaptive lease, KEYS end with the hold record and ARGV with the place
// ("" for the server's time) and the bounds in ms.
func TestAcquireArgs_CallAdaptive(t *testing.T) {
	keys := []string{"dlock:{n}", "dlock:{n}:q", "dlock:{n}:w", "dlock:{n}:h"}
	a := acquireArgs{keys: keys, owner: "secret:1", ttl: "3000", meta: "{}", channel: "dlock:{n}:rel", client: "c1",
		adaptLo: "100", adaptHi: "3000"}
	checkCall(t, "adaptive", a.call(), protocol.ScriptAcquire, keys, []string{"secret:1", "3000", "{}", "", "dlock:{n}:rel", "p", "c1", "", "", "100", "3000"})
	a.queue, a.window, a.place = true, "900", "1796000000000000"
	checkCall(t, "adaptive, queued at a place", a.call(), protocol.ScriptAcquire, keys,
		[]string{"secret:1", "3000", "{}", "q", "dlock:{n}:rel", "p", "c1", "900", "1796000000000000", "100", "3000"})
}

func TestReadAcquire_Adaptive(t *testing.T) {
	for _, tc := range []struct {
		reply []int64
		want  acquired
	}{
		{[]int64{1, 42, 1, 750}, acquired{ok: true, token: 42, holds: 1, ttl: 750 * time.Millisecond}},
		{[]int64{0, 1500, 42, 300}, acquired{pttl: 1500 * time.Millisecond, token: 42, ttl: 300 * time.Millisecond}},
	} {
		got, err := readAcquire(tc.reply)
		if err != nil || got.ok != tc.want.ok || got.token != tc.want.token || got.holds != tc.want.holds || got.pttl != tc.want.pttl || got.ttl != tc.want.ttl {
			t.Errorf("readAcquire(%v) = %+v, %v; want %+v", tc.reply, got, err, tc.want)
		}
	}
	for _, bad := range [][]int64{{1, 42, 1, 0}, {1, 42, 1, -5}, {1, 42, 1, 750, 1}} {
		if got, err := readAcquire(bad); err == nil {
			t.Errorf("readAcquire(%v) = %+v, want an error", bad, got)
		}
	}
}

// release.lua: with a hold to record, ARGV ends with the leaving entry ("" for none) and the
// record's retention in ms.
func TestReleaseArgs_CallRecord(t *testing.T) {
	keys := []string{"dlock:{n}", "dlock:{n}:q", "dlock:{n}:w", "dlock:{n}:h"}
	a := releaseArgs{keys: keys, owner: "secret:1", retention: "60000", channel: "dlock:{n}:rel", all: true, floor: 42, record: "86400000"}
	checkCall(t, "record", a.call(), protocol.ScriptRelease, keys, []string{"secret:1", "60000", "dlock:{n}:rel", "1", "p", "42", "", "86400000"})
	a.leave = "c1.7"
	checkCall(t, "record and leave", a.call(), protocol.ScriptRelease, keys, []string{"secret:1", "60000", "dlock:{n}:rel", "1", "p", "42", "c1.7", "86400000"})
}

// A quorum's lease is the need-th longest of the servers' choices (a majority holds the lock
// for it); with fewer choices than need, the shortest.
func TestMajorityLease(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	for _, tc := range []struct {
		leases []time.Duration
		need   int
		want   time.Duration
	}{
		{nil, 3, 0},
		{ms(300, 5000, 200), 3, 200 * time.Millisecond},
		{ms(300, 5000, 200, 5000, 250), 3, 300 * time.Millisecond},
		{ms(5000, 5000, 5000, 200, 200), 3, 5000 * time.Millisecond},
		{ms(400, 100), 3, 100 * time.Millisecond},
	} {
		if got := majorityLease(tc.leases, tc.need); got != tc.want {
			t.Errorf("majorityLease(%v, %d) = %v, want %v", tc.leases, tc.need, got, tc.want)
		}
	}
}

// HoldStats reads the record as inspect.lua returns it, and Lease computes what acquire.lua
// chooses: 3 × high in whole ms rounded up, within the bounds; the greatest without a record.
func TestHoldStats(t *testing.T) {
	h := parseHoldStats("7 48213 410001 52000", int64(3600000))
	want := HoldStats{Count: 7, Typical: 48213 * time.Microsecond, High: 410001 * time.Microsecond, Last: 52 * time.Millisecond, Expires: time.Hour}
	if h != want {
		t.Fatalf("parseHoldStats = %+v, want %+v", h, want)
	}
	for _, tc := range []struct {
		h          HoldStats
		least, top time.Duration
		want       time.Duration
	}{
		{h, 10 * time.Millisecond, 10 * time.Second, 1231 * time.Millisecond}, // 1230.003 ms rounded up
		{h, 2 * time.Second, 10 * time.Second, 2 * time.Second},
		{h, 10 * time.Millisecond, time.Second, time.Second},
		{HoldStats{Count: 1, High: 1000 * time.Microsecond}, 10 * time.Millisecond, time.Second, 10 * time.Millisecond},
		{HoldStats{Count: 1, High: 10 * time.Millisecond}, 10 * time.Millisecond, time.Second, 30 * time.Millisecond},
		{HoldStats{}, 10 * time.Millisecond, time.Second, time.Second},
	} {
		if got := tc.h.Lease(tc.least, tc.top); got != tc.want {
			t.Errorf("%+v.Lease(%v, %v) = %v, want %v", tc.h, tc.least, tc.top, got, tc.want)
		}
	}
	for _, bad := range []any{nil, "", "1 2 3", "1 2 3 x", "-1 2 3 4", int64(5)} {
		if got := parseHoldStats(bad, int64(10)); got != (HoldStats{}) {
			t.Errorf("parseHoldStats(%v) = %+v, want nothing recorded", bad, got)
		}
	}
}
