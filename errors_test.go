package dlock_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/goredisconn"
)

// errShutdown is a cause a caller gives its context when it cancels it.
var errShutdown = errors.New("shutting down")

// checkWaitEnded checks the error of a wait that ended without the lock: a *NotAcquiredError
// (ErrNotAcquired) on one line, naming the lock; with the context's error and the cause given
// to it when ctxEnded, and no context error at all when WithWait ended it.
func checkWaitEnded(t *testing.T, what string, err error, name string, ctxEnded bool) {
	t.Helper()
	var na *dlock.NotAcquiredError
	switch {
	case !errors.As(err, &na) || !errors.Is(err, dlock.ErrNotAcquired):
		t.Errorf("%s = %v, want a *NotAcquiredError", what, err)
	case !strings.Contains(err.Error(), name) || strings.Contains(err.Error(), "\n"):
		t.Errorf("%s = %q, want one line naming %q", what, err, name)
	case ctxEnded && (!errors.Is(err, context.Canceled) || !errors.Is(err, errShutdown)):
		t.Errorf("%s = %v, want it to match context.Canceled and the context's cause too", what, err)
	case !ctxEnded && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
		t.Errorf("%s = %v: WithWait ended it, not a context", what, err)
	}
}

// WithWait bounds the wait of every primitive that waits (Mutex, RWMutex, Semaphore,
// MultiMutex) and of their Do forms, whose fn then does not run; a wait that the caller's
// context ends matches ErrNotAcquired, context.Canceled and the cause the context was given.
func TestWithWait_EveryPrimitive(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		holder, c := tr.dial(t, shared.URL()), tr.dial(t, shared.URL())
		mu, rw, sem := uniqueName(t), uniqueName(t), uniqueName(t)
		names := multiNames(t, 2)
		var held []*dlock.Lease
		take := func(l *dlock.Lease, err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, l)
		}
		take(holder.Mutex(mu).Lock(ctx))
		take(holder.RWMutex(rw).Lock(ctx))
		take(holder.Semaphore(sem, 1).Acquire(ctx, 1))
		take(holder.Mutex(names[1]).Lock(ctx))

		const d = 150 * time.Millisecond
		wait := dlock.WithWait(d)
		ran := func(context.Context) error { return errors.New("fn ran without the lock") }
		calls := []struct {
			what, name string
			call       func(ctx context.Context, opts ...dlock.Option) error
		}{
			{"Mutex.Lock", mu, func(ctx context.Context, o ...dlock.Option) error { _, err := c.Mutex(mu, o...).Lock(ctx); return err }},
			{"Do", mu, func(ctx context.Context, o ...dlock.Option) error { return c.Do(ctx, mu, ran, o...) }},
			{"RWMutex.RLock", rw, func(ctx context.Context, o ...dlock.Option) error {
				_, err := c.RWMutex(rw, o...).RLock(ctx)
				return err
			}},
			{"RWMutex.Lock", rw, func(ctx context.Context, o ...dlock.Option) error {
				_, err := c.RWMutex(rw, o...).Lock(ctx)
				return err
			}},
			{"DoRead", rw, func(ctx context.Context, o ...dlock.Option) error { return c.DoRead(ctx, rw, ran, o...) }},
			{"DoWrite", rw, func(ctx context.Context, o ...dlock.Option) error { return c.DoWrite(ctx, rw, ran, o...) }},
			{"Semaphore.Acquire", sem, func(ctx context.Context, o ...dlock.Option) error {
				_, err := c.Semaphore(sem, 1, o...).Acquire(ctx, 1)
				return err
			}},
			{"DoAcquire", sem, func(ctx context.Context, o ...dlock.Option) error { return c.DoAcquire(ctx, sem, 1, 1, ran, o...) }},
			{"MultiMutex.Lock", names[1], func(ctx context.Context, o ...dlock.Option) error {
				_, err := c.MultiMutex(names, o...).Lock(ctx)
				return err
			}},
			{"DoMulti", names[1], func(ctx context.Context, o ...dlock.Option) error { return c.DoMulti(ctx, names, ran, o...) }},
		}
		for _, cl := range calls {
			start := time.Now()
			err := cl.call(ctx, wait)
			if took := time.Since(start); took < d || took > 10*time.Second {
				t.Errorf("%s with WithWait(%v) returned after %v", cl.what, d, took)
			}
			checkWaitEnded(t, cl.what+" with WithWait", err, cl.name, false)

			cctx, cancel := context.WithCancelCause(ctx)
			timer := time.AfterFunc(d, func() { cancel(errShutdown) })
			err = cl.call(cctx)
			timer.Stop()
			cancel(nil)
			checkWaitEnded(t, cl.what+" ended by its context", err, cl.name, true)
		}
		// The MultiMutex took nothing: its free name is still free.
		if l, err := holder.Mutex(names[0]).TryLock(ctx); err != nil {
			t.Errorf("a multi-lock whose wait ended kept %s: %v", names[0], err)
		} else {
			l.Unlock(ctx)
		}
		for _, l := range held {
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// A goroutine that locks a name its own client holds, without the lease in its context, is
// told so when its wait ends: the holder is this client, and how to re-enter.
func TestWithWait_HolderIsThisClient(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL())
		name := uniqueName(t)
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(ctx)
		_, err = c.Mutex(name, dlock.WithWait(100*time.Millisecond)).Lock(ctx)
		var na *dlock.NotAcquiredError
		if !errors.As(err, &na) || !na.Mine || na.Holder.Token != l.Token() || !strings.Contains(err.Error(), "this client") || !strings.Contains(err.Error(), "Context") {
			t.Fatalf("a wait for a lock this client holds = %v, want it to say the holder is this client and how to re-enter", err)
		}
		inner, err := c.Mutex(name, dlock.WithWait(0)).Lock(l.Context())
		if err != nil || inner.Token() != l.Token() {
			t.Fatalf("re-entry through the lease's context: %v", err)
		}
		inner.Unlock(ctx)
	})
}

// A Do whose lock is lost while fn runs says so on one line, naming the lock, with fn's own
// error; a Do under a fixed lease (WithoutRenewal) that runs out reports the planned end
// (ErrExpired, with ErrLost), not a loss "before Unlock".
func TestDo_LostWhileFnRan(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL(), dlock.WithTTL(300*time.Millisecond))
		admin := tr.dial(t, shared.URL())
		name := uniqueName(t)
		fnErr := errors.New("the work stopped")
		waitLoss := func(fctx context.Context) error {
			select {
			case <-fctx.Done():
				return fmt.Errorf("%w: %w", fnErr, context.Cause(fctx))
			case <-time.After(10 * time.Second):
				return errors.New("fn's context not cancelled")
			}
		}
		err := c.Do(ctx, name, func(fctx context.Context) error {
			if _, err := admin.ForceUnlock(ctx, name); err != nil {
				return err
			}
			return waitLoss(fctx)
		})
		msg := fmt.Sprint(err)
		if !errors.Is(err, dlock.ErrLost) || !errors.Is(err, fnErr) || errors.Is(err, dlock.ErrExpired) {
			t.Fatalf("Do whose lock was force-unlocked = %v, want ErrLost and fn's error", err)
		}
		if !strings.Contains(msg, "lost while fn ran") || !strings.Contains(msg, name) || strings.Contains(msg, "before Unlock") || strings.Contains(msg, "\n") {
			t.Fatalf("Do whose lock was lost = %q, want one line saying %q was lost while fn ran", msg, name)
		}

		err = c.Do(ctx, name, waitLoss, dlock.WithTTL(100*time.Millisecond), dlock.WithoutRenewal())
		msg = fmt.Sprint(err)
		if !errors.Is(err, dlock.ErrExpired) || !errors.Is(err, dlock.ErrLost) || !strings.Contains(msg, name) || !strings.Contains(msg, "ran out while fn ran") || strings.Contains(msg, "lost while") || strings.Contains(msg, "before Unlock") || strings.Contains(msg, "\n") {
			t.Fatalf("Do whose fixed lease ran out = %q, want ErrExpired (and ErrLost) on one line naming %q", msg, name)
		}
	})
}

// New checks the connection it is given: a wrong address fails there with ErrUnavailable, a
// wrong password with ErrDenied, TLS options (it dials nothing) with ErrInvalid, and WithReplicaAck on a server without replicas with
// ErrReplicaAck saying so (go-redis; Dial's cases are in TestDial_RefusesWhatCannotWork).
func TestNew_ChecksTheConnection(t *testing.T) {
	needShared(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	newGoRedis := func(o *redis.Options, opts ...dlock.ClientOption) error {
		o.ContextTimeoutEnabled = true
		rc := redis.NewClient(o)
		defer rc.Close()
		c, err := dlock.New(goredisconn.New(rc), opts...)
		if err == nil {
			c.Close()
		}
		return err
	}
	start := time.Now()
	if err := newGoRedis(&redis.Options{Addr: closed}); !errors.Is(err, dlock.ErrUnavailable) || !strings.Contains(err.Error(), closed) {
		t.Errorf("New on a closed port = %v, want ErrUnavailable naming %s", err, closed)
	}
	if took := time.Since(start); took > 9*time.Second {
		t.Errorf("New on a closed port took %v", took)
	}
	if err := newGoRedis(&redis.Options{Addr: shared.Addr}, dlock.WithTLSConfig(&tls.Config{})); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("New with WithTLSConfig = %v, want ErrInvalid (New dials nothing)", err)
	}
	o, err := redis.ParseURL(shared.URLAs(testUser, "wrong"))
	if err != nil {
		t.Fatal(err)
	}
	if err := newGoRedis(o); !errors.Is(err, dlock.ErrDenied) || strings.Contains(err.Error(), "wrong") {
		t.Errorf("New with a wrong password = %v, want ErrDenied (and no password shown)", err)
	}
	o, err = redis.ParseURL(shared.URL())
	if err != nil {
		t.Fatal(err)
	}
	if err := newGoRedis(o, dlock.WithReplicaAck(1, 50*time.Millisecond)); !errors.Is(err, dlock.ErrReplicaAck) || !strings.Contains(err.Error(), "0 replica") {
		t.Errorf("New with WithReplicaAck on a server without replicas = %v, want ErrReplicaAck saying it has none", err)
	}
}

// WithReplicaAck given to one lock, on a server without replicas: the acquisition fails with
// ErrReplicaAck saying the server has none, and leaves the lock free.
func TestReplicaAck_LockOnServerWithoutReplicas(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL())
		name := uniqueName(t)
		_, err := c.Mutex(name, dlock.WithReplicaAck(1, 50*time.Millisecond)).TryLock(ctx)
		if !errors.Is(err, dlock.ErrReplicaAck) || !strings.Contains(err.Error(), "0 replica") || !strings.Contains(err.Error(), name) {
			t.Fatalf("TryLock with WithReplicaAck on a server without replicas = %v, want ErrReplicaAck naming the lock and saying the server has none", err)
		}
		if info, err := c.Inspect(ctx, name); err != nil || info.Held {
			t.Fatalf("after the refused acquisition: %+v, %v; want the lock free", info, err)
		}
	})
}

// In quorum mode, a Lock (or a MultiMutex's) whose wait ends while too few servers answer
// returns their *QuorumError (ErrNoQuorum), with the context's error when the context ended
// it, and never ErrNotAcquired: nobody was found holding the lock.
func TestQuorum_WaitEndedWithoutQuorum(t *testing.T) {
	srv := startN(t, 5)
	clients := make([]*dlock.Client, len(quorumTransports))
	for i, tr := range quorumTransports {
		clients[i] = tr.dial(t, serverAddrs(srv), dlock.WithTTL(300*time.Millisecond))
	}
	for _, s := range srv[:3] {
		s.Kill()
	}
	for i, tr := range quorumTransports {
		t.Run(tr.name, func(t *testing.T) {
			c := clients[i]
			ctx := ctxT(t)
			lock := func(ctx context.Context, o ...dlock.Option) error {
				_, err := c.Mutex(uniqueName(t), o...).Lock(ctx)
				return err
			}
			multi := func(ctx context.Context, o ...dlock.Option) error {
				_, err := c.MultiMutex([]string{uniqueName(t), uniqueName(t)}, o...).Lock(ctx)
				return err
			}
			for what, call := range map[string]func(context.Context, ...dlock.Option) error{"Lock": lock, "MultiMutex.Lock": multi} {
				start := time.Now()
				err := call(ctx, dlock.WithWait(300*time.Millisecond))
				var qe *dlock.QuorumError
				if !errors.As(err, &qe) || !errors.Is(err, dlock.ErrNoQuorum) || errors.Is(err, dlock.ErrNotAcquired) || errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%s with WithWait and 3 of 5 servers down = %v, want a *QuorumError that is neither ErrNotAcquired nor a context error", what, err)
				}
				if took := time.Since(start); took < 300*time.Millisecond {
					t.Errorf("%s returned after %v, before its WithWait(300ms)", what, took)
				}
				cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				err = call(cctx)
				cancel()
				if !errors.Is(err, dlock.ErrNoQuorum) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, dlock.ErrNotAcquired) || strings.Contains(err.Error(), "\n") {
					t.Errorf("%s ended by its context with 3 of 5 servers down = %v, want ErrNoQuorum and DeadlineExceeded, not ErrNotAcquired, on one line", what, err)
				}
			}
		})
	}
}

// An Unlock after an administrator's ForceUnlock says what the lease context says, one
// sentence naming the lock, without a trailing "(dlock: not held)"; it still matches ErrLost
// and ErrNotHeld.
func TestUnlock_AfterForceUnlock_OneSentence(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL(), dlock.WithTTL(300*time.Millisecond))
		admin := tr.dial(t, shared.URL())
		check := func(what string, err error, name string) {
			t.Helper()
			msg := fmt.Sprint(err)
			if !errors.Is(err, dlock.ErrLost) || !errors.Is(err, dlock.ErrNotHeld) {
				t.Errorf("%s = %v, want ErrLost and ErrNotHeld", what, err)
			}
			if !strings.HasPrefix(msg, fmt.Sprintf("dlock: lock lost: %q: ", name)) || strings.Contains(msg, "not held") || strings.Contains(msg, "\n") {
				t.Errorf("%s = %q, want one sentence naming %q, without \"not held\"", what, msg, name)
			}
		}

		// The renewal finds the lock force-unlocked first: Unlock returns the lease's cause.
		name := uniqueName(t)
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := admin.ForceUnlock(ctx, name); err != nil {
			t.Fatal(err)
		}
		select {
		case <-l.Context().Done():
		case <-time.After(10 * time.Second):
			t.Fatal("lease context not cancelled after ForceUnlock")
		}
		err = l.Unlock(ctx)
		check("Unlock after the loss was found", err, name)
		want := fmt.Sprintf("dlock: lock lost: %q: a renewal found it released by someone else (force-unlocked)", name)
		if err.Error() != want || context.Cause(l.Context()).Error() != want {
			t.Errorf("Unlock = %q, lease cause %q; want both %q", err, context.Cause(l.Context()), want)
		}

		// Unlock finds it itself (or the renewal does, just before): the same kind of sentence.
		name = uniqueName(t)
		l, err = c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := admin.ForceUnlock(ctx, name); err != nil {
			t.Fatal(err)
		}
		check("Unlock right after ForceUnlock", l.Unlock(ctx), name)
	})
}

// A Do whose fn returns context.Cause(ctx) after the lock was lost (as the README shows), or
// an error wrapping it, gets that cause said once, not twice; DoMulti likewise.
func TestDo_FnReturnsTheCause_SaidOnce(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL(), dlock.WithTTL(300*time.Millisecond))
		admin := tr.dial(t, shared.URL())
		// fn force-unlocks its own lock, waits for its context to end and returns wrap(cause).
		fn := func(name string, wrap func(error) error) func(context.Context) error {
			return func(fctx context.Context) error {
				if _, err := admin.ForceUnlock(ctx, name); err != nil {
					return err
				}
				select {
				case <-fctx.Done():
					return wrap(context.Cause(fctx))
				case <-time.After(10 * time.Second):
					return errors.New("fn's context not cancelled")
				}
			}
		}
		cause := func(name string) string {
			return fmt.Sprintf("dlock: lock lost: %q: a renewal found it released by someone else (force-unlocked)", name)
		}
		same := func(err error) error { return err }
		errCharge := errors.New("charge refused")
		wrapped := func(err error) error { return fmt.Errorf("%w: %w", errCharge, err) }

		name := uniqueName(t)
		err := c.Do(ctx, name, fn(name, same))
		if want := fmt.Sprintf("dlock: %q was lost while fn ran: %s", name, cause(name)); fmt.Sprint(err) != want || !errors.Is(err, dlock.ErrLost) {
			t.Errorf("Do whose fn returned the cause = %q, want %q (ErrLost)", err, want)
		}
		name = uniqueName(t)
		err = c.Do(ctx, name, fn(name, wrapped))
		if want := fmt.Sprintf("dlock: %q was lost while fn ran: charge refused: %s", name, cause(name)); fmt.Sprint(err) != want || !errors.Is(err, dlock.ErrLost) || !errors.Is(err, errCharge) {
			t.Errorf("Do whose fn wrapped the cause = %q, want %q (ErrLost and fn's error)", err, want)
		}
		names := multiNames(t, 2)
		err = c.DoMulti(ctx, names, fn(names[0], same))
		if want := fmt.Sprintf("dlock: %q was lost while fn ran: %s", names[0], cause(names[0])); fmt.Sprint(err) != want || !errors.Is(err, dlock.ErrLost) {
			t.Errorf("DoMulti whose fn returned the cause = %q, want %q (ErrLost)", err, want)
		}
		// The read-write lock's and the semaphore's Do forms: the loss said once too.
		for _, tc := range []struct {
			what string
			do   func(name string, fn func(context.Context) error) error
		}{
			{"DoRead", func(name string, fn func(context.Context) error) error { return c.DoRead(ctx, name, fn) }},
			{"DoWrite", func(name string, fn func(context.Context) error) error { return c.DoWrite(ctx, name, fn) }},
			{"DoAcquire", func(name string, fn func(context.Context) error) error { return c.DoAcquire(ctx, name, 2, 1, fn) }},
		} {
			name := uniqueName(t)
			err := tc.do(name, fn(name, same))
			if msg := fmt.Sprint(err); !errors.Is(err, dlock.ErrLost) || strings.Count(msg, "lock lost") != 1 || strings.Count(msg, "was lost while fn ran") != 1 {
				t.Errorf("%s whose fn returned the cause = %q, want ErrLost, its loss said once", tc.what, err)
			}
		}
	})
}
