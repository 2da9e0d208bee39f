package dlock

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/protocol"
)

// A grant announced to a read-write lock's or semaphore's waiter with a token not above the
// newest one an attempt under the same entry found is stale: the waiter's process was paused
// past the grant's acceptance window (the announcement still buffered), the units went to
// someone else, and the attempt that found them taken queued the same entry again. The waiter
// must not make a lease of it — dating it from that attempt would admit one hold too many
// (two permits of a semaphore of one, a reader beside a writer). A grant made after that
// attempt counts.
func TestSharedGrant_StaleAnnouncementAfterRequeue(t *testing.T) {
	_, ctx, dial := privateServer(t)
	a, b := dial(WithTTL(2*time.Second)), dial(WithTTL(2*time.Second))
	for _, tc := range []struct {
		kind   string
		holder func() (*Lease, error)
		waiter func(*Client) *lockSpec
	}{
		{"semaphore", func() (*Lease, error) { return a.Semaphore("stale-sem", 1).Acquire(ctx, 1) },
			func(c *Client) *lockSpec {
				s := c.Semaphore("stale-sem", 1)
				return s.h.spec(protocol.SharedPermits, 1, s.size)
			}},
		{"read-write", func() (*Lease, error) { return a.RWMutex("stale-rw").Lock(ctx) },
			func(c *Client) *lockSpec { return c.RWMutex("stale-rw").read }},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			held, err := tc.holder()
			if err != nil {
				t.Fatal(err)
			}
			e := b.e
			spec := tc.waiter(b)
			w := e.newSharedWaiter(ctx, spec)
			st, res, err := e.sharedAttempt(ctx, spec, w)
			if err != nil || st != nil {
				t.Fatalf("attempt beside the holder: lease %v, error %v; want queued", st, err)
			}
			if res.Stale < held.Token()-1 {
				t.Fatalf("attempt's stale bound %d, want at least below the holder's token %d", res.Stale, held.Token())
			}
			e.sharedWaits.join(w)
			defer e.sharedWaits.leave(w, true, false)

			e.granted(w.reg.id, res.Stale, 0, time.Second) // the lapsed grant's announcement
			select {
			case st := <-w.grant:
				st.end(endReleased, nil)
				t.Fatalf("stale grant (token %d, attempt's bound %d) made a lease", st.token, res.Stale)
			default:
			}
			if got := w.reg.state.Load(); got != regQueued {
				t.Fatalf("entry state %d after a stale grant, want still queued", got)
			}

			waitFor(t, 10*time.Second, "subscribed", isLive(e, spec.channel, true))
			if err := held.Unlock(ctx); err != nil { // the server grants the waiting entry
				t.Fatal(err)
			}
			select {
			case st := <-w.grant:
				if st.token <= res.Stale {
					t.Errorf("granted token %d, want above %d", st.token, res.Stale)
				}
				if err := (&Lease{st: st}).Unlock(ctx); err != nil {
					t.Error(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the grant made at the release never reached the waiter")
			}
		})
	}
}

// A grant whose acceptance window ran out before the client could act on it (its process
// paused past the window, the announcement still buffered) has lapsed on the server: the
// waiter makes no lease of it — a lease already lost, returned by Acquire with a nil error —
// but is woken to queue again.
func TestSharedGrant_LapsedWindowQueuesAgain(t *testing.T) {
	_, ctx, dial := privateServer(t)
	a, b := dial(WithTTL(2*time.Second)), dial(WithTTL(2*time.Second))
	held, err := a.Semaphore("lapsed-sem", 1).Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(ctx)
	e := b.e
	s := b.Semaphore("lapsed-sem", 1)
	spec := s.h.spec(protocol.SharedPermits, 1, s.size)
	w := e.newSharedWaiter(ctx, spec)
	if st, _, err := e.sharedAttempt(ctx, spec, w); err != nil || st != nil {
		t.Fatalf("attempt beside the holder: lease %v, error %v; want queued", st, err)
	}
	defer e.sharedWaits.leave(w, false, false)
	const window = time.Second
	w.reg.sentOn[0].Store(mono() - int64(2*window)) // the entry's last refresh, before a long pause
	e.granted(w.reg.id, held.Token()+1, 0, window)
	select {
	case st := <-w.grant:
		st.end(endReleased, nil)
		t.Fatal("a grant whose window had run out made a lease")
	default:
	}
	select {
	case <-w.q.wake:
	default:
		t.Error("the waiter was not woken to queue again")
	}
	if got := w.reg.state.Load(); got != regQueued {
		t.Errorf("entry state %d, want still queued (to attempt again)", got)
	}
}
