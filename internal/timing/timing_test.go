package timing

import (
	"testing"
	"time"
)

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
		if got := MajorityLease(tc.leases, tc.need); got != tc.want {
			t.Errorf("MajorityLease(%v, %d) = %v, want %v", tc.leases, tc.need, got, tc.want)
		}
	}
}
