package main

import "golang.org/x/sys/unix"

// mono reads CLOCK_MONOTONIC in nanoseconds. Unlike the monotonic reading inside time.Time,
// whose origin is private to each process, this clock is one clock for every process on the
// machine: the checker, its resource server and its workers stamp events on the same
// timeline, so "the lost-lock signal came before the next holder acquired" can be decided
// across processes.
func mono() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return ts.Nano()
}

// realtime reads CLOCK_REALTIME in nanoseconds: the clock redis-server's TIME reports.
func realtime() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_REALTIME, &ts); err != nil {
		panic("clock_gettime(CLOCK_REALTIME): " + err.Error())
	}
	return ts.Nano()
}

// clockSample pairs the two clocks read back to back.
type clockSample struct{ mono, real int64 }

// sampleClocks keeps the tightest of a few back-to-back readings, so that a descheduling
// between two reads (a busy machine) does not skew the pair.
func sampleClocks() clockSample {
	var best clockSample
	width := int64(-1)
	for range 5 {
		m1 := mono()
		r := realtime()
		m2 := mono()
		if width < 0 || m2-m1 < width {
			best, width = clockSample{mono: m1 + (m2-m1)/2, real: r}, m2-m1
		}
		if width < 20_000 {
			break
		}
	}
	return best
}

// clockMap converts CLOCK_REALTIME instants (such as a fencing token, which is the Redis
// server's TIME in microseconds when the lock was granted) to CLOCK_MONOTONIC, using samples
// taken through the run, so a slewing NTP daemon does not skew the mapping. ok is false when
// the wall clock stepped during the run: tokens then cannot be placed on the timeline.
type clockMap struct {
	samples []clockSample // by time
	ok      bool
}

func newClockMap(samples []clockSample) clockMap {
	m := clockMap{samples: samples, ok: len(samples) > 0}
	for i := 1; i < len(samples); i++ {
		d := (samples[i].real - samples[i].mono) - (samples[i-1].real - samples[i-1].mono)
		if d > 2e6 || d < -2e6 {
			m.ok = false // stepped by more than 2 ms between two samples
		}
	}
	return m
}

// toMono maps a CLOCK_REALTIME instant to CLOCK_MONOTONIC with the nearest earlier sample.
func (m clockMap) toMono(real int64) (int64, bool) {
	if !m.ok {
		return 0, false
	}
	i := 0
	for lo, hi := 0, len(m.samples); lo < hi; {
		mid := (lo + hi) / 2
		if m.samples[mid].real <= real {
			i, lo = mid, mid+1
		} else {
			hi = mid
		}
	}
	s := m.samples[i]
	return real - (s.real - s.mono), true
}
