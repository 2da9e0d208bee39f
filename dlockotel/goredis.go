package dlockotel

import (
	"context"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/goredisconn"
)

// GoRedisHook returns a go-redis hook that links the span of a command or pipeline serving
// several callers' lock calls to every one of those callers' spans: dlock sends the concurrent
// acquisitions or releases of several callers as one script call (conn.Callers), and goredisconn
// batches concurrent calls into one pipeline (goredisconn.CallerContexts). Such a command runs
// with its first caller's context values, so its span is a child of that caller's span; the
// links lead the other callers' traces to it too. Add it after your tracing hook (such as
// go-redis's redisotel), so that the command's span is in the context it sees:
//
//	rdb.AddHook(tracingHook)
//	rdb.AddHook(dlockotel.GoRedisHook())
//
// It does nothing for other commands, or when the span does not record.
func GoRedisHook() redis.Hook { return linkHook{} }

type linkHook struct{}

func (linkHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (linkHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		link(ctx, conn.Callers(ctx))
		return next(ctx, cmd)
	}
}

func (linkHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		callers := goredisconn.CallerContexts(ctx)
		if callers == nil {
			callers = []context.Context{ctx}
		}
		var all []context.Context
		for _, c := range callers {
			if cs := conn.Callers(c); cs != nil {
				all = append(all, cs...)
			} else if c != ctx {
				all = append(all, c)
			}
		}
		link(ctx, all)
		return next(ctx, cmds)
	}
}

// link adds to the span in ctx a link to each caller's span (once each, not to itself).
func link(ctx context.Context, callers []context.Context) {
	if len(callers) == 0 {
		return
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	own := span.SpanContext().SpanID()
	seen := make(map[trace.SpanID]bool, len(callers))
	for _, c := range callers {
		sc := trace.SpanContextFromContext(c)
		if !sc.IsValid() || sc.SpanID() == own || seen[sc.SpanID()] {
			continue
		}
		seen[sc.SpanID()] = true
		span.AddLink(trace.Link{SpanContext: sc})
	}
}
