package rueidisconn

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/redistest"
)

var echo = conn.NewScript("echo", "return {tonumber(ARGV[1])}")

// A lone call (nothing else on its way) goes on its own connection, on the caller's goroutine,
// with the context's deadline: a deadline that passes while the server does not answer ends
// the call, and the caller then finds its context ended too (not a server error); a
// cancellable context without a deadline takes the pipelined way and ends the moment it is
// cancelled. Either way the next call works once the server answers again.
func TestLoneCall_DeadlineAndCancel(t *testing.T) {
	s := redistest.Start(t)
	c := dial(t, s.URL())
	a := c.(*adapter)
	if a.lone == nil {
		t.Fatal("Dial made no lone client")
	}
	if v, err := c.Eval(context.Background(), echo, nil, []string{"7"}); err != nil || len(v) != 1 || v[0] != 7 {
		t.Fatalf("Eval = %v, %v; want [7]", v, err)
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, err := c.Eval(ctx, echo, nil, []string{"1"})
	ended := ctx.Err()
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || ended == nil {
		t.Errorf("Eval past its deadline: error %v, context %v; want DeadlineExceeded with the context ended", err, ended)
	}
	cctx, ccancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, ccancel)
	start := time.Now()
	if _, err := c.Eval(cctx, echo, nil, []string{"2"}); !errors.Is(err, context.Canceled) {
		t.Errorf("Eval cancelled while the server is frozen = %v, want context.Canceled", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("a cancelled Eval returned after %v", took)
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	if v, err := c.Eval(rctx, echo, nil, []string{"3"}); err != nil || len(v) != 1 || v[0] != 3 {
		t.Fatalf("Eval after the server resumed = %v, %v; want [3]", v, err)
	}
}
