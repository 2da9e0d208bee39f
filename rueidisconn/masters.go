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
	slots, err := a.c.Do(dctx, a.c.B().ClusterSlots().Build()).ToArray()
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
