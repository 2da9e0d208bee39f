package dlock

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/backend"
	"github.com/dlock-go/dlock/internal/protocol"
)

// The adaptive lease (WithAdaptiveTTL): the server keeps, per lock name, what it measured of
// the name's holds, and chooses each acquisition's lease from it, in the acquire script, with
// no extra round trip (docs/PROTOCOL.md, "The hold record").
//
//   - release.lua, told so by an argument, adds the hold to the record at the final release:
//     from the lock's token (the server's clock at the acquisition, in µs) to the release;
//   - acquire.lua, given the bounds, reads the record and takes the lease 3 × the high-water
//     hold within them (the greater bound when the name has no record), and replies with it;
//   - the client counts the lease's deadline and renewals from that answer (adaptTo).
//
// An adaptive lock never passes among one client's waiters without the server (handOff): each
// hold is an acquisition of its own, so that the server measures each.

const (
	// DefaultHoldStatsRetention is how long a name's hold record (WithAdaptiveTTL) is kept
	// after the last hold it recorded, when no WithHoldStatsRetention option is given.
	DefaultHoldStatsRetention = 24 * time.Hour
	// MinHoldStatsRetention is the shortest WithHoldStatsRetention accepted.
	MinHoldStatsRetention = time.Second
	// adaptiveFactor is how many times the high-water hold the adaptive lease is (acquire.lua
	// says it too): renewed when the greater of a third of it and 300 ms is left (renewAfter),
	// the first renewal falls after the longest recent hold, so that typical holds need none;
	// without renewal, a hold up to about three times the mark still ends within the lease.
	adaptiveFactor = 3
)

// adaptive is WithAdaptiveTTL's bounds; the zero value is a fixed lease.
type adaptive struct {
	min, max time.Duration
}

func (a adaptive) on() bool { return a.max > 0 }

// WithAdaptiveTTL gives the lock an adaptive lease: at each acquisition the server chooses the
// lease from how long the holds of this lock name have lasted, within [min, max]. The server
// measures each hold on its own clock (acquisition to final Unlock) and keeps, per name, a
// weighted average (0.8 × the old value + 0.2 × the new hold), a count and a high-water mark
// (the larger of the new hold and 0.99 × the old mark); a new acquisition's lease is three times
// the high-water mark, within [min, max], and max for a name with no hold recorded. The lease
// is then renewed when the greater of a third of it and 300 ms is left, and never sooner than
// WithTTL's lease of that length would be (so a hold no longer than the mark needs no renewal
// at all), or, with WithoutRenewal, fixed; a crashed holder's lock frees
// within the lease it got, typically far below max. Lease.TTL and the lease context follow the
// chosen lease.
//
// Only locks with this option record their holds, in one small record per name (docs/PROTOCOL.md,
// "The hold record"), which expires after WithHoldStatsRetention without a hold; Client.Inspect
// shows it (Info.HoldStats). A hold that ends without an Unlock (a crash) is not recorded; an
// Unlock after the lease ran out is, so that the lease grows for the next holders. An adaptive
// lock passes among the waiters of one client through the server, not locally (see Waiting in
// the package documentation), so that every hold is measured.
//
// min must be at least MinTTL and at most max; max is bounded as WithTTL's ttl is (MaxTTL with
// renewal, MaxFixedTTL without). Of WithTTL and WithAdaptiveTTL, the last one given applies.
func WithAdaptiveTTL(min, max time.Duration) Option {
	return func(o *options) {
		switch {
		case min < MinTTL:
			o.fail(fmt.Errorf("%w: WithAdaptiveTTL(%v, %v): the least lease is below the minimum %v", ErrInvalid, min, max, MinTTL))
			return
		case max < min:
			o.fail(fmt.Errorf("%w: WithAdaptiveTTL(%v, %v): the least lease is above the greatest", ErrInvalid, min, max))
			return
		}
		o.adapt = adaptive{min: min, max: max}
		o.ttl = max
	}
}

// WithHoldStatsRetention sets how long the server keeps a lock name's hold record
// (WithAdaptiveTTL) after the last hold it recorded: about 165 bytes per name (docs/PROTOCOL.md,
// "The hold record"). Longer keeps what was learnt across quiet periods (a daily job needs more
// than a day); shorter saves memory where many distinct names are locked adaptively. A Client
// option; the default is DefaultHoldStatsRetention (24 hours), the minimum
// MinHoldStatsRetention (1 second).
func WithHoldStatsRetention(d time.Duration) ClientOption {
	return retentionOption("hold statistics retention", d, MinHoldStatsRetention, func(o *options) *time.Duration { return &o.holdKeep })
}

// checkAdaptive reports an adaptive lease whose greatest bound is too long for its kind.
func checkAdaptive(a adaptive, renew bool) error {
	switch {
	case renew && a.max > MaxTTL:
		return fmt.Errorf("%w: WithAdaptiveTTL(%v, %v) with renewal: the greatest lease is above MaxTTL (%v); use WithoutRenewal for a fixed lease (up to %v)",
			ErrInvalid, a.min, a.max, MaxTTL, MaxFixedTTL)
	case !renew && a.max > MaxFixedTTL:
		return fmt.Errorf("%w: WithAdaptiveTTL(%v, %v) without renewal: the greatest lease is above MaxFixedTTL (%v)", ErrInvalid, a.min, a.max, MaxFixedTTL)
	}
	return nil
}

// adaptiveLock is what the adaptive lease adds to a lock's spec; a fixed lease has none (nil),
// so that its spec stays as small as before.
type adaptiveLock struct {
	bounds adaptive
	lo, hi string // the bounds in ms, as acquire.lua takes them
	keep   string // the hold record's retention in ms, as release.lua takes it
}

// on reports whether the lock is adaptive.
func (a *adaptiveLock) on() bool { return a != nil }

// args returns the bounds as acquire.lua takes them: "", "" for a fixed lease.
func (a *adaptiveLock) args() (lo, hi string) {
	if a == nil {
		return "", ""
	}
	return a.lo, a.hi
}

// same reports whether a and b ask for the same lease: both fixed, or the same bounds.
func (a *adaptiveLock) same(b *adaptiveLock) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.bounds == b.bounds
}

// leastTTL is the shortest lease spec's lock can get: its TTL, or the adaptive lease's least
// bound. A registration's acceptance window (a grant's first lease, and how long a queued client
// that crashed delays the others) is made from it, so that an adaptive lock granted to a client
// that dies at once frees as soon as one given its least lease would.
func (spec *lockSpec) leastTTL() time.Duration {
	if spec.adapt.on() {
		return spec.adapt.bounds.min
	}
	return spec.ttl
}

// holdKey is the key of the hold record of the lock with this key: same hash tag, so the same
// Cluster slot as the lock.
func holdKey(lockKey string) string { return lockKey + ":h" }

// adaptiveSpec makes spec's lock adaptive: its script calls carry the hold record's key, and
// acquisitions and final releases the arguments that make the server choose the lease and
// record the hold.
func (spec *lockSpec) adaptiveSpec(a adaptive, keep time.Duration) {
	spec.adapt = &adaptiveLock{bounds: a, lo: protocol.Millis(a.min), hi: protocol.Millis(a.max), keep: protocol.Millis(keep)}
	spec.keys = append(spec.keys[:len(spec.keys):len(spec.keys)], holdKey(spec.key))
}

// adaptTo sets a just-acquired lease to the adaptive lease the server chose, ttl (whole ms),
// counted from sent, the acquisition's send time. It runs before the lease is shared.
func (st *leaseState) adaptTo(ttl time.Duration, sent int64) {
	st.adaptMS = int32(ttl / time.Millisecond)
	st.ttl.Store(int64(ttl))
	st.deadline.Store(sent + int64(ttl-drift(ttl)))
}

// fullTTL is the lease this acquisition asked for: the adaptive lease the server chose, or
// the spec's TTL. A grant, which starts with the acceptance window, is renewed to it at once.
func (st *leaseState) fullTTL() time.Duration {
	if st.adaptMS > 0 {
		return time.Duration(st.adaptMS) * time.Millisecond
	}
	return st.spec.ttl
}

// fullTTLArg is fullTTL as the scripts take it.
func (st *leaseState) fullTTLArg() string {
	if st.adaptMS > 0 {
		return strconv.Itoa(int(st.adaptMS))
	}
	return st.spec.ttlArg
}

// recordHold makes req, the final release of st, record the hold when st's lock is adaptive.
func (st *leaseState) recordHold(req backend.ReleaseReq) backend.ReleaseReq {
	if st.spec.adapt.on() {
		req.Record = st.spec.adapt.keep
	}
	return req
}

// HoldStats is what the server measured of a lock name's holds, kept for locks taken with
// WithAdaptiveTTL (docs/PROTOCOL.md, "The hold record"). Durations are on the server's clock,
// to the microsecond. The zero value: nothing recorded (the name is not adaptive, or its
// record expired).
type HoldStats struct {
	// Count is how many holds were recorded.
	Count int64
	// Typical is their weighted average: each recorded hold moves it a fifth of the way
	// (0.8 × the old average + 0.2 × the hold); the first sets it.
	Typical time.Duration
	// High is the high-water mark: the larger of the latest hold and 0.99 × the previous mark,
	// a maximum that fades by 1% per hold.
	High time.Duration
	// Last is the latest hold recorded.
	Last time.Duration
	// Expires is how long the server keeps the record unless another hold is recorded.
	Expires time.Duration
}

// Lease returns the lease an acquisition with WithAdaptiveTTL(least, most) gets from these
// statistics: three times High, in whole milliseconds rounded up, within [least, most]; most
// when nothing was recorded.
func (h HoldStats) Lease(least, most time.Duration) time.Duration {
	if h.Count == 0 {
		return most
	}
	us := h.High.Microseconds()
	l := time.Duration((adaptiveFactor*us+999)/1000) * time.Millisecond
	return min(most, max(least, l))
}

// parseHoldStats reads a hold record's value and PTTL as inspect.lua returns them:
// "<count> <typical µs> <high µs> <last µs>". Anything else reads as nothing recorded.
func parseHoldStats(value, pttl any) HoldStats {
	v, ok := value.(string)
	if !ok {
		return HoldStats{}
	}
	f := strings.Fields(v)
	if len(f) != 4 {
		return HoldStats{}
	}
	var n [4]int64
	for i, s := range f {
		x, err := strconv.ParseInt(s, 10, 64)
		if err != nil || x < 0 {
			return HoldStats{}
		}
		n[i] = x
	}
	h := HoldStats{Count: n[0], Typical: time.Duration(n[1]) * time.Microsecond,
		High: time.Duration(n[2]) * time.Microsecond, Last: time.Duration(n[3]) * time.Microsecond}
	if ms, ok := pttl.(int64); ok && ms > 0 {
		h.Expires = time.Duration(ms) * time.Millisecond
	}
	return h
}
