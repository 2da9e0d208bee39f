package dlock_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/goredisconn"
)

// Helper processes for the read-write lock's and semaphore's tests (see runHelper): each
// prints "locked <token>" once it holds, then, by role:
//
//	rw-read:    holds a read lock of DLOCK_NAME until killed;
//	sem-hold:   holds DLOCK_N permits of the semaphore DLOCK_NAME (size DLOCK_SIZE) until killed;
//	sem-work:   holds every permit and appends its token to DLOCK_NAME:writes every 2 ms while
//	            its lease context is live; prints "lost <cause>" and exits once it is not;
//	sem-stress: (prints "ready" instead) DLOCK_GOROUTINES goroutines take 1 to DLOCK_MAXN
//	            permits DLOCK_ROUNDS times each and, holding them, add the permits to the counter
//	            DLOCK_NAME:count on DLOCK_ADMIN_URL, check that it stays within the size, and
//	            take them off again; prints "over <value>" for a count above the size,
//	            "lost <cause>" for a lease lost in the section, and "done <holds> <max count>".
var moreHelpers = map[string]func() int{
	"rw-read":    func() int { return sharedHelper("rw-read") },
	"sem-hold":   func() int { return sharedHelper("sem-hold") },
	"sem-work":   func() int { return sharedHelper("sem-work") },
	"sem-stress": semStressHelper,
}

func envInt(name string) int {
	n, _ := strconv.Atoi(os.Getenv(name))
	return n
}

// helperClient dials DLOCK_URL through the transport DLOCK_TRANSPORT (rueidis by default).
func helperClient(opts ...dlock.ClientOption) (*dlock.Client, func(), error) {
	url := os.Getenv("DLOCK_URL")
	if os.Getenv("DLOCK_TRANSPORT") == "goredis" {
		o, err := redis.ParseURL(url)
		if err != nil {
			return nil, nil, err
		}
		o.ContextTimeoutEnabled = true
		rc := redis.NewClient(o)
		c, err := dlock.New(goredisconn.New(rc), opts...)
		if err != nil {
			rc.Close()
			return nil, nil, err
		}
		return c, func() { c.Close(); rc.Close() }, nil
	}
	c, err := dlock.Dial(context.Background(), url, opts...)
	if err != nil {
		return nil, nil, err
	}
	return c, func() { c.Close() }, nil
}

func sharedHelper(role string) int {
	ctx := context.Background()
	ttl, err := time.ParseDuration(os.Getenv("DLOCK_TTL"))
	if err != nil {
		fmt.Println("bad DLOCK_TTL:", err)
		return 2
	}
	name := os.Getenv("DLOCK_NAME")
	c, done, err := helperClient(dlock.WithTTL(ttl))
	if err != nil {
		fmt.Println("dial:", err)
		return 2
	}
	defer done()
	var l *dlock.Lease
	switch role {
	case "rw-read":
		l, err = c.RWMutex(name).RLock(ctx)
	case "sem-hold":
		l, err = c.Semaphore(name, envInt("DLOCK_SIZE")).Acquire(ctx, envInt("DLOCK_N"))
	case "sem-work":
		l, err = c.Semaphore(name, envInt("DLOCK_SIZE")).Acquire(ctx, envInt("DLOCK_SIZE"))
	}
	if err != nil {
		fmt.Println("lock:", err)
		return 2
	}
	fmt.Printf("locked %d\n", l.Token())
	if role != "sem-work" {
		time.Sleep(time.Minute)
		return 0
	}
	o, _ := redis.ParseURL(os.Getenv("DLOCK_URL"))
	rc := redis.NewClient(o)
	defer rc.Close()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if l.Context().Err() != nil {
			fmt.Printf("lost %v\n", context.Cause(l.Context()))
			return 0
		}
		if err := rc.RPush(ctx, name+":writes", l.Token()).Err(); err != nil {
			fmt.Println("write:", err)
			return 2
		}
	}
	fmt.Println("timeout")
	return 1
}

func semStressHelper() int {
	ctx := context.Background()
	name, size := os.Getenv("DLOCK_NAME"), envInt("DLOCK_SIZE")
	c, done, err := helperClient()
	if err != nil {
		fmt.Println("dial:", err)
		return 2
	}
	defer done()
	o, err := redis.ParseURL(os.Getenv("DLOCK_ADMIN_URL"))
	if err != nil {
		fmt.Println("admin url:", err)
		return 2
	}
	rc := redis.NewClient(o)
	defer rc.Close()
	s := c.Semaphore(name, size)
	var holds, top atomic.Int64
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	say("ready")
	var wg sync.WaitGroup
	for range envInt("DLOCK_GOROUTINES") {
		wg.Go(func() {
			for range envInt("DLOCK_ROUNDS") {
				n := 1 + rand.IntN(envInt("DLOCK_MAXN"))
				actx, cancel := context.WithTimeout(ctx, 60*time.Second)
				l, err := s.Acquire(actx, n)
				cancel()
				if err != nil {
					say("error %v", err)
					return
				}
				v, err := rc.IncrBy(ctx, name+":count", int64(n)).Result()
				if err != nil {
					say("error %v", err)
					return
				}
				if v > int64(size) {
					say("over %d", v)
				}
				for {
					if old := top.Load(); v <= old || top.CompareAndSwap(old, v) {
						break
					}
				}
				time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
				if err := rc.DecrBy(ctx, name+":count", int64(n)).Err(); err != nil {
					say("error %v", err)
					return
				}
				if l.Context().Err() != nil {
					say("lost %v", context.Cause(l.Context()))
				}
				l.Unlock(ctx)
				holds.Add(1)
			}
		})
	}
	wg.Wait()
	say("done %d %d", holds.Load(), top.Load())
	return 0
}
