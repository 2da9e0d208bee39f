package goredisconn

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/slot"
)

// shardedListener subscribes with SSUBSCRIBE on a Redis Cluster: each channel on the master
// that owns its slot, over one pub/sub connection per such node. When a slot moves, the server
// unsubscribes the channel itself (sunsubscribe) and the listener ends (Done), so that the
// caller opens a new one, which asks the client for the slots' owners again.
type shardedListener struct {
	a *adapter
	h conn.Handler

	hmu   sync.Mutex // one handler call at a time; none once quiet
	quiet bool

	mu      sync.Mutex
	stopped bool
	nodes   map[string]*redis.PubSub // by node address
	pending map[string]int           // channels we asked to SUNSUBSCRIBE, not yet confirmed

	rctx   context.Context // the readers' context, cancelled by stop
	cancel context.CancelFunc
	fail   chan error
	done   chan error
	wg     sync.WaitGroup
}

func (a *adapter) listenSharded(ctx context.Context, h conn.Handler) (conn.Listener, error) {
	// Fail here, as the single-server listener does, if the cluster cannot be reached.
	if err := a.cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		return c.Ping(ctx).Err()
	}); err != nil {
		return nil, fmt.Errorf("pub/sub on cluster %s: %w", a.addr, err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	l := &shardedListener{
		a:       a,
		h:       h,
		nodes:   make(map[string]*redis.PubSub),
		pending: make(map[string]int),
		rctx:    rctx,
		cancel:  cancel,
		fail:    make(chan error, 1),
		done:    make(chan error, 1),
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

// node returns the pub/sub connection to c's node, opening it if needed. Called with l.mu held.
func (l *shardedListener) node(c *redis.Client) *redis.PubSub {
	addr := c.Options().Addr
	if ps := l.nodes[addr]; ps != nil {
		return ps
	}
	ps := c.SSubscribe(l.rctx)
	l.nodes[addr] = ps
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for {
			msg, err := ps.Receive(l.rctx)
			if err != nil {
				if l.rctx.Err() == nil {
					l.failWith(fmt.Errorf("pub/sub connection to %s: %w", addr, err))
				}
				return
			}
			switch m := msg.(type) {
			case *redis.Message:
				l.hmu.Lock()
				if !l.quiet {
					l.h.Message(m.Channel, m.Payload)
				}
				l.hmu.Unlock()
			case *redis.Subscription:
				l.onSubscription(m)
			}
		}
	}()
	return ps
}

func (l *shardedListener) onSubscription(s *redis.Subscription) {
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

// failWith ends the listener with err, once; the supervisor goroutine does the closing.
func (l *shardedListener) failWith(err error) {
	l.hmu.Lock()
	l.quiet = true
	l.hmu.Unlock()
	select {
	case l.fail <- err:
	default:
	}
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
		ps  *redis.PubSub
		chs []string
	}
	bySlot := make(map[int][]string)
	for _, ch := range channels {
		bySlot[slot.Of(ch)] = append(bySlot[slot.Of(ch)], ch)
	}
	// Ask the client for each slot's master before taking the lock (it may have to load the
	// cluster's slots first).
	owners := make(map[int]*redis.Client, len(bySlot))
	for slot, chs := range bySlot {
		c, err := l.a.cc.MasterForKey(ctx, chs[0])
		if err != nil {
			return err
		}
		owners[slot] = c
	}
	var jobs []job
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return errors.New("pub/sub listener closed")
	}
	for slot, chs := range bySlot {
		var ps *redis.PubSub
		if sub {
			ps = l.node(owners[slot])
		} else if ps = l.nodes[owners[slot].Options().Addr]; ps == nil {
			continue // never subscribed there
		} else {
			for _, ch := range chs {
				l.pending[ch]++
			}
		}
		jobs = append(jobs, job{ps, chs})
	}
	l.mu.Unlock()
	for _, j := range jobs {
		var err error
		if sub {
			err = j.ps.SSubscribe(ctx, j.chs...)
		} else {
			err = j.ps.SUnsubscribe(ctx, j.chs...)
		}
		if err != nil {
			return err
		}
	}
	return nil
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
	l.cancel()
	for _, ps := range nodes {
		_ = ps.Close()
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
