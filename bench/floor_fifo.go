package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// The minimal FIFO handoff: the least a strictly first-in first-out lock with handoff between
// processes needs, written for the bench as the yardstick of scenario 7's one-server cases. It is
// a floor, not a product: nothing survives a crash but the lease (PX) on the key; a waiter whose
// predecessor dies waits until its own context ends; there is no renewal.
//
// State per name: the key (value "ID TOKEN", with a lease), a list of waiting clients' IDs and
// a token counter. Acquire: take the key with SET NX and a fresh token from INCR, or append the
// caller to the list and wait for its grant. Release: if the caller still owns the key, pop the
// first waiter, give it the key with a fresh token and PUBLISH one message (the token) to its
// channel; with no waiter, delete the key. A grantee acts on the message alone: no further round
// trip. A client's ID is also the channel it subscribed to before its first acquire.

const fifoName = "minimal FIFO handoff"

var (
	// KEYS: the lock, its queue, its token counter. ARGV: the caller's ID, the lease in ms.
	// Returns the token, or 0 when the caller was queued.
	fifoAcquire = rueidis.NewLuaScript(`
local t = redis.call('INCR', KEYS[3])
if redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. t, 'NX', 'PX', ARGV[2]) then return t end
redis.call('RPUSH', KEYS[2], ARGV[1])
return 0`)
	// KEYS: as fifoAcquire. ARGV: the holder's value ("ID TOKEN"), the lease in ms. Returns 1
	// when released (and handed to the next waiter, if any), 0 when the caller did not own it.
	fifoRelease = rueidis.NewLuaScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local nxt = redis.call('LPOP', KEYS[2])
if not nxt then
  redis.call('DEL', KEYS[1])
  return 1
end
local t = redis.call('INCR', KEYS[3])
redis.call('SET', KEYS[1], nxt .. ' ' .. t, 'PX', ARGV[2])
redis.call('PUBLISH', nxt, t)
return 1`)
)

var fifoContender = &contender{
	name: fifoName, kind: kindRaw,
	config: "the bench's own strictly first-in first-out lock with server-side handoff (`floor_fifo.go`): acquire = one script " +
		"(`INCR` a token, `SET NX PX` the key to it, else `RPUSH` the caller to the queue and wait for its grant message), " +
		"release = one script (if the caller owns the key: `LPOP` the next waiter, `SET` the key to it with a fresh token, " +
		"`PUBLISH` one grant to its channel; no waiter: `DEL`); the grantee acts on the message alone. rueidis with its " +
		"defaults (no flush delay), one subscription per goroutine. A floor, not a product: no crash handling beyond the " +
		"lease (PX) on the key, no renewal",
	open: func(ctx context.Context, addr string, ttl time.Duration) (client, error) {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
		if err != nil {
			return nil, err
		}
		return &fifoClient{c: c, ttl: ttl}, nil
	},
	key: func(name string) string { return "fifo:{" + name + "}" },
}

// fifoClient is one process's client of the minimal FIFO handoff.
type fifoClient struct {
	c   rueidis.Client
	ttl time.Duration

	mu   sync.Mutex
	subs []context.CancelFunc
	wg   sync.WaitGroup
}

func (f *fifoClient) close() {
	f.mu.Lock()
	for _, cancel := range f.subs {
		cancel()
	}
	f.mu.Unlock()
	f.wg.Wait()
	f.c.Close()
}

func (f *fifoClient) mutex(name string) lockFunc {
	lock := f.tokenMutex(name)
	return func(ctx context.Context) (func(context.Context) error, error) {
		_, unlock, err := lock(ctx)
		return unlock, err
	}
}

// fifoPing is what a waiter publishes to its own channel to learn that its subscription is live.
const fifoPing = "ping"

// tokenMutex returns the lock of name for one goroutine: it takes the lock (waiting for its turn)
// and returns the fencing token with the release.
func (f *fifoClient) tokenMutex(name string) func(context.Context) (uint64, func(context.Context) error, error) {
	keys := []string{"fifo:{" + name + "}", "fifo:{" + name + "}:q", "fifo:{" + name + "}:n"}
	px := strconv.FormatInt(f.ttl.Milliseconds(), 10)
	var id string
	grants := make(chan uint64, 4)
	var subErr error
	subscribed := false
	subscribe := func(ctx context.Context) error {
		var rnd [8]byte
		rand.Read(rnd[:])
		id = "fifo:c:" + hex.EncodeToString(rnd[:])
		sctx, cancel := context.WithCancel(context.Background())
		f.mu.Lock()
		f.subs = append(f.subs, cancel)
		f.mu.Unlock()
		live := make(chan struct{}, 1)
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.c.Receive(sctx, f.c.B().Subscribe().Channel(id).Build(), func(m rueidis.PubSubMessage) {
				if m.Message == fifoPing {
					select {
					case live <- struct{}{}:
					default:
					}
					return
				}
				if t, err := strconv.ParseUint(m.Message, 10, 64); err == nil {
					grants <- t
				}
			})
		}()
		// Publish pings to the own channel until one comes back: then a grant cannot be missed.
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			if err := f.c.Do(ctx, f.c.B().Publish().Channel(id).Message(fifoPing).Build()).Error(); err != nil {
				return err
			}
			select {
			case <-live:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
		}
	}
	release := func(ctx context.Context, tok uint64) error {
		n, err := fifoRelease.Exec(ctx, f.c, keys, []string{id + " " + strconv.FormatUint(tok, 10), px}).AsInt64()
		if err == nil && n != 1 {
			err = errors.New("minimal FIFO handoff: released a lock it no longer held")
		}
		return err
	}
	return func(ctx context.Context) (uint64, func(context.Context) error, error) {
		if !subscribed {
			if subErr = subscribe(ctx); subErr != nil {
				return 0, nil, fmt.Errorf("minimal FIFO handoff: subscribe: %w", subErr)
			}
			subscribed = true
		}
		t, err := fifoAcquire.Exec(ctx, f.c, keys, []string{id, px}).AsInt64()
		if err != nil {
			return 0, nil, err
		}
		tok := uint64(t)
		if t == 0 {
			select {
			case tok = <-grants:
			case <-ctx.Done():
				// Leave the queue; if the grant was already made, take it and pass it on.
				wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				n, err := f.c.Do(wctx, f.c.B().Lrem().Key(keys[1]).Count(1).Element(id).Build()).AsInt64()
				if err != nil {
					return 0, nil, err
				}
				if n == 0 {
					select {
					case tok = <-grants:
						if err := release(wctx, tok); err != nil {
							return 0, nil, err
						}
					case <-wctx.Done():
						return 0, nil, errors.New("minimal FIFO handoff: dequeued but no grant arrived")
					}
				}
				return 0, nil, ctx.Err()
			}
		}
		return tok, func(ctx context.Context) error { return release(ctx, tok) }, nil
	}
}
