// Package shardsub is the conn.Listener both adapters give on a Redis Cluster: it subscribes
// each channel with SSUBSCRIBE on the master that owns the channel's slot, over one pub/sub
// connection per such master. When a slot moves, the server unsubscribes the channel itself
// (sunsubscribe) and the listener ends (Done), so that the caller opens a new one, which finds
// the slots' owners again. The adapters supply only what depends on the client library: which
// master owns a channel's slot (Master), and a pub/sub connection to it (Node).
package shardsub

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/slot"
)

// Master is a cluster master that owns the slot of a channel.
type Master interface {
	// Addr names the master; the listener keeps one Node per address.
	Addr() string
	// Open opens a pub/sub connection to the master whose events go to ev. The listener calls
	// it holding its lock, so it must not wait for an event.
	Open(ev Events) (Node, error)
}

// Node is one pub/sub connection to a master. The listener runs Wait on a goroutine of its own
// and may call the other methods meanwhile, from several goroutines.
type Node interface {
	// Subscribe sends SSUBSCRIBE for channels, which share a slot. The server's confirmations
	// go to the Events the Node was opened with; Subscribe may return before them.
	Subscribe(ctx context.Context, channels []string) error
	// Unsubscribe sends SUNSUBSCRIBE for channels, which share a slot.
	Unsubscribe(ctx context.Context, channels []string) error
	// Wait returns when the connection has ended, closed by Close or lost, with the error
	// that ended it if there was one. After Close, what it returns is not used.
	Wait() error
	// Close closes the connection; Wait then returns.
	Close()
}

// Events is where a Node reports what its connection reads. Its methods may be called from
// any goroutine (a client library's own, or the one running Wait).
type Events struct{ l *Listener }

// Message reports a message published on channel.
func (e Events) Message(channel, payload string) {
	e.l.hmu.Lock()
	defer e.l.hmu.Unlock()
	if !e.l.quiet {
		e.l.h.Message(channel, payload)
	}
}

// Subscription reports a subscription event of the given kind ("ssubscribe", "sunsubscribe";
// others are ignored) for channel.
func (e Events) Subscription(kind, channel string) {
	l := e.l
	switch kind {
	case "ssubscribe":
		l.hmu.Lock()
		if !l.quiet {
			l.h.Subscribed(channel)
		}
		l.hmu.Unlock()
	case "sunsubscribe":
		l.mu.Lock()
		asked := l.pending[channel] > 0
		if asked {
			l.unpend(channel)
		}
		l.mu.Unlock()
		if !asked {
			// The server dropped the subscription: the channel's slot moved to another node.
			l.failWith(fmt.Errorf("the server ended the subscription to %s (its slot moved)", channel))
		}
	}
}

// Listener is a sharded pub/sub listener (see the package documentation).
type Listener struct {
	master func(ctx context.Context, channel string) (Master, error)
	h      conn.Handler

	hmu   sync.Mutex // one handler call at a time; none once quiet
	quiet bool

	mu      sync.Mutex
	stopped bool
	nodes   map[string]Node // by master address
	pending map[string]int  // channels we asked to SUNSUBSCRIBE, not yet confirmed

	fail chan error // the first failure, for the supervisor
	done chan error
	wg   sync.WaitGroup
}

var _ conn.Listener = (*Listener)(nil)

// New returns a listener whose events go to h. master returns the master that owns the slot of
// a channel; the listener calls it without holding its lock, so it may ask the server.
func New(h conn.Handler, master func(ctx context.Context, channel string) (Master, error)) *Listener {
	l := &Listener{
		master:  master,
		h:       h,
		nodes:   make(map[string]Node),
		pending: make(map[string]int),
		fail:    make(chan error, 1),
		done:    make(chan error, 1),
	}
	// A failure may be reported from a client library's goroutine that closing its own
	// connection would wait for: this goroutine does the closing.
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		select {
		case err := <-l.fail:
			l.stop(err)
		case <-l.done:
		}
	}()
	return l
}

// node returns the connection to m, opening it if needed. Called with l.mu held.
func (l *Listener) node(m Master) (Node, error) {
	addr := m.Addr()
	if n := l.nodes[addr]; n != nil {
		return n, nil
	}
	n, err := m.Open(Events{l})
	if err != nil {
		return nil, err
	}
	l.nodes[addr] = n
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		err := n.Wait()
		switch {
		case l.isStopped():
		case err != nil:
			l.failWith(fmt.Errorf("pub/sub connection to %s: %w", addr, err))
		default:
			l.failWith(fmt.Errorf("pub/sub connection to %s closed", addr))
		}
	}()
	return n, nil
}

func (l *Listener) isStopped() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stopped
}

// unpend forgets one SUNSUBSCRIBE we asked for on channel. Called with l.mu held.
func (l *Listener) unpend(channel string) {
	if l.pending[channel]--; l.pending[channel] <= 0 {
		delete(l.pending, channel)
	}
}

// failWith ends the listener with err, once, from any goroutine.
func (l *Listener) failWith(err error) {
	l.hmu.Lock()
	l.quiet = true // nothing more reaches the handler
	l.hmu.Unlock()
	select {
	case l.fail <- err:
	default:
	}
}

// Subscribe sends one SSUBSCRIBE per slot, each on the connection to the slot's master.
func (l *Listener) Subscribe(ctx context.Context, channels ...string) error {
	return l.send(ctx, channels, true)
}

// Unsubscribe sends one SUNSUBSCRIBE per slot, to the masters it has connections to.
func (l *Listener) Unsubscribe(ctx context.Context, channels ...string) error {
	return l.send(ctx, channels, false)
}

func (l *Listener) send(ctx context.Context, channels []string, sub bool) error {
	type job struct {
		m   Master
		n   Node
		chs []string
	}
	var jobs []job
	bySlot := make(map[int]int) // index in jobs
	for _, ch := range channels {
		s := slot.Of(ch)
		i, ok := bySlot[s]
		if !ok {
			i = len(jobs)
			bySlot[s] = i
			jobs = append(jobs, job{})
		}
		jobs[i].chs = append(jobs[i].chs, ch)
	}
	for i := range jobs {
		m, err := l.master(ctx, jobs[i].chs[0])
		if err != nil {
			return err
		}
		jobs[i].m = m
	}
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return errors.New("pub/sub listener closed")
	}
	todo := jobs[:0]
	for _, j := range jobs {
		if sub {
			var err error
			if j.n, err = l.node(j.m); err != nil {
				l.mu.Unlock()
				return err
			}
		} else if j.n = l.nodes[j.m.Addr()]; j.n == nil {
			continue // never subscribed there
		} else {
			for _, ch := range j.chs {
				l.pending[ch]++
			}
		}
		todo = append(todo, j)
	}
	l.mu.Unlock()
	for i, j := range todo {
		var err error
		if sub {
			err = j.n.Subscribe(ctx, j.chs)
		} else {
			err = j.n.Unsubscribe(ctx, j.chs)
		}
		if err != nil {
			if !sub {
				// What was not sent will not be confirmed: left pending, it would hide the
				// server ending that subscription when its slot moves. If the failed one did
				// reach the server, its confirmation ends the listener, which is safe.
				l.mu.Lock()
				for _, j := range todo[i:] {
					for _, ch := range j.chs {
						l.unpend(ch)
					}
				}
				l.mu.Unlock()
			}
			return err
		}
	}
	return nil
}

// Done: see conn.Listener.
func (l *Listener) Done() <-chan error { return l.done }

// stop closes every node connection and then Done, after err if not nil. Only the first call
// does anything.
func (l *Listener) stop(err error) {
	l.hmu.Lock()
	l.quiet = true
	l.hmu.Unlock()
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return
	}
	l.stopped = true
	nodes := l.nodes
	l.nodes = nil
	l.mu.Unlock()
	for _, n := range nodes {
		n.Close()
	}
	if err != nil {
		l.done <- err
	}
	close(l.done)
}

// Close closes every node connection and waits for the listener's goroutines to end.
func (l *Listener) Close() error {
	l.stop(nil)
	l.wg.Wait()
	return nil
}
