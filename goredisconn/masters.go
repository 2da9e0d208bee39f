package goredisconn

import (
	"context"
	"errors"
	"sort"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/conn"
)

var _ conn.Masters = (*adapter)(nil)

// CommandMasters runs args on every master of a *redis.ClusterClient; on any other client it
// is Command on the server the client talks to.
func (a *adapter) CommandMasters(ctx context.Context, args ...string) []conn.MasterReply {
	if a.cc == nil {
		v, err := a.Command(ctx, args...)
		return []conn.MasterReply{{Addr: a.addr, Reply: v, Err: err}}
	}
	var mu sync.Mutex
	var out []conn.MasterReply
	err := a.cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		v, err := c.Do(ctx, argv(args)...).Result()
		if errors.Is(err, redis.Nil) {
			v, err = nil, nil
		}
		mu.Lock()
		out = append(out, conn.MasterReply{Addr: c.Options().Addr, Reply: v, Err: err})
		mu.Unlock()
		return nil
	})
	if err != nil && len(out) == 0 {
		return []conn.MasterReply{{Addr: a.addr, Err: err}}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out
}
