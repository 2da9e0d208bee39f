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
