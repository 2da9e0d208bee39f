package shardsub

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/slot"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// cluster is a fake set of masters: a slot's owner is owner(slot).
type cluster struct {
	t       *testing.T
	owner   func(s int) string
	openErr error

	mu      sync.Mutex
	opened  []string
	nodes   map[string]*node
	lookups int
}

func newCluster(t *testing.T, owner func(s int) string) *cluster {
	return &cluster{t: t, owner: owner, nodes: make(map[string]*node)}
}

func (c *cluster) master(_ context.Context, channel string) (Master, error) {
	c.mu.Lock()
	c.lookups++
	c.mu.Unlock()
	addr := c.owner(slot.Of(channel))
	if addr == "" {
		return nil, fmt.Errorf("no owner for %s", channel)
	}
	return master{c, addr}, nil
}

// node returns the node opened to addr, failing the test if there is none.
func (c *cluster) node(addr string) *node {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[addr]
	if n == nil {
		c.t.Fatalf("no connection opened to %s", addr)
	}
	return n
}

type master struct {
	c    *cluster
	addr string
}

func (m master) Addr() string { return m.addr }

func (m master) Open(ev Events) (Node, error) {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	if m.c.openErr != nil {
		return nil, m.c.openErr
	}
	m.c.opened = append(m.c.opened, m.addr)
	n := &node{ev: ev, end: make(chan error, 1), closed: make(chan struct{})}
	m.c.nodes[m.addr] = n
	return n, nil
}

// node is a fake connection: it records what it sent; the test reports events through ev and
// ends the connection with end.
type node struct {
	ev       Events
	end      chan error
	closed   chan struct{}
	close    sync.Once
	mu       sync.Mutex
	sent     []string // "SSUBSCRIBE a b", "SUNSUBSCRIBE c"
	sendErr  error
	waitDone atomic.Bool
}

func (n *node) record(cmd string, channels []string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.sendErr != nil {
		return n.sendErr
	}
	n.sent = append(n.sent, cmd+" "+strings.Join(channels, " "))
	return nil
}

func (n *node) Subscribe(_ context.Context, channels []string) error {
	return n.record("SSUBSCRIBE", channels)
}

func (n *node) Unsubscribe(_ context.Context, channels []string) error {
	return n.record("SUNSUBSCRIBE", channels)
}

func (n *node) Wait() error {
	defer n.waitDone.Store(true)
	select {
	case err := <-n.end:
		return err
	case <-n.closed:
		return nil
	}
}

func (n *node) Close() { n.close.Do(func() { close(n.closed) }) }

func (n *node) isClosed() bool {
	select {
	case <-n.closed:
		return true
	default:
		return false
	}
}

func (n *node) commands() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.sent)
}

// recorder is a conn.Handler that records its calls and fails the test if two overlap.
type recorder struct {
	t      *testing.T
	inside atomic.Int32
	mu     sync.Mutex
	events []string
}

func (r *recorder) handler() conn.Handler {
	enter := func(ev string) {
		if r.inside.Add(1) != 1 {
			r.t.Error("two handler calls at once")
		}
		time.Sleep(50 * time.Microsecond)
		r.mu.Lock()
		r.events = append(r.events, ev)
		r.mu.Unlock()
		r.inside.Add(-1)
	}
	return conn.Handler{
		Message:    func(ch, payload string) { enter("message " + ch + " " + payload) },
		Subscribed: func(ch string) { enter("subscribed " + ch) },
	}
}

func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// Channels named so that their slots are known: "{a}x" and "{a}y" share a slot.
var (
	chA1, chA2 = "{a}1", "{a}2" // one slot
	chB        = "{b}"
	chC        = "{c}"
)

// twoMasters puts slot.Of(chB)'s and slot.Of(chC)'s slots on m2, every other on m1.
func twoMasters(s int) string {
	if s == slot.Of(chB) || s == slot.Of(chC) {
		return "m2"
	}
	return "m1"
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func waitDone(t *testing.T, l *Listener) error {
	t.Helper()
	select {
	case err := <-l.Done():
		if _, open := <-l.Done(); open {
			t.Error("Done delivered a second value")
		}
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed")
		return nil
	}
}

func notDone(t *testing.T, l *Listener) {
	t.Helper()
	select {
	case err := <-l.Done():
		t.Fatalf("listener ended: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
}

// Channels go to their slot's master, one SSUBSCRIBE per slot, over one connection per master
// opened on first use; events reach the handler.
func TestSubscribe(t *testing.T) {
	c := newCluster(t, twoMasters)
	r := &recorder{t: t}
	l := New(r.handler(), c.master)
	defer l.Close()
	if err := l.Subscribe(ctx(t), chA1, chB, chA2, chC); err != nil {
		t.Fatal(err)
	}
	if err := l.Subscribe(ctx(t), chB); err != nil {
		t.Fatal(err)
	}
	if want := []string{"m1", "m2"}; !slices.Equal(c.opened, want) {
		t.Errorf("opened %v, want %v", c.opened, want)
	}
	if got, want := c.node("m1").commands(), []string{"SSUBSCRIBE {a}1 {a}2"}; !slices.Equal(got, want) {
		t.Errorf("m1 got %q, want %q", got, want)
	}
	if got, want := c.node("m2").commands(), []string{"SSUBSCRIBE {b}", "SSUBSCRIBE {c}", "SSUBSCRIBE {b}"}; !slices.Equal(got, want) {
		t.Errorf("m2 got %q, want %q", got, want)
	}
	ev := c.node("m1").ev
	ev.Subscription("ssubscribe", chA1)
	ev.Subscription("subscribe", chA2) // not sharded: not ours
	ev.Message(chA1, "7")
	if got, want := r.got(), []string{"subscribed {a}1", "message {a}1 7"}; !slices.Equal(got, want) {
		t.Errorf("handler got %q, want %q", got, want)
	}
	notDone(t, l)
}

// Our own SUNSUBSCRIBE, once confirmed, does not end the listener; one the server sends on its
// own (the slot moved) does, with an error, and nothing reaches the handler afterwards.
func TestUnsubscribe(t *testing.T) {
	c := newCluster(t, twoMasters)
	r := &recorder{t: t}
	l := New(r.handler(), c.master)
	defer l.Close()
	if err := l.Subscribe(ctx(t), chA1, chA2); err != nil {
		t.Fatal(err)
	}
	// No connection to m2: nothing to unsubscribe there, and none is opened.
	if err := l.Unsubscribe(ctx(t), chA1, chB); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.opened, []string{"m1"}) {
		t.Errorf("opened %v, want only m1", c.opened)
	}
	m1 := c.node("m1")
	if got, want := m1.commands(), []string{"SSUBSCRIBE {a}1 {a}2", "SUNSUBSCRIBE {a}1"}; !slices.Equal(got, want) {
		t.Errorf("m1 got %q, want %q", got, want)
	}
	m1.ev.Subscription("sunsubscribe", chA1)
	notDone(t, l)

	// Asked twice, confirmed twice: still ours.
	for range 2 {
		if err := l.Unsubscribe(ctx(t), chA2); err != nil {
			t.Fatal(err)
		}
	}
	m1.ev.Subscription("sunsubscribe", chA2)
	m1.ev.Subscription("sunsubscribe", chA2)
	notDone(t, l)

	// A third one we did not ask for.
	m1.ev.Subscription("sunsubscribe", chA2)
	m1.ev.Message(chA1, "late")
	m1.ev.Subscription("ssubscribe", chA1)
	err := waitDone(t, l)
	if err == nil || !strings.Contains(err.Error(), chA2) || !strings.Contains(err.Error(), "slot moved") {
		t.Errorf("Done: %v, want an error naming %s and the slot move", err, chA2)
	}
	if len(r.got()) != 0 {
		t.Errorf("handler got %q after the listener failed", r.got())
	}
	if !m1.isClosed() {
		t.Error("the node connection is still open")
	}
	if err := l.Subscribe(ctx(t), chA1); err == nil {
		t.Error("Subscribe on an ended listener succeeded")
	}
}

// A node connection that ends, with an error or without, ends the listener with an error
// naming the node.
func TestNodeEnds(t *testing.T) {
	for _, cause := range []error{errors.New("connection reset"), nil} {
		c := newCluster(t, twoMasters)
		r := &recorder{t: t}
		l := New(r.handler(), c.master)
		if err := l.Subscribe(ctx(t), chA1, chB); err != nil {
			t.Fatal(err)
		}
		c.node("m2").end <- cause
		err := waitDone(t, l)
		if err == nil || !strings.Contains(err.Error(), "m2") || (cause != nil && !errors.Is(err, cause)) || (cause == nil && !strings.Contains(err.Error(), "closed")) {
			t.Errorf("ended with %v: Done: %v", cause, err)
		}
		if !c.node("m1").isClosed() {
			t.Error("the other node connection is still open")
		}
		l.Close()
	}
}

// Close closes every node connection, closes Done without an error, and returns once every
// goroutine of the listener has; it stays quiet afterwards.
func TestClose(t *testing.T) {
	c := newCluster(t, twoMasters)
	r := &recorder{t: t}
	l := New(r.handler(), c.master)
	if err := l.Subscribe(ctx(t), chA1, chB); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if err := waitDone(t, l); err != nil {
		t.Errorf("Done after Close: %v", err)
	}
	for _, addr := range []string{"m1", "m2"} {
		n := c.node(addr)
		if !n.isClosed() || !n.waitDone.Load() {
			t.Errorf("%s: closed %v, Wait returned %v", addr, n.isClosed(), n.waitDone.Load())
		}
		n.ev.Message(chA1, "late")
		n.ev.Subscription("sunsubscribe", chA1)
	}
	if len(r.got()) != 0 {
		t.Errorf("handler got %q after Close", r.got())
	}
	if err := l.Subscribe(ctx(t), chA1); err == nil {
		t.Error("Subscribe after Close succeeded")
	}
	if err := l.Unsubscribe(ctx(t), chA1); err == nil {
		t.Error("Unsubscribe after Close succeeded")
	}
	l.Close()
}

// A slot without a known owner, or a connection that cannot be opened, fails Subscribe.
func TestErrors(t *testing.T) {
	c := newCluster(t, func(s int) string {
		if s == slot.Of(chB) {
			return ""
		}
		return "m1"
	})
	l := New(conn.Handler{Message: func(string, string) {}, Subscribed: func(string) {}}, c.master)
	defer l.Close()
	if err := l.Subscribe(ctx(t), chA1, chB); err == nil || !strings.Contains(err.Error(), chB) {
		t.Errorf("Subscribe to a slot without owner: %v", err)
	}
	if len(c.opened) != 0 {
		t.Errorf("opened %v before finding every slot's master", c.opened)
	}
	c.openErr = errors.New("cannot connect")
	if err := l.Subscribe(ctx(t), chA1); !errors.Is(err, c.openErr) {
		t.Errorf("Subscribe with a failing Open: %v", err)
	}
	c.openErr = nil
	if err := l.Subscribe(ctx(t), chA1); err != nil {
		t.Fatal(err)
	}
	send := errors.New("write failed")
	c.node("m1").sendErr = send
	if err := l.Subscribe(ctx(t), chA2); !errors.Is(err, send) {
		t.Errorf("Subscribe with a failing send: %v", err)
	}
}

// Events from several node connections at once reach the handler one at a time.
func TestHandlerCallsSerialized(t *testing.T) {
	c := newCluster(t, twoMasters)
	r := &recorder{t: t}
	l := New(r.handler(), c.master)
	defer l.Close()
	if err := l.Subscribe(ctx(t), chA1, chB); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, addr := range []string{"m1", "m2"} {
		ev := c.node(addr).ev
		wg.Go(func() {
			for i := range 50 {
				ev.Message(addr, fmt.Sprint(i))
				ev.Subscription("ssubscribe", addr)
			}
		})
	}
	wg.Wait()
	if n := len(r.got()); n != 200 {
		t.Errorf("handler got %d events, want 200", n)
	}
}

// An Unsubscribe that fails leaves nothing pending for the channels it did not send: the
// server ending one of those subscriptions later still ends the listener. What it sent before
// the failure stays ours.
func TestUnsubscribeFailed(t *testing.T) {
	const chD = "{d}" // on m1, in another slot than chA1
	c := newCluster(t, twoMasters)
	l := New(conn.Handler{Message: func(string, string) {}, Subscribed: func(string) {}}, c.master)
	defer l.Close()
	if err := l.Subscribe(ctx(t), chB, chA1, chD); err != nil {
		t.Fatal(err)
	}
	send := errors.New("write failed")
	c.node("m1").sendErr = send
	if err := l.Unsubscribe(ctx(t), chB, chA1, chD); !errors.Is(err, send) {
		t.Fatalf("Unsubscribe: %v, want %v", err, send)
	}
	c.node("m2").ev.Subscription("sunsubscribe", chB)
	notDone(t, l)
	c.node("m1").ev.Subscription("sunsubscribe", chD)
	if err := waitDone(t, l); err == nil || !strings.Contains(err.Error(), chD) {
		t.Errorf("Done: %v, want an error naming %s", err, chD)
	}
}
