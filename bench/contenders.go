package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/goredisconn"
)

// kind says what a contender is compared as.
type kind int

const (
	kindDlock kind = iota // the library under test
	kindPeer              // another lock library: "best peer" is the best of these
	kindRaw               // SET NX PX + DEL with no safety: a floor, not a lock
)

// lockFunc takes the lock (waiting for it if it is held) and returns how to release it.
// One lockFunc is used by one goroutine at a time.
type lockFunc func(ctx context.Context) (unlock func(context.Context) error, err error)

// client is one contender's connection(s) to the server.
type client interface {
	mutex(name string) lockFunc
	close()
}

// contender is one way of locking, opened afresh for every measurement.
type contender struct {
	name string
	kind kind
	// config describes the settings used, for the notes under the tables.
	config string
	open   func(ctx context.Context, addr string, ttl time.Duration) (client, error)
	// key is the Redis key that holds the lock called name (scenario 6 reads its PTTL).
	key func(name string) string
}

// goredisPool is the go-redis pool size for every go-redis based contender: one connection per
// goroutine of the largest scenario, so that no contender waits for a pooled connection.
const goredisPool = 64

func newGoredis(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, PoolSize: goredisPool, ContextTimeoutEnabled: true})
}

var contenders = []*contender{
	{
		name: "dlock (rueidis)", kind: kindDlock,
		config: "`dlock.Dial` (rueidis transport: no flush delay, a lone call written and read on the caller's goroutine over an unpipelined connection), `Mutex.Lock` / `Lease.Unlock`, renewal on",
		open: func(ctx context.Context, addr string, ttl time.Duration) (client, error) {
			c, err := dlock.Dial(ctx, "redis://"+addr+"/0", dlock.WithTTL(ttl))
			if err != nil {
				return nil, err
			}
			return &dlockClient{c: c}, nil
		},
		key: dlockKey,
	},
	{
		name: "dlock (go-redis)", kind: kindDlock,
		config: "`dlock.New(goredisconn.New(rdb))`, go-redis pool of 64, `ContextTimeoutEnabled`",
		open: func(ctx context.Context, addr string, ttl time.Duration) (client, error) {
			rdb := newGoredis(addr)
			c, err := dlock.New(goredisconn.New(rdb), dlock.WithTTL(ttl))
			if err != nil {
				rdb.Close()
				return nil, err
			}
			return &dlockClient{c: c, rdb: rdb}, nil
		},
		key: dlockKey,
	},
	{
		name: "redsync", kind: kindPeer,
		config: "go-redsync/redsync v4.18.1, one go-redis v9 pool of 64, `WithExpiry(ttl)`, `WithTries(MaxInt32)`, default retry delay (random 50–250 ms)",
		open: func(ctx context.Context, addr string, ttl time.Duration) (client, error) {
			rdb := newGoredis(addr)
			return &redsyncClient{rdb: rdb, rs: redsync.New(redsyncgoredis.NewPool(rdb)), ttl: ttl}, nil
		},
		key: func(name string) string { return name },
	},
	{
		name: "redislock", kind: kindPeer,
		config: "bsm/redislock v0.9.4, go-redis pool of 64, `Obtain` with `ExponentialBackoff(16 ms, 256 ms)` (its recommended minimum) until the context's deadline",
		open: func(ctx context.Context, addr string, ttl time.Duration) (client, error) {
			rdb := newGoredis(addr)
			return &redislockClient{rdb: rdb, c: redislock.New(rdb), ttl: ttl}, nil
		},
		key: func(name string) string { return name },
	},
	{
		name: "rueidislock", kind: kindPeer,
		config: "rueidis/rueidislock v1.0.79, `KeyMajority: 1` (one key per lock), `NoLoopTracking`, `KeyValidity: ttl`, `WithContext`, waiting on client-side-cache invalidations",
		open: func(ctx context.Context, addr string, ttl time.Duration) (client, error) {
			l, err := rueidislock.NewLocker(rueidislock.LockerOption{
				ClientOption:   rueidis.ClientOption{InitAddress: []string{addr}},
				KeyMajority:    1,
				NoLoopTracking: true,
				KeyValidity:    ttl,
			})
			if err != nil {
				return nil, err
			}
			return &rueidislockClient{l: l}, nil
		},
		key: func(name string) string { return "rueidislock:0:" + name },
	},
	{
		name: "raw go-redis", kind: kindRaw,
		config: "`SET NX PX` + `DEL` through go-redis (pool of 64): no ownership check, no waiting",
		open: func(ctx context.Context, addr string, ttl time.Duration) (client, error) {
			return &rawGoredis{rdb: newGoredis(addr), ttl: ttl}, nil
		},
	},
	{
		name: "raw rueidis", kind: kindRaw,
		config: "`SET NX PX` + `DEL` through rueidis with its defaults (auto-pipelining, no flush delay)",
		open: func(ctx context.Context, addr string, ttl time.Duration) (client, error) {
			return newRawRueidis(addr, ttl)
		},
	},
}

func contenderByName(name string) *contender {
	for _, c := range contenders {
		if c.name == name {
			return c
		}
	}
	for _, c := range clientsOnly {
		if c.name == name {
			return c
		}
	}
	return nil
}

// openNamed opens the contender called name on addrs: a contender of one server (contenders)
// when there is one address, a quorum contender (quorumContenders) when there are several.
func openNamed(ctx context.Context, name string, addrs []string, ttl time.Duration) (client, error) {
	if len(addrs) == 1 {
		if c := contenderByName(name); c != nil {
			return c.open(ctx, addrs[0], ttl)
		}
	} else {
		if c := quorumContenderByName(name); c != nil {
			return c.open(ctx, addrs, ttl)
		}
	}
	return nil, fmt.Errorf("no contender %q for %d servers", name, len(addrs))
}

// --- dlock

// dlockKey is the key of dlock's lock called name under the default prefix (a name that does
// not start with a brace, as the bench's are).
func dlockKey(name string) string { return dlock.DefaultPrefix + "{" + name + "}" }

type dlockClient struct {
	c    *dlock.Client
	rdb  *redis.Client
	opts []dlock.Option // the options of every Mutex this client makes (WithTurnSlice)
}

// mutexOf is the client's Mutex of name, with the contender's Mutex options.
func (d *dlockClient) mutexOf(name string) *dlock.Mutex { return d.c.Mutex(name, d.opts...) }

func (d *dlockClient) mutex(name string) lockFunc {
	m := d.mutexOf(name)
	return func(ctx context.Context) (func(context.Context) error, error) {
		l, err := m.Lock(ctx)
		if err != nil {
			return nil, err
		}
		return l.Unlock, nil
	}
}

func (d *dlockClient) close() {
	d.c.Close()
	if d.rdb != nil {
		d.rdb.Close()
	}
}

// --- redsync

type redsyncClient struct {
	rdb *redis.Client
	rs  *redsync.Redsync
	ttl time.Duration
}

func (r *redsyncClient) mutex(name string) lockFunc {
	// A redsync Mutex remembers the value of its last acquisition: one per goroutine.
	m := r.rs.NewMutex(name, redsync.WithExpiry(r.ttl), redsync.WithTries(math.MaxInt32))
	unlock := func(ctx context.Context) error {
		ok, err := m.UnlockContext(ctx)
		if err == nil && !ok {
			err = errors.New("redsync: unlock reported not held")
		}
		return err
	}
	return func(ctx context.Context) (func(context.Context) error, error) {
		if err := m.LockContext(ctx); err != nil {
			return nil, err
		}
		return unlock, nil
	}
}

func (r *redsyncClient) close() { r.rdb.Close() }

// --- bsm/redislock

type redislockClient struct {
	rdb *redis.Client
	c   *redislock.Client
	ttl time.Duration
	// retry makes the retry strategy of one Obtain (nil: exponential, 16 ms to 256 ms).
	retry func() redislock.RetryStrategy
}

func (r *redislockClient) mutex(name string) lockFunc {
	return func(ctx context.Context) (func(context.Context) error, error) {
		// The strategy counts attempts: a new one per Obtain.
		retry := redislock.ExponentialBackoff(16*time.Millisecond, 256*time.Millisecond)
		if r.retry != nil {
			retry = r.retry()
		}
		l, err := r.c.Obtain(ctx, name, r.ttl, &redislock.Options{RetryStrategy: retry})
		if err != nil {
			return nil, err
		}
		return l.Release, nil
	}
}

func (r *redislockClient) close() { r.rdb.Close() }

// --- rueidislock

type rueidislockClient struct{ l rueidislock.Locker }

func (r *rueidislockClient) mutex(name string) lockFunc {
	return func(ctx context.Context) (func(context.Context) error, error) {
		_, cancel, err := r.l.WithContext(ctx, name)
		if err != nil {
			return nil, err
		}
		// cancel releases the key and returns once it is released.
		return func(context.Context) error { cancel(); return nil }, nil
	}
}

func (r *rueidislockClient) close() { r.l.Close() }

// --- raw floors

var errRawBusy = errors.New("raw: key already set (raw floors do not wait)")

type rawGoredis struct {
	rdb *redis.Client
	ttl time.Duration
}

func (r *rawGoredis) mutex(name string) lockFunc {
	unlock := func(ctx context.Context) error { return r.rdb.Del(ctx, name).Err() }
	return func(ctx context.Context) (func(context.Context) error, error) {
		ok, err := r.rdb.SetNX(ctx, name, "owner", r.ttl).Result()
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, errRawBusy
		}
		return unlock, nil
	}
}

func (r *rawGoredis) close() { r.rdb.Close() }

type rawRueidis struct {
	c  rueidis.Client
	ms int64
}

func newRawRueidis(addr string, ttl time.Duration) (client, error) {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		return nil, err
	}
	return &rawRueidis{c: c, ms: ttl.Milliseconds()}, nil
}

func (r *rawRueidis) mutex(name string) lockFunc {
	unlock := func(ctx context.Context) error {
		return r.c.Do(ctx, r.c.B().Del().Key(name).Build()).Error()
	}
	return func(ctx context.Context) (func(context.Context) error, error) {
		err := r.c.Do(ctx, r.c.B().Set().Key(name).Value("owner").Nx().PxMilliseconds(r.ms).Build()).Error()
		if rueidis.IsRedisNil(err) {
			return nil, errRawBusy
		}
		if err != nil {
			return nil, err
		}
		return unlock, nil
	}
}

func (r *rawRueidis) close() { r.c.Close() }
