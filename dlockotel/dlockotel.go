// Package dlockotel reports what dlock's locks do through OpenTelemetry: the metrics of the
// dlockprom module as OTel instruments, and a span for each acquisition (its wait) and each
// hold, in the trace of the request that took the lock.
//
//	tel, err := dlockotel.New() // the global MeterProvider and TracerProvider, or With... options
//	...
//	c, err := dlock.Dial(ctx, url, dlock.WithObserver(tel.Observer()))
//
// Spans, children of the span in the context given to Lock, TryLock or Do:
//
//	dlock.wait  from the call to its return; attributes dlock.name, dlock.outcome (acquired,
//	            busy, timed_out, cancelled, error), and when acquired dlock.path (server or
//	            local) and dlock.token; status Error for the outcome error
//	dlock.hold  from the acquisition to the release or loss; attributes dlock.name, dlock.token,
//	            dlock.outcome (released, passed_on, lost) and, when lost, dlock.cause
//	            (dlock.LostCause); status Error when lost
//
// Both are made when they end, with their start and end times, so that nothing is kept per
// lock while it waits or is held.
//
// Instruments (meter "github.com/dlock-go/dlock/dlockotel"), named so that an OTel-to-
// Prometheus export gives the names of dlockprom:
//
//	dlock.acquire.wait     histogram, s: attributes outcome, path (none when not acquired)
//	dlock.hold             histogram, s
//	dlock.leases.held      up-down counter: leases held now
//	dlock.waiters          up-down counter: goroutines waiting for a lock now
//	dlock.leases.lost      counter: attribute cause
//	dlock.renewal          histogram, s: one renewal round
//	dlock.renewal.errors   counter: renewal rounds with a renewal that got no answer
//
// With WithLockAttribute, the instruments of locks also carry the attribute lock (a bounded
// class of the name: names themselves are unbounded); spans always carry the name.
//
// The lock commands themselves run under the caller's context on both transports, so that a
// Redis client's own tracing hook puts them in the request's trace. The go-redis adapter
// batches concurrent calls into shared pipelines; GoRedisHook links such a pipeline's span to
// every caller's span.
package dlockotel

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlock-go/dlock"
)

// ScopeName names the meter and the tracer.
const ScopeName = "github.com/dlock-go/dlock/dlockotel"

// Option configures New.
type Option func(*config)

type config struct {
	mp        metric.MeterProvider
	tp        trace.TracerProvider
	lockClass func(string) string
}

// WithMeterProvider sets where the instruments are made; the default is otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithTracerProvider sets where the spans go; the default is otel.GetTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithLockAttribute adds the attribute lock, f(name), to the instruments of locks (wait, hold,
// held, waiters, lost). f must map the unbounded set of names to a few classes ("sku:42" to
// "sku"), be cheap and safe for concurrent use.
func WithLockAttribute(f func(name string) string) Option {
	return func(c *config) { c.lockClass = f }
}

// Telemetry holds the instruments and the tracer. Make it with New; give its Observer to
// dlock.WithObserver (of one Client or several).
type Telemetry struct {
	tracer        trace.Tracer
	lockClass     func(string) string
	wait          metric.Float64Histogram
	hold          metric.Float64Histogram
	held          metric.Int64UpDownCounter
	waiters       metric.Int64UpDownCounter
	lost          metric.Int64Counter
	renewal       metric.Float64Histogram
	renewalErrors metric.Int64Counter
}

// Bucket boundaries of the histograms, in seconds (as dlockprom's defaults).
var (
	waitBuckets    = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
	holdBuckets    = []float64{0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300}
	renewalBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}
)

// New makes the instruments and the tracer.
func New(opts ...Option) (*Telemetry, error) {
	var cfg config
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if cfg.mp == nil {
		cfg.mp = otel.GetMeterProvider()
	}
	if cfg.tp == nil {
		cfg.tp = otel.GetTracerProvider()
	}
	m := cfg.mp.Meter(ScopeName)
	t := &Telemetry{tracer: cfg.tp.Tracer(ScopeName), lockClass: cfg.lockClass}
	var errs []error
	add := func(err error) {
		errs = append(errs, err)
	}
	var err error
	t.wait, err = m.Float64Histogram("dlock.acquire.wait", metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(waitBuckets...),
		metric.WithDescription("Time from calling Lock, TryLock or Do to its return, by outcome and path."))
	add(err)
	t.hold, err = m.Float64Histogram("dlock.hold", metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(holdBuckets...),
		metric.WithDescription("Time a lease was held, from its acquisition to its release or loss."))
	add(err)
	t.held, err = m.Int64UpDownCounter("dlock.leases.held", metric.WithUnit("{lease}"), metric.WithDescription("Leases held now."))
	add(err)
	t.waiters, err = m.Int64UpDownCounter("dlock.waiters", metric.WithUnit("{goroutine}"), metric.WithDescription("Goroutines waiting for a lock now."))
	add(err)
	t.lost, err = m.Int64Counter("dlock.leases.lost", metric.WithUnit("{lease}"),
		metric.WithDescription("Leases that ended otherwise than by their release, by cause."))
	add(err)
	t.renewal, err = m.Float64Histogram("dlock.renewal", metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(renewalBuckets...),
		metric.WithDescription("Time of one round of the renewal loop, from sending it to its answer."))
	add(err)
	t.renewalErrors, err = m.Int64Counter("dlock.renewal.errors", metric.WithUnit("{round}"),
		metric.WithDescription("Renewal rounds in which a lease's renewal got no answer; it is retried until the lease's deadline."))
	add(err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return t, nil
}

// attrs returns the attributes of a lock's instrument: kv, then the lock class.
func (t *Telemetry) attrs(name string, kv ...attribute.KeyValue) metric.MeasurementOption {
	if t.lockClass != nil {
		kv = append(kv, attribute.String("lock", t.lockClass(name)))
	}
	return metric.WithAttributes(kv...)
}

// Attribute keys of the spans.
const (
	AttrName    = attribute.Key("dlock.name")
	AttrToken   = attribute.Key("dlock.token")
	AttrOutcome = attribute.Key("dlock.outcome")
	AttrPath    = attribute.Key("dlock.path")
	AttrCause   = attribute.Key("dlock.cause")
)

// token is a fencing token as a span attribute (tokens are microseconds of the server's clock:
// well within int64).
func token(tk uint64) attribute.KeyValue { return AttrToken.Int64(int64(tk)) }

// Observer returns the dlock.Observer that feeds the instruments and makes the spans.
func (t *Telemetry) Observer() dlock.Observer {
	return dlock.Observer{
		AcquireDone: func(ctx context.Context, ev dlock.AcquireEvent) {
			path := "none"
			attrs := []attribute.KeyValue{AttrName.String(ev.Name), AttrOutcome.String(ev.Outcome.String())}
			if ev.Outcome == dlock.OutcomeAcquired {
				path = ev.Path.String()
				attrs = append(attrs, AttrPath.String(path), token(ev.Token))
				t.held.Add(ctx, 1, t.attrs(ev.Name))
			}
			t.wait.Record(ctx, ev.Wait.Seconds(), t.attrs(ev.Name, attribute.String("outcome", ev.Outcome.String()), attribute.String("path", path)))
			_, span := t.tracer.Start(ctx, "dlock.wait", trace.WithTimestamp(ev.Start), trace.WithAttributes(attrs...))
			if ev.Outcome == dlock.OutcomeError {
				span.RecordError(ev.Err)
				span.SetStatus(codes.Error, ev.Err.Error())
			}
			span.End(trace.WithTimestamp(ev.Start.Add(ev.Wait)))
		},
		Waiting: func(ctx context.Context, ev dlock.WaitingEvent) {
			n := int64(1)
			if !ev.Joined {
				n = -1
			}
			t.waiters.Add(ctx, n, t.attrs(ev.Name))
		},
		Released: func(ctx context.Context, ev dlock.ReleaseEvent) {
			t.held.Add(ctx, -1, t.attrs(ev.Name))
			t.hold.Record(ctx, ev.Held.Seconds(), t.attrs(ev.Name))
			outcome := "released"
			if ev.PassedOn {
				outcome = "passed_on"
			}
			end := time.Now()
			_, span := t.tracer.Start(ctx, "dlock.hold", trace.WithTimestamp(end.Add(-ev.Held)),
				trace.WithAttributes(AttrName.String(ev.Name), token(ev.Token), AttrOutcome.String(outcome)))
			span.End(trace.WithTimestamp(end))
		},
		Lost: func(ctx context.Context, ev dlock.LostEvent) {
			t.held.Add(ctx, -1, t.attrs(ev.Name))
			t.hold.Record(ctx, ev.Held.Seconds(), t.attrs(ev.Name))
			t.lost.Add(ctx, 1, t.attrs(ev.Name, attribute.String("cause", ev.Cause.String())))
			end := time.Now()
			_, span := t.tracer.Start(ctx, "dlock.hold", trace.WithTimestamp(end.Add(-ev.Held)),
				trace.WithAttributes(AttrName.String(ev.Name), token(ev.Token), AttrOutcome.String("lost"), AttrCause.String(ev.Cause.String())))
			if ev.Err != nil {
				span.SetStatus(codes.Error, ev.Err.Error())
			}
			span.End(trace.WithTimestamp(end))
		},
		Renewal: func(ev dlock.RenewalEvent) {
			ctx := context.Background()
			t.renewal.Record(ctx, ev.Latency.Seconds())
			if ev.Failed > 0 {
				t.renewalErrors.Add(ctx, 1)
			}
		},
	}
}
