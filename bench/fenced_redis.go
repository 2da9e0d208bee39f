package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/goredisconn"
	"github.com/dlock-go/dlock/rueidisconn"
)

// Scenario 11: what a fenced operation on the application's own key costs beside the plain
// command, through the same Redis client: Client.FencedIncrBy (fenced.lua: read the fence,
// INCRBY, and for a token other than the fence's PTTL and a write of the fence) against INCRBY,
// and FencedGet against GET, one process × 16 goroutines (and × 1) on one key, the plain and the
// fenced runs interleaved. Not in the default list: run it with --scenarios 11.

// fencedShapes are the goroutines of each measurement: 16, the target's, where calls queue on
// the server (rueidis pipelines them on one connection), and 1, where each call waits for its
// own round trip.
var fencedShapes = []int{16, 1}

// fencedResult is one measurement: calls completed in elapsed, and each call's latency.
type fencedResult struct {
	goroutines int
	calls      int // measured
	total      int // completed, with the warm-up's
	elapsed    time.Duration
	p50        time.Duration
	cpu        time.Duration // the server's CPU time while measuring
	err        error
}

// perCall is the time one call costs the run: elapsed × goroutines ÷ calls (the inverse of
// the throughput, per goroutine).
func (r fencedResult) perCall() time.Duration {
	if r.calls == 0 {
		return 0
	}
	return r.elapsed * time.Duration(r.goroutines) / time.Duration(r.calls)
}

// fencedClient is one transport: a dlock Client over a Redis client, and that client's plain
// commands.
type fencedClient struct {
	name  string
	c     *dlock.Client
	incr  func(ctx context.Context, key string) error
	get   func(ctx context.Context, key string) error
	floor func(ctx context.Context, key string) error // floorScript on key, through the same client
	close func()
}

// floorScript is the least a check on the server costs: a script of two commands (a read of a
// second key of the same slot, then the increment), with no fencing logic: what any fenced
// operation through a script pays at least.
const floorScript = "redis.call('GET', KEYS[2]) return redis.call('INCRBY', KEYS[1], 1)"

func fencedClients(srv *server) ([]fencedClient, error) {
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
	if err != nil {
		return nil, err
	}
	rd, err := dlock.New(rueidisconn.New(rc))
	if err != nil {
		rc.Close()
		return nil, err
	}
	gc := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	gd, err := dlock.New(goredisconn.New(gc))
	if err != nil {
		rd.Close()
		rc.Close()
		gc.Close()
		return nil, err
	}
	rfloor, gfloor := rueidis.NewLuaScript(floorScript), redis.NewScript(floorScript)
	return []fencedClient{
		{"rueidis", rd,
			func(ctx context.Context, key string) error {
				return rc.Do(ctx, rc.B().Incrby().Key(key).Increment(1).Build()).Error()
			},
			func(ctx context.Context, key string) error {
				err := rc.Do(ctx, rc.B().Get().Key(key).Build()).Error()
				if rueidis.IsRedisNil(err) {
					return nil
				}
				return err
			},
			func(ctx context.Context, key string) error {
				return rfloor.Exec(ctx, rc, []string{key, key + ":x"}, nil).Error()
			},
			func() { rd.Close(); rc.Close() }},
		{"go-redis", gd,
			func(ctx context.Context, key string) error { return gc.IncrBy(ctx, key, 1).Err() },
			func(ctx context.Context, key string) error {
				if err := gc.Get(ctx, key).Err(); err != nil && !errors.Is(err, redis.Nil) {
					return err
				}
				return nil
			},
			func(ctx context.Context, key string) error {
				return gfloor.Run(ctx, gc, []string{key, key + ":x"}).Err()
			},
			func() { gd.Close(); gc.Close() }},
	}, nil
}

// runFenced runs op from goroutines goroutines for cfg.fencedDuration after a warm-up.
func runFenced(srv *server, cfg config, goroutines int, op func(ctx context.Context) error) fencedResult {
	ctx, cancel := context.WithTimeout(context.Background(), cfg.fencedDuration+cfg.warmUp+time.Minute)
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		first    error
		lats     []time.Duration
		calls    int
		total    int
		start    time.Time
		cpu0     time.Duration
		ready    = make(chan struct{})
		measured = make(chan struct{})
	)
	stopAt := time.Now().Add(cfg.warmUp + cfg.fencedDuration)
	for range goroutines {
		wg.Go(func() {
			mine := make([]time.Duration, 0, 4096)
			done := 0
			for {
				t0 := time.Now()
				if t0.After(stopAt) {
					break
				}
				if err := op(ctx); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
				done++
				select {
				case <-ready:
					select {
					case <-measured:
					default:
						mine = append(mine, time.Since(t0))
					}
				default:
				}
			}
			mu.Lock()
			lats = append(lats, mine...)
			calls += len(mine)
			total += done
			mu.Unlock()
		})
	}
	time.Sleep(cfg.warmUp)
	cpu0, start = srv.cpu(), time.Now()
	close(ready)
	time.Sleep(time.Until(stopAt))
	close(measured)
	elapsed, cpu := time.Since(start), srv.cpu()-cpu0
	wg.Wait()
	res := fencedResult{goroutines: goroutines, calls: calls, total: total, elapsed: elapsed, cpu: cpu, err: first}
	if len(lats) > 0 {
		slices.Sort(lats)
		res.p50 = lats[len(lats)/2]
	}
	return res
}

// measureFenced runs scenario 11 and returns its markdown; ok is false when a call failed or
// the fenced counter did not add up.
func measureFenced(srv *server, cfg config) (string, bool) {
	var b strings.Builder
	ok := true
	b.WriteString("### 11. Fenced operations on the application's own key\n\n")
	fmt.Fprintf(&b, "`Client.FencedIncrBy(ctx, key, 1, token)` (one script: check the token against the key's fence, "+
		"INCRBY; with a token other than the fence's, also read the key's PTTL and write the fence) beside "+
		"`INCRBY key 1` sent through the same Redis client, and `FencedGet` (the same script, its reply read "+
		"through the transport's plain command path, as it holds a string) beside `GET`: 1 process × 16 "+
		"goroutines on one key (and × 1, where each call waits for its own round trip), one holder's token, "+
		"%v per measurement after %v of warm-up, the plain and the fenced runs interleaved, medians of %d. "+
		"**time per call**: the measurement's length × goroutines ÷ calls (the inverse of the throughput, per "+
		"goroutine); **p50**: the median call's latency; **Redis CPU**: the server's CPU time (`INFO cpu`) per "+
		"call. Every fenced INCRBY measurement checks that the counter is exactly the calls made. "+
		"Target: fenced INCRBY ≤ 1.2× INCRBY's time per call at 16 goroutines.\n\n",
		cfg.fencedDuration, cfg.warmUp, cfg.reps)
	b.WriteString("| transport | goroutines | operation | plain calls/s | fenced calls/s | time per call, plain / fenced | fenced ÷ plain | p50, plain / fenced | Redis CPU µs per call, plain / fenced |\n")
	b.WriteString("|---|---:|---|---:|---:|---:|---:|---:|---:|\n")
	clients, err := fencedClients(srv)
	if err != nil {
		fmt.Fprintf(&b, "| error | | %s | | | | | | |\n", oneLine(err))
		return b.String(), false
	}
	defer func() {
		for _, fc := range clients {
			fc.close()
		}
	}()
	stopDog := watchdog("scenario 11", time.Duration(cfg.reps*len(clients)*len(fencedShapes)*4)*(cfg.fencedDuration+cfg.warmUp+time.Minute))
	defer stopDog()
	for _, fc := range clients {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		l, err := fc.c.Mutex("bench:fenced").TryLock(ctx)
		if err != nil {
			cancel()
			ok = false
			fmt.Fprintf(&b, "| %s | | error | %s | | | | | |\n", fc.name, oneLine(err))
			continue
		}
		token := l.Token()
		l.Unlock(ctx)
		cancel()
		const fencedKey, plainKey = "bench:{fenced}:stock", "bench:{plain}:stock"
		ops := []fencedPair{
			{"incr by 1", func(ctx context.Context) error { return fc.incr(ctx, plainKey) },
				func(ctx context.Context) error { _, err := fc.c.FencedIncrBy(ctx, fencedKey, 1, token); return err },
				fencedKey},
			{"get", func(ctx context.Context) error { return fc.get(ctx, plainKey) },
				func(ctx context.Context) error { _, _, err := fc.c.FencedGet(ctx, fencedKey, token); return err },
				""},
			// The floor: in the fenced column, a bare two-command script in place of the fenced call.
			{"incr by 1: a bare two-command script (the floor)", func(ctx context.Context) error { return fc.incr(ctx, plainKey) },
				func(ctx context.Context) error { return fc.floor(ctx, "bench:{floor}:stock") },
				""},
		}
		for _, goroutines := range fencedShapes {
			for _, op := range ops {
				row, rok := measureFencedPair(srv, cfg, fc.name, goroutines, op)
				b.WriteString(row)
				ok = ok && rok
			}
		}
	}
	return b.String(), ok
}

// fencedPair is a plain operation and its fenced counterpart.
type fencedPair struct {
	name          string
	plain, fenced func(ctx context.Context) error
	counter       string // the key the fenced one increments by 1 per call ("": none)
}

// measureFencedPair measures op plain and fenced, interleaved, and returns its table row.
func measureFencedPair(srv *server, cfg config, transport string, goroutines int, op fencedPair) (string, bool) {
	type series struct{ rate, per, p50, cpu []float64 }
	var plain, fenced series
	check := ""
	for rep := range cfg.reps {
		srv.flush()
		order := []bool{false, true}
		if rep%2 == 1 {
			order = []bool{true, false}
		}
		for _, isFenced := range order {
			run, s := op.plain, &plain
			if isFenced {
				run, s = op.fenced, &fenced
			}
			r := runFenced(srv, cfg, goroutines, run)
			cfg.logf("bench: scenario 11, %s, %d goroutines, %s, fenced=%v: %d calls in %v, p50 %v (%v)",
				transport, goroutines, op.name, isFenced, r.calls, r.elapsed.Round(time.Millisecond), r.p50, r.err)
			if r.err != nil || r.calls == 0 {
				check = "error: " + oneLine(cmp(r.err, errors.New("no call completed")))
				continue
			}
			if isFenced && op.counter != "" {
				// No increment lost or doubled: the counter is what the calls added.
				if err := fencedCounterIs(srv, op.counter, r.total); err != nil {
					check = oneLine(err)
					continue
				}
			}
			s.rate = append(s.rate, float64(r.calls)/r.elapsed.Seconds())
			s.per = append(s.per, float64(r.perCall().Microseconds()))
			s.p50 = append(s.p50, float64(r.p50.Microseconds()))
			s.cpu = append(s.cpu, float64(r.cpu.Microseconds())/float64(r.calls))
		}
	}
	if check != "" {
		return fmt.Sprintf("| %s | %d | %s | %s | | | | | |\n", transport, goroutines, op.name, check), false
	}
	return fmt.Sprintf("| %s | %d | %s | %s | %s | %.0f µs / %.0f µs | %.2f× | %.0f µs / %.0f µs | %.1f / %.1f |\n",
		transport, goroutines, op.name, thousands(median(plain.rate)), thousands(median(fenced.rate)),
		median(plain.per), median(fenced.per), median(fenced.per)/median(plain.per),
		median(plain.p50), median(fenced.p50), median(plain.cpu), median(fenced.cpu)), true
}

// fencedCounterIs checks the fenced counter after a measurement: want, with its fence beside it.
func fencedCounterIs(srv *server, key string, want int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := srv.admin.Get(ctx, key).Result()
	if err != nil {
		return fmt.Errorf("fenced counter: %w", err)
	}
	if v != strconv.Itoa(want) {
		return fmt.Errorf("fenced counter %s after %d increments", v, want)
	}
	if n, _ := srv.admin.Exists(ctx, key+":dlock-fence").Result(); n != 1 {
		return errors.New("fenced counter without its fence")
	}
	return nil
}
