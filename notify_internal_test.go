package dlock

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A queue registered on a channel whose subscription is still live (its previous queue just
// left and the unsubscribe was not sent yet) gets no confirmation of its own: add must wake its
// head, which made its attempt before registering and could otherwise sleep through a release
// in between until the holder's lease ran out.
func TestNotifier_AddOnLiveChannelWakes(t *testing.T) {
	_, ctx, dial := privateServer(t)
	c := dial()
	other := dial()
	m := c.Mutex("live")
	held, err := other.Mutex("live").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, stopWaiter := context.WithCancel(ctx)
	waiter := make(chan error, 1)
	go func() {
		_, err := m.Lock(wctx)
		waiter <- err
	}()
	waitFor(t, 10*time.Second, "the waiter's subscription to be confirmed", isLive(c.e, m.spec.grants, true))
	q2 := &queue{key: m.spec.key, channel: m.spec.grants, wake: make(chan struct{}, 1)}
	c.e.notices.add(m.spec.grants, q2)
	select {
	case <-q2.wake:
	default:
		t.Fatal("a queue registered on a live channel was not woken")
	}
	c.e.notices.remove(m.spec.grants, q2)
	stopWaiter()
	if err := <-waiter; !errors.Is(err, context.Canceled) {
		t.Fatalf("waiter: %v, want context.Canceled", err)
	}
	held.Unlock(ctx)

	// Once the unsubscribe is decided the channel is no longer live: a new queue then waits
	// for the confirmation of its own subscription.
	waitFor(t, 10*time.Second, "the channel to stop being live after its last queue left", isLive(c.e, m.spec.grants, false))
}

// A grant announced for another client's registration makes the head wait for that grant's
// first lease (its acceptance window); a grant to one of this client's own registrations does
// not: grant handles it, and a late grant to a registration this client is done with (in quorum
// mode, a server that answered an attempt late) goes with that registration's release. Before,
// such a late grant held the head of a client's queue for a whole window.
func TestNotifier_OwnGrantHoldsNobodyUp(t *testing.T) {
	n := newNotifier(nil, func(string, uint64, int, time.Duration) {})
	n.own = "c1."
	q := &queue{key: "k", channel: "ch", wake: make(chan struct{}, 1), rearm: make(chan struct{}, 1)}
	n.subs["ch"] = q
	n.onMessage("ch", "g 7 c1.3 1000")
	select {
	case <-q.rearm:
		t.Fatal("a grant to this client's own registration re-armed the head's wait")
	default:
	}
	n.onMessage("ch", "g 8 c2.1 1000")
	select {
	case <-q.rearm:
	default:
		t.Fatal("a grant to another client's registration did not re-arm the head's wait")
	}
	if at := q.pokeAt.Load(); at <= mono() {
		t.Fatalf("the head waits until %d, not into the other client's window (now %d)", at, mono())
	}
}
