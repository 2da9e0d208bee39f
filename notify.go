package dlock

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/dlock-go/dlock/conn"
)

// notifier is the one pub/sub subscription of a Client. Queues whose head waits for a lock
// register the lock's release channel; the notifier keeps the server-side subscriptions equal
// to that set and routes each release notice to its queue. It opens its connection on first
// need and, when the connection drops, reopens it, subscribes again and wakes every head
// (a notice may have been missed meanwhile). Waiters themselves hold no connection.
type notifier struct {
	listen func(context.Context, conn.Handler) (conn.Listener, error) // the backend's

	mu   sync.Mutex
	subs map[string]*queue // channel -> queue wanting its notices
	// live: channels whose subscription the server confirmed and that no unsubscribe has been
	// decided for since. A queue registered on a live channel hears every later notice but
	// gets no confirmation of its own, so add wakes it instead.
	live map[string]bool

	dirty chan struct{} // capacity 1: subs changed
	quit  chan struct{}

	// owned by run
	ln     conn.Listener
	active map[string]bool // channels subscribed on ln
}

func newNotifier(listen func(context.Context, conn.Handler) (conn.Listener, error)) *notifier {
	return &notifier{
		listen: listen,
		subs:   make(map[string]*queue),
		live:   make(map[string]bool),
		dirty:  make(chan struct{}, 1),
		quit:   make(chan struct{}),
		active: make(map[string]bool),
	}
}

// add routes channel's notices to q. Its head made an attempt before this call, and a release
// between that attempt and now sent a notice nobody routed to q: the head must try again once
// notices reach it. On a new subscription the server's confirmation wakes it (onSubscribed);
// on a channel still live from a queue that just left, add wakes it at once.
func (n *notifier) add(channel string, q *queue) {
	n.mu.Lock()
	n.subs[channel] = q
	live := n.live[channel]
	n.mu.Unlock()
	n.markDirty()
	if live {
		q.wakeHead(anyToken)
	}
}

// remove stops routing channel to q (a newer queue for the same lock may have taken its place).
func (n *notifier) remove(channel string, q *queue) {
	n.mu.Lock()
	if n.subs[channel] == q {
		delete(n.subs, channel)
	}
	n.mu.Unlock()
	n.markDirty()
}

func (n *notifier) markDirty() {
	select {
	case n.dirty <- struct{}{}:
	default:
	}
}

func (n *notifier) stop() { close(n.quit) }

// isLive reports whether the server confirmed this client's subscription to channel (so a
// release there counts this client among the subscribers that heard it).
func (n *notifier) isLive(channel string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.live[channel]
}

func (n *notifier) lookup(channel string) *queue {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.subs[channel]
}

func (n *notifier) onMessage(channel, payload string) {
	if q := n.lookup(channel); q != nil {
		token, err := strconv.ParseUint(payload, 10, 64)
		if err != nil {
			token = anyToken
		}
		q.wakeHead(token)
	}
}

func (n *notifier) onSubscribed(channel string) {
	n.mu.Lock()
	n.live[channel] = true
	q := n.subs[channel]
	n.mu.Unlock()
	if q != nil {
		q.wakeHead(anyToken)
	}
}

// wakeEveryHead wakes every queue's head: notices may have been missed.
func (n *notifier) wakeEveryHead() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, q := range n.subs {
		q.wakeHead(anyToken)
	}
}

func (n *notifier) run() {
	defer n.closeListener()
	backoff := time.Duration(0)
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		var lost <-chan error
		if n.ln != nil {
			lost = n.ln.Done()
		}
		select {
		case <-n.quit:
			return
		case <-n.dirty:
		case <-retry.C:
		case <-lost:
			n.closeListener()
			n.wakeEveryHead()
		}
		if err := n.syncSubscriptions(); err != nil {
			// Heads fall back on their holders' lease times until the subscription is back.
			n.closeListener()
			n.wakeEveryHead()
			backoff = min(max(2*backoff, 50*time.Millisecond), 2*time.Second)
			retry.Reset(backoff)
			continue
		}
		backoff = 0
	}
}

// syncSubscriptions makes the server-side subscriptions equal to subs.
func (n *notifier) syncSubscriptions() error {
	n.mu.Lock()
	var sub, unsub []string
	for ch := range n.subs {
		if !n.active[ch] {
			sub = append(sub, ch)
		}
	}
	for ch := range n.active {
		if n.subs[ch] == nil {
			unsub = append(unsub, ch)
			delete(n.live, ch) // a queue added from now on waits for the next confirmation
		}
	}
	n.mu.Unlock()
	if len(sub) == 0 && len(unsub) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if n.ln == nil {
		if len(sub) == 0 {
			clear(n.active)
			return nil
		}
		ln, err := n.listen(ctx, conn.Handler{Message: n.onMessage, Subscribed: n.onSubscribed})
		if err != nil {
			return err
		}
		n.ln = ln
	}
	if len(sub) > 0 {
		if err := n.ln.Subscribe(ctx, sub...); err != nil {
			return err
		}
		for _, ch := range sub {
			n.active[ch] = true
		}
	}
	if len(unsub) > 0 {
		if err := n.ln.Unsubscribe(ctx, unsub...); err != nil {
			return err
		}
		for _, ch := range unsub {
			delete(n.active, ch)
		}
	}
	return nil
}

func (n *notifier) closeListener() {
	n.mu.Lock()
	clear(n.live)
	n.mu.Unlock()
	if n.ln != nil {
		n.ln.Close()
		n.ln = nil
	}
	clear(n.active)
}
