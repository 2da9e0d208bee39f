package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// The multi-lock scenarios (a row with accounts > 0): transfers between accounts, each under a
// MultiMutex of its two accounts' locks. The resource is a set of accounts (the ledger) instead
// of one register; each worker goroutine loops, as a correct dlock user:
//
//	MultiMutex{from, to}.Lock → check the lease context → read both balances → (work, checking
//	the context) → check → write both balances (from − amount, to + amount) → Unlock
//
// with each account's own fencing token on every request. Fenced, the ledger refuses a read or
// a write that carries, for either account, a token below the highest it has seen for that
// account, and applies a write to both accounts or neither: the total of the balances must
// stay what it was. Unfenced it applies everything, and the run counts the overlaps (two
// participants' sections on one account intersecting) and lost updates a fence would have
// prevented. The faults are the single-lock scenarios' own (faults.go): a trap springs on the
// next request of the matching kind, so it hits a holder of two names inside its section.
//
// Wire format, one line each way:
//
//	R <slot> <inc> <g> <seq> <a> <tokA> <b> <tokB>\n                 read both
//	W <slot> <inc> <g> <seq> <a> <tokA> <newA> <b> <tokB> <newB>\n   write both
//	ok <balA> <balB> <work-ms>\n | stale 0 0 0\n

// transferStart is every account's balance when a run starts.
const transferStart = 1000

// transferOp is one request as the ledger saw it.
type transferOp struct {
	T          int64 // CLOCK_MONOTONIC ns when applied (or refused)
	Op         byte
	W          who
	Seq        int64
	A, B       int
	TokA, TokB uint64
	ValA, ValB int64 // read: the balances read; write: the balances written
	Accepted   bool
	Stale      bool // a token below the highest seen for its account
}

// transferHit is a request that sprang a fault's trap: the holder and its two accounts.
type transferHit struct {
	T    int64
	W    who
	A, B int
}

// transferData is what a transfers run leaves for analysis (runData.transfers).
type transferData struct {
	accounts int
	ops      []transferOp
	hits     []transferHit
	final    []int64
}

// ledger is the accounts server.
type ledger struct {
	fenced bool
	ln     net.Listener
	wg     sync.WaitGroup

	mu       sync.Mutex
	bal      []int64
	maxToken []uint64
	ops      []transferOp
	hits     []transferHit
	trap     *trap
	conns    map[net.Conn]struct{}
	closed   bool
	writes   int
}

func startLedger(fenced bool, accounts int) (*ledger, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	l := &ledger{fenced: fenced, ln: ln, bal: make([]int64, accounts), maxToken: make([]uint64, accounts), conns: make(map[net.Conn]struct{})}
	for i := range l.bal {
		l.bal[i] = transferStart
	}
	l.wg.Add(1)
	go l.serve()
	return l, nil
}

func (l *ledger) arm(t *trap) {
	l.mu.Lock()
	l.trap = t
	l.mu.Unlock()
}

func (l *ledger) disarm() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	had := l.trap != nil
	l.trap = nil
	return had
}

func (l *ledger) acceptedWrites() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.writes
}

func (l *ledger) Close() {
	l.mu.Lock()
	l.closed = true
	for c := range l.conns {
		_ = c.Close()
	}
	l.mu.Unlock()
	_ = l.ln.Close()
	l.wg.Wait()
}

func (l *ledger) serve() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = c.Close()
			return
		}
		l.conns[c] = struct{}{}
		l.mu.Unlock()
		l.wg.Add(1)
		go l.handle(c)
	}
}

func (l *ledger) handle(c net.Conn) {
	defer l.wg.Done()
	defer func() {
		l.mu.Lock()
		delete(l.conns, c)
		l.mu.Unlock()
		_ = c.Close()
	}()
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		op, err := parseTransferOp(line)
		if err != nil {
			fmt.Fprintf(c, "error %v\n", err)
			return
		}
		reply, ok := l.do(op)
		if !ok {
			return // dropped by a trap: the worker is gone
		}
		if _, err := c.Write([]byte(reply)); err != nil {
			return
		}
	}
}

func parseTransferOp(line string) (transferOp, error) {
	f := strings.Fields(line)
	bad := func() (transferOp, error) { return transferOp{}, fmt.Errorf("bad request %q", strings.TrimSpace(line)) }
	if len(f) < 9 || (f[0] != "R" && f[0] != "W") || (f[0] == "W") != (len(f) == 11) {
		return bad()
	}
	n := make([]int64, len(f)-1)
	for i, s := range f[1:] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return bad()
		}
		n[i] = v
	}
	op := transferOp{Op: f[0][0], W: who{int(n[0]), int(n[1]), int(n[2])}, Seq: n[3], A: int(n[4]), TokA: uint64(n[5])}
	if op.Op == 'R' {
		op.B, op.TokB = int(n[6]), uint64(n[7])
	} else {
		op.ValA, op.B, op.TokB, op.ValB = n[6], int(n[7]), uint64(n[8]), n[9]
	}
	return op, nil
}

// do applies one request (after springing a trap that matches it) and returns the reply line;
// ok is false when a trap dropped the request.
func (l *ledger) do(op transferOp) (string, bool) {
	l.mu.Lock()
	if op.A < 0 || op.A >= len(l.bal) || op.B < 0 || op.B >= len(l.bal) || op.A == op.B {
		l.mu.Unlock()
		return "error bad accounts\n", false
	}
	t := l.trap
	if t != nil && t.op == op.Op {
		l.trap = nil
		l.hits = append(l.hits, transferHit{T: mono(), W: op.W, A: op.A, B: op.B})
	} else {
		t = nil
	}
	l.mu.Unlock()
	var work time.Duration
	if t != nil {
		var drop bool
		if work, drop = t.fire(op.W, op.TokA); drop {
			return "", false
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	op.T = mono()
	op.Stale = op.TokA < l.maxToken[op.A] || op.TokB < l.maxToken[op.B]
	op.Accepted = !(l.fenced && op.Stale)
	if op.Accepted {
		l.maxToken[op.A] = max(l.maxToken[op.A], op.TokA)
		l.maxToken[op.B] = max(l.maxToken[op.B], op.TokB)
		if op.Op == 'W' {
			l.bal[op.A], l.bal[op.B] = op.ValA, op.ValB
			l.writes++
		} else {
			op.ValA, op.ValB = l.bal[op.A], l.bal[op.B]
		}
	}
	l.ops = append(l.ops, op)
	if !op.Accepted {
		return "stale 0 0 0\n", true
	}
	if op.Op == 'R' {
		return fmt.Sprintf("ok %d %d %d\n", op.ValA, op.ValB, work.Milliseconds()), true
	}
	return "ok 0 0 0\n", true
}

// accountLock is the lock name of account i in a run whose lock prefix is base.
func accountLock(base string, i int) string { return fmt.Sprintf("%s-acct-%d", base, i) }

// runTransfers is run for a transfers scenario: one redis-server behind a fault proxy per
// worker, the ledger, the workers (in their transfers role), the scenario's faults on the
// seeded schedule, until enough writes were applied and faults played out.
func runTransfers(conf runConf, sc *scenario, exe string) (*runData, error) {
	if sc.deploy != standalone {
		return nil, fmt.Errorf("scenario %s: transfers run on one server only", sc.name)
	}
	r := &runner{conf: conf, sc: sc, exe: exe, lock: "check-" + conf.Scenario, ending: make(chan struct{})}
	srv, err := redistest.StartProcess()
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	r.srvs = []*redistest.Server{srv}
	led, err := startLedger(conf.Fenced, sc.accounts)
	if err != nil {
		return nil, err
	}
	ledClosed := false
	defer func() {
		if !ledClosed {
			led.Close()
		}
	}()
	// The runner's resource only tells spawn the address the workers dial: the ledger's.
	r.res = &resource{ln: led.ln}
	for i := range conf.Workers {
		s := &slot{i: i}
		p, err := redistest.StartProxy(srv.Addr)
		if err != nil {
			return nil, err
		}
		defer p.Close()
		s.proxies = []*redistest.Proxy{p}
		r.slots = append(r.slots, s)
	}
	for _, s := range r.slots {
		if err := r.spawn(s); err != nil {
			r.stopWorkers()
			return nil, err
		}
	}
	data := &runData{conf: conf}
	startBy := time.Now().Add(30 * time.Second)
	for led.acceptedWrites() == 0 {
		if time.Now().After(startBy) {
			r.stopWorkers()
			return nil, fmt.Errorf("no transfer reached the ledger within 30 s: workers did not start (see %s)", conf.Dir)
		}
		time.Sleep(10 * time.Millisecond)
	}
	data.start = mono()
	deadline := time.Now().Add(conf.MaxRun)
	sched := newSchedule(conf)
	ctx, stopSched := context.WithCancel(context.Background())
	schedDone := make(chan struct{})
	go func() { defer close(schedDone); r.scheduleOn(ctx, sched, led) }()
	tick := time.NewTicker(20 * time.Millisecond)
	for {
		<-tick.C
		if time.Now().After(deadline) {
			break
		}
		r.mu.Lock()
		done := 0
		for _, f := range r.faults {
			if f.End != 0 {
				done++
			}
		}
		r.mu.Unlock()
		if led.acceptedWrites() >= conf.Cycles && done >= conf.MinFaults {
			break
		}
	}
	stopSched()
	<-schedDone
	r.faultWG.Wait()
	w0 := led.acceptedWrites()
	recoverBy := time.Now().Add(3*conf.TTL + 15*time.Second)
	for led.acceptedWrites() < w0+5 {
		if time.Now().After(recoverBy) {
			r.infraf("traffic did not recover within %v of the last fault", 3*conf.TTL+15*time.Second)
			break
		}
		<-tick.C
	}
	tick.Stop()
	close(r.ending)
	r.stopWorkers()
	data.end = mono()
	led.Close()
	ledClosed = true
	td := &transferData{accounts: sc.accounts, ops: led.ops, hits: led.hits, final: slices.Clone(led.bal)}
	data.transfers = td
	r.mu.Lock()
	data.faults = append([]faultRec(nil), r.faults...)
	data.infra = append(data.infra, r.infra...)
	r.mu.Unlock()
	if data.faults == nil && conf.MinFaults > 0 {
		data.infra = append(data.infra, "no fault was injected")
	}
	if b, err := json.MarshalIndent(data.faults, "", "  "); err == nil {
		_ = os.WriteFile(filepath.Join(conf.Dir, "faults.json"), b, 0o644)
	}
	data.events, err = readEvents(conf.Dir)
	return data, err
}

// scheduleOn is schedule (run.go) with the ledger's traps.
func (r *runner) scheduleOn(ctx context.Context, s *schedule, led *ledger) {
	for {
		p := s.next(r.sc.fault, r.conf.TTL)
		select {
		case <-ctx.Done():
			return
		case <-time.After(p.gap):
		}
		in := newInjection(r)
		led.arm(r.sc.fault.inject(r, p, in))
		select {
		case <-in.fired:
		case <-ctx.Done():
			if led.disarm() {
				return
			}
			<-in.fired
		case <-time.After(10 * time.Second):
			if led.disarm() {
				r.infraf("a %s trap did not spring within 10 s", r.conf.Scenario)
				continue
			}
			<-in.fired
		}
		select {
		case <-in.done:
		case <-ctx.Done():
			<-in.done
			return
		}
	}
}

// runTransferProcess is a worker process of a transfers scenario: one Client, Goroutines
// goroutines moving money between random pairs of accounts under a MultiMutex of both.
func runTransferProcess(ctx context.Context, conf workerConf, log *eventLog) error {
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	ds := mono()
	client, err := dlock.Dial(dctx, conf.RedisURLs[0], dlock.WithTTL(conf.TTL))
	dcancel()
	if err != nil {
		log.add(event{K: "dial", S: ds, R: mono(), Res: "err: " + err.Error(), Is: kindsOf(err)})
		return err
	}
	log.add(event{K: "dial", S: ds, R: mono(), Res: "ok"})
	defer client.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g := max(conf.Goroutines, 1)
	errs := make([]error, g)
	var wg sync.WaitGroup
	for i := range g {
		c, err := net.DialTimeout("tcp", conf.Resource, 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		w := &worker{conf: conf, log: log, g: i, res: &resConn{c: c, br: bufio.NewReader(c)}}
		rng := rand.New(rand.NewPCG(uint64(conf.Slot)<<32|uint64(conf.Inc)<<16|uint64(i), uint64(os.Getpid())))
		wg.Go(func() {
			backoff := 5 * time.Millisecond
			for ctx.Err() == nil {
				ok, err := w.transfer(ctx, client, rng)
				if err != nil {
					errs[i] = err
					cancel()
					return
				}
				if ok {
					backoff = 5 * time.Millisecond
					continue
				}
				select {
				case <-ctx.Done():
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, 100*time.Millisecond)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// transfer runs one transfer. Its acq event names the two accounts in Cause ("a,b").
func (w *worker) transfer(ctx context.Context, client *dlock.Client, rng *rand.Rand) (ok bool, err error) {
	a := rng.IntN(w.conf.Accounts)
	b := (a + 1 + rng.IntN(w.conf.Accounts-1)) % w.conf.Accounts
	names := []string{accountLock(w.conf.Lock, a), accountLock(w.conf.Lock, b)}
	pair := fmt.Sprintf("%d,%d", a, b)
	lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
	s := mono()
	l, lerr := client.MultiMutex(names).Lock(lctx)
	r := mono()
	lcancel()
	if lerr != nil {
		if ctx.Err() == nil {
			w.add(event{K: "acq", S: s, R: r, Res: "err: " + lerr.Error(), Is: kindsOf(lerr), Cause: pair})
		}
		return false, nil
	}
	toks := l.Tokens()
	ta, tb := toks[names[0]], toks[names[1]]
	w.add(event{K: "acq", S: s, R: r, Tok: l.Token(), Res: "ok", Cause: pair})
	lease := l.Context()
	var signalled atomic.Bool
	signal := func(at int64, how string, cause error) {
		if signalled.CompareAndSwap(false, true) {
			w.add(event{K: "sig", S: at, Tok: l.Token(), Cause: how, Is: kindsOf(cause)})
		}
	}
	stopAfter := context.AfterFunc(lease, func() {
		if cause := context.Cause(lease); errors.Is(cause, dlock.ErrLost) {
			signal(mono(), "done", cause)
		}
	})
	defer stopAfter()
	check := func() bool {
		at := mono()
		live := lease.Err() == nil
		w.add(event{K: "chk", S: at, Tok: l.Token(), Live: live})
		if cause := context.Cause(lease); !live && errors.Is(cause, dlock.ErrLost) {
			signal(at, "err", cause)
		}
		return live
	}
	w.seq++
	seq := w.seq
	defer func() {
		uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		us := mono()
		uerr := l.Unlock(uctx)
		ucancel()
		w.add(event{K: "unl", S: us, R: mono(), Tok: l.Token(), Res: errString(uerr), Is: kindsOf(uerr)})
		if errors.Is(uerr, dlock.ErrLost) {
			signal(us, "unlock", uerr)
		}
	}()
	if !check() {
		return true, nil
	}
	rs := mono()
	st, balA, balB, work, err := w.ledgerCall(fmt.Sprintf("R %d %d %d %d %d %d %d %d\n", w.conf.Slot, w.conf.Inc, w.g, seq, a, ta, b, tb))
	if err != nil {
		return true, fmt.Errorf("ledger read: %w", err)
	}
	w.add(event{K: "rd", S: rs, R: mono(), Tok: ta, Seq: seq, Res: st})
	if st != "ok" {
		return true, nil
	}
	if work > 0 {
		end := mono() + int64(work)
		for mono() < end {
			if !check() {
				return true, nil
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if !check() {
		return true, nil
	}
	amount := 1 + rng.Int64N(10)
	ws := mono()
	st, _, _, _, err = w.ledgerCall(fmt.Sprintf("W %d %d %d %d %d %d %d %d %d %d\n", w.conf.Slot, w.conf.Inc, w.g, seq, a, ta, balA-amount, b, tb, balB+amount))
	if err != nil {
		return true, fmt.Errorf("ledger write: %w", err)
	}
	w.add(event{K: "wr", S: ws, R: mono(), Tok: ta, Seq: seq, Res: st})
	return true, nil
}

// ledgerCall sends one request line and reads the reply: status, two balances, work.
func (w *worker) ledgerCall(line string) (string, int64, int64, time.Duration, error) {
	rc := w.res
	_ = rc.c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := rc.c.Write([]byte(line)); err != nil {
		return "", 0, 0, 0, err
	}
	reply, err := rc.br.ReadString('\n')
	if err != nil {
		return "", 0, 0, 0, err
	}
	f := strings.Fields(reply)
	if len(f) != 4 {
		return "", 0, 0, 0, fmt.Errorf("ledger: bad reply %q", reply)
	}
	var n [3]int64
	for i := range n {
		if n[i], err = strconv.ParseInt(f[i+1], 10, 64); err != nil {
			return "", 0, 0, 0, fmt.Errorf("ledger: bad reply %q", reply)
		}
	}
	return f[0], n[0], n[1], time.Duration(n[2]) * time.Millisecond, nil
}

// analyzeTransfers is analyze for a transfers run. Claimed, whatever the mode: a fault is
// followed by an acquisition; in scenarios that say so, a hit holder is told it lost its locks
// (mustSignal) and the locks of a dead holder come back within TTL + killRecoverySlack
// (boundedRecovery). Fenced: no lost update, the total of the balances unchanged, and no two
// participants' accepted sections on one account intersecting. Unfenced those are measured.
func analyzeTransfers(d *runData) *findings {
	td := d.transfers
	sc, _ := scenarioNamed(d.conf.Scenario)
	f := &findings{Scenario: d.conf.Scenario, Mode: d.conf.mode(), Seed: d.conf.Seed, Duration: time.Duration(d.end - d.start),
		Faults: len(d.faults), Linearizable: porcupine.CheckResult("–")}
	fail := func(format string, args ...any) { f.Failures = append(f.Failures, fmt.Sprintf(format, args...)) }
	for _, p := range d.infra {
		f.Notes = append(f.Notes, "harness: "+p)
	}

	// The ledger's record: sections, lost updates, stale operations.
	ops := slices.Clone(td.ops)
	slices.SortStableFunc(ops, func(x, y transferOp) int { return compareInt64(x.T, y.T) })
	f.Ops = len(ops)
	type key struct {
		w   who
		seq int64
	}
	reads := map[key]transferOp{}
	cur := make([]int64, td.accounts)
	for i := range cur {
		cur[i] = transferStart
	}
	type section struct {
		w      who
		s, e   int64
		accts  [2]int
		tokens [2]uint64
	}
	var sections []section
	for _, op := range ops {
		switch {
		case op.Stale && op.Accepted:
			f.StaleLanded++
		case op.Stale:
			f.StaleRejected++
		}
		if !op.Accepted {
			continue
		}
		k := key{op.W, op.Seq}
		if op.Op == 'R' {
			reads[k] = op
			continue
		}
		f.Writes++
		if rd, ok := reads[k]; ok {
			if cur[op.A] != rd.ValA {
				f.LostUpdates++
			}
			if cur[op.B] != rd.ValB {
				f.LostUpdates++
			}
			sections = append(sections, section{w: op.W, s: rd.T, e: op.T, accts: [2]int{op.A, op.B}, tokens: [2]uint64{op.TokA, op.TokB}})
		}
		cur[op.A], cur[op.B] = op.ValA, op.ValB
	}
	var total int64
	for _, v := range td.final {
		total += v
	}
	drift := total - int64(td.accounts*transferStart)
	for i := range sections {
		for j := i + 1; j < len(sections); j++ {
			x, y := sections[i], sections[j]
			if x.w == y.w || y.s >= x.e || x.s >= y.e {
				continue
			}
			if x.accts[0] == y.accts[0] || x.accts[0] == y.accts[1] || x.accts[1] == y.accts[0] || x.accts[1] == y.accts[1] {
				f.Overlaps++
			}
		}
	}
	f.Notes = append(f.Notes, fmt.Sprintf("transfers: %d accounts, %d transfers applied, the balances' total off by %d", td.accounts, f.Writes, drift))
	if d.conf.Fenced {
		if drift != 0 {
			fail("fenced: the balances' total is %d, not %d", total, td.accounts*transferStart)
		}
		if f.LostUpdates > 0 {
			fail("fenced: %d lost updates", f.LostUpdates)
		}
		if f.Overlaps > 0 {
			fail("fenced: %d overlapping accepted sections on an account", f.Overlaps)
		}
	}

	// The workers' events: acquisitions, signals.
	type acqEv struct {
		w     who
		s, r  int64
		accts [2]int
	}
	var acqs []acqEv
	var lat []time.Duration
	var sigs []event
	for _, e := range d.events {
		switch e.K {
		case "acq":
			if e.Res != "ok" {
				f.AcquireErrors++
				continue
			}
			var a, b int
			if _, err := fmt.Sscanf(e.Cause, "%d,%d", &a, &b); err != nil {
				continue
			}
			acqs = append(acqs, acqEv{w: e.who(), s: e.S, r: e.R, accts: [2]int{a, b}})
			lat = append(lat, time.Duration(e.R-e.S))
		case "sig":
			sigs = append(sigs, e)
		}
	}
	f.Cycles, f.Signals = len(acqs), len(sigs)
	if len(lat) > 0 {
		slices.Sort(lat)
		f.AcquireP50, f.AcquireP99 = lat[len(lat)/2], lat[(len(lat)*99)/100]
	}

	// Each fault: the request that sprang it names the hit holder's accounts.
	for _, ft := range d.faults {
		var hit *transferHit
		for i := range td.hits {
			if h := &td.hits[i]; h.W == ft.who() && h.T <= ft.Start && (hit == nil || h.T > hit.T) {
				hit = h
			}
		}
		if hit == nil {
			f.Notes = append(f.Notes, fmt.Sprintf("fault at %d: no ledger request recorded as its trigger", ft.Start))
			continue
		}
		next := int64(-1)
		for _, a := range acqs {
			if a.w.sameProcess(ft.who()) || a.r <= ft.Start {
				continue
			}
			if a.accts[0] == hit.A || a.accts[0] == hit.B || a.accts[1] == hit.A || a.accts[1] == hit.B {
				if next < 0 || a.r < next {
					next = a.r
				}
			}
		}
		if next < 0 {
			fail("fault on %s at %d: no other process acquired account %d or %d afterwards", ft.who(), ft.Start, hit.A, hit.B)
			continue
		}
		rec := time.Duration(next - ft.Start)
		f.Recovery = append(f.Recovery, rec)
		if sc.boundedRecovery && rec > d.conf.TTL+killRecoverySlack {
			fail("fault on %s: accounts %d,%d taken again %v after it, more than TTL + %v", ft.who(), hit.A, hit.B, rec, killRecoverySlack)
		}
		if sc.mustSignal {
			told := false
			for _, e := range sigs {
				if e.who() == ft.who() && e.S >= ft.Start {
					told = true
					break
				}
			}
			if !told {
				fail("fault on %s at %d: the hit holder was never told it lost its locks", ft.who(), ft.Start)
			}
		}
	}
	return f
}

func compareInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
