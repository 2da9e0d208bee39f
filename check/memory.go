package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/redistest"
)

// Memory pressure: the scenarios whose redis-server has a memory limit (a row's memory). An
// evicting server is used as a cache at the same time: the harness's filler writes large keys
// with a TTL into it, steadily, and in a burst while a holder works (the evictHeldLock fault),
// and watches, by keyspace notifications, which keys the server evicts. A server that must not
// evict (noeviction) is pushed out of memory by the exhaustMemory fault (faults.go).

// memorySetup is a scenario's redis-server memory configuration.
type memorySetup struct {
	maxmemory string // --maxmemory; "" sets no limit
	policy    string // --maxmemory-policy
	filler    bool   // the harness's filler loads the server as a cache; evictions are watched
}

var (
	// evictingCache is a small cache: 3 MB hold about 30 filler keys, so the server evicts
	// one on nearly every filler write. Lock keys are evicted too, and not seldom: Redis's LRU
	// clock ticks once a second, so a lock key touched a millisecond ago looks as idle as a
	// filler key written this second, and with the keyspace turning over in well under a
	// second the lock key is picked about as often as any other. The policy is chosen in the
	// eviction row of the table (scenario.go).
	evictingCache = memorySetup{maxmemory: "3mb", policy: "allkeys-lru", filler: true}
	// boundedNoEviction is a server configured as dlock asks: a memory limit, and noeviction.
	// Its limit is far above what the run uses until exhaustMemory lowers it.
	boundedNoEviction = memorySetup{maxmemory: "64mb", policy: "noeviction"}
)

// args are the redis-server arguments of m.
func (m memorySetup) args() []string {
	var a []string
	if m.maxmemory != "" {
		a = append(a, "--maxmemory", m.maxmemory)
	}
	if m.policy != "" {
		a = append(a, "--maxmemory-policy", m.policy)
	}
	if m.filler {
		a = append(a, "--notify-keyspace-events", "Ee") // keyevent notices of evictions
	}
	return a
}

const (
	fillerValueSize = 64 << 10
	fillerTTL       = 30 * time.Second
	fillerEvery     = 50 * time.Millisecond // the steady load: ~1.3 MB/s, the 3 MB cache turns over in ~2 s
	// A burst writes back to back until the lock's key is evicted, but at most this many keys
	// for at most this long.
	burstKeys = 1000
	burstTime = 3 * time.Second
)

// filler writes cache-like keys to an evicting server and counts the evictions of the lock's
// key, from keyspace notifications.
type filler struct {
	rdb     *redis.Client
	ps      *redis.PubSub
	lockKey string
	value   string

	written atomic.Int64 // filler keys written
	notices atomic.Int64 // eviction notices of any key

	mu            sync.Mutex
	lockEvictions []int64 // CLOCK_MONOTONIC when each eviction notice of the lock's key arrived
	evicted       chan struct{}

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startFiller subscribes to the eviction notices of the server at addr and starts the steady
// load.
func startFiller(addr, lockKey string) (*filler, error) {
	f := &filler{
		rdb:     redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1}),
		lockKey: lockKey,
		value:   strings.Repeat("c", fillerValueSize),
		evicted: make(chan struct{}, 1),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	f.ps = f.rdb.Subscribe(ctx, "__keyevent@0__:evicted")
	if _, err := f.ps.Receive(ctx); err != nil { // the subscription is confirmed
		_ = f.ps.Close()
		_ = f.rdb.Close()
		return nil, fmt.Errorf("filler: subscribe to eviction notices: %w", err)
	}
	ctx, f.cancel = context.WithCancel(context.Background())
	f.wg.Add(2)
	go f.watch()
	go f.steady(ctx)
	return f, nil
}

// watch counts eviction notices until the subscription is closed.
func (f *filler) watch() {
	defer f.wg.Done()
	for m := range f.ps.Channel() {
		f.notices.Add(1)
		if m.Payload != f.lockKey {
			continue
		}
		f.mu.Lock()
		f.lockEvictions = append(f.lockEvictions, mono())
		f.mu.Unlock()
		select {
		case f.evicted <- struct{}{}:
		default:
		}
	}
}

// steady writes one key every fillerEvery until ctx ends.
func (f *filler) steady(ctx context.Context) {
	defer f.wg.Done()
	t := time.NewTicker(fillerEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f.write(ctx)
		}
	}
}

// write sets one filler key with the cache's TTL.
func (f *filler) write(ctx context.Context) error {
	n := f.written.Add(1)
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return f.rdb.Set(wctx, "cache:"+strconv.FormatInt(n, 10), f.value, fillerTTL).Err()
}

// burst writes filler keys back to back until the lock's key is evicted, for at most burstKeys
// keys and burstTime; it returns how many it wrote and whether the lock's key was evicted.
func (f *filler) burst() (keys int, evicted bool, err error) {
	select {
	case <-f.evicted: // an earlier eviction, not this burst's
	default:
	}
	deadline := time.Now().Add(burstTime)
	for keys < burstKeys && time.Now().Before(deadline) {
		if err := f.write(context.Background()); err != nil {
			return keys, false, err
		}
		keys++
		select {
		case <-f.evicted:
			return keys, true, nil
		default:
		}
	}
	// The notice of an eviction by the last write may still be on its way.
	select {
	case <-f.evicted:
		return keys, true, nil
	case <-time.After(50 * time.Millisecond):
		return keys, false, nil
	}
}

// close stops the load and the watch, and returns the instants at which the lock's key was
// evicted and how many filler keys were written.
func (f *filler) close() (lockEvictions []int64, written int64) {
	f.cancel()
	_ = f.ps.Close() // ends watch's range
	f.wg.Wait()
	_ = f.rdb.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int64(nil), f.lockEvictions...), f.written.Load()
}

// memRecord is what a run with a memory limit leaves for analysis.
type memRecord struct {
	EvictedKeys   int64   `json:"evicted_keys"`   // INFO stats evicted_keys at the end of the run (the server never restarts in these scenarios)
	FillerKeys    int64   `json:"filler_keys"`    // keys the filler wrote
	LockEvictions []int64 `json:"lock_evictions"` // CLOCK_MONOTONIC instants the lock's key was evicted (its notice arrived)
}

// infoField reads one numeric field of INFO section from srv.
func infoField(ctx context.Context, srv *redistest.Server, section, field string) (int64, error) {
	info, err := srv.Do(ctx, "INFO", section)
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), field+":"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("INFO %s has no %s", section, field)
}
