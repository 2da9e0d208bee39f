package dlock

import (
	"testing"
	"time"
)

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

// An adaptive lease is renewed when the greater of a third of it and adaptiveMargin is left,
// never sooner than a fixed lease of its length would be; a fixed lease every third of its TTL;
// a grant's acceptance window (confirm) at a third, to extend it to the full lease.
func TestRenewAfter(t *testing.T) {
	for _, tc := range []struct {
		ttl      time.Duration
		adaptive bool
		confirm  bool
		want     time.Duration
	}{
		{1200 * time.Millisecond, false, false, 400 * time.Millisecond},
		{9 * time.Second, false, false, 3 * time.Second},
		{300 * time.Millisecond, true, false, 100 * time.Millisecond},
		{450 * time.Millisecond, true, false, 150 * time.Millisecond},
		{750 * time.Millisecond, true, false, 450 * time.Millisecond},
		{900 * time.Millisecond, true, false, 600 * time.Millisecond},
		{1200 * time.Millisecond, true, false, 800 * time.Millisecond},
		{1500 * time.Millisecond, true, false, time.Second},
		{3 * time.Second, true, false, 2 * time.Second},
		{9 * time.Second, true, false, 6 * time.Second},
		{1200 * time.Millisecond, true, true, 400 * time.Millisecond},
	} {
		st := &leaseState{}
		st.ttl.Store(int64(tc.ttl))
		if tc.adaptive {
			st.adaptMS = int32(tc.ttl / time.Millisecond)
		}
		st.confirm.Store(tc.confirm)
		if got := time.Duration(renewAfter(st)); got != tc.want {
			t.Errorf("ttl %v adaptive %v confirm %v: renewed %v after, want %v", tc.ttl, tc.adaptive, tc.confirm, got, tc.want)
		}
	}
}
