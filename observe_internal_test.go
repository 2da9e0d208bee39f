package dlock

import (
	"context"
	"log/slog"
	"testing"
	"time"
)

// BenchmarkObserverPath: the work an observer adds to one Lock+Unlock pair, without the
// server: making the lease (with its record, or without), reporting its acquisition and its
// release to an observer whose functions do nothing, against making the lease alone, as a
// client without an observer does. The difference is the observer's cost per pair; the pair
// itself costs tens of microseconds of the client's CPU (docs/BENCHMARKS.md, "Observer
// overhead").
func BenchmarkObserverPath(b *testing.B) {
	noop := Observer{
		AcquireDone: func(context.Context, AcquireEvent) {},
		Released:    func(context.Context, ReleaseEvent) {},
	}
	ctx := context.Background()
	for _, v := range []struct {
		name string
		fns  []Observer
	}{{"none", nil}, {"noop", []Observer{noop}}} {
		b.Run(v.name, func(b *testing.B) {
			e := &engine{ev: newObserver(slog.Default(), v.fns), renewer: newRenewer(nil, nil), waits: newWaitQueues(nil)}
			if e.ev.hot() {
				e.obs = e.ev
			}
			m := &Mutex{e: e, name: "bench", spec: &lockSpec{name: "bench", key: "dlock:{bench}", ttl: time.Second}}
			b.ReportAllocs()
			for b.Loop() {
				var start int64
				if e.obs != nil {
					start = mono()
				}
				st := newLeaseState(e, m.spec, ctx, "owner", 42, mono())
				l := &Lease{st: st}
				if o := e.obs; o != nil {
					o.acquired(ctx, e, m.spec, false, start, l, nil)
				}
				st.end(endReleased, nil)
			}
		})
	}
}
