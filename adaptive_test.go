package dlock_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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
		// A least lease of 300 ms: the holds, up to 200 ms, are renewed with room to spare.
		const least, most = 300 * time.Millisecond, 5 * time.Second
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
// of 1.2 s three times that; one after a hold longer than max/3 max; and a run of instant
// holds brings it back down to min as the high-water mark fades (1% per hold).
func TestAdaptive_LeaseGrowsAndShrinks(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		const least, most = time.Second, 6 * time.Second
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
		hold(1200*time.Millisecond, least, "after an instant hold")
		r := readHoldRecord(t, shared, name)
		grown := r.stats().Lease(least, most)
		if grown < 3600*time.Millisecond || grown >= most {
			t.Fatalf("after a 1.2s hold the record %+v gives %v, want 3 × the hold (≥ 3.6s), below max", r, grown)
		}
		hold(2100*time.Millisecond, grown, "after a 1.2s hold")
		hold(0, most, "after a 2.1s hold (clamped to max)")
		// Instant holds: the mark fades to below min/3 within about 200 of them.
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

// Without renewal the adaptive lease is fixed: a hold that outlives it loses the lock (the lease
// context ends with ErrExpired when the lease can run out), and its Unlock records the hold all
// the same, so that the next holder gets a lease long enough for it.
func TestAdaptive_FixedLeaseLearnsFromAnOverrun(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		const least, most = 100 * time.Millisecond, 5 * time.Second
		c := tr.dial(t, shared.URL(), dlock.WithAdaptiveTTL(least, most), dlock.WithoutRenewal())
		name := uniqueName(t)
		m := c.Mutex(name)
		l, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil { // an instant hold: the next lease is min
			t.Fatal(err)
		}
		called := time.Now()
		l, err = m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		taken := time.Now()
		checkLease(t, shared, name, least, "after an instant hold")
		// The lease counts from before the call: from then on, its context reports the end
		// (Err checks the deadline itself; Done follows when the renewal loop runs).
		time.Sleep(time.Until(called.Add(least)))
		if l.Context().Err() == nil {
			t.Fatalf("the lease context is live %v after the Lock call, past the adaptive lease", least)
		}
		if cause := context.Cause(l.Context()); !errors.Is(cause, dlock.ErrExpired) {
			t.Fatalf("lease context cause %v, want ErrExpired", cause)
		}
		time.Sleep(400*time.Millisecond - time.Since(taken)) // the work went on for 400 ms
		if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrLost) {
			t.Fatalf("Unlock after the lease ran out = %v, want ErrLost", err)
		}
		r := readHoldRecord(t, shared, name)
		if r.count != 2 || r.last < 400_000 {
			t.Fatalf("record after the overrun %+v, want count 2 and the last hold ≥ 400ms", r)
		}
		want := r.stats().Lease(least, most)
		if want < 1200*time.Millisecond {
			t.Fatalf("the next lease %v is below 3 × the 400ms hold", want)
		}
		l, err = m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		checkLease(t, shared, name, want, "after the overrun")
		time.Sleep(400 * time.Millisecond) // the same work again: now within the lease
		if err := l.Context().Err(); err != nil {
			t.Fatalf("a 400ms hold lost its lease of %v: %v", want, context.Cause(l.Context()))
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// A holder process killed (SIGKILL) while it holds an adaptive lock frees the name within the
// lease it got, chosen from the name's holds (about 3 × 200 ms here, while the greatest lease
// is 10 s), plus 250 ms.
func TestAdaptive_KilledHolderFreesWithinItsLease(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		const least, most = dlock.MinTTL, 10 * time.Second
		name := uniqueName(t)
		c := tr.dial(t, shared.URL(), dlock.WithAdaptiveTTL(least, most))
		for range 3 { // holds of about 200 ms
			l, err := c.Mutex(name).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond)
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		lease := readHoldRecord(t, shared, name).stats().Lease(least, most)
		if lease > 2*time.Second {
			t.Fatalf("after holds of 200ms the lease is %v, want about 600ms", lease)
		}
		t.Setenv("DLOCK_ADAPTIVE_MIN", least.String())
		h, token := startHelper(t, "hold", shared.URL(), name, most)
		if left := pttlOf(t, shared, name); left <= 0 || left > lease {
			t.Fatalf("the helper's lease has %v left, want at most its adaptive lease %v", left, lease)
		}
		h.signal(t, syscall.SIGKILL)
		killed := time.Now()
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(context.Background())
		waited := time.Since(killed)
		t.Logf("the next holder got the lock %v after the SIGKILL (adaptive lease %v, greatest %v)", waited, lease, most)
		if waited > lease+250*time.Millisecond {
			t.Errorf("the next holder got the lock %v after the SIGKILL, want within the adaptive lease + 250ms = %v", waited, lease+250*time.Millisecond)
		}
		if l.Token() <= token {
			t.Errorf("token %d after the crash, want > the killed holder's %d", l.Token(), token)
		}
	})
}

// A hold record expires after WithHoldStatsRetention without a hold: the name then starts
// again from the greatest lease.
func TestAdaptive_RecordExpiresWhenIdle(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		const least, most = 50 * time.Millisecond, 2 * time.Second
		c := tr.dial(t, shared.URL(), dlock.WithAdaptiveTTL(least, most), dlock.WithHoldStatsRetention(time.Second))
		name := uniqueName(t)
		m := c.Mutex(name)
		lockUnlock := func() {
			t.Helper()
			l, err := m.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		lockUnlock()
		if r := readHoldRecord(t, shared, name); r.count != 1 {
			t.Fatalf("record %+v, want one hold", r)
		}
		info, err := c.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if e := info.HoldStats.Expires; e <= 0 || e > time.Second {
			t.Fatalf("HoldStats.Expires = %v, want within the retention of 1s", e)
		}
		waitFor(t, 5*time.Second, "the hold record to expire", func(ctx context.Context) error {
			if r := readHoldRecord(t, shared, name); r.ok {
				return errors.New("still there")
			}
			return nil
		})
		if info, err := c.Inspect(ctx, name); err != nil || info.HoldStats != (dlock.HoldStats{}) {
			t.Fatalf("Inspect after the record expired: %+v, %v; want no hold statistics", info.HoldStats, err)
		}
		l, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		checkLease(t, shared, name, most, "after the record expired")
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if r := readHoldRecord(t, shared, name); r.count != 1 {
			t.Fatalf("record %+v, want one hold (a new record)", r)
		}
	})
}

// Bad bounds are refused with ErrInvalid, as a lock's option and as a client's default.
func TestAdaptive_BadInput(t *testing.T) {
	needShared(t)
	ctx := ctxT(t)
	c := transports[0].dial(t, shared.URL())
	name := uniqueName(t)
	for _, tc := range []struct {
		what string
		opts []dlock.Option
	}{
		{"min above max", []dlock.Option{dlock.WithAdaptiveTTL(2*time.Second, time.Second)}},
		{"min below MinTTL", []dlock.Option{dlock.WithAdaptiveTTL(dlock.MinTTL-time.Millisecond, time.Second)}},
		{"zero", []dlock.Option{dlock.WithAdaptiveTTL(0, 0)}},
		{"negative", []dlock.Option{dlock.WithAdaptiveTTL(-time.Second, time.Second)}},
		{"max above MaxTTL with renewal", []dlock.Option{dlock.WithAdaptiveTTL(time.Second, dlock.MaxTTL+time.Second)}},
		{"max above MaxFixedTTL without renewal", []dlock.Option{dlock.WithAdaptiveTTL(time.Second, dlock.MaxFixedTTL+time.Second), dlock.WithoutRenewal()}},
	} {
		if _, err := c.Mutex(name, tc.opts...).TryLock(ctx); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("%s: TryLock = %v, want ErrInvalid", tc.what, err)
		}
		if err := c.Do(ctx, name, func(context.Context) error { return nil }, tc.opts...); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("%s: Do = %v, want ErrInvalid", tc.what, err)
		}
	}
	for _, tc := range []struct {
		what string
		opt  dlock.ClientOption
	}{
		{"min above max", dlock.WithAdaptiveTTL(2*time.Second, time.Second)},
		{"retention below the minimum", dlock.WithHoldStatsRetention(dlock.MinHoldStatsRetention - time.Millisecond)},
	} {
		if _, err := dlock.Dial(ctx, shared.URL(), tc.opt); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("Dial with %s = %v, want ErrInvalid", tc.what, err)
		}
	}
	// Above MaxTTL is a fixed lease's right.
	l, err := c.Mutex(name, dlock.WithAdaptiveTTL(time.Second, dlock.MaxTTL+time.Second), dlock.WithoutRenewal()).TryLock(ctx)
	if err != nil {
		t.Fatalf("a fixed adaptive lease of up to MaxTTL+1s: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Only adaptive locks record holds, once per final release; of WithTTL and WithAdaptiveTTL the
// last applies; a re-entry keeps the lease and must ask for the same bounds.
func TestAdaptive_OnlyAdaptiveLocksRecord(t *testing.T) {
	needShared(t)
	ctx := ctxT(t)
	c := transports[0].dial(t, shared.URL(), dlock.WithAdaptiveTTL(50*time.Millisecond, 2*time.Second))
	lockUnlock := func(name string, opts ...dlock.Option) {
		t.Helper()
		l, err := c.Mutex(name, opts...).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	plain, later, adaptive := uniqueName(t), uniqueName(t), uniqueName(t)
	lockUnlock(plain, dlock.WithTTL(time.Second))
	lockUnlock(later, dlock.WithTTL(time.Second), dlock.WithAdaptiveTTL(50*time.Millisecond, time.Second))
	if r := readHoldRecord(t, shared, plain); r.ok {
		t.Fatalf("a lock with WithTTL after the client's WithAdaptiveTTL left a hold record %+v", r)
	}
	if r := readHoldRecord(t, shared, later); r.count != 1 {
		t.Fatalf("WithAdaptiveTTL after WithTTL: record %+v, want one hold", r)
	}

	l, err := c.Mutex(adaptive).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := c.Mutex(adaptive).Lock(l.Context())
	if err != nil {
		t.Fatal(err)
	}
	if inner.Token() != l.Token() {
		t.Fatalf("re-entry token %d, want %d", inner.Token(), l.Token())
	}
	if _, err := c.Mutex(adaptive, dlock.WithAdaptiveTTL(60*time.Millisecond, 2*time.Second)).Lock(l.Context()); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("re-entry with other bounds = %v, want ErrInvalid", err)
	}
	if err := inner.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if r := readHoldRecord(t, shared, adaptive); r.ok {
		t.Fatalf("an inner Unlock recorded a hold: %+v", r)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if r := readHoldRecord(t, shared, adaptive); r.count != 1 {
		t.Fatalf("record %+v after the final Unlock, want one hold", r)
	}

	// The record is under the client's key prefix, beside its lock.
	const prefix = "dlock:adaptive-prefix:"
	pc := transports[0].dial(t, shared.URL(), dlock.WithPrefix(prefix), dlock.WithAdaptiveTTL(50*time.Millisecond, time.Second))
	l, err = pc.Mutex(adaptive).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if v := redisDo(t, shared, "GET", prefix+"{"+adaptive+"}:h"); !strings.HasPrefix(v, "1 ") {
		t.Fatalf("hold record under the prefix %q: %q, want one hold", prefix, v)
	}
	if info, err := pc.Inspect(ctx, adaptive); err != nil || info.HoldStats.Count != 1 {
		t.Fatalf("Inspect under the prefix: %+v, %v; want one hold", info.HoldStats, err)
	}
}

// Several clients of several goroutines take an adaptive lock in turn: it stays exclusive, and
// every hold is measured (the lock passes through the server, also among one client's
// goroutines, granted to queued clients with the adaptive lease).
func TestAdaptive_EveryHoldMeasuredAcrossWaiters(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		opt := dlock.WithAdaptiveTTL(500*time.Millisecond, 5*time.Second)
		clients := []*dlock.Client{tr.dial(t, shared.URL(), opt), tr.dial(t, shared.URL(), opt)}
		name := uniqueName(t)
		const perClient, per = 3, 10
		var inside atomic.Int32
		var wg sync.WaitGroup
		errs := make(chan error, len(clients)*perClient)
		for _, c := range clients {
			for range perClient {
				wg.Go(func() {
					for range per {
						l, err := c.Mutex(name).Lock(ctx)
						if err != nil {
							errs <- err
							return
						}
						if inside.Add(1) != 1 {
							errs <- errors.New("two holders at once")
						}
						time.Sleep(time.Millisecond)
						inside.Add(-1)
						if err := l.Unlock(ctx); err != nil {
							errs <- err
							return
						}
					}
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if r := readHoldRecord(t, shared, name); r.count != int64(len(clients)*perClient*per) {
			t.Fatalf("record %+v, want %d holds measured", r, len(clients)*perClient*per)
		}
	})
}

// A lock granted to a queued client gets the adaptive lease: the server grants it for the
// acceptance window (the least lease, here 300 ms), and the client renews it to the lease the
// server chose when it queued (here about 3 × 400 ms), not to the greatest bound.
func TestAdaptive_GrantedLeaseIsAdaptive(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		const least, most = 300 * time.Millisecond, 10 * time.Second
		a := tr.dial(t, shared.URL(), dlock.WithAdaptiveTTL(least, most))
		b := tr.dial(t, shared.URL(), dlock.WithAdaptiveTTL(least, most))
		name := uniqueName(t)
		l, err := a.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(400 * time.Millisecond) // a hold of 400 ms: the lease is about 1.2 s from now on
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		lease := readHoldRecord(t, shared, name).stats().Lease(least, most)
		if l, err = a.Mutex(name).Lock(ctx); err != nil {
			t.Fatal(err)
		}
		got := lockInBackground(t, b, name)
		waitQueued(t, name, 1)
		// Subscribed too, so that b takes the grant from its announcement (else it may claim it
		// with an attempt, which sets the adaptive lease at once).
		waitSubscribed(t, name)
		if err := l.Unlock(ctx); err != nil { // grants it to b
			t.Fatal(err)
		}
		var lb *dlock.Lease
		select {
		case lb = <-got:
		case <-time.After(5 * time.Second):
			t.Fatal("the queued client did not get the lock within 5s")
		}
		if lb == nil {
			t.Fatal("the queued client's Lock failed")
		}
		defer lb.Unlock(ctx)
		t.Logf("right after the grant: PTTL %v (the acceptance window is %v, the adaptive lease %v)", pttlOf(t, shared, name), least, lease)
		waitFor(t, 5*time.Second, "the granted lease renewed to the adaptive lease", func(ctx context.Context) error {
			if left := pttlOf(t, shared, name); left <= least+50*time.Millisecond || left > lease {
				return errors.New("PTTL " + left.String())
			}
			return nil
		})
		if err := lb.Context().Err(); err != nil {
			t.Fatalf("granted lease lost: %v", context.Cause(lb.Context()))
		}
	})
}

// Quorum mode: every server keeps its own record of the name (each release.lua records the hold
// on its own clock), and an acquisition's lease is the need-th longest of the leases the
// granting servers chose, so that a majority holds the lock for that long. Here two servers
// lost their record (they choose the greatest lease) while three know the holds are short: the
// lease is the short one, and a fixed lease ends then.
func TestAdaptive_Quorum(t *testing.T) {
	srv := startN(t, 5)
	for _, tr := range quorumTransports {
		t.Run(tr.name, func(t *testing.T) {
			ctx := ctxT(t)
			const least, most = 100 * time.Millisecond, 5 * time.Second
			c := tr.dial(t, serverAddrs(srv), dlock.WithAdaptiveTTL(least, most))
			name := uniqueName(t)
			m := c.Mutex(name, dlock.WithoutRenewal())
			for range 3 {
				l, err := c.Mutex(name).Lock(ctx) // renewed: the holds never outlive their lease
				if err != nil {
					t.Fatal(err)
				}
				time.Sleep(20 * time.Millisecond)
				if err := l.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, 10*time.Second, "every server to record the 3 holds", func(context.Context) error {
				for i, s := range srv {
					if r := readHoldRecord(t, s, name); r.count != 3 {
						return errors.New("server " + strconv.Itoa(i) + ": record " + strconv.FormatInt(r.count, 10))
					}
				}
				return nil
			})
			info, err := c.Inspect(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			// Inspect reads the record of the first server (in the order given) that answers.
			got, want := info.HoldStats, readHoldRecord(t, srv[0], name).stats()
			if got.Expires <= 0 || got.Expires > dlock.DefaultHoldStatsRetention {
				t.Fatalf("Inspect: %+v, want Expires in (0, %v]", got, dlock.DefaultHoldStatsRetention)
			}
			if got.Expires = 0; got != want {
				t.Fatalf("Inspect: %+v, want the first server's record %+v", got, want)
			}
			var short time.Duration
			for _, s := range srv[2:] {
				short = max(short, readHoldRecord(t, s, name).stats().Lease(least, most))
			}
			if short >= time.Second {
				t.Fatalf("after holds of 20ms the servers choose %v, want about 60ms clamped to %v", short, least)
			}
			for _, s := range srv[:2] {
				redisDo(t, s, "DEL", keyOf(name)+":h")
			}
			called := time.Now()
			l, err := m.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Until(called.Add(short))) // Err checks the lease deadline itself
			if l.Context().Err() == nil {
				t.Fatalf("the fixed lease is live %v after the Lock call: the majority's lease is %v, the greatest %v", short, short, most)
			}
			if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrLost) {
				t.Fatalf("Unlock after the lease ran out = %v, want ErrLost", err)
			}
		})
	}
}

// Cluster: the hold record shares the lock's hash tag, so it lives on the shard of the lock's
// slot, and the scripts that read and write both run there.
func TestAdaptive_Cluster(t *testing.T) {
	g := redistest.NewCluster(t)
	const least, most = 100 * time.Millisecond, 5 * time.Second
	for tr, c := range clusterClients(t, g, dlock.WithAdaptiveTTL(least, most)) {
		t.Run(tr, func(t *testing.T) {
			ctx := ctxT(t)
			name := uniqueName(t)
			if redistest.SlotOf(keyOf(name)+":h") != redistest.SlotOf(keyOf(name)) {
				t.Fatalf("the hold record of %s is not in the lock's slot", name)
			}
			m := c.Mutex(name)
			for range 3 {
				l, err := m.Lock(ctx)
				if err != nil {
					t.Fatal(err)
				}
				time.Sleep(50 * time.Millisecond)
				if err := l.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			master, err := g.MasterOfSlot(ctx, redistest.SlotOf(keyOf(name)))
			if err != nil {
				t.Fatal(err)
			}
			r := readHoldRecord(t, master, name)
			if r.count != 3 || r.last < 50_000 {
				t.Fatalf("record on the slot's master %+v, want 3 holds of at least 50ms", r)
			}
			l, err := m.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Unlock(ctx)
			checkLease(t, master, name, r.stats().Lease(least, most), "on a Cluster")
			info, err := c.Inspect(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if info.HoldStats.Count != 3 {
				t.Fatalf("Inspect: %+v, want the record of 3 holds", info.HoldStats)
			}
		})
	}
}

// Sentinel: the record is replicated with the lock, so that after a failover the new master
// goes on from what the old one had learnt.
func TestAdaptive_SentinelFailoverKeepsTheRecord(t *testing.T) {
	g := redistest.NewSentinel(t)
	ctx := ctxT(t)
	// Holds of 300 ms: the lease (about 900 ms) comes from the record, with room for the
	// clients' reconnection after the failover.
	const least, most = 500 * time.Millisecond, 10 * time.Second
	var clients []*dlock.Client
	for _, tr := range sentinelTransports {
		clients = append(clients, tr.dial(t, g, dlock.WithAdaptiveTTL(least, most)))
	}
	name := uniqueName(t)
	for _, c := range clients {
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	want := readHoldRecord(t, g.Master(), name)
	if want.count != int64(len(clients)) {
		t.Fatalf("record on the master %+v, want %d holds", want, len(clients))
	}
	for _, rep := range g.Replicas() {
		waitFor(t, 10*time.Second, "the record on replica "+rep.Addr, func(context.Context) error {
			if got := readHoldRecord(t, rep, name); got != want {
				return errors.New("not there yet")
			}
			return nil
		})
	}
	if _, _, err := g.Failover(ctx); err != nil {
		t.Fatal(err)
	}
	for i, c := range clients {
		var l *dlock.Lease
		waitFor(t, 15*time.Second, "a lock on the new master", func(ctx context.Context) error {
			tctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			var err error
			l, err = c.Mutex(name).TryLock(tctx)
			return err
		})
		checkLease(t, g.Master(), name, readHoldRecord(t, g.Master(), name).stats().Lease(least, most), "after the failover")
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if r := readHoldRecord(t, g.Master(), name); r.count != want.count+int64(i+1) {
			t.Fatalf("record on the new master %+v, want %d holds", r, want.count+int64(i+1))
		}
	}
}

// A renewed adaptive lease is renewed late: when the greater of a third of it and 300 ms is
// left (never sooner than at a third), so that a hold shorter than that costs no renewal. With a 1.5 s lease, a 700 ms hold
// sends none (a fixed lease of 1.5 s is renewed after 500 ms, or from 250 ms when it joins a
// round); a 2.6 s hold is first renewed no sooner than 750 ms after the acquisition (1 s, less
// the sixth by which a lease may join an earlier round) and keeps its lease throughout.
func TestAdaptive_RenewedWhenItsMarginIsLeft(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		const lease = 1500 * time.Millisecond
		var mu sync.Mutex
		var rounds []time.Time // rounds that renewed a lease
		c := tr.dial(t, shared.URL(), dlock.WithAdaptiveTTL(lease, lease), dlock.WithObserver(dlock.Observer{Renewal: func(ev dlock.RenewalEvent) {
			if ev.Leases > 0 {
				mu.Lock()
				rounds = append(rounds, time.Now())
				mu.Unlock()
			}
		}}))
		name := uniqueName(t)
		m := c.Mutex(name)
		renewed := func() []time.Time {
			mu.Lock()
			defer mu.Unlock()
			return append([]time.Time(nil), rounds...)
		}

		l, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		checkLease(t, shared, name, lease, "the first acquisition")
		time.Sleep(700 * time.Millisecond) // the hold's work
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if got := renewed(); len(got) != 0 {
			t.Fatalf("a 700 ms hold of a 1.5 s adaptive lease was renewed %d times, want none", len(got))
		}

		start := time.Now()
		l, err = m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2600 * time.Millisecond) // a hold longer than the lease: renewed meanwhile
		if err := l.Context().Err(); err != nil {
			t.Fatalf("the lease was lost during a 2.6 s hold: %v", context.Cause(l.Context()))
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		got := renewed()
		if len(got) == 0 {
			t.Fatal("a 2.6 s hold of a 1.5 s lease was never renewed")
		}
		if first := got[0].Sub(start); first < 750*time.Millisecond {
			t.Fatalf("first renewal %v after the acquisition began, want no sooner than 750ms", first)
		}
		t.Logf("renewal rounds after the acquisition began: %v", func() (d []time.Duration) {
			for _, at := range got {
				d = append(d, at.Sub(start).Round(time.Millisecond))
			}
			return d
		}())
	})
}
