package dlockotel_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockotel"
	"github.com/dlock-go/dlock/internal/redistest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// setup returns a Telemetry whose spans go to an in-memory exporter and whose instruments are
// read by a manual reader, and a client that reports to it.
func setup(t *testing.T, url string, opts ...dlock.ClientOption) (*dlock.Client, *tracetest.InMemoryExporter, *sdktrace.TracerProvider, *sdkmetric.ManualReader) {
	t.Helper()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() {
		tp.Shutdown(context.Background())
		mp.Shutdown(context.Background())
	})
	tel, err := dlockotel.New(dlockotel.WithTracerProvider(tp), dlockotel.WithMeterProvider(mp),
		dlockotel.WithLockAttribute(func(name string) string {
			class, _, _ := strings.Cut(name, ":")
			return class
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dlock.Dial(ctx, url, append(opts, dlock.WithObserver(tel.Observer()), dlock.WithLogger(slog.New(slog.DiscardHandler)))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, spans, tp, reader
}

func attrOf(s tracetest.SpanStub, key attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// spansNamed returns the exported spans called name whose dlock.name is lock.
func spansNamed(exp *tracetest.InMemoryExporter, name, lock string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if v, _ := attrOf(s, dlockotel.AttrName); s.Name == name && v.AsString() == lock {
			out = append(out, s)
		}
	}
	return out
}

func poll(t *testing.T, what string, check func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := redistest.Poll(ctx, what, func(context.Context) error { return check() }); err != nil {
		t.Fatal(err)
	}
}

// Do under a request span gives a wait span and a hold span, both children of the request's
// span, with the lock's name, token and outcome; a busy TryLock's wait span says busy; a lease
// lost to a force unlock ends its hold span with an error status and the cause.
func TestSpans(t *testing.T) {
	s := redistest.Start(t)
	c, exp, tp, _ := setup(t, s.URL(), dlock.WithTTL(300*time.Millisecond))
	ctx, req := tp.Tracer("test").Start(context.Background(), "request")
	var token uint64
	before := time.Now()
	err := c.Do(ctx, "sku:1", func(ctx context.Context) error {
		token, _ = dlock.TokenFromContext(ctx)
		time.Sleep(5 * time.Millisecond)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	req.End()
	waits, holds := spansNamed(exp, "dlock.wait", "sku:1"), spansNamed(exp, "dlock.hold", "sku:1")
	if len(waits) != 1 || len(holds) != 1 {
		t.Fatalf("%d wait and %d hold spans, want one each", len(waits), len(holds))
	}
	w, h := waits[0], holds[0]
	for _, s := range []tracetest.SpanStub{w, h} {
		if s.Parent.SpanID() != req.SpanContext().SpanID() || s.SpanContext.TraceID() != req.SpanContext().TraceID() {
			t.Errorf("%s: parent %v, want the request span %v", s.Name, s.Parent.SpanID(), req.SpanContext().SpanID())
		}
		if v, _ := attrOf(s, dlockotel.AttrToken); v.AsInt64() != int64(token) {
			t.Errorf("%s: token %v, want %d", s.Name, v.Emit(), token)
		}
	}
	if v, _ := attrOf(w, dlockotel.AttrOutcome); v.AsString() != "acquired" {
		t.Errorf("wait outcome %q", v.Emit())
	}
	if v, _ := attrOf(w, dlockotel.AttrPath); v.AsString() != "server" {
		t.Errorf("wait path %q", v.Emit())
	}
	if v, _ := attrOf(h, dlockotel.AttrOutcome); v.AsString() != "released" {
		t.Errorf("hold outcome %q", v.Emit())
	}
	if w.StartTime.Before(before) || !w.EndTime.After(w.StartTime) || h.EndTime.Sub(h.StartTime) < 5*time.Millisecond ||
		h.StartTime.Before(w.StartTime) {
		t.Errorf("wait %v–%v, hold %v–%v: want the wait first, then a hold of at least 5ms", w.StartTime, w.EndTime, h.StartTime, h.EndTime)
	}

	// Busy.
	other, _, _, _ := setup(t, s.URL())
	l, err := other.Mutex("sku:2").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Mutex("sku:2").TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatal(err)
	}
	l.Unlock(ctx)
	waits = spansNamed(exp, "dlock.wait", "sku:2")
	if len(waits) != 1 {
		t.Fatalf("%d wait spans for the busy TryLock", len(waits))
	}
	if v, _ := attrOf(waits[0], dlockotel.AttrOutcome); v.AsString() != "busy" {
		t.Errorf("busy TryLock's outcome %q", v.Emit())
	}
	if _, ok := attrOf(waits[0], dlockotel.AttrToken); ok || waits[0].Status.Code == codes.Error {
		t.Errorf("busy TryLock's span %+v: want no token, no error status", waits[0])
	}

	// Lost.
	l, err = c.Mutex("sku:3").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.ForceUnlock(ctx, "sku:3"); err != nil {
		t.Fatal(err)
	}
	poll(t, "the lost hold's span", func() error {
		if len(spansNamed(exp, "dlock.hold", "sku:3")) != 1 {
			return errors.New("not yet")
		}
		return nil
	})
	l.Unlock(ctx)
	h = spansNamed(exp, "dlock.hold", "sku:3")[0]
	if v, _ := attrOf(h, dlockotel.AttrOutcome); v.AsString() != "lost" {
		t.Errorf("lost hold's outcome %q", v.Emit())
	}
	if v, _ := attrOf(h, dlockotel.AttrCause); v.AsString() != "force_unlocked" {
		t.Errorf("lost hold's cause %q", v.Emit())
	}
	if h.Status.Code != codes.Error {
		t.Errorf("lost hold's status %+v, want an error", h.Status)
	}
}

// points returns the data points of instrument name as (attributes, count or value) pairs.
func points(t *testing.T, reader *sdkmetric.ManualReader, name string) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := make(map[string]float64)
	key := func(set attribute.Set) string {
		var parts []string
		for _, kv := range set.ToSlice() {
			parts = append(parts, string(kv.Key)+"="+kv.Value.Emit())
		}
		return strings.Join(parts, ",")
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[key(p.Attributes)] = float64(p.Count)
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[key(p.Attributes)] = float64(p.Value)
				}
			}
		}
	}
	return out
}

// The instruments, read by the SDK's manual reader: waits by outcome and path, holds, leases
// held, waiting goroutines, losses by cause, and renewal rounds, each lock's with its class.
func TestInstruments(t *testing.T) {
	s := redistest.Start(t)
	c, _, _, reader := setup(t, s.URL(), dlock.WithTTL(300*time.Millisecond))
	ctx := context.Background()
	l, err := c.Mutex("sku:1").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p := points(t, reader, "dlock.leases.held"); p["lock=sku"] != 1 {
		t.Fatalf("leases held while held: %v", p)
	}
	got := make(chan error, 1)
	go func() {
		l, err := c.Mutex("sku:1").Lock(ctx)
		if err == nil {
			err = l.Unlock(ctx)
		}
		got <- err
	}()
	poll(t, "one waiter", func() error {
		if p := points(t, reader, "dlock.waiters"); p["lock=sku"] != 1 {
			return fmt.Errorf("waiters %v", p)
		}
		return nil
	})
	poll(t, "a renewal round", func() error {
		if p := points(t, reader, "dlock.renewal"); p[""] < 1 {
			return fmt.Errorf("renewal %v", p)
		}
		return nil
	})
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	wait := points(t, reader, "dlock.acquire.wait")
	if wait["lock=sku,outcome=acquired,path=server"] != 1 || wait["lock=sku,outcome=acquired,path=local"] != 1 {
		t.Fatalf("acquire waits %v: want one from the server, one local", wait)
	}
	if p := points(t, reader, "dlock.hold"); p["lock=sku"] != 2 {
		t.Fatalf("holds %v, want 2", p)
	}
	if p := points(t, reader, "dlock.leases.held"); p["lock=sku"] != 0 {
		t.Fatalf("leases held after: %v", p)
	}
	if p := points(t, reader, "dlock.waiters"); p["lock=sku"] != 0 {
		t.Fatalf("waiters after: %v", p)
	}

	l, err = c.Mutex("job:nightly").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ForceUnlock(ctx, "job:nightly"); err != nil {
		t.Fatal(err)
	}
	poll(t, "a loss", func() error {
		if p := points(t, reader, "dlock.leases.lost"); p["cause=force_unlocked,lock=job"] != 1 {
			return fmt.Errorf("lost %v", p)
		}
		return nil
	})
	l.Unlock(ctx)
}
