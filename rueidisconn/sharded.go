package rueidisconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"

	"github.com/redis/rueidis"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/slot"
)

// shardedListener subscribes with SSUBSCRIBE on a Redis Cluster: each channel on the master
// that owns its slot, over one dedicated connection per such node. The slot owners are read
// (CLUSTER SLOTS) when the listener opens; when a slot moves, the server unsubscribes the
// channel itself (sunsubscribe) and the listener ends (Done), so that the caller opens a new
// one, which reads the slots again.
type shardedListener struct {
	a *adapter
	h conn.Handler

	hmu   sync.Mutex // one handler call at a time; none once quiet
	quiet bool

	mu      sync.Mutex
	stopped bool
	owners  [16384]string // master address per slot
	nodes   map[string]*nodeSub
	pending map[string]int // channels we asked to SUNSUBSCRIBE, not yet confirmed

	fail chan error // the first failure, for the supervisor
	done chan error
	wg   sync.WaitGroup
}

type nodeSub struct {
	dc      rueidis.DedicatedClient
	release func()
}

func (a *adapter) listenSharded(ctx context.Context, h conn.Handler) (conn.Listener, error) {
	l := &shardedListener{
		a:       a,
		h:       h,
		nodes:   make(map[string]*nodeSub),
		pending: make(map[string]int),
		fail:    make(chan error, 1),
		done:    make(chan error, 1),
	}
	if err := l.readSlots(ctx); err != nil {
		return nil, fmt.Errorf("pub/sub on cluster %s: %w", a.addr, err)
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		select {
		case err := <-l.fail:
			l.stop(err)
		case <-l.done:
		}
	}()
	return l, nil
}

// readSlots fills owners from CLUSTER SLOTS.
func (l *shardedListener) readSlots(ctx context.Context) error {
	dctx, done := noDeadline(ctx)
	defer done()
	ranges, err := l.a.c.Do(dctx, l.a.c.B().ClusterSlots().Build()).ToArray()
	if err = ctxCause(ctx, err); err != nil {
		return err
	}
	for _, r := range ranges {
		v, err := r.ToArray()
		if err != nil || len(v) < 3 {
			return fmt.Errorf("unexpected CLUSTER SLOTS entry: %v", err)
		}
		lo, err1 := v[0].AsInt64()
		hi, err2 := v[1].AsInt64()
		node, err3 := v[2].ToArray()
		if err := errors.Join(err1, err2, err3); err != nil || len(node) < 2 || lo < 0 || hi >= 16384 {
			return fmt.Errorf("unexpected CLUSTER SLOTS entry: %v", err)
		}
		host, err1 := node[0].ToString()
		port, err2 := node[1].AsInt64()
		if err := errors.Join(err1, err2); err != nil {
			return fmt.Errorf("unexpected CLUSTER SLOTS node: %w", err)
		}
		addr := net.JoinHostPort(host, strconv.FormatInt(port, 10))
		for s := lo; s <= hi; s++ {
			l.owners[s] = addr
		}
	}
	return nil
}

// node returns the subscription connection to addr, opening it if needed. Called with l.mu held.
func (l *shardedListener) node(addr string) (*nodeSub, error) {
	if n := l.nodes[addr]; n != nil {
		return n, nil
	}
	c := l.a.c.Nodes()[addr]
	if c == nil {
		return nil, fmt.Errorf("cluster node %s (owner of a channel's slot) is unknown to the client", addr)
	}
	dc, release := c.Dedicate()
	errs := dc.SetPubSubHooks(rueidis.PubSubHooks{
		OnMessage:      l.onMessage,
		OnSubscription: l.onSubscription,
	})
	n := &nodeSub{dc: dc, release: release}
	l.nodes[addr] = n
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		lost := false
		for err := range errs {
			if err != nil && !errors.Is(err, rueidis.ErrClosing) {
				l.failWith(fmt.Errorf("pub/sub connection to %s: %w", addr, err))
				lost = true
			}
		}
		if !lost && !l.isStopped() {
			l.failWith(fmt.Errorf("pub/sub connection to %s closed", addr))
		}
	}()
	return n, nil
}

func (l *shardedListener) isStopped() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stopped
}

func (l *shardedListener) onMessage(m rueidis.PubSubMessage) {
	l.hmu.Lock()
	defer l.hmu.Unlock()
	if !l.quiet {
		l.h.Message(m.Channel, m.Message)
	}
}

func (l *shardedListener) onSubscription(s rueidis.PubSubSubscription) {
	switch s.Kind {
	case "ssubscribe":
		l.hmu.Lock()
		if !l.quiet {
			l.h.Subscribed(s.Channel)
		}
		l.hmu.Unlock()
	case "sunsubscribe":
		l.mu.Lock()
		asked := l.pending[s.Channel] > 0
		if asked {
			if l.pending[s.Channel]--; l.pending[s.Channel] == 0 {
				delete(l.pending, s.Channel)
			}
		}
		l.mu.Unlock()
		if !asked {
			// The server dropped the subscription: the channel's slot moved to another node.
			l.failWith(fmt.Errorf("the server ended the subscription to %s (its slot moved)", s.Channel))
		}
	}
}

// failWith ends the listener with err, once, from any goroutine (also rueidis' hook goroutine:
// the supervisor goroutine does the closing).
func (l *shardedListener) failWith(err error) {
	l.hmu.Lock()
	l.quiet = true // nothing more reaches the handler
	l.hmu.Unlock()
	select {
	case l.fail <- err:
	default:
	}
}

// groups returns channels by owning node address, and by slot within each node.
func (l *shardedListener) groups(channels []string) map[string]map[uint16][]string {
	out := make(map[string]map[uint16][]string)
	for _, ch := range channels {
		slot := uint16(slot.Of(ch))
		addr := l.owners[slot]
		if out[addr] == nil {
			out[addr] = make(map[uint16][]string)
		}
		out[addr][slot] = append(out[addr][slot], ch)
	}
	return out
}

// Subscribe sends one SSUBSCRIBE per slot, each on the connection to the slot's master.
func (l *shardedListener) Subscribe(ctx context.Context, channels ...string) error {
	return l.send(ctx, channels, true)
}

// Unsubscribe sends one SUNSUBSCRIBE per slot.
func (l *shardedListener) Unsubscribe(ctx context.Context, channels ...string) error {
	return l.send(ctx, channels, false)
}

func (l *shardedListener) send(ctx context.Context, channels []string, sub bool) error {
	type job struct {
		n   *nodeSub
		chs []string
	}
	var jobs []job
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return errors.New("pub/sub listener closed")
	}
	for addr, bySlot := range l.groups(channels) {
		if addr == "" {
			l.mu.Unlock()
			return fmt.Errorf("no cluster node serves the slot of channel %s", bySlot[firstKey(bySlot)][0])
		}
		var n *nodeSub
		if sub {
			var err error
			if n, err = l.node(addr); err != nil {
				l.mu.Unlock()
				return err
			}
		} else if n = l.nodes[addr]; n == nil {
			continue // never subscribed there
		}
		for _, chs := range bySlot {
			jobs = append(jobs, job{n, chs})
			if !sub {
				for _, ch := range chs {
					l.pending[ch]++
				}
			}
		}
	}
	l.mu.Unlock()
	for _, j := range jobs {
		var cmd rueidis.Completed
		if sub {
			cmd = j.n.dc.B().Ssubscribe().Channel(j.chs...).Build()
		} else {
			cmd = j.n.dc.B().Sunsubscribe().Channel(j.chs...).Build()
		}
		if err := j.n.dc.Do(ctx, cmd).Error(); err != nil {
			return err
		}
	}
	return nil
}

func firstKey(m map[uint16][]string) uint16 {
	for k := range m {
		return k
	}
	return 0
}

func (l *shardedListener) Done() <-chan error { return l.done }

// stop closes every node connection and then Done, after err if not nil. Only the first call
// does anything.
func (l *shardedListener) stop(err error) {
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
		n.dc.Close()
		n.release()
	}
	if err != nil {
		l.done <- err
	}
	close(l.done)
}

func (l *shardedListener) Close() error {
	l.stop(nil)
	l.wg.Wait()
	return nil
}
