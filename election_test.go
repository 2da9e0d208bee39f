package dlock_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// observed reads the next LeaderInfo of an Observe stream until want accepts one, failing the
// test after within (or when the stream closes). It returns the accepted one.
func observed(t *testing.T, ch <-chan dlock.LeaderInfo, within time.Duration, what string, want func(dlock.LeaderInfo) bool) dlock.LeaderInfo {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	var seen []dlock.LeaderInfo
	for {
		select {
		case info, ok := <-ch:
			if !ok {
				t.Fatalf("%s: the Observe stream closed (seen %+v)", what, seen)
			}
			if want(info) {
				return info
			}
			seen = append(seen, info)
		case <-timer.C:
			t.Fatalf("%s: not observed within %v (seen %+v)", what, within, seen)
		}
	}
}

func leads(value string) func(dlock.LeaderInfo) bool {
	return func(i dlock.LeaderInfo) bool { return i.Term > 0 && i.Value == value }
}

func nobody(i dlock.LeaderInfo) bool { return i.Term == 0 }

// Campaign serves candidates in the order they campaigned; Leader and Observe show each
// leader, its value and term; Resign passes leadership to the next candidate; Proclaim changes
// the value; terms strictly increase; the last Resign leaves no leader.
func TestElection_CampaignOrderLeaderObserveResign(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		watcher := tr.dial(t, shared.URL())
		obs := watcher.Election(name).Observe(ctx)
		observed(t, obs, 5*time.Second, "no leader at first", nobody)
		if _, err := watcher.Election(name).Leader(ctx); !errors.Is(err, dlock.ErrNoLeader) {
			t.Fatalf("Leader of a fresh election = %v, want ErrNoLeader", err)
		}

		clients := []*dlock.Client{tr.dial(t, shared.URL()), tr.dial(t, shared.URL()), tr.dial(t, shared.URL())}
		values := []string{"replica-a", "replica-b", "replica-c"}
		first, err := clients[0].Election(name).Campaign(ctx, values[0])
		if err != nil {
			t.Fatal(err)
		}
		got := observed(t, obs, 5*time.Second, "the first leader", leads(values[0]))
		if got.Term != first.Term() || got.Holder.PID != os.Getpid() || got.Since.IsZero() {
			t.Fatalf("observed %+v, want term %d, this process, a start time", got, first.Term())
		}
		info, err := watcher.Election(name).Leader(ctx)
		if err != nil || info.Term != got.Term || info.Value != got.Value || info.Holder != got.Holder || !info.Since.Equal(got.Since) {
			t.Fatalf("Leader = %+v, %v; want %+v", info, err, got)
		}

		// Two more candidates queue, b before c.
		type result struct {
			ld  *dlock.Leadership
			err error
		}
		results := make([]chan result, 3)
		for i := 1; i < 3; i++ {
			results[i] = make(chan result, 1)
			go func() {
				ld, err := clients[i].Election(name).Campaign(ctx, values[i])
				results[i] <- result{ld, err}
			}()
			waitQueued(t, name, i)
		}

		if err := first.Proclaim(ctx, "replica-a v2"); err != nil {
			t.Fatal(err)
		}
		if first.Value() != "replica-a v2" {
			t.Fatalf("Value after Proclaim = %q", first.Value())
		}
		observed(t, obs, 5*time.Second, "the proclaimed value", leads("replica-a v2"))

		prev := first
		for i := 1; i < 3; i++ {
			if err := prev.Resign(ctx); err != nil {
				t.Fatal(err)
			}
			if prev.Context().Err() == nil {
				t.Fatal("a resigned leadership's context is live")
			}
			var r result
			select {
			case r = <-results[i]:
			case <-time.After(10 * time.Second):
				t.Fatalf("candidate %d does not lead after the Resign", i)
			}
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.ld.Term() <= prev.Term() {
				t.Fatalf("term %d after term %d", r.ld.Term(), prev.Term())
			}
			got := observed(t, obs, 5*time.Second, "leader "+values[i], leads(values[i]))
			if got.Term != r.ld.Term() {
				t.Fatalf("observed term %d, leader has %d", got.Term, r.ld.Term())
			}
			prev = r.ld
		}
		if err := prev.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		observed(t, obs, 5*time.Second, "no leader after the last Resign", nobody)
		if _, err := watcher.Election(name).Leader(ctx); !errors.Is(err, dlock.ErrNoLeader) {
			t.Fatalf("Leader after the last Resign = %v, want ErrNoLeader", err)
		}
		if err := prev.Resign(ctx); !errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("second Resign = %v, want ErrNotHeld", err)
		}
		if err := prev.Proclaim(ctx, "x"); !errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("Proclaim after Resign = %v, want ErrNotHeld", err)
		}
	})
}

// A force-unlock deposes the leader: its context ends with ErrLost, its Proclaim says
// ErrLost, the queued candidate leads with a larger term, and observers see it.
func TestElection_ForceUnlockDeposes(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		a, b, admin := tr.dial(t, shared.URL()), tr.dial(t, shared.URL()), tr.dial(t, shared.URL())
		obs := admin.Election(name).Observe(ctx)
		la, err := a.Election(name, dlock.WithTTL(2*time.Second)).Campaign(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		observed(t, obs, 5*time.Second, "a leads", leads("a"))
		bled := make(chan *dlock.Leadership, 1)
		go func() {
			lb, err := b.Election(name).Campaign(ctx, "b")
			if err != nil {
				t.Error(err)
			}
			bled <- lb
		}()
		waitQueued(t, name, 1)
		if _, err := admin.ForceUnlock(ctx, name); err != nil {
			t.Fatal(err)
		}
		lb := <-bled
		if lb == nil {
			t.FailNow()
		}
		defer lb.Resign(ctx)
		if lb.Term() <= la.Term() {
			t.Fatalf("term %d after %d", lb.Term(), la.Term())
		}
		observed(t, obs, 5*time.Second, "b leads", leads("b"))
		select {
		case <-la.Context().Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the deposed leader's context is still live")
		}
		if cause := context.Cause(la.Context()); !errors.Is(cause, dlock.ErrLost) {
			t.Fatalf("deposed leader's cause = %v, want ErrLost", cause)
		}
		if err := la.Proclaim(ctx, "a again"); !errors.Is(err, dlock.ErrLost) {
			t.Fatalf("deposed leader's Proclaim = %v, want ErrLost", err)
		}
	})
}

// RunElected runs fn on one caller at a time, campaigns again after fn returns nil or after a
// loss, and returns ctx's error when ctx ends and fn's error when it fails.
func TestRunElected_OneAtATimeAndReturns(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		var (
			inside  atomic.Int32
			overlap atomic.Bool
			terms   sync.Map // term -> runner
			runs    atomic.Int32
		)
		runCtx, stop := context.WithCancel(ctx)
		errc := make(chan error, 3)
		for i := range 3 {
			c := tr.dial(t, shared.URL())
			go func() {
				errc <- c.RunElected(runCtx, name, "runner", func(lctx context.Context) error {
					if inside.Add(1) != 1 {
						overlap.Store(true)
					}
					defer inside.Add(-1)
					tok, _ := dlock.TokenFromContext(lctx)
					if _, dup := terms.LoadOrStore(tok, i); dup {
						overlap.Store(true)
					}
					runs.Add(1)
					select { // a short term, then step down and campaign again
					case <-time.After(2 * time.Millisecond):
					case <-lctx.Done():
					}
					return nil
				})
			}()
		}
		waitFor(t, 20*time.Second, "30 terms", func(context.Context) error {
			if runs.Load() < 30 {
				return errors.New("fewer than 30 terms yet")
			}
			return nil
		})
		stop()
		for range 3 {
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Fatalf("RunElected after ctx ended = %v, want context.Canceled", err)
			}
		}
		if overlap.Load() {
			t.Fatal("two runners led at once, or a term repeated")
		}

		// fn's own error ends the loop, and the leadership is given back.
		c := tr.dial(t, shared.URL())
		boom := errors.New("boom")
		if err := c.RunElected(ctx, name, "x", func(context.Context) error { return boom }); err != boom {
			t.Fatalf("RunElected with a failing fn = %v, want its error", err)
		}
		if _, err := c.Election(name).Leader(ctx); !errors.Is(err, dlock.ErrNoLeader) {
			t.Fatalf("after RunElected returned, Leader = %v, want ErrNoLeader", err)
		}
	})
}

// Bad input and unusable handles fail at once with clear errors.
func TestElection_BadInput(t *testing.T) {
	needShared(t)
	ctx := ctxT(t)
	c := transports[0].dial(t, shared.URL())
	name := uniqueName(t)
	cases := []struct {
		what string
		err  error
		want error
	}{
		{"empty name", func() error { _, err := c.Election("").Campaign(ctx, "v"); return err }(), dlock.ErrInvalid},
		{"value too long", func() error {
			_, err := c.Election(name).Campaign(ctx, strings.Repeat("v", dlock.MaxLeaderValue+1))
			return err
		}(), dlock.ErrInvalid},
		{"turn slice", func() error {
			_, err := c.Election(name, dlock.WithTurnSlice(time.Millisecond)).Campaign(ctx, "v")
			return err
		}(), dlock.ErrInvalid},
		{"zero TTL", func() error { _, err := c.Election(name, dlock.WithTTL(0)).Leader(ctx); return err }(), dlock.ErrInvalid},
		{"nil client", func() error { _, err := (*dlock.Client)(nil).Election(name).Leader(ctx); return err }(), dlock.ErrInvalid},
		{"nil fn", c.RunElected(ctx, name, "v", nil), dlock.ErrInvalid},
		{"nil leadership", (*dlock.Leadership)(nil).Resign(ctx), dlock.ErrNotHeld},
	}
	for _, tc := range cases {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.what, tc.err, tc.want)
		}
	}
	if _, ok := <-c.Election("").Observe(ctx); ok {
		t.Error("Observe of an invalid election sent a value; want a closed channel")
	}

	// A leader does not campaign again with its own leadership's context.
	ld, err := c.Election(name).Campaign(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Election(name).Campaign(ld.Context(), "v"); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Campaign with the leadership's context = %v, want ErrInvalid", err)
	}
	if err := ld.Resign(ctx); err != nil {
		t.Fatal(err)
	}

	// A closed client: every call says ErrClosed, and an observer's channel closes.
	closed := transports[0].dial(t, shared.URL())
	obs := closed.Election(name).Observe(ctx)
	observed(t, obs, 5*time.Second, "first state", nobody)
	closed.Close()
	select {
	case _, ok := <-obs:
		if ok {
			for range obs {
			}
		}
	case <-time.After(5 * time.Second):
		t.Fatal("an observer of a closed client is still open")
	}
	if _, err := closed.Election(name).Campaign(ctx, "v"); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("Campaign on a closed client = %v, want ErrClosed", err)
	}
	if _, err := closed.Election(name).Leader(ctx); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("Leader on a closed client = %v, want ErrClosed", err)
	}
}

// RunElected's fn sees ctx's end too: cancelling ctx while fn runs ends fn, the leadership is
// given back, and RunElected returns ctx's error.
func TestRunElected_CancelWhileLeading(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL())
		runCtx, stop := context.WithCancel(ctx)
		leading := make(chan uint64, 1)
		errc := make(chan error, 1)
		go func() {
			errc <- c.RunElected(runCtx, name, "v", func(lctx context.Context) error {
				term, ok := dlock.TokenFromContext(lctx)
				if !ok {
					t.Error("fn's context carries no term")
				}
				leading <- term
				<-lctx.Done()
				return lctx.Err()
			})
		}()
		var term uint64
		select {
		case term = <-leading:
		case <-time.After(10 * time.Second):
			t.Fatal("RunElected did not lead")
		}
		if info, err := c.Election(name).Leader(ctx); err != nil || info.Term != term || info.Value != "v" {
			t.Fatalf("Leader while running = %+v, %v; want term %d, value v", info, err, term)
		}
		stop()
		select {
		case err := <-errc:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("RunElected = %v, want context.Canceled", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("RunElected did not return after its context ended")
		}
		if _, err := c.Election(name).Leader(ctx); !errors.Is(err, dlock.ErrNoLeader) {
			t.Fatalf("Leader after RunElected returned = %v, want ErrNoLeader", err)
		}
	})
}

// An observer nobody reads holds nothing up: twenty terms pass on the same client (each
// candidate woken by the one subscription the observer shares), and the reader then gets the
// latest state after at most two older ones.
func TestElection_UnreadObserverBlocksNothing(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL())
		other := tr.dial(t, shared.URL())
		obs := c.Election(name).Observe(ctx)
		e := c.Election(name)
		for i := range 20 {
			held, err := other.Election(name).Campaign(ctx, "other")
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			go func() {
				ld, err := e.Campaign(ctx, "mine")
				if err == nil {
					err = ld.Resign(ctx)
				}
				got <- err
			}()
			waitQueued(t, name, 1)
			if err := held.Resign(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-got:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("term %d: the queued candidate of the observer's client did not lead", i)
			}
		}
		final, err := e.Campaign(ctx, "final")
		if err != nil {
			t.Fatal(err)
		}
		defer final.Resign(ctx)
		stale := 0
		observed(t, obs, 5*time.Second, "the latest state", func(i dlock.LeaderInfo) bool {
			if i.Term == final.Term() && i.Value == "final" {
				return true
			}
			stale++
			return false
		})
		if stale > 2 {
			t.Fatalf("%d older states before the latest; an unread observer keeps one", stale)
		}
	})
}

// A leader's value round-trips whatever its bytes, UTF-8 or not.
func TestElection_ValueAnyBytes(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL())
		for _, v := range []string{"", "plain", "quote \" tab\t é", "\xff\xfe bytes \x00 not utf-8"} {
			ld, err := c.Election(name).Campaign(ctx, v)
			if err != nil {
				t.Fatal(err)
			}
			info, err := c.Election(name).Leader(ctx)
			if err != nil || info.Value != v {
				t.Errorf("value %q read back as %q (%v)", v, info.Value, err)
			}
			if err := ld.Proclaim(ctx, v+"!"); err != nil {
				t.Fatal(err)
			}
			if info, err := c.Election(name).Leader(ctx); err != nil || info.Value != v+"!" {
				t.Errorf("proclaimed %q read back as %q (%v)", v+"!", info.Value, err)
			}
			ld.Resign(ctx)
		}
	})
}
