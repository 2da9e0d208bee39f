package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/goredisconn"
)

// The demo's worker processes run "dlock demo-worker". The parent talks to each worker over
// its standard streams, one word per line:
//
//	worker -> parent   "ready"  connected; waiting for "go"
//	parent -> worker   "go"     start buying
//	parent -> worker   "stop"   the sale is over: finish the purchase in hand and exit 0
//
// A closed standard input (the parent died) also stops the worker. Errors go to stderr and
// make the worker exit 1. Every count the demo reports is kept in Redis.
const demoWorkerCmd = "demo-worker"

// Demo modes.
const (
	modeNoLock = "nolock"
	modeNaive  = "naive"
	modeDlock  = "dlock"
)

var modeTitles = map[string]string{
	modeNoLock: "no lock",
	modeNaive:  "naive SETNX",
	modeDlock:  "dlock",
}

// Fields of the stats hash of a run.
const (
	statSold           = "sold"            // sales recorded
	statRejectedWrites = "rejected_writes" // fenced writes refused: a newer holder had read the stock
	statRejectedReads  = "rejected_reads"  // fenced reads refused: a newer holder had read the stock
	statOverran        = "overran"         // purchases that took longer than the lease (a pause hit the buyer)
	statForeignDel     = "foreign_del"     // naive DELs that removed another buyer's lock
	statLost           = "lost"            // dlock leases lost before Do returned
)

// demoKeys names the keys of one mode of one demo run. The data keys share the hash tag
// {run}, so the scripts that touch several of them also work on a Redis Cluster.
type demoKeys struct {
	stock  string // items left
	stats  string // hash of the stat* counters
	fence  string // the stock's fence, which dlock's fenced operations keep (dlock mode)
	lock   string // the hand-made lock's key (naive mode)
	inside string // pid of a buyer in the middle of a purchase, for the pause injector
	name   string // the dlock lock name (dlock mode)
}

func newDemoKeys(run, mode string) demoKeys {
	ns := "demo:{" + run + "}:" + mode + ":"
	return demoKeys{
		stock:  ns + "stock",
		stats:  ns + "stats",
		fence:  ns + "stock:dlock-fence", // the fence of a key with a hash tag (docs/PROTOCOL.md)
		lock:   ns + "lock",
		inside: ns + "inside",
		name:   "demo:" + run + ":" + mode + ":stock",
	}
}

func (k demoKeys) all() []string { return []string{k.stock, k.stats, k.fence, k.lock, k.inside} }

const (
	maxPurchaseAttempts = 1_000_000            // per buyer goroutine; the worker's --timeout bounds it too
	maxLockAttempts     = 100_000              // per naive acquisition, each after a retry sleep
	workMax             = 3 * time.Millisecond // a purchase works 1.5 to 3 ms
	markMargin          = 500 * time.Microsecond
	idleMin, idleMax    = 3 * time.Millisecond, 7 * time.Millisecond // re-check of an empty stock
	retryMin, retryMax  = 3 * time.Millisecond, 7 * time.Millisecond // naive lock busy: sleep, retry
)

type demoWorker struct {
	rdb      *redis.Client
	lc       *dlock.Client // dlock mode only
	keys     demoKeys
	mode     string
	ttl      time.Duration
	pid      string
	ctx      context.Context // bounded by --timeout; Redis calls use it, so a purchase in hand completes after "stop"
	seed, id uint64
}

func runDemoWorker(ctx context.Context, std *stdio, args []string) int {
	fs := newFlagSet(demoWorkerCmd, `
One buyer process of "dlock demo", which starts it; not meant to be run by hand.
It connects, prints "ready", buys on "go" until "stop" or the end of its input.

Example (what demo runs):
  dlock demo-worker --redis redis://127.0.0.1:6379/0 --mode dlock --run 1a2b3c4d --goroutines 8`)
	url := fs.String("redis", "", "Redis URL")
	mode := fs.String("mode", modeDlock, "nolock, naive or dlock")
	run := fs.String("run", "", "run id: names the keys")
	goroutines := fs.Int("goroutines", 8, "concurrent buyers")
	ttl := fs.Duration("ttl", 300*time.Millisecond, "lock lease")
	seed := fs.Uint64("seed", 1, "seed of the random work times")
	id := fs.Uint64("id", 0, "worker number, mixed into the seed")
	transport := fs.String("transport", "rueidis", "dlock transport: rueidis or goredis")
	timeout := fs.Duration("timeout", time.Minute, "hard limit on the worker's life")
	if done, code := parseFlags(fs, std, args, false); done {
		return code
	}
	if _, ok := modeTitles[*mode]; !ok || *url == "" || *run == "" || *goroutines < 1 || *goroutines > maxGoroutines {
		fmt.Fprintln(std.err, "demo-worker: need --redis, --run, a valid --mode and --goroutines")
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	w := &demoWorker{
		keys: newDemoKeys(*run, *mode), mode: *mode, ttl: *ttl,
		pid: strconv.Itoa(os.Getpid()), ctx: ctx, seed: *seed, id: *id,
	}
	if err := w.connect(*url, *goroutines, *transport); err != nil {
		fmt.Fprintf(std.err, "demo-worker %d: %v\n", *id, err)
		return exitFailure
	}
	defer w.close()

	lines := make(chan string)
	go func() { // ends with the process: the parent closes our stdin, or we exit
		defer close(lines)
		sc := bufio.NewScanner(std.in)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	fmt.Fprintln(std.out, "ready")
	select {
	case l := <-lines:
		if l != "go" {
			return exitOK // input closed (or not "go"): the parent gave up on this run
		}
	case <-ctx.Done():
		fmt.Fprintf(std.err, "demo-worker %d: no \"go\" within %v\n", *id, *timeout)
		return exitFailure
	}
	sale, stopSale := context.WithCancel(ctx)
	defer stopSale()
	go func() {
		for l := range lines {
			if l == "stop" {
				break
			}
		}
		stopSale()
	}()

	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for g := range *goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.buyer(uint64(g)).run(sale); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				stopSale()
			}
		}()
	}
	wg.Wait()
	if errors.Is(ctx.Err(), context.DeadlineExceeded) && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("still buying after --timeout %v", *timeout))
	}
	if len(errs) > 0 {
		fmt.Fprintf(std.err, "demo-worker %d (pid %s): %v\n", *id, w.pid, errors.Join(errs...))
		return exitFailure
	}
	return exitOK
}

func (w *demoWorker) connect(url string, goroutines int, transport string) error {
	rdb, err := newRedisClient(url, goroutines+4)
	if err != nil {
		return err
	}
	w.rdb = rdb
	if err := rdb.Ping(w.ctx).Err(); err != nil {
		return fmt.Errorf("redis %s: %w", url, err)
	}
	if w.mode != modeDlock {
		return nil
	}
	switch transport {
	case "rueidis":
		w.lc, err = dlock.Dial(w.ctx, url, dlock.WithTTL(w.ttl), dlock.WithLabel("dlock demo"))
	case "goredis":
		w.lc, err = dlock.New(goredisconn.New(rdb), dlock.WithTTL(w.ttl), dlock.WithLabel("dlock demo"))
	default:
		err = fmt.Errorf("unknown transport %q", transport)
	}
	return err
}

func (w *demoWorker) close() {
	if w.lc != nil {
		w.lc.Close()
	}
	if w.rdb != nil {
		w.rdb.Close()
	}
}

type buyer struct {
	w   *demoWorker
	rng *rand.Rand
	tag string // pid:goroutine, the start of this buyer's naive lock values
	seq int
}

func (w *demoWorker) buyer(g uint64) *buyer {
	return &buyer{
		w:   w,
		rng: rand.New(rand.NewPCG(w.seed, w.id<<32|g)),
		tag: w.pid + ":" + strconv.FormatUint(g, 10) + ":",
	}
}

func (b *buyer) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(b.rng.Int64N(int64(hi-lo)))
}

// run buys one item at a time until the sale stops.
func (b *buyer) run(sale context.Context) error {
	w := b.w
	for range maxPurchaseAttempts {
		if sale.Err() != nil {
			return nil
		}
		// Look at the shelf first, without a lock, so an empty stock costs no lock traffic.
		left, err := w.rdb.Get(w.ctx, w.keys.stock).Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			return b.fail(sale, "read stock", err)
		}
		if left <= 0 {
			sleepCtx(sale, b.between(idleMin, idleMax))
			continue
		}
		switch w.mode {
		case modeNoLock:
			err = b.buyNoLock()
		case modeNaive:
			err = b.buyNaive(sale)
		case modeDlock:
			err = b.buyDlock(sale)
		}
		if err != nil {
			return b.fail(sale, "buy", err)
		}
	}
	return nil
}

// fail turns err into the worker's error, unless it only says that the sale or the worker's
// time is over.
func (b *buyer) fail(sale context.Context, what string, err error) error {
	if sale.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

// work is the purchase's business logic between reading and writing the stock: a few
// milliseconds. It tells the pause injector who is inside (the mark expires when the work
// should be over) and records a purchase that lasted longer than the lease: the buyer was
// frozen mid-purchase.
func (b *buyer) work(since time.Time) error {
	// The mark lasts whole milliseconds and ends at least markMargin before the work does, so
	// that a worker found through it is still working when the SIGSTOP arrives.
	mark := time.Duration(1+b.rng.IntN(int(workMax/time.Millisecond)-1)) * time.Millisecond
	if err := b.w.rdb.Set(b.w.ctx, b.w.keys.inside, b.w.pid, mark).Err(); err != nil {
		return err
	}
	time.Sleep(mark + b.between(markMargin, time.Millisecond))
	if time.Since(since) > b.w.ttl {
		return b.w.rdb.HIncrBy(b.w.ctx, b.w.keys.stats, statOverran, 1).Err()
	}
	return nil
}

// buyNoLock is the articles' starting point: read the stock, and write back one less.
func (b *buyer) buyNoLock() error {
	w := b.w
	start := time.Now()
	left, err := w.rdb.Get(w.ctx, w.keys.stock).Int64()
	if err != nil || left <= 0 {
		return ignoreNil(err)
	}
	if err := b.work(start); err != nil {
		return err
	}
	return b.recordSale(left - 1)
}

func (b *buyer) recordSale(left int64) error {
	w := b.w
	_, err := w.rdb.Pipelined(w.ctx, func(p redis.Pipeliner) error {
		p.Set(w.ctx, w.keys.stock, left, 0)
		p.HIncrBy(w.ctx, w.keys.stats, statSold, 1)
		return nil
	})
	return err
}

// buyNaive is the articles' hand-made lock: SET lock NX PX ttl, retried after a sleep while
// busy, then DEL. Nothing checks the owner, renews the lease or fences the writes. The value
// is unique per acquisition only so that the demo can count the DELs that removed someone
// else's lock; the release still deletes whatever is there, as the articles' code does.
func (b *buyer) buyNaive(sale context.Context) error {
	w := b.w
	b.seq++
	me := b.tag + strconv.Itoa(b.seq)
	for attempt := 1; ; attempt++ {
		ok, err := w.rdb.SetNX(w.ctx, w.keys.lock, me, w.ttl).Result()
		if err != nil {
			return err
		}
		if ok {
			break
		}
		if attempt == maxLockAttempts {
			return fmt.Errorf("lock still busy after %d attempts", attempt)
		}
		if !sleepCtx(sale, b.between(retryMin, retryMax)) {
			return nil // the sale is over; nothing held
		}
	}
	start := time.Now()
	err := func() error {
		left, err := w.rdb.Get(w.ctx, w.keys.stock).Int64()
		if err != nil || left <= 0 {
			return ignoreNil(err)
		}
		if err := b.work(start); err != nil {
			return err
		}
		return b.recordSale(left - 1)
	}()
	// GETDEL is a DEL that also says what it deleted.
	was, derr := w.rdb.GetDel(w.ctx, w.keys.lock).Result()
	switch {
	case derr == nil && was != me:
		derr = w.rdb.HIncrBy(w.ctx, w.keys.stats, statForeignDel, 1).Err()
	case errors.Is(derr, redis.Nil):
		derr = nil // our lock had expired and nobody had taken it
	}
	return errors.Join(err, derr)
}

// buyDlock runs the purchase under c.Do, with fenced reads and writes of the stock: the
// server refuses both to a holder whose token is older than the newest that used the stock.
func (b *buyer) buyDlock(sale context.Context) error {
	w := b.w
	err := w.lc.Do(sale, w.keys.name, func(ctx context.Context) error {
		start := time.Now()
		token, _ := dlock.TokenFromContext(ctx)
		v, ok, err := w.lc.FencedGet(w.ctx, w.keys.stock, token)
		switch {
		case errors.Is(err, dlock.ErrStale): // a newer holder has read the stock since
			return w.rdb.HIncrBy(w.ctx, w.keys.stats, statRejectedReads, 1).Err()
		case err != nil || !ok:
			return err
		}
		left, err := strconv.ParseInt(v, 10, 64)
		if err != nil || left <= 0 {
			return err
		}
		if err := b.work(start); err != nil {
			return err
		}
		// A careful service would check ctx.Err() here and give up if the lease was lost.
		// The demo writes regardless, as a holder paused between that check and its write
		// would, so that the fence has to refuse the stale write.
		err = w.lc.FencedSet(w.ctx, w.keys.stock, strconv.FormatInt(left-1, 10), token, 0)
		switch {
		case errors.Is(err, dlock.ErrStale):
			return w.rdb.HIncrBy(w.ctx, w.keys.stats, statRejectedWrites, 1).Err()
		case err != nil:
			return err
		}
		return w.rdb.HIncrBy(w.ctx, w.keys.stats, statSold, 1).Err()
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, dlock.ErrLost):
		return w.rdb.HIncrBy(w.ctx, w.keys.stats, statLost, 1).Err()
	case sale.Err() != nil && errors.Is(err, context.Canceled):
		return nil // the sale ended while this buyer waited for the lock
	}
	return err
}

func ignoreNil(err error) error {
	if errors.Is(err, redis.Nil) {
		return nil
	}
	return err
}

// sleepCtx sleeps for d unless ctx ends first; it reports whether it slept the whole time.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
