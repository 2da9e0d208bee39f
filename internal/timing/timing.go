// Package timing is the lease arithmetic that both the engine (the root package) and the
// backends use: the monotonic clock leases are kept on, how much earlier than the server a
// holder treats its lease as over, and the lease a quorum's majority holds.
package timing

import (
	"slices"
	"time"
)

// Epoch anchors the monotonic clock readings kept as int64 nanoseconds in leases.
var Epoch = time.Now()

// Mono is the monotonic clock, in nanoseconds since Epoch; wall-clock jumps do not move it.
func Mono() int64 { return int64(time.Since(Epoch)) }

// Drift is how much earlier than the server's expiry a holder treats its lease as over:
// TTL/100 + 2 ms for clock-rate differences (the Redlock allowance), plus TTL/20, at most 50 ms,
// for the delay before the renewal loop's timer runs on a busy machine.
func Drift(ttl time.Duration) time.Duration {
	return ttl/100 + 2*time.Millisecond + min(ttl/20, 50*time.Millisecond)
}

// MajorityLease combines the leases a quorum's servers chose for one acquisition: the need-th
// longest, so that a majority holds the lock for at least that long. With fewer answers, the
// shortest. 0 when none chose one (a lock that is not adaptive).
func MajorityLease(leases []time.Duration, need int) time.Duration {
	if len(leases) == 0 {
		return 0
	}
	s := slices.Clone(leases)
	slices.Sort(s)
	if len(s) < need {
		return s[0]
	}
	return s[len(s)-need]
}
