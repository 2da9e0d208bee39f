package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/goredisconn"
)

// A worker is one process of the workload: the checker runs its own binary again with
// roleEnv=worker and the worker's configuration in confEnv. The process makes one dlock.Client
// and runs Goroutines goroutines that share it (and so the same Mutex name): while one of them
// holds the lock, the others wait in the Client's local queue, and an Unlock passes the lock to
// the first of them, most times without a round trip to Redis (a local handoff). Each goroutine
// is a participant of its own, with its own connection to the resource and its own cycle
// numbers; each loops, as a correct dlock user:
//
//	Lock → check the lease context → read the register → (work, checking the context) →
//	check the lease context → write value+1 → Unlock
//
// with the lease's fencing token on every request. The process writes one JSON line per event
// to its log file, each naming the goroutine and stamped with CLOCK_MONOTONIC (see mono).
// Lines are written with one write(2) each, so a worker killed with SIGKILL loses none it had
// written.

const (
	roleEnv = "DLOCK_CHECK_ROLE"
	confEnv = "DLOCK_CHECK_WORKER"
)

type workerConf struct {
	Slot      int           `json:"slot"`
	Inc       int           `json:"inc"`
	RedisURLs []string      `json:"redis_urls"` // through the slot's own fault proxies; more than one: quorum
	Sentinels []string      `json:"sentinels"`  // instead: a Sentinel group, through go-redis's failover client
	Master    string        `json:"master"`
	AckN      int           `json:"ack_n"` // WithReplicaAck(AckN, AckWait) when > 0
	AckWait   time.Duration `json:"ack_wait"`
	Resource  string        `json:"resource"`
	Lock      string        `json:"lock"`
	TTL       time.Duration `json:"ttl"`
	Log       string        `json:"log"`
	MaxRun    time.Duration `json:"max_run"` // the worker exits after this even if never told to stop
	// Goroutines is how many goroutines share the process's Client (at least 1).
	Goroutines int `json:"goroutines"`
	// Poll: goroutine 0 takes the lock with TryLock every 10 ms instead of waiting in Lock (the
	// others wait in Lock).
	Poll bool `json:"poll"`
	// UnsafeEviction: Dial WithUnsafeEviction.
	UnsafeEviction bool `json:"unsafe_eviction"`
	// ReadBack: after each Unlock, read the lock's key (through the slot's proxy) and log it.
	ReadBack bool `json:"read_back"`
	// Shared: hold a read-write lock ("rw") or a semaphore ("sem") instead (shared.go).
	Shared string `json:"shared,omitempty"`
	// Permits > 0: every semaphore hold takes this many permits (shared.go).
	Permits int `json:"permits,omitempty"`
	// Accounts > 0: a multi-lock scenario's worker (transfers.go).
	Accounts int `json:"accounts"`
	// AdaptiveMin > 0: lock with WithAdaptiveTTL(AdaptiveMin, TTL) (adaptive.go).
	AdaptiveMin time.Duration `json:"adaptive_min,omitempty"`
	// TurnSlice > 0: the Mutex takes WithTurnSlice(TurnSlice) (turns.go).
	TurnSlice time.Duration `json:"turn_slice,omitempty"`
	// Election: the goroutines are candidates of an election on the lock's name (election.go).
	Election bool `json:"election,omitempty"`
}

// who is one participant of the workload: goroutine G of incarnation Inc of the worker process
// in slot Slot. Faults hit processes; every analysis treats each goroutine as a client of its
// own.
type who struct {
	Slot, Inc, G int
}

func (w who) String() string { return fmt.Sprintf("worker %d.%d g%d", w.Slot, w.Inc, w.G) }

// sameProcess reports whether w and o are goroutines of one worker process (one Client).
func (w who) sameProcess(o who) bool { return w.Slot == o.Slot && w.Inc == o.Inc }

// event is one line of a worker's log. Times are CLOCK_MONOTONIC ns.
type event struct {
	K     string `json:"k"` // start dial acq chk sig rd wr unl key log exit
	S     int64  `json:"s"` // start (or the instant, for chk and sig)
	R     int64  `json:"r,omitempty"`
	Tok   uint64 `json:"tok,omitempty"`
	Seq   int64  `json:"seq,omitempty"`
	Val   int64  `json:"val,omitempty"`
	Res   string `json:"res,omitempty"` // ok, stale, lost, err: ...
	Live  bool   `json:"live,omitempty"`
	PID   int    `json:"pid,omitempty"`
	Slot  int    `json:"slot"`
	Inc   int    `json:"inc"`
	G     int    `json:"g"` // the goroutine (start and exit: the process, 0)
	Cause string `json:"cause,omitempty"`
	Is    string `json:"is,omitempty"`    // the errKinds the event's error (sig: the lease's cause) wraps
	Units int    `json:"units,omitempty"` // acq of a shared row: 1 a reader, -1 the writer, or permits (shared.go)
}

func (e event) who() who { return who{e.Slot, e.Inc, e.G} }

// The dlock errors a worker tells apart in its log (event.Is): the analysis cannot call
// errors.Is on a logged message.
const (
	errKindLost           = "lost"
	errKindEvictionPolicy = "eviction-policy"
	errKindOutOfMemory    = "out-of-memory"
)

var errKinds = []struct {
	name   string
	err    error
	goName string // for messages
}{
	{errKindLost, dlock.ErrLost, "ErrLost"},
	{errKindEvictionPolicy, dlock.ErrEvictionPolicy, "ErrEvictionPolicy"},
	{errKindOutOfMemory, dlock.ErrOutOfMemory, "ErrOutOfMemory"},
}

// errName is the name in package dlock of the error an errKind stands for.
func errName(kind string) string {
	for _, k := range errKinds {
		if k.name == kind {
			return k.goName
		}
	}
	return kind
}

// kindsOf lists, comma-separated, the errKinds that err wraps.
func kindsOf(err error) string {
	var names []string
	for _, k := range errKinds {
		if errors.Is(err, k.err) {
			names = append(names, k.name)
		}
	}
	return strings.Join(names, ",")
}

// is reports whether e's error wraps the errKind kind.
func (e event) is(kind string) bool {
	for k := range strings.SplitSeq(e.Is, ",") {
		if k == kind {
			return true
		}
	}
	return false
}

// logWriter turns each line the Client logs (WithLogger, a text handler: one Write per record)
// into a "log" event.
type logWriter struct{ log *eventLog }

func (lw logWriter) Write(p []byte) (int, error) {
	lw.log.add(event{K: "log", S: mono(), Res: strings.TrimSpace(string(p))})
	return len(p), nil
}

type eventLog struct {
	mu   sync.Mutex
	f    *os.File
	slot int
	inc  int
}

func (l *eventLog) add(e event) {
	e.Slot, e.Inc = l.slot, l.inc
	b, _ := json.Marshal(e)
	b = append(b, '\n')
	l.mu.Lock()
	_, _ = l.f.Write(b)
	l.mu.Unlock()
}

func runWorker() int {
	var conf workerConf
	if err := json.Unmarshal([]byte(os.Getenv(confEnv)), &conf); err != nil {
		fmt.Fprintf(os.Stderr, "dlock-check worker: bad %s: %v\n", confEnv, err)
		return 2
	}
	f, err := os.OpenFile(conf.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dlock-check worker: %v\n", err)
		return 1
	}
	defer f.Close()
	log := &eventLog{f: f, slot: conf.Slot, inc: conf.Inc}
	log.add(event{K: "start", S: mono(), PID: os.Getpid()})

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, conf.MaxRun)
	defer cancel()

	err = runProcess(ctx, conf, log)
	log.add(event{K: "exit", S: mono(), Res: errString(err)})
	if err != nil {
		fmt.Fprintf(os.Stderr, "dlock-check worker %d.%d: %v\n", conf.Slot, conf.Inc, err)
		return 1
	}
	return 0
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// worker is one goroutine of a worker process.
type worker struct {
	conf workerConf
	log  *eventLog
	g    int
	poll bool // TryLock every 10 ms instead of Lock
	seq  int64
	// think > 0: a between-holds fault (turns.go) asked, in the resource's answer to the write,
	// that the process stop itself (SIGSTOP) right after the cycle's Unlock and then wait this
	// long before the next Lock. 0 for every other answer.
	think time.Duration

	res  *resConn
	keys *redis.Client // ReadBack, else nil
}

// add logs an event of this goroutine.
func (w *worker) add(e event) {
	e.G = w.g
	w.log.add(e)
}

// resConn is the worker's connection to the resource server: one request at a time.
type resConn struct {
	c  net.Conn
	br *bufio.Reader
}

// call sends one request line and reads the reply: status, value, work.
func (rc *resConn) call(line string) (string, int64, time.Duration, error) {
	_ = rc.c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := rc.c.Write([]byte(line)); err != nil {
		return "", 0, 0, err
	}
	reply, err := rc.br.ReadString('\n')
	if err != nil {
		return "", 0, 0, err
	}
	f := strings.Fields(reply)
	if len(f) != 3 {
		return "", 0, 0, fmt.Errorf("resource: bad reply %q", reply)
	}
	v, err1 := strconv.ParseInt(f[1], 10, 64)
	ms, err2 := strconv.ParseInt(f[2], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return "", 0, 0, fmt.Errorf("resource: bad reply %q", reply)
	}
	return f[0], v, time.Duration(ms) * time.Millisecond, nil
}

// runProcess makes the process's one Client and runs its goroutines until ctx ends or one of
// them fails (its resource connection broke); it returns the first failure.
func runProcess(ctx context.Context, conf workerConf, log *eventLog) error {
	if conf.Accounts > 0 {
		return runTransferProcess(ctx, conf, log)
	}
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	var client *dlock.Client
	var err error
	opts := []dlock.ClientOption{leaseOption(conf), dlock.WithLogger(slog.New(slog.NewTextHandler(logWriter{log}, nil)))}
	if conf.UnsafeEviction {
		opts = append(opts, dlock.WithUnsafeEviction())
	}
	ds := mono()
	if len(conf.Sentinels) > 0 {
		rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: conf.Master, SentinelAddrs: conf.Sentinels})
		defer rdb.Close()
		if conf.AckN > 0 {
			opts = append(opts, dlock.WithReplicaAck(conf.AckN, conf.AckWait))
		}
		client, err = dlock.New(goredisconn.New(rdb), opts...)
	} else if len(conf.RedisURLs) == 1 {
		client, err = dlock.Dial(dctx, conf.RedisURLs[0], opts...)
	} else {
		client, err = dlock.DialQuorum(dctx, conf.RedisURLs, opts...)
	}
	dcancel()
	if err != nil {
		log.add(event{K: "dial", S: ds, R: mono(), Res: "err: " + err.Error(), Is: kindsOf(err)})
		return err
	}
	log.add(event{K: "dial", S: ds, R: mono(), Res: "ok"})
	defer client.Close()
	var mopts []dlock.Option
	if conf.TurnSlice > 0 {
		mopts = append(mopts, dlock.WithTurnSlice(conf.TurnSlice))
	}
	m := client.Mutex(conf.Lock, mopts...)
	var keys *redis.Client // ReadBack: reads the lock's key after each Unlock
	if conf.ReadBack {
		ropts, err := redis.ParseURL(conf.RedisURLs[0])
		if err != nil {
			return err
		}
		keys = redis.NewClient(ropts)
		defer keys.Close()
	}

	workers := make([]*worker, max(conf.Goroutines, 1))
	for g := range workers {
		c, err := net.DialTimeout("tcp", conf.Resource, 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		workers[g] = &worker{conf: conf, log: log, g: g, poll: conf.Poll && g == 0, res: &resConn{c: c, br: bufio.NewReader(c)}, keys: keys}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(workers))
	var wg sync.WaitGroup
	for g, w := range workers {
		wg.Go(func() {
			run := func() error { return w.run(ctx, m) }
			switch {
			case conf.Shared != "":
				run = func() error { return w.runShared(ctx, client) } // shared.go
			case conf.Election:
				run = func() error { return w.runElection(ctx, client) } // election.go
			}
			if errs[g] = run(); errs[g] != nil {
				cancel() // the others finish their cycles and stop
			}
		})
	}
	wg.Wait()
	for g, err := range errs {
		if err != nil {
			return fmt.Errorf("goroutine %d: %w", g, err)
		}
	}
	return nil
}

// run loops cycles until ctx ends; it returns an error only when the resource connection
// failed.
func (w *worker) run(ctx context.Context, m *dlock.Mutex) error {
	return retryCycles(ctx, func() (bool, error) { return w.cycle(ctx, m) }, func() {
		if w.think > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(w.think):
			}
			w.think = 0
		}
	})
}

// retryCycles runs cycle until ctx ends, and returns its error (a failure of the resource
// connection, which ends the worker). After a cycle that could not take its lock (ok false:
// Redis unreachable in a restart, partition or failover, or no acknowledgement) it backs off,
// 5 ms doubling up to 100 ms, bounded by ctx; after one that did, it runs done, when not nil.
func retryCycles(ctx context.Context, cycle func() (ok bool, err error), done func()) error {
	backoff := 5 * time.Millisecond
	for ctx.Err() == nil {
		ok, err := cycle()
		if err != nil {
			return err
		}
		if ok {
			backoff = 5 * time.Millisecond
			if done != nil {
				done()
			}
			continue
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
	return nil
}

// cycle runs one Lock → read → write → Unlock. ok is false when the lock could not be taken
// (the caller backs off); err is returned only for failures of the resource connection, which
// end the worker.
func (w *worker) cycle(ctx context.Context, m *dlock.Mutex) (ok bool, err error) {
	lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
	s := mono()
	var l *dlock.Lease
	var lerr error
	if w.poll {
		l, lerr = pollLock(lctx, m)
	} else {
		l, lerr = m.Lock(lctx)
	}
	r := mono()
	lcancel()
	if lerr != nil {
		if ctx.Err() == nil {
			w.add(event{K: "acq", S: s, R: r, Res: "err: " + lerr.Error(), Is: kindsOf(lerr)})
		}
		return false, nil
	}
	tok := l.Token()
	w.add(event{K: "acq", S: s, R: r, Tok: tok, Res: "ok"})
	check, stopWatch := w.watch(tok, l.Context())
	defer stopWatch()

	w.seq++
	seq := w.seq
	defer func() {
		uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		us := mono()
		uerr := l.Unlock(uctx)
		ucancel()
		w.add(event{K: "unl", S: us, R: mono(), Tok: tok, Res: errString(uerr), Is: kindsOf(uerr)})
		if w.think > 0 {
			// A between-holds fault (turns.go): the process is to be hit right after this
			// Unlock, while its lock may be parked; the checker takes it from here.
			_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
		}
		if w.keys != nil {
			w.readBack(ctx, tok)
		}
	}()

	return true, w.section(tok, seq, check)
}

// watch watches the context of the lease (or term) of tok: it logs the lost-lock signal
// ("sig") when the context ends with ErrLost, and returns the check a correct user makes before
// each protected step (logged as "chk"), and the function that stops watching.
func (w *worker) watch(tok uint64, lease context.Context) (check func() bool, stop func() bool) {
	var signalled atomic.Bool
	signal := func(at int64, how string) {
		if signalled.CompareAndSwap(false, true) {
			w.add(event{K: "sig", S: at, Tok: tok, Cause: how, Is: kindsOf(context.Cause(lease))})
		}
	}
	stop = context.AfterFunc(lease, func() {
		at := mono()
		if errors.Is(context.Cause(lease), dlock.ErrLost) {
			signal(at, "done")
		}
	})
	check = func() bool {
		at := mono()
		err := lease.Err()
		live := err == nil
		w.add(event{K: "chk", S: at, Tok: tok, Live: live})
		if !live && errors.Is(context.Cause(lease), dlock.ErrLost) {
			signal(at, "err")
		}
		return live
	}
	return check, stop
}

// section is one critical section of the lease (or term) of tok, as a correct user runs it:
// check the context → read → (work, checking) → check → write value+1, every request carrying
// tok. It returns an error only for failures of the resource connection.
func (w *worker) section(tok uint64, seq int64, check func() bool) error {
	if !check() {
		return nil
	}
	rs := mono()
	st, val, work, err := w.res.call(fmt.Sprintf("R %d %d %d %d %d\n", w.conf.Slot, w.conf.Inc, w.g, seq, tok))
	if err != nil {
		return fmt.Errorf("resource read: %w", err)
	}
	w.add(event{K: "rd", S: rs, R: mono(), Tok: tok, Seq: seq, Val: val, Res: st})
	if st != "ok" {
		return nil
	}
	if work > 0 {
		// Long work: a correct user checks the lease between steps and gives up when it is lost.
		end := mono() + int64(work)
		for mono() < end {
			if !check() {
				return nil
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if !check() {
		return nil
	}
	ws := mono()
	st, _, w.think, err = w.res.call(fmt.Sprintf("W %d %d %d %d %d %d\n", w.conf.Slot, w.conf.Inc, w.g, seq, tok, val+1))
	if err != nil {
		return fmt.Errorf("resource write: %w", err)
	}
	w.add(event{K: "wr", S: ws, R: mono(), Tok: tok, Seq: seq, Val: val + 1, Res: st})
	return nil
}

// readBack reads the lock's key right after the Unlock of the lease of tok and logs what it
// holds: Live and the value when it exists, Res "err: ..." when it could not be read. The
// analysis judges it (checkOutOfMemory).
func (w *worker) readBack(ctx context.Context, tok uint64) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	s := mono()
	v, err := w.keys.Get(rctx, dlockKey(w.conf.Lock)).Result()
	e := event{K: "key", S: s, R: mono(), Tok: tok}
	switch {
	case errors.Is(err, redis.Nil):
	case err != nil:
		e.Res = "err: " + err.Error()
	default:
		e.Live, e.Res = true, v
	}
	w.add(e)
}

// pollLock takes the lock as a client that does not wait in Lock: TryLock every 10 ms. Unlike a
// waiter, which retries when the holder's lease would end or when woken by a release, it
// also tries at moments when the servers' state just changed under the holder (a restart).
func pollLock(ctx context.Context, m *dlock.Mutex) (*dlock.Lease, error) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		l, err := m.TryLock(ctx)
		if err == nil || !errors.Is(err, dlock.ErrNotAcquired) {
			return l, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}
