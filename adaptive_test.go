package dlock_test

import (
	"context"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// The adaptive lease (WithAdaptiveTTL): the server records each hold of a name and chooses the
// next acquisition's lease from the record (docs/PROTOCOL.md, "The hold record").

// holdRecord is a name's hold record as the server stores it: "<count> <typical µs> <high µs>
// <last µs>".
type holdRecord struct {
	count, typical, high, last int64
	ok                         bool // the key exists
}

// readHoldRecord reads the hold record of the lock called name (default prefix) on s.
func readHoldRecord(t testing.TB, s *redistest.Server, name string) holdRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := s.Do(ctx, "GET", keyOf(name)+":h")
	if err != nil || v == "" {
		return holdRecord{} // a nil reply
	}
	f := strings.Fields(v)
	if len(f) != 4 {
		t.Fatalf("hold record of %s = %q, want four numbers", name, v)
	}
	var n [4]int64
	for i, x := range f {
		if n[i], err = strconv.ParseInt(x, 10, 64); err != nil {
			t.Fatalf("hold record of %s = %q: %v", name, v, err)
		}
	}
	return holdRecord{count: n[0], typical: n[1], high: n[2], last: n[3], ok: true}
}

func (r holdRecord) stats() dlock.HoldStats {
	if !r.ok {
		return dlock.HoldStats{}
	}
	return dlock.HoldStats{Count: r.count, Typical: time.Duration(r.typical) * time.Microsecond,
		High: time.Duration(r.high) * time.Microsecond, Last: time.Duration(r.last) * time.Microsecond}
}

// pttlOf is the remaining lease of the lock called name on s, in ms (negative: no key).
func pttlOf(t testing.TB, s *redistest.Server, name string) time.Duration {
	t.Helper()
	ms, err := strconv.Atoi(redisDo(t, s, "PTTL", keyOf(name)))
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(ms) * time.Millisecond
}

// checkLease fails t unless the lock called name, just acquired, has a lease of want on the
// server: its PTTL, read right after, is at most want and not far below it.
func checkLease(t testing.TB, s *redistest.Server, name string, want time.Duration, what string) {
	t.Helper()
	got := pttlOf(t, s, name)
	if got > want || got < want-250*time.Millisecond {
		t.Fatalf("%s: PTTL right after the acquisition = %v, want the adaptive lease %v (at most, and within 250ms of it)", what, got, want)
	}
}

// The record follows the rule exactly for a known sequence of holds: count + 1, typical =
// round(0.8 × typical + 0.2 × hold) (the first hold sets it), high = max(hold, floor(0.99 ×
// high)), last = the hold. The hold is measured on the server's clock; the test knows it to
// within its own readings: the server's acquisition ran between the Lock call and its return,
// and its release between the Unlock call and its return, so the hold lies between
// (Unlock call − Lock return) and (Unlock return − Lock call), give or take 1 ms for the
// server clock's microsecond readings and a rate that may differ slightly from this process's
// monotonic clock. The rule is then checked on the holds the record itself reports, exactly.
func TestAdaptive_StatisticsFollowTheRule(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		const least, most = 50 * time.Millisecond, 5 * time.Second
		c := tr.dial(t, shared.URL(), dlock.WithAdaptiveTTL(least, most))
		name := uniqueName(t)
		m := c.Mutex(name)
		var prev holdRecord
		for i, hold := range []time.Duration{40 * time.Millisecond, 5 * time.Millisecond, 120 * time.Millisecond,
			0, 60 * time.Millisecond, 200 * time.Millisecond, 10 * time.Millisecond} {
			called := time.Now()
			l, err := m.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			taken := time.Now()
			checkLease(t, shared, name, prev.stats().Lease(least, most), "hold "+strconv.Itoa(i))
			time.Sleep(hold) // the work under the lock: the test measures it, below
			unlocking := time.Now()
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			unlocked := time.Now()

			r := readHoldRecord(t, shared, name)
			if !r.ok || r.count != int64(i+1) {
				t.Fatalf("hold %d: record %+v, want count %d", i, r, i+1)
			}
			lo := unlocking.Sub(taken).Microseconds() - 1000
			hi := unlocked.Sub(called).Microseconds() + 1000
			if r.last < lo || r.last > hi {
				t.Fatalf("hold %d: the server measured %d µs, want within [%d, %d] µs (the test's readings)", i, r.last, lo, hi)
			}
			wantTypical, wantHigh := r.last, r.last
			if i > 0 {
				// float64(…) keeps each product rounded on its own, as the script's Lua does.
				wantTypical = int64(math.Floor(float64(0.8*float64(prev.typical)) + float64(0.2*float64(r.last)) + 0.5))
				wantHigh = max(r.last, int64(math.Floor(0.99*float64(prev.high))))
			}
			if r.typical != wantTypical || r.high != wantHigh {
				t.Fatalf("hold %d of %d µs after %+v: typical %d, high %d; want %d and %d", i, r.last, prev, r.typical, r.high, wantTypical, wantHigh)
			}
			info, err := c.Inspect(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			want := r.stats()
			if got := info.HoldStats; got.Count != want.Count || got.Typical != want.Typical || got.High != want.High ||
				got.Last != want.Last || got.Expires <= 0 || got.Expires > dlock.DefaultHoldStatsRetention {
				t.Fatalf("Inspect: HoldStats %+v, want %+v with Expires in (0, %v]", got, want, dlock.DefaultHoldStatsRetention)
			}
			prev = r
		}
		// List shows the same for a held lock.
		l, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(ctx)
		infos, err := c.List(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) != 1 || infos[0].HoldStats.Count != prev.count || infos[0].HoldStats.High != prev.stats().High {
			t.Fatalf("List(%q) = %+v, want one lock with the hold record %+v", name, infos, prev)
		}
	})
}

// The lease grows after long holds and shrinks back after short ones, within [min, max]: the
// first acquisition (no record) gets max; one after a near-instant hold min; one after a hold
// of 400 ms three times that; one after a hold longer than max/3 max; and a run of instant
// holds brings it back down to min as the high-water mark fades (1% per hold).
func TestAdaptive_LeaseGrowsAndShrinks(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		const least, most = 300 * time.Millisecond, 3 * time.Second
		c := tr.dial(t, shared.URL(), dlock.WithAdaptiveTTL(least, most))
		name := uniqueName(t)
		m := c.Mutex(name)
		hold := func(d time.Duration, want time.Duration, what string) {
			t.Helper()
			rec := readHoldRecord(t, shared, name).stats()
			if got := rec.Lease(least, most); got != want {
				t.Fatalf("%s: the record %+v gives a lease of %v, want %v", what, rec, got, want)
			}
			l, err := m.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			checkLease(t, shared, name, want, what)
			if d > 0 {
				time.Sleep(d) // a long hold: renewed meanwhile
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
		hold(0, most, "first acquisition, no record")
		hold(400*time.Millisecond, least, "after an instant hold")
		r := readHoldRecord(t, shared, name)
		grown := r.stats().Lease(least, most)
		if grown < 1200*time.Millisecond || grown >= most {
			t.Fatalf("after a 400ms hold the record %+v gives %v, want 3 × the hold (≥ 1.2s), below max", r, grown)
		}
		hold(1100*time.Millisecond, grown, "after a 400ms hold")
		hold(0, most, "after a 1.1s hold (clamped to max)")
		// Instant holds: the mark fades to below min/3 within about 250 of them.
		last := most
		for i := range 400 {
			want := readHoldRecord(t, shared, name).stats().Lease(least, most)
			if want > last {
				t.Fatalf("instant hold %d: the lease grew from %v to %v", i, last, want)
			}
			last = want
			if want == least {
				break
			}
			l, err := m.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if last != least {
			t.Fatalf("after 400 instant holds the lease is %v, want min %v", last, least)
		}
		hold(0, least, "after many instant holds")
	})
}
