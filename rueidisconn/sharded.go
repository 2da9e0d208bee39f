package rueidisconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/shardsub"
	"github.com/dlock-go/dlock/internal/slot"
)

// listenSharded opens a sharded listener (see package shardsub), with one dedicated connection
// per node. rueidis does not tell which node owns a slot, so the owners are read (CLUSTER
// SLOTS) when the listener opens; a listener that outlives a slot move ends (Done), and the
// caller's next one reads the slots again.
func (a *adapter) listenSharded(ctx context.Context, h conn.Handler) (conn.Listener, error) {
	owners, err := a.readSlots(ctx)
	if err != nil {
		return nil, fmt.Errorf("pub/sub on cluster %s: %w", a.addr, err)
	}
	return shardsub.New(h, func(_ context.Context, channel string) (shardsub.Master, error) {
		addr := owners[slot.Of(channel)]
		if addr == "" {
			return nil, fmt.Errorf("no cluster node serves the slot of channel %s", channel)
		}
		return master{a, addr}, nil
	}), nil
}

// readSlots returns the master address of every slot, from CLUSTER SLOTS.
func (a *adapter) readSlots(ctx context.Context) (*[slot.Count]string, error) {
	dctx, done := noDeadline(ctx)
	defer done()
	ranges, err := a.c.Do(dctx, a.c.B().ClusterSlots().Build()).ToArray()
	if err = ctxCause(ctx, err); err != nil {
		return nil, err
	}
	owners := new([slot.Count]string)
	for _, r := range ranges {
		v, err := r.ToArray()
		if err != nil || len(v) < 3 {
			return nil, fmt.Errorf("unexpected CLUSTER SLOTS entry: %v", err)
		}
		lo, err1 := v[0].AsInt64()
		hi, err2 := v[1].AsInt64()
		node, err3 := v[2].ToArray()
		if err := errors.Join(err1, err2, err3); err != nil || len(node) < 2 || lo < 0 || hi >= slot.Count {
			return nil, fmt.Errorf("unexpected CLUSTER SLOTS entry: %v", err)
		}
		host, err1 := node[0].ToString()
		port, err2 := node[1].AsInt64()
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("unexpected CLUSTER SLOTS node: %w", err)
		}
		addr := net.JoinHostPort(host, strconv.FormatInt(port, 10))
		for s := lo; s <= hi; s++ {
			owners[s] = addr
		}
	}
	return owners, nil
}

// master is a cluster node as CLUSTER SLOTS names it.
type master struct {
	a    *adapter
	addr string
}

func (m master) Addr() string { return m.addr }

// Open takes a dedicated connection to the node. rueidis calls the hooks from its own
// goroutine, and reports the connection's end on the channel SetPubSubHooks returns.
func (m master) Open(ev shardsub.Events) (shardsub.Node, error) {
	c := m.a.c.Nodes()[m.addr]
	if c == nil {
		return nil, fmt.Errorf("cluster node %s (owner of a channel's slot) is unknown to the client", m.addr)
	}
	dc, release := c.Dedicate()
	errs := dc.SetPubSubHooks(rueidis.PubSubHooks{
		OnMessage:      func(msg rueidis.PubSubMessage) { ev.Message(msg.Channel, msg.Message) },
		OnSubscription: func(s rueidis.PubSubSubscription) { ev.Subscription(s.Kind, s.Channel) },
	})
	return &node{dc: dc, release: release, errs: errs}, nil
}

type node struct {
	dc      rueidis.DedicatedClient
	release func()
	errs    <-chan error
}

func (n *node) Subscribe(ctx context.Context, channels []string) error {
	return n.dc.Do(ctx, n.dc.B().Ssubscribe().Channel(channels...).Build()).Error()
}

func (n *node) Unsubscribe(ctx context.Context, channels []string) error {
	return n.dc.Do(ctx, n.dc.B().Sunsubscribe().Channel(channels...).Build()).Error()
}

// Wait returns at the first value on errs: rueidis sends at most one, the error that ended the
// connection (ErrClosing when we closed it), and closes errs.
func (n *node) Wait() error {
	if err := <-n.errs; err != nil && !errors.Is(err, rueidis.ErrClosing) {
		return err
	}
	return nil
}

func (n *node) Close() {
	n.dc.Close()
	n.release()
}
