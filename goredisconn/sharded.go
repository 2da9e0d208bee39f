package goredisconn

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/shardsub"
)

// listenSharded opens a sharded listener (see package shardsub), with one *redis.PubSub per
// master. The client tells which master owns a channel's slot (MasterForKey), from the slots it
// loaded; a listener that outlives a slot move ends (Done), and the caller's next one asks the
// client again.
func (a *adapter) listenSharded(ctx context.Context, h conn.Handler) (conn.Listener, error) {
	// Fail here, as the single-server listener does, if the cluster cannot be reached.
	if err := a.cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		return c.Ping(ctx).Err()
	}); err != nil {
		return nil, fmt.Errorf("pub/sub on cluster %s: %w", a.addr, err)
	}
	return shardsub.New(h, func(ctx context.Context, channel string) (shardsub.Master, error) {
		c, err := a.cc.MasterForKey(ctx, channel)
		if err != nil {
			return nil, err
		}
		return master{c}, nil
	}), nil
}

type master struct{ c *redis.Client }

func (m master) Addr() string { return m.c.Options().Addr }

// Open makes a PubSub on the master's client (it connects when first used); go-redis delivers
// its events to whoever calls Receive, which Wait does.
func (m master) Open(ev shardsub.Events) (shardsub.Node, error) {
	ctx, cancel := context.WithCancel(context.Background())
	return &node{ps: m.c.SSubscribe(ctx), ev: ev, ctx: ctx, cancel: cancel}, nil
}

type node struct {
	ps     *redis.PubSub
	ev     shardsub.Events
	ctx    context.Context // Wait's, cancelled by Close
	cancel context.CancelFunc
}

func (n *node) Subscribe(ctx context.Context, channels []string) error {
	return n.ps.SSubscribe(ctx, channels...)
}

func (n *node) Unsubscribe(ctx context.Context, channels []string) error {
	return n.ps.SUnsubscribe(ctx, channels...)
}

// Wait reads the connection until Receive fails: the connection was closed or lost, or the
// server answered an error (MOVED, to a subscription sent to a slot's former owner). go-redis
// would reconnect and subscribe again on the next Receive, but messages published meanwhile
// are lost, so the listener ends instead (as conn.Listener says).
func (n *node) Wait() error {
	for {
		msg, err := n.ps.Receive(n.ctx)
		if err != nil {
			return err
		}
		switch m := msg.(type) {
		case *redis.Message:
			n.ev.Message(m.Channel, m.Payload)
		case *redis.Subscription:
			n.ev.Subscription(m.Kind, m.Channel)
		}
	}
}

func (n *node) Close() {
	n.cancel()
	_ = n.ps.Close()
}
