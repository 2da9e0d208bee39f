package goredisconn

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/redistest"
)

// echoScript replies with its one argument, as an integer.
var echoScript = conn.NewScript("echo", "return tonumber(ARGV[1])")

// gate is a go-redis hook that holds every script call and pipeline of them until opened, and
// records their sizes (1 for a call sent alone).
type gate struct {
	open  chan struct{}
	mu    sync.Mutex
	sizes []int
	// per pipeline command of several callers: the callKey value of the context
	// CallerContexts gives for it, and the number it echoes
	callerOf, arg []any
	first         []any // per such pipeline: the callKey value of its own context
}

// callKey marks each call's context with the number it echoes.
type callKey struct{}

func (g *gate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" {
			<-g.open
			g.record(1)
		}
		return next(ctx, cmd)
	}
}

func (g *gate) record(n int) {
	g.mu.Lock()
	g.sizes = append(g.sizes, n)
	g.mu.Unlock()
}
func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) == 0 || cmds[0].Name() != "evalsha" {
			return next(ctx, cmds) // a connection's own set-up (HELLO, CLIENT SETINFO)
		}
		<-g.open
		g.record(len(cmds))
		if callers := CallerContexts(ctx); callers != nil {
			g.mu.Lock()
			g.first = append(g.first, ctx.Value(callKey{}))
			for i, cmd := range cmds {
				args := cmd.Args()
				g.callerOf, g.arg = append(g.callerOf, callers[i].Value(callKey{})), append(g.arg, args[len(args)-1])
			}
			g.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

// The first maxPipelines calls leave at once, alone; calls made while they are out queue, and
// the next pipeline carries all of them, each caller getting its own reply; a caller whose
// context ends returns at once, and its queued call is not sent.
func TestAutoBatch_QueuedCallsShareOnePipeline(t *testing.T) {
	s := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o, err := redis.ParseURL(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	rc := redis.NewClient(o)
	t.Cleanup(func() { rc.Close() })
	g := &gate{open: make(chan struct{})}
	rc.AddHook(g)
	a := New(rc).(*adapter)

	type reply struct {
		want int64
		got  []int64
		err  error
	}
	replies := make(chan reply, 20)
	call := func(n int64) {
		cctx := context.WithValue(ctx, callKey{}, strconv.FormatInt(n, 10))
		v, err := a.Eval(cctx, echoScript, []string{"k"}, []string{strconv.FormatInt(n, 10)})
		replies <- reply{n, v, err}
	}
	queued := func() int {
		a.ab.mu.Lock()
		defer a.ab.mu.Unlock()
		return len(a.ab.queue)
	}
	waitFor := func(what string, check func() error) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := redistest.Poll(wctx, what, func(context.Context) error { return check() }); err != nil {
			t.Fatal(err)
		}
	}
	waitQueued := func(n int) {
		t.Helper()
		waitFor(fmt.Sprintf("%d calls queued", n), func() error {
			if q := queued(); q != n {
				return fmt.Errorf("%d queued", q)
			}
			return nil
		})
	}
	// maxPipelines calls leave at once, alone, held by the gate.
	for i := range maxPipelines {
		go call(int64(i))
	}
	waitFor("the first calls to leave", func() error {
		a.ab.mu.Lock()
		out := a.ab.active
		a.ab.mu.Unlock()
		if q := queued(); out != maxPipelines || q != 0 {
			return fmt.Errorf("%d out, %d queued; want %d out", out, q, maxPipelines)
		}
		return nil
	})
	// The next ones queue; one of them gives up while queued.
	const more = 10
	for i := range more {
		go call(int64(100 + i))
	}
	waitQueued(more)
	cctx, stop := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() {
		_, err := a.Eval(cctx, echoScript, []string{"k"}, []string{"999"})
		gaveUp <- err
	}()
	waitQueued(more + 1)
	stop()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("a queued call whose context ended returned %v, want context.Canceled", err)
	}

	close(g.open)
	for range maxPipelines + more {
		r := <-replies
		if r.err != nil || len(r.got) != 1 || r.got[0] != r.want {
			t.Fatalf("call %d: reply %v, %v", r.want, r.got, r.err)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	sizes := slices.Sorted(slices.Values(g.sizes))
	want := append(slices.Repeat([]int{1}, maxPipelines), more)
	if !slices.Equal(sizes, want) {
		t.Fatalf("pipeline sizes %v: want %v (%d calls alone, then a pipeline of the %d queued calls; the abandoned call not sent)", g.sizes, want, maxPipelines, more)
	}
	// The pipeline runs under its callers' contexts: each command's, and the first one's values.
	if len(g.callerOf) != more || len(g.first) != 1 || g.first[0] != g.callerOf[0] {
		t.Fatalf("caller contexts %v, pipeline context value %v: want %d, the pipeline's the first one's", g.callerOf, g.first, more)
	}
	for i := range g.callerOf {
		if g.callerOf[i] != g.arg[i] {
			t.Fatalf("command %d echoes %v but its caller context is %v's", i, g.arg[i], g.callerOf[i])
		}
	}
}
