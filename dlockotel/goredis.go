package dlockotel

import (
	"context"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlock-go/dlock/goredisconn"
)

// GoRedisHook returns a go-redis hook that links the span of a pipeline that goredisconn sent
// for several concurrent callers (their lock commands batched together) to every one of those
// callers' spans: the pipeline's span is a child of the first caller's span (the pipeline runs
// with its context's values), and the other callers' traces then lead to it too. Add it after
// your tracing hook (such as go-redis's redisotel), so that the pipeline's span is in the
// context it sees:
//
//	rdb.AddHook(tracingHook)
//	rdb.AddHook(dlockotel.GoRedisHook())
//
// It does nothing for other commands and pipelines, or when the span does not record.
func GoRedisHook() redis.Hook { return linkHook{} }

type linkHook struct{}

func (linkHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (linkHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (linkHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if callers := goredisconn.CallerContexts(ctx); len(callers) > 0 {
			if span := trace.SpanFromContext(ctx); span.IsRecording() {
				own := span.SpanContext()
				seen := make(map[trace.SpanID]bool, len(callers))
				for _, c := range callers {
					sc := trace.SpanContextFromContext(c)
					if !sc.IsValid() || sc.SpanID() == own.SpanID() || seen[sc.SpanID()] {
						continue
					}
					seen[sc.SpanID()] = true
					span.AddLink(trace.Link{SpanContext: sc})
				}
			}
		}
		return next(ctx, cmds)
	}
}
