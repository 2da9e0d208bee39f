package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

const (
	redlockServers    = 5
	redlockGoroutines = 16
	redlockDelay      = 20 * time.Millisecond // added by the fault proxy to each direction
)

// quorumContender is a contender of scenario 4: one lock over redlockServers independent servers.
type quorumContender struct {
	name   string
	kind   kind
	config string
	open   func(ctx context.Context, addrs []string, ttl time.Duration) (client, error)
}

var quorumContenders = []*quorumContender{
	{
		name: "dlock quorum (rueidis)", kind: kindDlock,
		config: "`dlock.DialQuorum(ctx, urls, dlock.WithTTL(ttl))`: acquisitions fanned out to the 5 servers in parallel, decided by the first majority",
		open: func(ctx context.Context, addrs []string, ttl time.Duration) (client, error) {
			urls := make([]string, len(addrs))
			for i, a := range addrs {
				urls[i] = "redis://" + a + "/0"
			}
			c, err := dlock.DialQuorum(ctx, urls, dlock.WithTTL(ttl))
			if err != nil {
				return nil, err
			}
			return &dlockClient{c: c}, nil
		},
	},
	{
		name: "redsync", kind: kindPeer,
		config: "go-redsync/redsync v4.18.1 with 5 pools (one go-redis v9 pool of 64 per server), `WithExpiry(ttl)`, `WithTries(MaxInt32)`; its default waits for every server's answer",
		open: func(ctx context.Context, addrs []string, ttl time.Duration) (client, error) {
			return newRedsync5(addrs, ttl, false), nil
		},
	},
	{
		name: "redsync, fail fast", kind: kindPeer,
		config: "as redsync, plus `WithFailFast(true)`: it returns as soon as a majority answered",
		open: func(ctx context.Context, addrs []string, ttl time.Duration) (client, error) {
			return newRedsync5(addrs, ttl, true), nil
		},
	},
}

// quorumTurn is dlock in quorum mode with turns per process (dlock.WithTurnSlice(turnLong)),
// measured in scenario 7's quorum case of many clients beside the strict handoff. It is not in
// quorumContenders: scenario 4 measures uncontended pairs, where a turn changes nothing.
var quorumTurn = &quorumContender{
	name: "dlock quorum (rueidis), turn " + msText(turnLong), kind: kindDlock,
	config: fmt.Sprintf("as dlock quorum (rueidis), with `dlock.WithTurnSlice(%v)` on its `Mutex`: after its last `Unlock` "+
		"the client keeps the lock on the majority until %s have passed since it got it (at most 16 holds), and a `Lock` "+
		"meanwhile takes it back locally with the next token; the turn's end releases it to the next client queued", turnLong, msText(turnLong)),
	open: func(ctx context.Context, addrs []string, ttl time.Duration) (client, error) {
		urls := make([]string, len(addrs))
		for i, a := range addrs {
			urls[i] = "redis://" + a + "/0"
		}
		c, err := dlock.DialQuorum(ctx, urls, dlock.WithTTL(ttl))
		if err != nil {
			return nil, err
		}
		return &dlockClient{c: c, opts: []dlock.Option{dlock.WithTurnSlice(turnLong)}}, nil
	},
}

// quorumContenderByName finds a quorum contender (quorumContenders or quorumTurn) by name.
func quorumContenderByName(name string) *quorumContender {
	for _, c := range append(quorumContenders, quorumTurn) {
		if c.name == name {
			return c
		}
	}
	return nil
}

type redsync5Client struct {
	rdbs     []*redis.Client
	rs       *redsync.Redsync
	ttl      time.Duration
	failFast bool
}

func newRedsync5(addrs []string, ttl time.Duration, failFast bool) *redsync5Client {
	r := &redsync5Client{ttl: ttl, failFast: failFast}
	var pools []redsyncredis.Pool
	for _, a := range addrs {
		rdb := newGoredis(a)
		r.rdbs = append(r.rdbs, rdb)
		pools = append(pools, redsyncgoredis.NewPool(rdb))
	}
	r.rs = redsync.New(pools...)
	return r
}

func (r *redsync5Client) mutex(name string) lockFunc {
	opts := []redsync.Option{redsync.WithExpiry(r.ttl), redsync.WithTries(math.MaxInt32)}
	if r.failFast {
		opts = append(opts, redsync.WithFailFast(true))
	}
	m := r.rs.NewMutex(name, opts...)
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

func (r *redsync5Client) close() {
	for _, rdb := range r.rdbs {
		rdb.Close()
	}
}

// redlockResult is one measurement of scenario 4.
type redlockResult struct {
	pairs            int64
	elapsed          time.Duration
	acqP50, acqP99   time.Duration
	pairP50, pairP99 time.Duration
	err              error
}

func (r redlockResult) rate() float64 { return float64(r.pairs) / r.elapsed.Seconds() }

// runQuorum runs Lock+Unlock pairs from redlockGoroutines goroutines, each on its own name, against
// the servers at addrs, and measures pairs/s and the time Lock takes.
func runQuorum(addrs []string, c *quorumContender, d, warm, pairTimeout time.Duration, tag string) redlockResult {
	octx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	cl, err := c.open(octx, addrs, 10*time.Second)
	cancel()
	if err != nil {
		return redlockResult{err: err}
	}
	defer cl.close()
	type sample struct{ acquire, pair time.Duration }
	pass := func(d time.Duration, record bool) ([][]sample, error) {
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			first error
			all   = make([][]sample, redlockGoroutines)
		)
		end := time.Now().Add(d)
		for i := 0; i < redlockGoroutines; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				lock := cl.mutex(fmt.Sprintf("s4:%s:%d", tag, i))
				var mine []sample
				if record {
					mine = make([]sample, 0, 4096)
				}
				for n := 0; n < maxPairsPerGoroutine && time.Now().Before(end); n++ {
					ctx, cancel := context.WithTimeout(context.Background(), pairTimeout)
					t0 := time.Now()
					unlock, err := lock(ctx)
					t1 := time.Now()
					if err == nil {
						err = unlock(ctx)
					}
					t2 := time.Now()
					cancel()
					if err != nil {
						mu.Lock()
						first = cmp(first, fmt.Errorf("goroutine %d: %w", i, err))
						mu.Unlock()
						break
					}
					if record {
						mine = append(mine, sample{t1.Sub(t0), t2.Sub(t0)})
					}
				}
				all[i] = mine
			}()
		}
		wg.Wait()
		return all, first
	}
	if _, err := pass(warm, false); err != nil {
		return redlockResult{err: fmt.Errorf("warm-up: %w", err)}
	}
	start := time.Now()
	all, err := pass(d, true)
	elapsed := time.Since(start)
	if err != nil {
		return redlockResult{err: err}
	}
	var acq, pair []time.Duration
	for _, s := range all {
		for _, x := range s {
			acq = append(acq, x.acquire)
			pair = append(pair, x.pair)
		}
	}
	if len(acq) == 0 {
		return redlockResult{err: errors.New("no pair completed")}
	}
	slices.Sort(acq)
	slices.Sort(pair)
	return redlockResult{pairs: int64(len(acq)), elapsed: elapsed,
		acqP50: acq[len(acq)/2], acqP99: acq[len(acq)*99/100],
		pairP50: pair[len(pair)/2], pairP99: pair[len(pair)*99/100]}
}

// measureRedlock is scenario 4, one lock over a quorum of servers: it starts 5 more servers, the
// fifth behind a fault proxy, and measures every quorum contender with the proxy passing bytes
// straight through and then delaying them.
func measureRedlock(cfg config) (string, bool) {
	var b strings.Builder
	fmt.Fprintf(&b, "### 4. Redlock over %d servers\n\n", redlockServers)
	var servers []*server
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	for range redlockServers {
		s, err := startServer()
		if err != nil {
			fmt.Fprintf(&b, "Not run: starting %d servers: %s.\n", redlockServers, oneLine(err))
			return b.String(), false
		}
		servers = append(servers, s)
	}
	proxy, err := redistest.StartProxy(servers[redlockServers-1].Addr)
	if err != nil {
		fmt.Fprintf(&b, "Not run: %s.\n", oneLine(err))
		return b.String(), false
	}
	defer proxy.Close()
	addrs := make([]string, redlockServers)
	for i, s := range servers {
		addrs[i] = s.Addr
	}
	addrs[redlockServers-1] = proxy.Addr

	conds := []struct {
		name  string
		delay time.Duration
	}{{"no fault", 0}, {fmt.Sprintf("server 5 delayed %v each way", redlockDelay), redlockDelay}}
	res := map[*quorumContender][2][]redlockResult{}
	ok := true
	for ci, cond := range conds {
		proxy.SetDelay(cond.delay)
		for rep := 0; rep < cfg.reps; rep++ {
			for i := range quorumContenders {
				c := quorumContenders[(i+rep)%len(quorumContenders)]
				for _, s := range servers {
					s.flush()
				}
				stop := watchdog(fmt.Sprintf("scenario 4, %s, %s", cond.name, c.name), cfg.redlockDuration+cfg.warmUp+60*time.Second)
				r := runQuorum(addrs, c, cfg.redlockDuration, cfg.warmUp, cfg.pairTimeout, fmt.Sprintf("%d:%d:%d", ci, rep, i))
				stop()
				if r.err != nil {
					ok = ok && c.kind != kindDlock
					cfg.logf("scenario 4, %s, rep %d, %s: %v", cond.name, rep+1, c.name, r.err)
				} else {
					cfg.logf("scenario 4, %s, rep %d, %-24s %7.0f pairs/s, acquire p50 %v p99 %v",
						cond.name, rep+1, c.name, r.rate(), r.acqP50.Round(time.Microsecond), r.acqP99.Round(time.Microsecond))
				}
				rs := res[c]
				rs[ci] = append(rs[ci], r)
				res[c] = rs
			}
		}
	}
	proxy.SetDelay(0)

	fmt.Fprintf(&b, "%d private redis-servers; the fifth is reached through a TCP fault proxy "+
		"(`internal/redistest.Proxy`) in both conditions: passing bytes straight through (no fault), "+
		"then delaying every chunk by %v in each direction (`SetDelay(%v)`: +%v per round trip to that server). "+
		"%d goroutines, each locking and unlocking its own name in a loop for %v (after a %v warm-up); "+
		"median of %d repetitions, contenders interleaved. Acquire = the time `Lock` took; pair = Lock+Unlock.\n\n",
		redlockServers, redlockDelay, redlockDelay, 2*redlockDelay, redlockGoroutines, cfg.redlockDuration, cfg.warmUp, cfg.reps)
	b.WriteString("| contender | condition | pairs/s (median) | × best peer | acquire p50 | acquire p99 | pair p50 | pair p99 |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|\n")
	type row struct {
		rate, a50, a99, p50, p99 float64
		n                        int
		err                      error
	}
	rows := map[*quorumContender][2]row{}
	var best [2]float64
	var bestName [2]string
	for _, c := range quorumContenders {
		var rr [2]row
		for ci := range conds {
			var rates, a50, a99, p50, p99 []float64
			for _, x := range res[c][ci] {
				if x.err != nil {
					rr[ci].err = x.err
					continue
				}
				rates = append(rates, x.rate())
				a50 = append(a50, ms(x.acqP50))
				a99 = append(a99, ms(x.acqP99))
				p50 = append(p50, ms(x.pairP50))
				p99 = append(p99, ms(x.pairP99))
			}
			rr[ci].n = len(rates)
			if len(rates) > 0 {
				rr[ci].rate, rr[ci].a50, rr[ci].a99, rr[ci].p50, rr[ci].p99 = median(rates), median(a50), median(a99), median(p50), median(p99)
			}
			if c.kind == kindPeer && rr[ci].rate > best[ci] {
				best[ci], bestName[ci] = rr[ci].rate, c.name
			}
		}
		rows[c] = rr
	}
	for ci, cond := range conds {
		for _, c := range quorumContenders {
			r := rows[c][ci]
			if r.n == 0 {
				fmt.Fprintf(&b, "| %s | %s | error: %s | | | | | |\n", c.name, cond.name, oneLine(r.err))
				continue
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %.2f ms | %.2f ms | %.2f ms | %.2f ms |\n", c.name, cond.name,
				thousands(r.rate), ratio(r.rate, best[ci]), r.a50, r.a99, r.p50, r.p99)
		}
	}
	b.WriteString("\n")
	d := rows[quorumContenders[0]]
	if d[0].n > 0 && best[0] > 0 {
		fmt.Fprintf(&b, "- No fault: dlock quorum = **%s** the best peer (%s) in pairs/s (target ≥ 2× redsync: %s).\n",
			ratio(d[0].rate, best[0]), bestName[0], metUnmet(d[0].rate >= 2*best[0]))
		for _, c := range quorumContenders[1:] {
			if r := rows[c][0]; r.n > 0 {
				cfg.fig.target("4, 5 servers, no fault", "pairs/s ≥ 2× "+c.name, d[0].rate >= 2*r.rate, "%s", ratio(d[0].rate, r.rate))
			}
		}
	}
	if d[1].n > 0 && best[1] > 0 {
		fmt.Fprintf(&b, "- One slow server: dlock quorum = **%s** the best peer (%s) in pairs/s.\n", ratio(d[1].rate, best[1]), bestName[1])
	}
	if d[0].n > 0 && d[1].n > 0 {
		diff := d[1].a50 - d[0].a50
		fmt.Fprintf(&b, "- dlock quorum's acquire p50 with one slow server: %.2f ms against %.2f ms without: %+.2f ms (target within 2 ms: %s).\n",
			d[1].a50, d[0].a50, diff, metUnmet(math.Abs(diff) <= 2))
		cfg.fig.target("4, one server +20 ms", "acquire p50 within 2 ms of the no-fault p50", math.Abs(diff) <= 2,
			"%.2f ms vs %.2f ms (%+.2f ms)", d[1].a50, d[0].a50, diff)
	}
	for _, c := range quorumContenders {
		for ci := range conds {
			if r := rows[c][ci]; r.err != nil {
				fmt.Fprintf(&b, "- %s, %s: a repetition failed: %s.\n", c.name, conds[ci].name, oneLine(r.err))
			}
		}
	}
	for _, c := range quorumContenders {
		fmt.Fprintf(&b, "- **%s**: %s.\n", c.name, c.config)
	}
	return b.String(), ok
}
