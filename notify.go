package dlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/conn"

	"github.com/dlock-go/dlock/internal/backend"
	"github.com/dlock-go/dlock/internal/protocol"
)

// notifier is the one pub/sub subscription of a Client. Queues whose head waits for a lock
// register the lock's release channel; the notifier keeps the server-side subscriptions equal
// to that set, plus the channels whose last queue left less than linger ago (a client that
// locks a hot name again and again keeps its subscription), and routes each announcement to
// its queue, or, for a grant, to the engine. It opens its connection on first need and, when
// the connection drops, reopens it, subscribes again and wakes every head (an announcement may
// have been missed meanwhile). Waiters themselves hold no connection.
type notifier struct {
	listen func(context.Context, conn.Handler) (conn.Listener, error)      // the backend's
	grant  func(id string, token uint64, server int, window time.Duration) // a grant announced (engine.granted)
	// own: the prefix of this client's registration ids ("<client id>."): grants to them are
	// grant's to handle, never another client's turn to wait out.
	own string

	mu   sync.Mutex
	subs map[string]*queue // channel -> queue wanting its notices
	// live: channels whose subscription the server confirmed and that no unsubscribe has been
	// decided for since. A queue registered on a live channel hears every later notice but
	// gets no confirmation of its own.
	live map[string]bool
	// idle: channels no queue wants, kept subscribed since (mono ns) for linger; released:
	// the newest token a release announced on each of them meanwhile. A queue registered on
	// such a channel is woken if a release it may have missed (of the holder it waits for, or
	// later) was announced.
	idle     map[string]int64
	released map[string]uint64

	// watches: channels that an election's observers follow (Election.Observe, election.go),
	// each with the functions that take a poke for every notice there and for every
	// confirmation of its subscription; nwatch counts them, so that a client without observers
	// looks nothing up per notice.
	watches map[string]map[*watch]struct{}
	nwatch  atomic.Int32

	dirty chan struct{} // capacity 1: subs changed
	quit  chan struct{}

	// denied: the server refused the subscription for its access rules; waiting Locks fail
	// with it instead of falling back on lease times for ever.
	denied atomic.Pointer[error]

	// owned by run
	ln     conn.Listener
	active map[string]bool // channels subscribed on ln
	down   bool            // the subscription dropped and has not been made again yet

	ev *observer // reports the subscription dropping and coming back (observe.go)
}

func newNotifier(listen func(context.Context, conn.Handler) (conn.Listener, error), grant func(string, uint64, int, time.Duration)) *notifier {
	return &notifier{
		listen:   listen,
		grant:    grant,
		subs:     make(map[string]*queue),
		live:     make(map[string]bool),
		idle:     make(map[string]int64),
		released: make(map[string]uint64),
		watches:  make(map[string]map[*watch]struct{}),
		dirty:    make(chan struct{}, 1),
		quit:     make(chan struct{}),
		active:   make(map[string]bool),
	}
}

// linger is how long a channel stays subscribed after its last queue left, and maxIdle how
// many channels may linger at once.
const (
	linger  = time.Second
	maxIdle = 1024
)

// add routes channel's notices to q. Its head made an attempt before this call, and a release
// between that attempt and now sent a notice nobody routed to q: the head must try again once
// notices reach it. On a new subscription the server's confirmation wakes it (onSubscribed);
// on a channel still subscribed since a queue left, add wakes it if a release of the holder it
// waits for (or a later one) was announced meanwhile.
func (n *notifier) add(channel string, q *queue) {
	n.mu.Lock()
	n.subs[channel] = q
	_, lingering := n.idle[channel]
	delete(n.idle, channel)
	live := n.live[channel]
	missed := n.released[channel] >= q.blockedOn.Load()
	delete(n.released, channel)
	n.mu.Unlock()
	if !lingering {
		n.markDirty()
	}
	if live && (!lingering || missed) {
		q.wakeHead(anyToken)
	}
}

// remove stops routing channel to q (a newer queue for the same lock may have taken its place);
// the channel lingers.
func (n *notifier) remove(channel string, q *queue) {
	n.mu.Lock()
	if n.subs[channel] == q {
		delete(n.subs, channel)
		n.idle[channel] = mono()
		delete(n.released, channel)
	}
	n.mu.Unlock()
	n.markDirty()
}

// watch is one observer of a release channel: poke is called, from the subscription's
// goroutine, for every notice on the channel and every confirmation of its subscription (a
// notice may have been missed before it). It must not block.
type watch struct{ poke func() }

// watch routes every notice on channel, and every confirmation of its subscription, to w as a
// poke; a channel already subscribed pokes w at once.
func (n *notifier) watch(channel string, w *watch) {
	n.mu.Lock()
	ws := n.watches[channel]
	if ws == nil {
		ws = make(map[*watch]struct{})
		n.watches[channel] = ws
	}
	ws[w] = struct{}{}
	n.nwatch.Add(1)
	delete(n.idle, channel)
	live := n.live[channel]
	n.mu.Unlock()
	n.markDirty()
	if live {
		w.poke()
	}
}

// unwatch stops poking w; the channel lingers as a queue's does.
func (n *notifier) unwatch(channel string, w *watch) {
	n.mu.Lock()
	if ws := n.watches[channel]; ws != nil {
		if _, ok := ws[w]; ok {
			delete(ws, w)
			n.nwatch.Add(-1)
		}
		if len(ws) == 0 {
			delete(n.watches, channel)
			if n.subs[channel] == nil {
				n.idle[channel] = mono()
			}
		}
	}
	n.mu.Unlock()
	n.markDirty()
}

// pokeWatches pokes the observers of channel (every one of them when channel is empty: the
// subscription dropped, and notices may have been missed).
func (n *notifier) pokeWatches(channel string) {
	if n.nwatch.Load() == 0 {
		return
	}
	n.mu.Lock()
	var ws []*watch
	for ch, set := range n.watches {
		if channel == "" || ch == channel {
			for w := range set {
				ws = append(ws, w)
			}
		}
	}
	n.mu.Unlock()
	for _, w := range ws {
		w.poke()
	}
}

func (n *notifier) markDirty() {
	select {
	case n.dirty <- struct{}{}:
	default:
	}
}

func (n *notifier) stop() { close(n.quit) }

func (n *notifier) lookup(channel string) *queue {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.subs[channel]
}

// onMessage takes an announcement: "<token>" for a release (the head tries again unless it
// waits for a newer holder), "g <token> <registration id> <window ms>" for a grant (to this
// client's registration: the lease; to another's: the head keeps waiting for its own).
func (n *notifier) onMessage(channel, payload string) {
	server := 0
	if p, tag, ok := strings.Cut(payload, backend.ServerTag); ok { // quorum mode: which server said it
		payload = p
		server, _ = strconv.Atoi(tag)
	}
	n.pokeWatches(channel)
	if protocol.IsLeaderNotice(payload) {
		return // an election's new term, for its observers only
	}
	if q := n.lookup(channel); q != nil && q.sink != nil {
		q.sink.notice(payload) // a read-write lock's or semaphore's
		return
	}
	var one [1]protocol.Grant
	if grants, ok := protocol.ParseGrants(payload, one[:0]); ok {
		for _, g := range grants {
			if q := n.lookup(channel); q != nil && (n.own == "" || !strings.HasPrefix(g.ID, n.own)) {
				// Another client's grant: the head waits for it to be taken or to lapse. A grant
				// to this client (taken by grant, or a late one to a registration done with,
				// whose hold goes with that registration's release) holds nobody up.
				q.heldBy(g.Token, g.Window)
			}
			n.grant(g.ID, g.Token, server, g.Window)
		}
		return
	}
	token := protocol.ParseRelease(payload)
	n.mu.Lock()
	q := n.subs[channel]
	if _, ok := n.idle[channel]; ok && q == nil && token > n.released[channel] {
		n.released[channel] = token
	}
	n.mu.Unlock()
	if q != nil {
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
	n.pokeWatches(channel)
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
	expire := time.NewTimer(time.Hour) // the next lingering channel to let go
	expire.Stop()
	defer expire.Stop()
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
		case <-expire.C:
		case err := <-lost:
			n.refused(err)
			n.closeListener()
			n.wakeEveryHead()
			n.pokeWatches("")
			if !errors.Is(err, backend.ErrListenRetry) {
				n.dropped(err)
			}
		}
		if d := n.nextExpiry(); d >= 0 {
			expire.Reset(d)
		}
		if err := n.syncSubscriptions(); err != nil {
			// Heads fall back on their holders' lease times until the subscription is back,
			// unless the server refuses it for good.
			n.refused(err)
			n.closeListener()
			n.wakeEveryHead()
			n.pokeWatches("")
			n.dropped(err)
			backoff = min(max(2*backoff, 50*time.Millisecond), 2*time.Second)
			retry.Reset(backoff)
			continue
		}
		backoff = 0
		if n.down {
			// Subscribed again, or nothing left to subscribe (no waiter can miss a notice).
			n.down = false
			if n.ev != nil {
				n.ev.subscription(true, nil)
			}
		}
	}
}

// dropped records that the subscription was lost (err says why), and reports it the first
// time after it was up.
func (n *notifier) dropped(err error) {
	if n.down {
		return
	}
	n.down = true
	if n.ev != nil {
		n.ev.subscription(false, err)
	}
}

// nextExpiry returns when the oldest lingering channel is due to go (-1: none).
func (n *notifier) nextExpiry() time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	oldest := int64(-1)
	for _, since := range n.idle {
		if oldest < 0 || since < oldest {
			oldest = since
		}
	}
	if oldest < 0 {
		return -1
	}
	return max(time.Duration(oldest+int64(linger)-mono()), 0)
}

// syncSubscriptions makes the server-side subscriptions equal to subs and the channels still
// lingering.
func (n *notifier) syncSubscriptions() error {
	n.mu.Lock()
	now := mono()
	for len(n.idle) > maxIdle {
		var oldestCh string
		oldest := int64(-1)
		for ch, since := range n.idle {
			if oldest < 0 || since < oldest {
				oldestCh, oldest = ch, since
			}
		}
		delete(n.idle, oldestCh)
	}
	for ch, since := range n.idle {
		if now-since >= int64(linger) {
			delete(n.idle, ch)
			delete(n.released, ch)
		}
	}
	var sub, unsub []string
	for ch := range n.subs {
		if !n.active[ch] {
			sub = append(sub, ch)
		}
	}
	for ch := range n.watches {
		if !n.active[ch] && n.subs[ch] == nil {
			sub = append(sub, ch)
		}
	}
	for ch := range n.active {
		if _, lingering := n.idle[ch]; n.subs[ch] == nil && n.watches[ch] == nil && !lingering {
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
	clear(n.idle)
	clear(n.released)
	n.mu.Unlock()
	if n.ln != nil {
		n.ln.Close()
		n.ln = nil
	}
	clear(n.active)
}

// deniedErr returns the server's refusal of the subscription, if it refused.
func (n *notifier) deniedErr() error {
	if p := n.denied.Load(); p != nil {
		return *p
	}
	return nil
}

// refused records err if it is the server's refusal of the subscription for its access rules
// (some clients report it when subscribing, others when the connection then ends).
func (n *notifier) refused(err error) {
	if err == nil || classify(err) != ErrDenied {
		return
	}
	err = fmt.Errorf("%w: the server refuses this user SUBSCRIBE on the release channels, which waiting needs: add +subscribe +unsubscribe (and +ssubscribe +sunsubscribe on a Cluster) to its ACL rule (docs/SECURITY.md): %v", ErrDenied, err)
	n.denied.Store(&err)
}
