package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/goredisconn"
	"github.com/dlock-go/dlock/internal/redistest"
)

// An unreachable server fails fast, and the error names the address.
func TestUnreachableServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	start := time.Now()
	_, err = dlock.Dial(ctxT(t), "redis://"+addr+"/0")
	if err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Dial to a closed port: got %v, want an error naming %s", err, addr)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Dial took %v to fail", d)
	}

	// A server that goes away after Dial: calls fail with the address, they do not hang.
	eachTransport(t, func(t *testing.T, tr transport) {
		s := redistest.Start(t)
		c := tr.dial(t, s.URL())
		s.Kill()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := c.Mutex("n").Lock(ctx)
		if err == nil || !strings.Contains(err.Error(), s.Addr) {
			t.Fatalf("Lock on a dead server: got %v, want an error naming %s", err, s.Addr)
		}
		if ctx.Err() != nil {
			t.Fatal("Lock on a dead server waited for the context instead of failing")
		}
	})
}

// Close releases what the client holds, ends waiting calls, and refuses new ones.
func TestClose(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL())
		other := tr.dial(t, shared.URL())
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		lo, err := other.Mutex(name + "-other").Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		waitErr := make(chan error, 1)
		go func() {
			_, err := c.Mutex(name + "-other").Lock(ctx)
			waitErr <- err
		}()
		waitSubscribed(t, name+"-other")
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-waitErr; !errors.Is(err, dlock.ErrClosed) {
			t.Fatalf("waiting Lock after Close: got %v, want ErrClosed", err)
		}
		if !errors.Is(context.Cause(l.Context()), dlock.ErrClosed) {
			t.Fatalf("lease cause after Close = %v, want ErrClosed", context.Cause(l.Context()))
		}
		if v := lockValue(t, name); v[0] != "-" {
			t.Fatalf("Close did not release the lock: value %q", v)
		}
		if _, err := c.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrClosed) {
			t.Fatalf("TryLock after Close: got %v, want ErrClosed", err)
		}
		if err := c.Do(ctx, name, func(context.Context) error { return nil }); !errors.Is(err, dlock.ErrClosed) {
			t.Fatalf("Do after Close: got %v, want ErrClosed", err)
		}
		if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrClosed) {
			t.Fatalf("Unlock after Close: got %v, want ErrClosed", err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		lo.Unlock(ctx)
	})
}

// Dial and DialQuorum refuse what cannot work, saying why: a context already done, a quorum
// of fewer than three servers or of one server twice, replica acknowledgement on a server
// without replicas; they accept the go-redis habit of a bare host:port; a wrong password is
// ErrDenied, an unreachable server ErrUnavailable, a bad URL ErrInvalid.
func TestDial_RefusesWhatCannotWork(t *testing.T) {
	needShared(t)
	ctx := ctxT(t)
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := dlock.Dial(done, shared.URL()); !errors.Is(err, context.Canceled) {
		t.Fatalf("Dial with a cancelled context = %v", err)
	}
	if _, err := dlock.DialQuorum(ctx, []string{shared.URL(), shared.URL() + "?x"}); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("DialQuorum of 2 = %v, want ErrInvalid", err)
	}
	if _, err := dlock.DialQuorum(ctx, []string{shared.URL(), shared.URL(), "redis://127.0.0.1:2"}); !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("DialQuorum with a server twice = %v, want ErrInvalid naming it", err)
	}
	c, err := dlock.Dial(ctx, shared.Addr)
	if err != nil {
		t.Fatalf("Dial(%q): %v", shared.Addr, err)
	}
	c.Close()
	_, err = dlock.Dial(ctx, shared.URL(), dlock.WithReplicaAck(1, 50*time.Millisecond))
	if !errors.Is(err, dlock.ErrReplicaAck) || !strings.Contains(err.Error(), "0 replica") {
		t.Fatalf("Dial with WithReplicaAck on a server without replicas = %v, want ErrReplicaAck saying it has none", err)
	}
	if _, err := dlock.Dial(ctx, shared.URLAs(testUser, "wrong")); !errors.Is(err, dlock.ErrDenied) {
		t.Fatalf("wrong password = %v, want ErrDenied", err)
	}
	if _, err := dlock.Dial(ctx, "redis://127.0.0.1:1/0"); !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("unreachable = %v, want ErrUnavailable", err)
	}
	if _, err := dlock.Dial(ctx, "redis://127.0.0.1:notaport/0"); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("bad URL = %v, want ErrInvalid", err)
	}
}

// An empty URL (or one of spaces alone) is ErrInvalid saying a URL is required, and names the
// usual cause; rueidis alone would read it as localhost:6379. DialQuorum says which of its
// URLs is empty.
func TestDial_EmptyURL(t *testing.T) {
	ctx := ctxT(t)
	for _, url := range []string{"", "   ", "\t\n"} {
		_, err := dlock.Dial(ctx, url)
		if !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "the Redis URL is empty") ||
			!strings.Contains(err.Error(), "environment variable") || strings.Contains(err.Error(), "\n") {
			t.Errorf("Dial(%q) = %v, want ErrInvalid on one line saying the URL is empty", url, err)
		}
	}
	_, err := dlock.DialQuorum(ctx, []string{"redis://127.0.0.1:1", "", "redis://127.0.0.1:2"})
	if !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "server 2 of 3") || !strings.Contains(err.Error(), "the Redis URL is empty") {
		t.Errorf("DialQuorum with an empty URL = %v, want ErrInvalid naming server 2 of 3", err)
	}
}

// A port where something other than a Redis server answers (an HTTP server here) fails Dial,
// New and DialQuorum with ErrUnavailable saying that the address is not a Redis server, not
// with the transport's "unknown message type".
func TestDial_NotARedisServer(t *testing.T) {
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))
	defer web.Close()
	addr := strings.TrimPrefix(web.URL, "http://")
	want := addr + " is not a Redis server"
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, dlock.ErrUnavailable) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") ||
			(what != "DialQuorum" && (strings.Contains(err.Error(), "cannot reach") || strings.Contains(err.Error(), "memory policy"))) {
			t.Errorf("%s on an HTTP server = %v, want ErrUnavailable on one line saying %q", what, err, want)
		}
	}
	ctx := ctxT(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		switch tr.name {
		case "rueidis":
			_, err := dlock.Dial(ctx, "redis://"+addr+"/0")
			check("Dial", err)
		case "goredis":
			for _, opts := range [][]dlock.ClientOption{nil, {dlock.WithUnsafeEviction(), dlock.WithLogger(slog.New(slog.DiscardHandler))}} {
				rc := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
				c, err := dlock.New(goredisconn.New(rc), opts...)
				if err == nil {
					c.Close()
				}
				rc.Close()
				check(fmt.Sprintf("New with %d options", len(opts)), err)
			}
		}
	})
	needShared(t)
	_, err := dlock.DialQuorum(ctx, []string{"redis://" + addr, shared.URL(), "redis://127.0.0.1:1"})
	check("DialQuorum", err)
}

// What Close does to a Do under way and to one waiting for the lock: the first's fn sees its
// context cancelled with cause ErrClosed and Do returns ErrClosed (said once, though fn
// returned it too); the lock is released on the server (not left to its lease); the waiting Do
// returns ErrClosed without running fn. So a service must drain its requests before it closes
// the client.
func TestClose_DoUnderWayAndWaiting(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL(), dlock.WithTTL(time.Minute))
		running := make(chan struct{})
		fnCause := make(chan error, 1)
		underWay := make(chan error, 1)
		go func() {
			underWay <- c.Do(ctx, name, func(fctx context.Context) error {
				close(running)
				<-fctx.Done()
				fnCause <- context.Cause(fctx)
				return context.Cause(fctx)
			})
		}()
		<-running
		waiting := make(chan error, 1)
		ranWaiting := make(chan struct{}, 1)
		go func() {
			waiting <- c.Do(ctx, name, func(context.Context) error { ranWaiting <- struct{}{}; return nil })
		}()
		waitFor(t, 10*time.Second, "the second Do waiting", func(ctx context.Context) error {
			info, err := c.Inspect(ctx, name)
			if err == nil && info.LocalWaiters != 1 {
				err = fmt.Errorf("%d local waiters", info.LocalWaiters)
			}
			return err
		})
		if err := c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if cause := <-fnCause; cause != dlock.ErrClosed {
			t.Errorf("fn's context cause after Close = %v, want ErrClosed", cause)
		}
		if err := <-underWay; !errors.Is(err, dlock.ErrClosed) || errors.Is(err, dlock.ErrLost) || err.Error() != "dlock: client closed" {
			t.Errorf("Do under way at Close = %v, want ErrClosed, said once (not ErrLost)", err)
		}
		if err := <-waiting; !errors.Is(err, dlock.ErrClosed) {
			t.Errorf("Do waiting at Close = %v, want ErrClosed", err)
		}
		select {
		case <-ranWaiting:
			t.Error("the waiting Do ran its fn after Close")
		default:
		}
		if v := lockValue(t, name); v[0] != "-" {
			t.Errorf("lock after Close = %q, want it released (not left to its one-minute lease)", v)
		}
	})
}
