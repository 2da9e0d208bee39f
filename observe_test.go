package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/goredisconn"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/rueidisconn"
)

// reqKey marks the contexts of the tests' calls, to check that events carry them.
type reqKey struct{}

// recorder is an Observer that keeps every event.
type recorder struct {
	mu       sync.Mutex
	acquired []dlock.AcquireEvent
	acqCtx   []any // reqKey value of each AcquireDone's context
	waiting  []dlock.WaitingEvent
	released []dlock.ReleaseEvent
	relCtx   []any
	lost     []dlock.LostEvent
	lostCtx  []any
	renewals []dlock.RenewalEvent
	subs     []dlock.SubscriptionEvent
	nodeErrs []dlock.NodeErrorEvent
	order    []string // "wait+ NAME", "wait- NAME", "acquire NAME", "release NAME", "lost NAME"
}

func (r *recorder) observer() dlock.Observer {
	return dlock.Observer{
		AcquireDone: func(ctx context.Context, ev dlock.AcquireEvent) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.acquired = append(r.acquired, ev)
			r.acqCtx = append(r.acqCtx, ctx.Value(reqKey{}))
			r.order = append(r.order, "acquire "+ev.Name)
		},
		Waiting: func(ctx context.Context, ev dlock.WaitingEvent) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.waiting = append(r.waiting, ev)
			if ev.Joined {
				r.order = append(r.order, "wait+ "+ev.Name)
			} else {
				r.order = append(r.order, "wait- "+ev.Name)
			}
		},
		Released: func(ctx context.Context, ev dlock.ReleaseEvent) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.released = append(r.released, ev)
			r.relCtx = append(r.relCtx, ctx.Value(reqKey{}))
			r.order = append(r.order, "release "+ev.Name)
		},
		Lost: func(ctx context.Context, ev dlock.LostEvent) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.lost = append(r.lost, ev)
			r.lostCtx = append(r.lostCtx, ctx.Value(reqKey{}))
			r.order = append(r.order, "lost "+ev.Name)
		},
		Renewal: func(ev dlock.RenewalEvent) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.renewals = append(r.renewals, ev)
		},
		Subscription: func(ev dlock.SubscriptionEvent) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.subs = append(r.subs, ev)
		},
		NodeError: func(ev dlock.NodeErrorEvent) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.nodeErrs = append(r.nodeErrs, ev)
		},
	}
}

// acquires returns the AcquireDone events of name, with their contexts' reqKey values.
func (r *recorder) acquires(name string) ([]dlock.AcquireEvent, []any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var evs []dlock.AcquireEvent
	var vals []any
	for i, ev := range r.acquired {
		if ev.Name == name {
			evs, vals = append(evs, ev), append(vals, r.acqCtx[i])
		}
	}
	return evs, vals
}

func (r *recorder) releases(name string) ([]dlock.ReleaseEvent, []any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var evs []dlock.ReleaseEvent
	var vals []any
	for i, ev := range r.released {
		if ev.Name == name {
			evs, vals = append(evs, ev), append(vals, r.relCtx[i])
		}
	}
	return evs, vals
}

func (r *recorder) losses(name string) ([]dlock.LostEvent, []any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var evs []dlock.LostEvent
	var vals []any
	for i, ev := range r.lost {
		if ev.Name == name {
			evs, vals = append(evs, ev), append(vals, r.lostCtx[i])
		}
	}
	return evs, vals
}

func (r *recorder) sequence(name string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, s := range r.order {
		if strings.HasSuffix(s, " "+name) {
			out = append(out, strings.TrimSuffix(s, " "+name))
		}
	}
	return out
}

// lastAcquire waits for the n-th AcquireDone event of name and returns it.
func (r *recorder) nthAcquire(t *testing.T, name string, n int) dlock.AcquireEvent {
	t.Helper()
	var ev dlock.AcquireEvent
	waitFor(t, 10*time.Second, fmt.Sprintf("acquire event %d of %s", n, name), func(context.Context) error {
		evs, _ := r.acquires(name)
		if len(evs) < n {
			return fmt.Errorf("%d events", len(evs))
		}
		ev = evs[n-1]
		return nil
	})
	return ev
}

// Lock and Unlock report the acquisition (outcome, path, token, wait, the caller's context) and
// the release (hold time, the Lock's context); busy, timed-out and cancelled acquisitions say
// so; a re-entry is not an acquisition.
func TestObserver_AcquireAndRelease(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		rec := &recorder{}
		c := tr.dial(t, shared.URL(), dlock.WithObserver(rec.observer()))
		other := tr.dial(t, shared.URL())
		ctx := context.WithValue(ctxT(t), reqKey{}, "req-1")
		name := uniqueName(t)

		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		inner, err := c.Mutex(name).Lock(l.Context()) // re-entry: no event
		if err != nil {
			t.Fatal(err)
		}
		if err := inner.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if rels, _ := rec.releases(name); len(rels) != 0 {
			t.Fatalf("an inner Unlock reported a release: %+v", rels)
		}
		time.Sleep(2 * time.Millisecond) // a hold time above zero, whatever the clock's resolution
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		evs, vals := rec.acquires(name)
		if len(evs) != 1 {
			t.Fatalf("%d acquire events after Lock and a re-entry, want 1: %+v", len(evs), evs)
		}
		ev := evs[0]
		if ev.Outcome != dlock.OutcomeAcquired || ev.Path != dlock.PathServer || ev.Token != l.Token() || ev.Err != nil ||
			ev.Wait <= 0 || ev.Start.IsZero() || vals[0] != "req-1" {
			t.Fatalf("acquire event %+v (ctx value %v), want acquired from the server with token %d, a wait, and the caller's context", ev, vals[0], l.Token())
		}
		rels, rvals := rec.releases(name)
		if len(rels) != 1 || rels[0].Token != l.Token() || rels[0].Held < 2*time.Millisecond || rels[0].PassedOn || rvals[0] != "req-1" {
			t.Fatalf("release events %+v (ctx values %v), want one for token %d held ≥ 2ms, not passed on, with the Lock's context", rels, rvals, l.Token())
		}

		// Busy, timed out (WithWait, and the context's deadline), cancelled.
		held, err := other.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Unlock(ctx)
		if _, err := c.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("TryLock of a held lock: %v", err)
		}
		if ev := rec.nthAcquire(t, name, 2); ev.Outcome != dlock.OutcomeBusy || ev.Err == nil || ev.Token != 0 {
			t.Fatalf("TryLock of a held lock reported %+v, want busy", ev)
		}
		if _, err := c.Mutex(name, dlock.WithWait(30*time.Millisecond)).Lock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("Lock WithWait of a held lock: %v", err)
		}
		if ev := rec.nthAcquire(t, name, 3); ev.Outcome != dlock.OutcomeTimedOut || ev.Wait < 30*time.Millisecond {
			t.Fatalf("Lock WithWait(30ms) of a held lock reported %+v, want timed out after ≥ 30ms", ev)
		}
		dctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		_, err = c.Mutex(name).Lock(dctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock with a deadline, of a held lock: %v", err)
		}
		if ev := rec.nthAcquire(t, name, 4); ev.Outcome != dlock.OutcomeTimedOut {
			t.Fatalf("Lock whose context's deadline passed reported %+v, want timed out", ev)
		}
		cctx, cancel := context.WithCancel(ctx)
		go func() {
			time.Sleep(20 * time.Millisecond)
			cancel()
		}()
		if _, err := c.Mutex(name).Lock(cctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Lock cancelled while waiting: %v", err)
		}
		if ev := rec.nthAcquire(t, name, 5); ev.Outcome != dlock.OutcomeCancelled {
			t.Fatalf("Lock cancelled while waiting reported %+v, want cancelled", ev)
		}
		// Every wait that started stopped, before its acquisition was reported.
		seq := strings.Join(rec.sequence(name), ",")
		if want := "acquire,release,acquire,wait+,wait-,acquire,wait+,wait-,acquire,wait+,wait-,acquire"; seq != want {
			t.Fatalf("events in order: %s, want %s", seq, want)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrClosed) {
			t.Fatalf("TryLock on a closed client: %v", err)
		}
		if ev := rec.nthAcquire(t, name, 6); ev.Outcome != dlock.OutcomeError || !errors.Is(ev.Err, dlock.ErrClosed) {
			t.Fatalf("TryLock on a closed client reported %+v, want an error", ev)
		}
	})
}

// A lock passed on inside the client is reported as such on both ends: the holder's release
// says passed on, the waiter's acquisition came by the local path; the waiter's wait is
// reported with this client's count of waiting goroutines.
func TestObserver_LocalHandoffAndWaiting(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		rec := &recorder{}
		c := tr.dial(t, shared.URL(), dlock.WithObserver(rec.observer()))
		ctx := ctxT(t)
		name := uniqueName(t)
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		const waiters = 3
		got := make(chan *dlock.Lease, waiters)
		errs := make(chan error, waiters)
		for range waiters {
			go func() {
				l, err := c.Mutex(name).Lock(ctx)
				if err != nil {
					errs <- err
					return
				}
				got <- l
			}()
		}
		waitFor(t, 10*time.Second, "3 goroutines waiting", func(context.Context) error {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if n := len(rec.waiting); n != waiters {
				return fmt.Errorf("%d waiting events", n)
			}
			return nil
		})
		rec.mu.Lock()
		// Each joiner reports the count as it joined; their reports may reach the observer in
		// another order.
		joined := slices.SortedFunc(slices.Values(rec.waiting), func(a, b dlock.WaitingEvent) int { return a.Waiting - b.Waiting })
		for i, ev := range joined {
			if !ev.Joined || ev.Waiting != i+1 {
				t.Errorf("waiting event %d = %+v, want joined with %d waiting", i, ev, i+1)
			}
		}
		rec.mu.Unlock()
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		for range waiters {
			select {
			case l := <-got:
				if err := l.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			case err := <-errs:
				t.Fatal(err)
			case <-ctx.Done():
				t.Fatal("waiters not served")
			}
		}
		evs, _ := rec.acquires(name)
		rels, _ := rec.releases(name)
		if len(evs) != 1+waiters || len(rels) != 1+waiters {
			t.Fatalf("%d acquisitions and %d releases reported, want %d each", len(evs), len(rels), 1+waiters)
		}
		for i, ev := range evs[1:] {
			if ev.Path != dlock.PathLocal || ev.Token != evs[i].Token+1 {
				t.Errorf("waiter %d's acquisition %+v, want a local handoff with token %d", i, ev, evs[i].Token+1)
			}
		}
		for i, r := range rels[:waiters] {
			if !r.PassedOn {
				t.Errorf("release %d %+v, want passed on", i, r)
			}
		}
		if rels[waiters].PassedOn {
			t.Errorf("the last release %+v says passed on: nobody was waiting", rels[waiters])
		}
		rec.mu.Lock()
		left := rec.waiting[waiters:]
		rec.mu.Unlock()
		for i, ev := range left {
			if ev.Joined || ev.Waiting != waiters-1-i {
				t.Errorf("waiting event %+v, want left with %d waiting", ev, waiters-1-i)
			}
		}
	})
}

// Every kind of loss is reported with its cause (and logged as a warning): a refused renewal
// (the key removed), a force unlock, no renewal before the deadline (the server unreachable),
// a fixed lease that ran out, a server that may evict keys, and a closed client.
func TestObserver_LostCauses(t *testing.T) {
	needShared(t)
	const ttl = 300 * time.Millisecond
	type setup struct {
		url   string
		after func(t *testing.T, name string) // makes the lease end
		opts  []dlock.Option
	}
	cases := []struct {
		cause dlock.LostCause
		setup func(t *testing.T) setup
	}{
		{dlock.LostRefused, func(t *testing.T) setup {
			return setup{url: shared.URL(), after: func(t *testing.T, name string) { redisDo(t, shared, "DEL", keyOf(name)) }}
		}},
		{dlock.LostForceUnlocked, func(t *testing.T) setup {
			admin := transports[0].dial(t, shared.URL())
			return setup{url: shared.URL(), after: func(t *testing.T, name string) {
				if _, err := admin.ForceUnlock(ctxT(t), name); err != nil {
					t.Fatal(err)
				}
			}}
		}},
		{dlock.LostDeadline, func(t *testing.T) setup {
			p := redistest.NewProxy(t, shared.Addr)
			return setup{url: p.URL(), after: func(t *testing.T, name string) {
				p.Close() // connections reset, new ones refused: no renewal can succeed
			}}
		}},
		{dlock.LostExpired, func(t *testing.T) setup {
			return setup{url: shared.URL(), after: func(*testing.T, string) {}, opts: []dlock.Option{dlock.WithoutRenewal(), dlock.WithTTL(50 * time.Millisecond)}}
		}},
		{dlock.LostEviction, func(t *testing.T) setup {
			s := redistest.Start(t, redistest.WithArgs("--maxmemory", "64mb", "--maxmemory-policy", "noeviction"))
			return setup{url: s.URL(), after: func(t *testing.T, _ string) {
				if _, err := s.Do(ctxT(t), "CONFIG", "SET", "maxmemory-policy", "allkeys-lru"); err != nil {
					t.Fatal(err)
				}
			}}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.cause.String(), func(t *testing.T) {
			eachTransport(t, func(t *testing.T, tr transport) {
				su := tc.setup(t)
				rec := &recorder{}
				var logs logBuffer
				c := tr.dial(t, su.url, dlock.WithTTL(ttl), dlock.WithObserver(rec.observer()), dlock.WithLogger(logs.logger()))
				ctx := context.WithValue(ctxT(t), reqKey{}, "req-lost")
				name := uniqueName(t)
				l, err := c.Mutex(name, su.opts...).Lock(ctx)
				if err != nil {
					t.Fatal(err)
				}
				su.after(t, name)
				var ev dlock.LostEvent
				var val any
				waitFor(t, 15*time.Second, "lost event", func(context.Context) error {
					evs, vals := rec.losses(name)
					if len(evs) == 0 {
						return errors.New("none")
					}
					ev, val = evs[0], vals[0]
					return nil
				})
				if ev.Cause != tc.cause || ev.Token != l.Token() || ev.Held <= 0 || !errors.Is(ev.Err, dlock.ErrLost) || val != "req-lost" {
					t.Fatalf("lost event %+v (ctx value %v), want cause %v, token %d, a hold time, ErrLost, and the Lock's context", ev, val, tc.cause, l.Token())
				}
				if cause := context.Cause(l.Context()); !errors.Is(cause, dlock.ErrLost) {
					t.Fatalf("lease context cause %v, want ErrLost", cause)
				}
				waitFor(t, 5*time.Second, "a warning naming the loss", func(context.Context) error {
					if out := logs.String(); !strings.Contains(out, "level=WARN msg=\"dlock: lease lost\"") || !strings.Contains(out, "cause="+tc.cause.String()) || !strings.Contains(out, name) {
						return fmt.Errorf("log: %s", out)
					}
					return nil
				})
				l.Unlock(ctx)
				if rels, _ := rec.releases(name); len(rels) != 0 {
					t.Fatalf("a lost lease was also reported released: %+v", rels)
				}
			})
		})
	}
	// A client closed while holding a lease.
	t.Run("closed", func(t *testing.T) {
		rec := &recorder{}
		c := transports[0].dial(t, shared.URL(), dlock.WithObserver(rec.observer()))
		name := uniqueName(t)
		l, err := c.Mutex(name).Lock(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		evs, _ := rec.losses(name)
		if len(evs) != 1 || evs[0].Cause != dlock.LostClosed || !errors.Is(evs[0].Err, dlock.ErrClosed) || evs[0].Token != l.Token() {
			t.Fatalf("lost events after Close: %+v, want one with cause closed", evs)
		}
	})
}

// The renewal loop reports each round: leases renewed and the time it took; a round that
// cannot reach the server reports its failures and is logged as a warning.
func TestObserver_RenewalRounds(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		rec := &recorder{}
		var logs logBuffer
		p := redistest.NewProxy(t, shared.Addr)
		c := tr.dial(t, p.URL(), dlock.WithTTL(600*time.Millisecond), dlock.WithObserver(rec.observer()), dlock.WithLogger(logs.logger()))
		ctx := ctxT(t)
		l, err := c.Mutex(uniqueName(t)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(ctx)
		waitFor(t, 10*time.Second, "a renewal round", func(context.Context) error {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			for _, ev := range rec.renewals {
				if ev.Leases == 1 && ev.Renewed == 1 && ev.Failed == 0 && ev.Latency > 0 && ev.Err == nil {
					return nil
				}
			}
			return fmt.Errorf("rounds %+v", rec.renewals)
		})
		p.Close()
		waitFor(t, 10*time.Second, "a failed renewal round", func(context.Context) error {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			for _, ev := range rec.renewals {
				if ev.Leases == 1 && ev.Failed == 1 && ev.Err != nil {
					return nil
				}
			}
			return fmt.Errorf("rounds %+v", rec.renewals)
		})
		if out := logs.String(); !strings.Contains(out, "level=WARN msg=\"dlock: renewal round failed") {
			t.Fatalf("no warning for the failed round: %s", out)
		}
		// Failed rounds are retried a few times before the deadline, not in a tight loop; and
		// warned about once.
		<-l.Context().Done()
		rec.mu.Lock()
		failed := 0
		for _, ev := range rec.renewals {
			if ev.Failed > 0 {
				failed++
			}
		}
		rec.mu.Unlock()
		if failed > 20 {
			t.Errorf("%d failed renewal rounds for one lease of 600ms: retried in a loop", failed)
		}
		if n := strings.Count(logs.String(), "level=WARN msg=\"dlock: renewal round failed"); n != 1 {
			t.Errorf("%d warnings for the failed rounds, want 1", n)
		}
	})
}

// The subscription to release notices reports its loss and its return (and logs both at INFO).
func TestObserver_SubscriptionDropsAndComesBack(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		rec := &recorder{}
		var logs logBuffer
		s := redistest.Start(t)
		holder := tr.dial(t, s.URL())
		c := tr.dial(t, s.URL(), dlock.WithObserver(rec.observer()), dlock.WithLogger(logs.logger()))
		ctx := ctxT(t)
		name := uniqueName(t)
		l, err := holder.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := c.Mutex(name).Lock(wctx)
			done <- err
		}()
		waitFor(t, 10*time.Second, "the waiter subscribed", func(ctx context.Context) error {
			// A waiting client listens on its own channel of the lock (docs/PROTOCOL.md).
			if chs := redisDo(t, s, "PUBSUB", "CHANNELS", keyOf(name)+":rel:*"); chs == "" {
				return errors.New("no channel of the lock subscribed")
			}
			return nil
		})
		// Only the subscription's connection goes: the waiter keeps waiting.
		redisDo(t, s, "CLIENT", "KILL", "TYPE", "pubsub")
		// The observer hears of each change first, then the log line is written: wait for both.
		waitFor(t, 10*time.Second, "dropped, then restored, observed and logged", func(context.Context) error {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if len(rec.subs) < 2 || rec.subs[0].Up || rec.subs[0].Err == nil || !rec.subs[1].Up {
				return fmt.Errorf("events %+v", rec.subs)
			}
			if out := logs.String(); !strings.Contains(out, "level=INFO msg=\"dlock: release subscription dropped") || !strings.Contains(out, "level=INFO msg=\"dlock: release subscription restored\"") {
				return fmt.Errorf("log: %s", out)
			}
			return nil
		})
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("the waiter's Lock: %v, want it to have waited until cancelled", err)
		}
		l.Unlock(ctx)
	})
}

// In quorum mode, a server that fails a call is reported by address, with the script it failed.
func TestObserver_QuorumNodeErrors(t *testing.T) {
	needShared(t)
	rec := &recorder{}
	var urls []string
	var proxies []*redistest.Proxy
	for range 3 {
		p := redistest.NewProxy(t, shared.Addr)
		proxies = append(proxies, p)
		urls = append(urls, p.URL())
	}
	ctx := ctxT(t)
	c, err := dlock.DialQuorum(ctx, urls, dlock.WithObserver(rec.observer()), dlock.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	down := proxies[2].Addr
	proxies[2].Close()
	waitFor(t, 10*time.Second, "a node error from the closed server", func(ctx context.Context) error {
		if l, err := c.Mutex(uniqueName(t)).TryLock(ctx); err == nil {
			l.Unlock(ctx)
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for _, ev := range rec.nodeErrs {
			if ev.Server == down && ev.Op == "acquire.lua" && ev.Err != nil {
				return nil
			}
		}
		return fmt.Errorf("node errors %+v", rec.nodeErrs)
	})
}

// Observers given more than once all receive every event.
func TestObserver_Several(t *testing.T) {
	needShared(t)
	a, b := &recorder{}, &recorder{}
	c := transports[0].dial(t, shared.URL(), dlock.WithObserver(a.observer()), dlock.WithObserver(dlock.Observer{}), dlock.WithObserver(b.observer()))
	ctx := ctxT(t)
	name := uniqueName(t)
	if err := c.Do(ctx, name, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	for i, r := range []*recorder{a, b} {
		evs, _ := r.acquires(name)
		rels, _ := r.releases(name)
		if len(evs) != 1 || len(rels) != 1 {
			t.Fatalf("observer %d: %d acquisitions, %d releases; want 1 each", i, len(evs), len(rels))
		}
	}
}

// With WithLogger at DEBUG, every acquisition and release is logged; at the default level
// (INFO) neither is.
func TestLogger_DebugAcquisitions(t *testing.T) {
	needShared(t)
	for _, level := range []slog.Level{slog.LevelDebug, slog.LevelInfo} {
		var logs logBuffer
		c := transports[0].dial(t, shared.URL(), dlock.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: level}))))
		name := uniqueName(t)
		if err := c.Do(ctxT(t), name, func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
		out := logs.String()
		logged := strings.Contains(out, `msg="dlock: acquired" name=`+name) && strings.Contains(out, `msg="dlock: released" name=`+name)
		if logged != (level == slog.LevelDebug) {
			t.Fatalf("level %v: log %q", level, out)
		}
	}
}

// ctxCounter is a go-redis hook and a rueidis client wrapper (as tracing hooks are) that
// records, for each dlock script command sent, the reqKey value of the context it runs under:
// for a go-redis pipeline of several callers' calls, the context goredisconn.CallerContexts
// gives for that command.
type ctxCounter struct {
	rueidis.Client
	mu        sync.Mutex
	seen      map[any]int // reqKey value (nil: none) -> commands
	pipelines int         // go-redis pipelines that carried more than one caller's calls
	batches   int         // script calls that served several callers (conn.Callers)
}

// count records the caller of a command sent under ctx: the callers conn.Callers gives (a
// script call that serves several, dlock's batches), or ctx's own.
func (h *ctxCounter) count(ctx context.Context) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if callers := conn.Callers(ctx); callers != nil {
		if len(callers) > 1 {
			h.batches++
		}
		for _, c := range callers {
			h.seen[c.Value(reqKey{})]++
		}
		return
	}
	h.seen[ctx.Value(reqKey{})]++
}

func isScript(name string) bool {
	name = strings.ToLower(name)
	return name == "evalsha" || name == "eval"
}

func (h *ctxCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *ctxCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd.Name()) {
			h.count(ctx)
		}
		return next(ctx, cmd)
	}
}

func (h *ctxCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		callers := goredisconn.CallerContexts(ctx)
		if len(callers) > 1 {
			h.mu.Lock()
			h.pipelines++
			h.mu.Unlock()
		}
		for i, cmd := range cmds {
			if !isScript(cmd.Name()) {
				continue
			}
			if len(callers) == len(cmds) {
				h.count(callers[i])
			} else {
				h.count(ctx)
			}
		}
		return next(ctx, cmds)
	}
}

func (h *ctxCounter) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if isScript(cmd.Commands()[0]) {
		h.count(ctx)
	}
	return h.Client.Do(ctx, cmd)
}

func (h *ctxCounter) DoMulti(ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	for _, cmd := range multi {
		if isScript(cmd.Commands()[0]) {
			h.count(ctx)
		}
	}
	return h.Client.DoMulti(ctx, multi...)
}

// Under 64 concurrent Do calls, every lock command the transport sends runs under (or links
// to) the context of each caller it serves, also when dlock sends several callers' acquisitions
// or releases as one script call (conn.Callers) and when go-redis's calls go out batched in one
// pipeline (goredisconn.CallerContexts): a tracing hook attributes each to its requests.
func TestTraceContext_EveryLockCommandCarriesItsCaller(t *testing.T) {
	needShared(t)
	const callers = 64
	for _, name := range []string{"rueidis", "goredis"} {
		t.Run(name, func(t *testing.T) {
			h := &ctxCounter{seen: make(map[any]int)}
			var cn dlock.Conn
			switch name {
			case "rueidis":
				opt, err := rueidisconn.ParseURL(shared.URL())
				if err != nil {
					t.Fatal(err)
				}
				opt.DisableCache = true
				rc, err := rueidis.NewClient(opt)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(rc.Close)
				h.Client = rc
				cn = rueidisconn.New(h)
			case "goredis":
				o, err := redis.ParseURL(shared.URL())
				if err != nil {
					t.Fatal(err)
				}
				rc := redis.NewClient(o)
				t.Cleanup(func() { rc.Close() })
				rc.AddHook(h)
				cn = goredisconn.New(rc)
			}
			c, err := dlock.New(cn)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			h.mu.Lock()
			clear(h.seen) // the client's own checks at New run under no caller's context
			h.mu.Unlock()
			ctx := ctxT(t)
			base := uniqueName(t)
			var wg sync.WaitGroup
			errs := make(chan error, callers)
			for i := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rctx := context.WithValue(ctx, reqKey{}, i)
					for j := range 20 {
						if err := c.Do(rctx, fmt.Sprintf("%s-%d-%d", base, i, j%2), func(context.Context) error { return nil }); err != nil {
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
			h.mu.Lock()
			defer h.mu.Unlock()
			total := 0
			for v, n := range h.seen {
				total += n
				if v == nil {
					t.Errorf("%d of the script commands ran under no caller's context", n)
				}
			}
			if len(h.seen) != callers || h.seen[nil] != 0 {
				t.Errorf("commands by caller: %v; want each of the %d callers", h.seen, callers)
			}
			// Each caller's 20 Dos are 20 acquisitions and 20 releases, each a script command
			// (or a share of one) that names it.
			for i := range callers {
				if h.seen[i] < 2*20 {
					t.Errorf("caller %d: %d script commands carry its context, want at least 40 (its acquisitions and releases)", i, h.seen[i])
				}
			}
			t.Logf("%d script commands by caller, %d script calls serving several callers, %d go-redis pipelines of several callers' calls", total, h.batches, h.pipelines)
			if h.batches == 0 {
				t.Error("no script call served several callers: the test did not exercise dlock's batches")
			}
		})
	}
}

// Read-write locks, semaphores and multi-locks are reported as Mutexes are: each acquisition
// (with its kind), each wait, each release; a multi-lock once per name it took.
func TestObserver_FamilyPrimitives(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		rec := &recorder{}
		c := tr.dial(t, shared.URL(), dlock.WithObserver(rec.observer()))
		ctx := ctxT(t)
		name := uniqueName(t)

		// Two readers, then a writer of the same client waits behind them.
		rw := c.RWMutex(name)
		r1, err := rw.RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := rw.RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			l   *dlock.Lease
			err error
		}
		wrote := make(chan result, 1)
		go func() {
			l, err := rw.Lock(ctx)
			wrote <- result{l, err}
		}()
		waitFor(t, 10*time.Second, "the writer's wait reported", func(context.Context) error {
			if seq := rec.sequence(name); len(seq) < 3 || seq[2] != "wait+" {
				return fmt.Errorf("events %v", seq)
			}
			return nil
		})
		info, err := c.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if info.Kind != dlock.KindRWMutex || info.LocalWaiters != 1 || info.WaitingGoroutines != 1 {
			t.Fatalf("Inspect while the writer waits: kind %q, local waiters %d, waiting goroutines %d; want rwmutex, 1, 1",
				info.Kind, info.LocalWaiters, info.WaitingGoroutines)
		}
		for _, l := range []*dlock.Lease{r1, r2} {
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		w := <-wrote
		if w.err != nil {
			t.Fatal(w.err)
		}
		if err := w.l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		// The second reader's release frees the lock on the server, which grants it to the
		// writer: the writer's goroutine may report its acquisition before the reader's
		// goroutine, back from its Unlock, reports the release.
		want := []string{"acquire,acquire,wait+,release,release,wait-,acquire,release", "acquire,acquire,wait+,release,wait-,acquire,release,release"}
		if seq := strings.Join(rec.sequence(name), ","); !slices.Contains(want, seq) {
			t.Fatalf("read-write lock events: %s, want one of %q", seq, want)
		}
		evs, _ := rec.acquires(name)
		for _, ev := range evs {
			if ev.Kind != dlock.KindRWMutex || ev.Outcome != dlock.OutcomeAcquired || ev.Token == 0 {
				t.Fatalf("read-write lock acquisition reported %+v", ev)
			}
		}
		if ev := evs[2]; ev.Token != w.l.Token() {
			t.Fatalf("the writer's acquisition reported token %d, its lease has %d", ev.Token, w.l.Token())
		}
		rels, _ := rec.releases(name)
		if len(rels) != 3 || rels[2].Kind != dlock.KindRWMutex {
			t.Fatalf("read-write lock releases: %+v", rels)
		}

		// A semaphore: taken, then refused.
		sem := name + "-sem"
		s := c.Semaphore(sem, 3)
		l, err := s.Acquire(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.TryAcquire(ctx, 2); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("TryAcquire of 2 of the 1 free permit: %v", err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if evs, _ := rec.acquires(sem); len(evs) != 2 || evs[0].Kind != dlock.KindSemaphore || evs[0].Outcome != dlock.OutcomeAcquired ||
			evs[1].Outcome != dlock.OutcomeBusy {
			t.Fatalf("semaphore acquisitions reported %+v, want acquired then busy", evs)
		}
		if rels, _ := rec.releases(sem); len(rels) != 1 || rels[0].Token != l.Token() {
			t.Fatalf("semaphore releases reported %+v", rels)
		}

		// A multi-lock: one acquisition and one release per name.
		a, b := name+"-a", name+"-b"
		ml, err := c.MultiMutex([]string{a, b}).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tokens := ml.Tokens()
		if err := ml.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{a, b} {
			if seq := strings.Join(rec.sequence(n), ","); seq != "acquire,release" {
				t.Fatalf("multi-lock events of %s: %s, want acquire,release", n, seq)
			}
			if evs, _ := rec.acquires(n); evs[0].Kind != dlock.KindMutex || evs[0].Token != tokens[n] {
				t.Fatalf("multi-lock acquisition of %s reported %+v, token %d", n, evs[0], tokens[n])
			}
		}
	})
}
