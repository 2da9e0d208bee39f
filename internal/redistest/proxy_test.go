package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// client is a persistent RESP connection for proxy tests.
type client struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{t: t, conn: c, r: bufio.NewReader(c)}
}

func (c *client) send(args ...string) {
	c.t.Helper()
	if _, err := c.conn.Write(appendCommand(nil, args)); err != nil {
		c.t.Fatalf("write %v: %v", args, err)
	}
}

// recv reads one reply, waiting at most d.
func (c *client) recv(d time.Duration) (string, error) {
	if err := c.conn.SetReadDeadline(time.Now().Add(d)); err != nil {
		return "", err
	}
	rep, err := readReply(c.r, 0)
	if err != nil {
		return "", err
	}
	if rep.err != nil {
		return "", rep.err
	}
	return rep.String(), nil
}

func (c *client) roundTrip(args ...string) string {
	c.t.Helper()
	c.send(args...)
	v, err := c.recv(5 * time.Second)
	if err != nil {
		c.t.Fatalf("%v: %v", args, err)
	}
	return v
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestProxyForwards(t *testing.T) {
	t.Parallel()
	s := Start(t)
	p := NewProxy(t, s.Addr)
	if p.Target != s.Addr || p.URL() != "redis://"+p.Addr+"/0" {
		t.Errorf("Target = %q, URL = %q", p.Target, p.URL())
	}
	c := dial(t, p.Addr)
	if got := c.roundTrip("SET", "k", "via-proxy"); got != "OK" {
		t.Errorf("SET = %q", got)
	}
	if got := mustDo(t, s, "GET", "k"); got != "via-proxy" {
		t.Errorf("GET direct = %q", got)
	}
	if got, err := Do(ctxTimeout(t, 5*time.Second), p.Addr, "GET", "k"); err != nil || got != "via-proxy" {
		t.Errorf("Do via proxy = %q, %v", got, err)
	}
	// A value larger than one chunk arrives intact.
	big := strings.Repeat("0123456789abcdef", 64<<10)
	c.roundTrip("SET", "big", big)
	if got := c.roundTrip("GET", "big"); got != big {
		t.Errorf("GET big: got %d bytes, want %d", len(got), len(big))
	}
	if n := p.NumConns(); n != 1 {
		t.Errorf("NumConns = %d, want 1", n)
	}
}

func TestProxyBlockUnblock(t *testing.T) {
	t.Parallel()
	s := Start(t)
	p := NewProxy(t, s.Addr)
	before := dial(t, p.Addr)
	if got := before.roundTrip("PING"); got != "PONG" {
		t.Fatalf("PING = %q", got)
	}

	p.Block()
	p.Block() // idempotent
	before.send("INCR", "n")
	if _, err := before.recv(200 * time.Millisecond); !isTimeout(err) {
		t.Fatalf("existing conn while blocked: err = %v, want timeout", err)
	}
	after := dial(t, p.Addr) // accepted, but held
	after.send("INCR", "n")
	if _, err := after.recv(200 * time.Millisecond); !isTimeout(err) {
		t.Fatalf("new conn while blocked: err = %v, want timeout", err)
	}
	if _, err := Do(ctxTimeout(t, 200*time.Millisecond), p.Addr, "PING"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Do while blocked: err = %v, want deadline exceeded", err)
	}
	// Neither request reached the server.
	if got := mustDo(t, s, "GET", "n"); got != "" {
		t.Fatalf("n = %q while blocked, want unset", got)
	}

	p.Unblock()
	p.Unblock() // idempotent
	// The held requests are delivered and their replies come back.
	got1, err1 := before.recv(5 * time.Second)
	got2, err2 := after.recv(5 * time.Second)
	if err1 != nil || err2 != nil {
		t.Fatalf("after Unblock: %v, %v", err1, err2)
	}
	if got1+got2 != "12" && got1+got2 != "21" {
		t.Errorf("INCR replies %q, %q; want 1 and 2", got1, got2)
	}
	if got := before.roundTrip("PING"); got != "PONG" {
		t.Errorf("PING after Unblock = %q", got)
	}
}

func TestProxyCutAll(t *testing.T) {
	t.Parallel()
	s := Start(t)
	p := NewProxy(t, s.Addr)
	c := dial(t, p.Addr)
	if got := c.roundTrip("PING"); got != "PONG" {
		t.Fatalf("PING = %q", got)
	}
	p.CutAll()
	_, err := c.recv(5 * time.Second)
	if err == nil || isTimeout(err) {
		t.Fatalf("read after CutAll: err = %v, want connection closed", err)
	}
	ctx := ctxTimeout(t, 5*time.Second)
	err = Poll(ctx, "no proxied connections after CutAll", func(context.Context) error {
		if n := p.NumConns(); n != 0 {
			return fmt.Errorf("NumConns = %d", n)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	// The server side was closed too (Redis notices asynchronously).
	err = Poll(ctx, "the server to drop the proxied clients", func(context.Context) error {
		got := mustDo(t, s, "CLIENT", "LIST")
		if len(strings.Split(strings.TrimSpace(got), "\n")) != 1 { // only CLIENT LIST's own conn
			return fmt.Errorf("clients:\n%s", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// New connections still work.
	if got := dial(t, p.Addr).roundTrip("PING"); got != "PONG" {
		t.Errorf("PING on new conn = %q", got)
	}
}

func TestProxySetDelay(t *testing.T) {
	t.Parallel()
	s := Start(t)
	p := NewProxy(t, s.Addr)
	c := dial(t, p.Addr)
	c.roundTrip("PING")

	p.SetDelay(50 * time.Millisecond)
	start := time.Now()
	if got := c.roundTrip("PING"); got != "PONG" {
		t.Fatalf("PING = %q", got)
	}
	if el := time.Since(start); el < 50*time.Millisecond {
		t.Errorf("round trip with 50ms delay took %v", el)
	}

	// Many small writes in flight: byte order is preserved.
	p.SetDelay(2 * time.Millisecond)
	const n = 300
	go func() {
		for i := range n {
			if _, err := c.conn.Write(appendCommand(nil, []string{"ECHO", strconv.Itoa(i)})); err != nil {
				return
			}
		}
	}()
	for i := range n {
		got, err := c.recv(10 * time.Second)
		if err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		if got != strconv.Itoa(i) {
			t.Fatalf("reply %d = %q: order not preserved", i, got)
		}
	}

	p.SetDelay(0)
	start = time.Now()
	c.roundTrip("PING")
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("round trip without delay took %v", el)
	}
}

func TestProxyClose(t *testing.T) {
	t.Parallel()
	s := Start(t)
	p, err := StartProxy(s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr)
	c.roundTrip("PING")
	// Close must not hang on held bytes or pending delays.
	p.Block()
	p.SetDelay(time.Hour)
	c.send("PING")
	blocked := dial(t, p.Addr)
	blocked.send("PING")
	time.Sleep(20 * time.Millisecond)

	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung")
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.recv(5 * time.Second); err == nil || isTimeout(err) {
		t.Errorf("read after Close: err = %v, want connection closed", err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr, time.Second); err == nil {
		t.Error("proxy still accepts after Close")
	}
}

func TestProxyTargetDown(t *testing.T) {
	t.Parallel()
	s := Start(t)
	p := NewProxy(t, s.Addr)
	c := dial(t, p.Addr)
	c.roundTrip("PING")
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.recv(5 * time.Second); err == nil || isTimeout(err) {
		t.Errorf("read after target died: err = %v, want connection closed", err)
	}
	if _, err := Do(ctxTimeout(t, 5*time.Second), p.Addr, "PING"); err == nil {
		t.Error("PING via proxy to a dead target succeeded")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if got, err := Do(ctxTimeout(t, 5*time.Second), p.Addr, "PING"); err != nil || got != "PONG" {
		t.Errorf("PING via proxy after Restart = %q, %v", got, err)
	}
}
