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
