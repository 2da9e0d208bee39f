package dlockotel_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockotel"
	"github.com/dlock-go/dlock/goredisconn"
	"github.com/dlock-go/dlock/internal/redistest"
)

// spanHook stands in for a go-redis tracing hook (redisotel): a span per command and per
// pipeline, started from the context go-redis gives the hook.
type spanHook struct{ tracer trace.Tracer }

func (h spanHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h spanHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		ctx, span := h.tracer.Start(ctx, "redis."+cmd.Name())
		defer span.End()
		return next(ctx, cmd)
	}
}
func (h spanHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		ctx, span := h.tracer.Start(ctx, "redis.pipeline")
		defer span.End()
		return next(ctx, cmds)
	}
}

// 64 requests, each under its own span, run Do concurrently through go-redis: dlock sends
// several requests' acquisitions or releases as one script call, and goredisconn batches calls
// into shared pipelines. Every request's span leads to the spans of its lock commands, as their
// parent or, for a command or pipeline shared with other requests, by a link.
func TestGoRedisHook_LinksEveryCaller(t *testing.T) {
	s := redistest.Start(t)
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.Background())
	o, err := redis.ParseURL(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(o)
	defer rdb.Close()
	rdb.AddHook(spanHook{tp.Tracer("redis")})
	rdb.AddHook(dlockotel.GoRedisHook())
	c, err := dlock.New(goredisconn.New(rdb))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	const callers = 64
	requests := make([]trace.SpanContext, callers)
	begin := time.Now() // the client's own commands (New's checks) come before
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, span := tp.Tracer("test").Start(context.Background(), fmt.Sprintf("request-%d", i))
			defer span.End()
			requests[i] = span.SpanContext()
			for j := range 10 {
				if err := c.Do(ctx, fmt.Sprintf("otel-%d-%d", i, j%2), func(context.Context) error { return nil }); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	reached := make(map[trace.SpanID]bool) // request spans that a redis span leads back to
	shared := 0                            // pipeline spans linked to several requests
	linked := 0                            // links from pipeline spans to requests' spans
	for _, sp := range spans.GetSpans() {
		if sp.Name != "redis.pipeline" && sp.Name != "redis.evalsha" && sp.Name != "redis.eval" || sp.StartTime.Before(begin) {
			continue
		}
		if sp.Parent.SpanID() == (trace.SpanID{}) && len(sp.Links) == 0 {
			t.Errorf("a lock command's span %s has neither parent nor link", sp.Name)
			continue
		}
		reached[sp.Parent.SpanID()] = true
		for _, l := range sp.Links {
			reached[l.SpanContext.SpanID()] = true
			linked++
		}
		if len(sp.Links) > 1 {
			shared++
		}
	}
	for i, r := range requests {
		if !reached[r.SpanID()] {
			t.Errorf("request %d: no lock command's span has it as parent or link", i)
		}
	}
	if shared == 0 || linked == 0 {
		t.Errorf("%d links, %d spans linked to several requests: want the shared commands linked to their callers", linked, shared)
	}
	t.Logf("%d links; %d spans linked to several requests", linked, shared)
}
