package dlock_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// WithWait bounds the wait, not the work: a Lock that waits longer than d returns an error
// that matches ErrNotAcquired (not a context error) and names the holder; WithWait(0) makes
// one attempt; Do runs fn past d once it has the lock.
func TestWithWait(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		holder := tr.dial(t, shared.URL(), dlock.WithLabel("the-holder"))
		other := tr.dial(t, shared.URL())
		l, err := holder.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = other.Mutex(name, dlock.WithWait(200*time.Millisecond)).Lock(ctx)
		took := time.Since(start)
		var na *dlock.NotAcquiredError
		if !errors.As(err, &na) || !errors.Is(err, dlock.ErrNotAcquired) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock with WithWait(200ms) on a held lock = %v, want a *NotAcquiredError that is not a context error", err)
		}
		if took < 200*time.Millisecond || took > 5*time.Second {
			t.Fatalf("waited %v, want about 200 ms", took)
		}
		host, _ := os.Hostname()
		if na.Mine || na.Holder.Holder.Label != "the-holder" || na.Holder.Holder.PID != os.Getpid() || na.Holder.Token != l.Token() || na.Waited < 200*time.Millisecond {
			t.Fatalf("error %+v: want the holder described (label, pid, token) and the wait", na)
		}
		for _, want := range []string{name, host, "the-holder", "lease", "waited"} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q lacks %q", err, want)
			}
		}
		// WithWait(0): one attempt.
		start = time.Now()
		if _, err := other.Mutex(name, dlock.WithWait(0)).Lock(ctx); !errors.Is(err, dlock.ErrNotAcquired) || time.Since(start) > 2*time.Second {
			t.Fatalf("WithWait(0) = %v after %v, want ErrNotAcquired at once", err, time.Since(start))
		}
		// The caller's context ending the wait: both busy and the context's error.
		cctx, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
		_, err = other.Mutex(name).Lock(cctx)
		cancel()
		if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock ended by its context = %v, want ErrNotAcquired and DeadlineExceeded", err)
		}
		// The same client holding it: said so.
		_, err = holder.Mutex(name).TryLock(ctx)
		if !errors.As(err, &na) || !na.Mine || !strings.Contains(err.Error(), "this client") {
			t.Fatalf("TryLock by the holder's own client = %v, want it to say the holder is this client", err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		// Do: WithWait bounds the wait only; fn runs as long as it needs.
		err = other.Do(ctx, name, func(ctx context.Context) error {
			time.Sleep(300 * time.Millisecond)
			return ctx.Err()
		}, dlock.WithWait(100*time.Millisecond))
		if err != nil {
			t.Fatalf("Do with WithWait(100ms) and 300 ms of work: %v", err)
		}
	})
}

// Re-entry with another lease than the held one is refused; TTLs beyond the limits are
// refused; a renewed TTL within MaxTTL and a long fixed lease are accepted.
func TestOptions_Limits(t *testing.T) {
	ctx := ctxT(t)
	c := transports[0].dial(t, shared.URL())
	name := uniqueName(t)
	l, err := c.Mutex(name, dlock.WithTTL(5*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)
	for _, opt := range []dlock.Option{dlock.WithTTL(6 * time.Second), dlock.WithoutRenewal(), dlock.WithLabel("other")} {
		if _, err := c.Mutex(name, dlock.WithTTL(5*time.Second), opt).Lock(l.Context()); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("re-entry with another lease = %v, want ErrInvalid", err)
		}
	}
	for _, opts := range [][]dlock.Option{
		{dlock.WithTTL(dlock.MaxTTL + time.Second)},
		{dlock.WithTTL(dlock.MaxFixedTTL + time.Second), dlock.WithoutRenewal()},
		{dlock.WithWait(-time.Second)},
	} {
		if _, err := c.Mutex(uniqueName(t), opts...).TryLock(ctx); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("TryLock with %d bad options = %v, want ErrInvalid", len(opts), err)
		}
	}
	fixed, err := c.Mutex(uniqueName(t), dlock.WithTTL(24*time.Hour), dlock.WithoutRenewal()).TryLock(ctx)
	if err != nil {
		t.Fatalf("a fixed lease of a day: %v", err)
	}
	if err := fixed.Extend(ctx, dlock.MaxFixedTTL+time.Hour); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("Extend past MaxFixedTTL = %v, want ErrInvalid", err)
	}
	fixed.Unlock(ctx)
}

// Dial and DialQuorum refuse what cannot work, saying why: a context already done, a quorum
// of fewer than three servers or of one server twice, replica acknowledgement on a server
// without replicas; they accept the go-redis habit of a bare host:port; a wrong password is
// ErrDenied, an unreachable server ErrUnavailable, a bad URL ErrInvalid.
func TestDial_RefusesWhatCannotWork(t *testing.T) {
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

// Quorum errors list every server on one line.
func TestErrors_OneLine(t *testing.T) {
	ctx := ctxT(t)
	_, err := dlock.DialQuorum(ctx, []string{"redis://127.0.0.1:1", "redis://127.0.0.1:2", "redis://127.0.0.1:3"})
	if err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("DialQuorum error %q: want one line", err)
	}
}
