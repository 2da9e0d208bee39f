package rueidisconn

import (
	"context"
	"errors"
	"net"
	"sort"
	"strconv"
	"sync"

	"github.com/redis/rueidis"

	"github.com/dlock-go/dlock/conn"
)

var _ conn.Masters = (*adapter)(nil)

// CommandMasters runs args on every master of a cluster, as CLUSTER SLOTS names them now (the
// slot map the cluster ACL rule already allows reading); on a single server or under Sentinel
// it is Command on the master.
func (a *adapter) CommandMasters(ctx context.Context, args ...string) []conn.MasterReply {
	if !a.cluster {
		v, err := a.Command(ctx, args...)
		return []conn.MasterReply{{Addr: a.addr, Reply: v, Err: err}}
	}
	dctx, done := noDeadline(ctx)
	defer done()
	slots, err := a.anySlots(dctx)
	if err != nil {
		return []conn.MasterReply{{Addr: a.addr, Err: ctxCause(ctx, err)}}
	}
	seen := make(map[string]bool)
	var addrs []string
	for _, r := range slots {
		// {start, end, {host, port, id, …} of the master, then the replicas}
		rng, err := r.ToArray()
		if err != nil || len(rng) < 3 {
			continue
		}
		node, err := rng[2].ToArray()
		if err != nil || len(node) < 2 {
			continue
		}
		host, _ := node[0].ToString()
		port, _ := node[1].AsInt64()
		addr := net.JoinHostPort(host, strconv.FormatInt(port, 10))
		if !seen[addr] {
			seen[addr] = true
			addrs = append(addrs, addr)
		}
	}
	sort.Strings(addrs)
	nodes := a.c.Nodes()
	out := make([]conn.MasterReply, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		out[i].Addr = addr
		c, ok := nodes[addr]
		if !ok {
			out[i].Err = errUnknownNode
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := c.Do(dctx, c.B().Arbitrary(args[0]).Args(args[1:]...).Build()).ToAny()
			if rueidis.IsRedisNil(err) {
				err = nil
			}
			out[i].Reply, out[i].Err = v, ctxCause(ctx, err)
		}()
	}
	wg.Wait()
	return out
}

var errUnknownNode = errors.New("the client has no connection to this master yet")

// anySlots asks every node the client knows for CLUSTER SLOTS at once and takes the first
// answer: one frozen node (the one a routed call might pick) then costs nothing, and the
// masters that do answer are asked in turn.
func (a *adapter) anySlots(ctx context.Context) ([]rueidis.RedisMessage, error) {
	nodes := a.c.Nodes()
	if len(nodes) == 0 {
		return a.c.Do(ctx, a.c.B().ClusterSlots().Build()).ToArray()
	}
	// The calls not needed are left to finish (answers is buffered): cancelling one could end
	// a node's first dial under it, and rueidis gives that dial's failure to every call that
	// waits for the connection, the masters' own commands next among them.
	type answer struct {
		slots []rueidis.RedisMessage
		err   error
	}
	answers := make(chan answer, len(nodes))
	for _, c := range nodes {
		go func() {
			v, err := c.Do(ctx, c.B().ClusterSlots().Build()).ToArray()
			answers <- answer{v, err}
		}()
	}
	var first error
	for range nodes {
		r := <-answers
		if r.err == nil {
			return r.slots, nil
		}
		if first == nil {
			first = r.err
		}
	}
	return nil, first
}
