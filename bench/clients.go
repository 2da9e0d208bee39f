package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
)

// Scenario 7: the contention shape production has. Not many goroutines of one process on one
// name (scenarios 2 and 3), but many clients — processes, each with its own client library
// instance — with one goroutine each, on one name; then the same over a quorum of servers, and
// what TryLock does when a majority of the quorum is frozen.

const (
	clientsN    = 10               // clients (or goroutines of the one client) on the name
	clientsHold = time.Millisecond // the critical section of the "1 ms" cases
	// frozenCount of the redlockServers quorum servers are SIGSTOPped in the TryLock case.
	frozenCount = 3
	// redislockRampStep and redislockRampMax: the n-th retry of the linear redislock variant
	// waits n × step, at most max.
	redislockRampStep = time.Millisecond
	redislockRampMax  = 10 * time.Millisecond
)

// linearRamp is a redislock.RetryStrategy whose n-th retry waits n × step, at most max.
// redislock's own LinearBackoff waits one fixed interval; its docs' examples use 100 and 500 ms.
type linearRamp struct {
	n         int
	step, max time.Duration
}

func (r *linearRamp) NextBackoff() time.Duration {
	r.n++
	return min(time.Duration(r.n)*r.step, r.max)
}

// The turn slices of scenario 7's turn contenders: dlock (rueidis) with dlock.WithTurnSlice on
// its Mutex, so that a client re-locking the name within its turn does so locally.
const (
	turnShort = 200 * time.Microsecond
	turnLong  = time.Millisecond
)

// turnContender is dlock (rueidis) whose Mutexes keep the lock for a turn of slice after their
// last Unlock (dlock.WithTurnSlice).
func turnContender(slice time.Duration) *contender {
	return &contender{
		name: turnName(slice), kind: kindDlock,
		config: fmt.Sprintf("as dlock (rueidis), with `dlock.WithTurnSlice(%v)` on its `Mutex`: after its last `Unlock` the "+
			"client keeps the lock until %s have passed since it got it from the server (at most 16 holds), and a `Lock` "+
			"meanwhile takes it back locally with the next token; the turn's end releases it to the next client queued",
			slice, strings.TrimPrefix(turnName(slice), "dlock (rueidis), turn ")),
		open: func(ctx context.Context, addr string, ttl time.Duration) (client, error) {
			c, err := dlock.Dial(ctx, "redis://"+addr+"/0", dlock.WithTTL(ttl))
			if err != nil {
				return nil, err
			}
			return &dlockClient{c: c, opts: []dlock.Option{dlock.WithTurnSlice(slice)}}, nil
		},
		key: dlockKey,
	}
}

// turnName is the name of the turn contender of slice ("dlock (rueidis), turn 200 µs").
func turnName(slice time.Duration) string {
	if slice < time.Millisecond {
		return fmt.Sprintf("dlock (rueidis), turn %d µs", slice.Microseconds())
	}
	return "dlock (rueidis), turn " + msText(slice)
}

// clientsOnly are contenders that only scenario 7 measures (contenderByName finds them, for the
// worker processes).
var clientsOnly = []*contender{
	turnContender(turnShort),
	turnContender(turnLong),
	{
		name: "redislock, 1–10 ms linear", kind: kindPeer,
		config: "bsm/redislock v0.9.4, go-redis pool of 64, `Obtain` retrying with a linear backoff: the n-th retry waits n ms, " +
			"at most 10 ms (a `RetryStrategy` of the bench: redislock's own `LinearBackoff` retries at one fixed interval, " +
			"100 or 500 ms in its examples, and its `ExponentialBackoff` recommends at least 16 ms, as scenarios 2 and 3 use), " +
			"until the context's deadline",
		open: func(ctx context.Context, addr string, ttl time.Duration) (client, error) {
			rdb := newGoredis(addr)
			return &redislockClient{rdb: rdb, c: redislock.New(rdb), ttl: ttl, retry: func() redislock.RetryStrategy {
				return &linearRamp{step: redislockRampStep, max: redislockRampMax}
			}}, nil
		},
		key: func(name string) string { return name },
	},
}

// clientsCase is one contention shape of scenario 7.
type clientsCase struct {
	name              string
	quorum            bool // against the redlockServers servers, else the one server
	procs, goroutines int  // worker processes (one client each) × goroutines in each
	hold              time.Duration
	locks             []string // contender names (contenders, clientsOnly or quorumContenders)
}

func clientsCases() []clientsCase {
	one := []string{"dlock (rueidis)", turnName(turnShort), turnName(turnLong), "dlock (go-redis)", "redsync", "redislock, 1–10 ms linear", "rueidislock"}
	quorum := []string{quorumContenders[0].name, quorumContenders[1].name}                      // dlock quorum, redsync with 5 pools
	quorumMany := []string{quorumContenders[0].name, quorumTurn.name, quorumContenders[1].name} // and dlock quorum with turns
	return []clientsCase{
		{name: fmt.Sprintf("1 server, %d clients × 1, empty", clientsN), procs: clientsN, goroutines: 1, locks: one},
		{name: fmt.Sprintf("1 server, %d clients × 1, %s held", clientsN, msText(clientsHold)), procs: clientsN, goroutines: 1, hold: clientsHold, locks: one},
		{name: fmt.Sprintf("%d servers, %d clients × 1, empty", redlockServers, clientsN), quorum: true, procs: clientsN, goroutines: 1, locks: quorumMany},
		{name: fmt.Sprintf("%d servers, 1 client × %d, empty", redlockServers, clientsN), quorum: true, procs: 1, goroutines: clientsN, locks: quorum},
	}
}

func kindOf(name string, quorum bool) kind {
	if quorum {
		if c := quorumContenderByName(name); c != nil {
			return c.kind
		}
	} else if c := contenderByName(name); c != nil {
		return c.kind
	}
	return kindRaw
}

// clientsRow is one contender's line in a case of scenario 7: medians over the repetitions that
// measured something.
type clientsRow struct {
	rate, changes, minShare, p50, p99, p99Fair float64
	waitMax                                    float64 // ms: the longest wait of every repetition
	n                                          int
	overlaps                                   int64
	checked                                    int
	err                                        error
}

func aggregateClients(rs []hotProcsResult, holders int) clientsRow {
	var rates, changes, shares, p50, p99, fair []float64
	var r clientsRow
	for _, x := range rs {
		r.overlaps += x.overlaps
		r.checked += x.holdsChecked
		if x.err != nil {
			r.err = x.err
		}
		if x.handoffs == 0 {
			continue
		}
		r.waitMax = max(r.waitMax, ms(x.waitMax))
		rate := x.rate()
		rates = append(rates, rate)
		changes = append(changes, float64(x.changes)/x.elapsed.Seconds())
		shares = append(shares, x.minShare)
		p50 = append(p50, ms(x.waitP50))
		p99 = append(p99, ms(x.waitP99))
		// Fair share: the other holders-1 holds, each one mean hold cycle (1 / rate) long.
		fair = append(fair, ms(x.waitP99)/(float64(holders-1)/rate*1000))
	}
	r.n = len(rates)
	if r.n > 0 {
		r.rate, r.changes, r.minShare, r.p50, r.p99, r.p99Fair = median(rates), median(changes), median(shares), median(p50), median(p99), median(fair)
	}
	return r
}

// frozenTry is one TryLock with a majority of the quorum frozen.
type frozenTry struct {
	took time.Duration
	err  error // what TryLock returned (nil: it took the lock, which it must not)
	cap  bool  // ended by the bench's context deadline, not by the library
}

// tryLocker is one client of the frozen case: one TryLock attempt on name.
type tryLocker interface {
	tryLock(ctx context.Context, name string) (unlock func(context.Context) error, err error)
	close()
}

type dlockTry struct{ c *dlock.Client }

func (d dlockTry) tryLock(ctx context.Context, name string) (func(context.Context) error, error) {
	l, err := d.c.Mutex(name).TryLock(ctx)
	if err != nil {
		return nil, err
	}
	return l.Unlock, nil
}

func (d dlockTry) close() { d.c.Close() }

type redsyncTry struct {
	rdbs []*redis.Client
	rs   *redsync.Redsync
	ttl  time.Duration
}

func (r redsyncTry) tryLock(ctx context.Context, name string) (func(context.Context) error, error) {
	m := r.rs.NewMutex(name, redsync.WithExpiry(r.ttl))
	if err := m.TryLockContext(ctx); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { _, err := m.UnlockContext(ctx); return err }, nil
}

func (r redsyncTry) close() {
	for _, rdb := range r.rdbs {
		rdb.Close()
	}
}

// frozenContenders are the frozen case's locks, opened with a lease of ttl.
var frozenContenders = []struct {
	name, config string
	open         func(ctx context.Context, addrs []string, ttl time.Duration) (tryLocker, error)
}{
	{
		name: "dlock quorum (rueidis)", config: "`dlock.DialQuorum(ctx, urls, dlock.WithTTL(ttl))`, `Mutex.TryLock`",
		open: func(ctx context.Context, addrs []string, ttl time.Duration) (tryLocker, error) {
			urls := make([]string, len(addrs))
			for i, a := range addrs {
				urls[i] = "redis://" + a + "/0"
			}
			c, err := dlock.DialQuorum(ctx, urls, dlock.WithTTL(ttl))
			if err != nil {
				return nil, err
			}
			return dlockTry{c}, nil
		},
	},
	{
		name: "redsync", config: "go-redsync/redsync v4.18.1 with 5 go-redis v9 pools, `NewMutex(name, WithExpiry(ttl))`, `TryLockContext` (one attempt; redsync bounds it by its timeout factor, 5 % of the TTL, then releases with the same bound)",
		open: func(ctx context.Context, addrs []string, ttl time.Duration) (tryLocker, error) {
			r := redsyncTry{ttl: ttl}
			var pools []redsyncredis.Pool
			for _, a := range addrs {
				rdb := newGoredis(a)
				r.rdbs = append(r.rdbs, rdb)
				pools = append(pools, redsyncgoredis.NewPool(rdb))
			}
			r.rs = redsync.New(pools...)
			return r, nil
		},
	},
}

// frozenKey names one cell of the frozen table.
type frozenKey struct {
	contender int
	ttl       time.Duration
}

// runFrozen opens tries clients per frozen contender and TTL (each takes and releases a warm-up
// lock, so that its connections to every server are up), SIGSTOPs frozenCount of the servers,
// then runs one TryLock per client, all at once, each on its own free name, and resumes the
// servers when every TryLock has returned. All at once: each try has its own client and name and
// only waits, so the tries do not slow each other; in turn, the 30 s TTL would cost minutes.
func runFrozen(servers []*server, ttls []time.Duration, tries int, tag string) (map[frozenKey][]frozenTry, error) {
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.Addr
	}
	type slot struct {
		key  frozenKey
		l    tryLocker
		name string
	}
	var slots []slot
	defer func() {
		for _, s := range slots {
			s.l.close()
		}
	}()
	for ci, fc := range frozenContenders {
		for _, ttl := range ttls {
			for i := 0; i < tries; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				l, err := fc.open(ctx, addrs, ttl)
				if err == nil {
					var unlock func(context.Context) error
					unlock, err = l.tryLock(ctx, fmt.Sprintf("s7f:%s:warm:%d:%v:%d", tag, ci, ttl, i))
					if err == nil {
						err = unlock(ctx)
					}
					if err != nil {
						l.close()
					}
				}
				cancel()
				if err != nil {
					return nil, fmt.Errorf("%s, TTL %v: warm-up: %w", fc.name, ttl, err)
				}
				slots = append(slots, slot{frozenKey{ci, ttl}, l, fmt.Sprintf("s7f:%s:%d:%v:%d", tag, ci, ttl, i)})
			}
		}
	}
	frozen := servers[len(servers)-frozenCount:]
	// Resume whatever was paused however this returns (a paused server would hang the next user).
	defer func() {
		for _, s := range frozen {
			s.proc.Resume()
		}
	}()
	for _, s := range frozen {
		if err := s.proc.Pause(); err != nil {
			return nil, err
		}
	}
	res := make([]frozenTry, len(slots))
	var wg sync.WaitGroup
	for i, s := range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Bounded: a TryLock still waiting at twice its TTL plus 15 s is ended by the bench.
			ctx, cancel := context.WithTimeout(context.Background(), 2*s.key.ttl+15*time.Second)
			defer cancel()
			t0 := time.Now()
			unlock, err := s.l.tryLock(ctx, s.name)
			res[i] = frozenTry{took: time.Since(t0), err: err, cap: ctx.Err() != nil}
			if err == nil {
				unlock(ctx)
			}
		}()
	}
	wg.Wait()
	for _, s := range frozen {
		if err := s.proc.Resume(); err != nil {
			return nil, err
		}
	}
	out := map[frozenKey][]frozenTry{}
	for i, s := range slots {
		out[s.key] = append(out[s.key], res[i])
	}
	return out, nil
}

// Scenario 7's targets for the turn contenders (turns per process) in the one-server cases.
const (
	turnVsRedsync = 10                    // holds/s ≥ this × redsync's
	turnMaxWait   = 30 * time.Millisecond // no hold waits longer, over every repetition
)

// clientsTargets records the targets of case ci of scenario 7 for dlock (rueidis transport),
// against redsync in the same case: plain dlock's, whose every Unlock releases (one hold per
// turn), then, in the one-server cases, the turn contenders'.
func clientsTargets(fig *figures, ci int, cs clientsCase, rows map[string]clientsRow) {
	if fig == nil {
		return
	}
	strictTargets(fig, cs, rows)
	if cs.quorum {
		if t, rs := rows[quorumTurn.name], rows["redsync"]; t.rate > 0 && rs.rate > 0 {
			sc := "7, " + cs.name
			fig.target(sc, quorumTurn.name+": holds/s ≥ 1.5× redsync", t.rate >= 1.5*rs.rate,
				"%s (%s vs %s)", ratio(t.rate, rs.rate), thousands(t.rate), thousands(rs.rate))
			fig.target(sc, quorumTurn.name+": every client ≥ half the mean holds", t.minShare >= 0.5, "least served %.2f", t.minShare)
			fig.target(sc, fmt.Sprintf("%s: wait max ≤ %s", quorumTurn.name, msText(turnMaxWait)), t.waitMax <= ms(turnMaxWait),
				"longest %.2f ms (of %d repetitions)", t.waitMax, t.n)
		}
		return
	}
	rs := rows["redsync"]
	sc := "7, " + cs.name
	for _, slice := range []time.Duration{turnShort, turnLong} {
		name := turnName(slice)
		t, ok := rows[name]
		if !ok {
			continue
		}
		if t.rate == 0 {
			fig.target(sc, name+": measured", false, "no repetition measured a hold")
			continue
		}
		if rs.rate > 0 {
			fig.target(sc, fmt.Sprintf("%s: holds/s ≥ %d× redsync", name, turnVsRedsync), t.rate >= turnVsRedsync*rs.rate,
				"%s (%s vs %s)", ratio(t.rate, rs.rate), thousands(t.rate), thousands(rs.rate))
		}
		fig.target(sc, name+": every client ≥ half the mean holds", t.minShare >= 0.5, "least served %.2f", t.minShare)
		fig.target(sc, fmt.Sprintf("%s: wait max ≤ %s", name, msText(turnMaxWait)), t.waitMax <= ms(turnMaxWait),
			"longest %.2f ms (of %d repetitions)", t.waitMax, t.n)
	}
}

// strictTargets records plain dlock's targets of a case of scenario 7.
func strictTargets(fig *figures, cs clientsCase, rows map[string]clientsRow) {
	dn := "dlock (rueidis)"
	if cs.quorum {
		dn = quorumContenders[0].name
	}
	d, rs := rows[dn], rows["redsync"]
	if d.rate == 0 {
		return
	}
	sc := "7, " + cs.name
	vsRedsync := func(want float64) {
		if rs.rate > 0 {
			fig.target(sc, fmt.Sprintf("holds/s ≥ %g× redsync", want), d.rate >= want*rs.rate, "%s (%s vs %s)", ratio(d.rate, rs.rate), thousands(d.rate), thousands(rs.rate))
		}
	}
	fair := func() {
		fig.target(sc, "every client ≥ half the mean holds", d.minShare >= 0.5, "least served %.2f", d.minShare)
	}
	switch {
	case !cs.quorum && cs.hold == 0:
		vsRedsync(1.5)
		fair()
		fig.target(sc, "wait p99 ≤ 3× the fair-share wait", d.p99Fair <= 3, "%.1f×", d.p99Fair)
	case !cs.quorum:
		limit := float64(time.Second / cs.hold)
		fig.target(sc, fmt.Sprintf("≥ %s holds/s (0.8 of the limit)", thousands(0.8*limit)), d.rate >= 0.8*limit, "%s holds/s", thousands(d.rate))
		vsRedsync(1.2)
		fair()
		fig.target(sc, "wait p99 ≤ 3× the fair-share wait", d.p99Fair <= 3, "%.1f×", d.p99Fair)
	case cs.procs > 1:
		vsRedsync(1.5)
		fair()
	default:
		// 445 holds/s: this case before the server-side queue and grants (same machine).
		fig.target(sc, "≥ 8,900 holds/s (20× the 445 before grants)", d.rate >= 20*445, "%s holds/s", thousands(d.rate))
		if rs.rate > 0 {
			fig.info(sc, "holds/s vs redsync", "%s (%s vs %s)", ratio(d.rate, rs.rate), thousands(d.rate), thousands(rs.rate))
		}
	}
}

// measureClients is scenario 7: clientsN clients with one goroutine each on one name, on one
// server (empty and 1 ms critical sections) and over a quorum of servers (with one client of
// clientsN goroutines beside it), reps times, contenders interleaved; then TryLock with a majority
// of the quorum frozen.
func measureClients(srv *server, cfg config) (string, bool) {
	var b strings.Builder
	fmt.Fprintf(&b, "### 7. Many clients, one goroutine each, one name: the contention shape of production\n\n")
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
	qaddrs := make([]string, len(servers))
	for i, s := range servers {
		qaddrs[i] = s.Addr
	}

	cases := clientsCases()
	res := make([]map[string][]hotProcsResult, len(cases))
	for ci := range cases {
		res[ci] = map[string][]hotProcsResult{}
	}
	ok := true
	for rep := 0; rep < cfg.reps; rep++ {
		for ci, cs := range cases {
			for i := range cs.locks {
				name := cs.locks[(i+rep)%len(cs.locks)]
				addrs := []string{srv.Addr}
				if cs.quorum {
					addrs = qaddrs
					for _, s := range servers {
						s.flush()
					}
				} else {
					srv.flush()
				}
				k := kindOf(name, cs.quorum)
				stop := watchdog(fmt.Sprintf("scenario 7, %s, %s", cs.name, name), cfg.clientsDuration+90*time.Second)
				r := runProcs(procsRun{contender: name, addrs: addrs, procs: cs.procs, goroutines: cs.goroutines,
					d: cfg.clientsDuration, hold: cs.hold, name: fmt.Sprintf("s7:%d:%d:%d", ci, rep, i),
					byToken: k == kindDlock && !cs.quorum})
				stop()
				if r.err != nil {
					ok = ok && k != kindDlock
					cfg.logf("scenario 7, %s, rep %d, %s: %v", cs.name, rep+1, name, r.err)
				}
				if r.overlaps != 0 {
					// A peer's overlap is a finding for the table; only dlock's fails the run.
					ok = ok && k != kindDlock
					cfg.logf("scenario 7, %s, %s: MUTUAL EXCLUSION BROKEN: %d overlapping holds of %d", cs.name, name, r.overlaps, r.holdsChecked)
				}
				cfg.logf("scenario 7, %s, rep %d, %-26s %7.0f holds/s, wait p50 %v p99 %v, least served %.2f, %d holds checked",
					cs.name, rep+1, name, r.rate(), r.waitP50.Round(time.Microsecond), r.waitP99.Round(time.Microsecond), r.minShare, r.holdsChecked)
				res[ci][name] = append(res[ci][name], r)
			}
		}
	}

	fmt.Fprintf(&b, "%d clients on one name, each its own worker process with its own client "+
		"(connections, pools, renewal loop) and one goroutine that locks, holds and unlocks in a loop; "+
		"%v per measurement, median of %d repetitions, contenders interleaved; lease 10 s. Cases: one server "+
		"(the bench's) with an empty critical section and with a %s one (`time.Sleep` while holding: "+
		"at most 1 / %s = %s holds/s, \"of the limit\"); %d more private servers (a Redlock quorum) "+
		"with %d clients, and with one client (process) of %d goroutines. "+
		"Wait = from calling Lock to holding the lock, over every hold of the case; wait max is the longest of every "+
		"repetition, not a median. Least served = the fewest holds "+
		"of a client (goroutine, for 1 client × %d) / the mean. Fair-share wait = (%d − 1) × the mean hold "+
		"cycle (1 / holds/s): what a holder waits when the others each take one turn before it; "+
		"\"p99 ÷ fair share\" above 1 means the slowest 1%% waited longer than a full round. "+
		"Mutual exclusion is checked as in scenario 3 (by fencing token for dlock on one server, by "+
		"acquisition time otherwise).\n\n",
		clientsN, cfg.clientsDuration, cfg.reps, msText(clientsHold), msText(clientsHold), thousands(float64(time.Second/clientsHold)),
		redlockServers, clientsN, clientsN, clientsN, clientsN)
	b.WriteString("| case | contender | holds/s (median) | × best peer | of the limit | to another holder /s | least served | wait p50 | wait p99 | wait max | p99 ÷ fair share | mutual exclusion |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for ci, cs := range cases {
		rows := map[string]clientsRow{}
		var best float64
		for _, name := range cs.locks {
			r := aggregateClients(res[ci][name], cs.procs*cs.goroutines)
			rows[name] = r
			if kindOf(name, cs.quorum) == kindPeer && r.rate > best {
				best = r.rate
			}
		}
		clientsTargets(cfg.fig, ci, cs, rows)
		for _, name := range cs.locks {
			r := rows[name]
			mx := fmt.Sprintf("exact (%s holds)", thousands(float64(r.checked)))
			if r.overlaps != 0 {
				mx = fmt.Sprintf("**BROKEN**: %d overlapping holds of %s", r.overlaps, thousands(float64(r.checked)))
			}
			if r.n == 0 {
				fmt.Fprintf(&b, "| %s | %s | error: %s | | | | | | | | | %s |\n", cs.name, name, oneLine(r.err), mx)
				continue
			}
			if r.err != nil {
				mx += " (error in a repetition: " + oneLine(r.err) + ")"
			}
			limit := "–"
			if cs.hold > 0 {
				limit = fmt.Sprintf("%.0f %%", 100*r.rate*cs.hold.Seconds())
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %.2f | %.2f ms | %.2f ms | %.2f ms | %.1f | %s |\n", cs.name, name,
				thousands(r.rate), ratio(r.rate, best), limit, thousands(r.changes), r.minShare, r.p50, r.p99, r.waitMax, r.p99Fair, mx)
		}
	}
	b.WriteString("\n")
	for _, name := range cases[0].locks {
		fmt.Fprintf(&b, "- **%s**: %s.\n", name, contenderByName(name).config)
	}
	for _, c := range []*quorumContender{quorumContenders[0], quorumTurn, quorumContenders[1]} {
		fmt.Fprintf(&b, "- **%s** (%d servers): %s.\n", c.name, redlockServers, c.config)
	}

	// The floors of the one-server cases (floor_clients.go, floor_ring.go).
	fl, flOK := floorClientsSection(srv, cfg)
	b.WriteString(fl + floorRingSection(srv, cfg))
	ok = ok && flOK

	// TryLock with a majority of the quorum frozen.
	for _, s := range servers {
		s.flush()
	}
	var maxTTL time.Duration
	for _, t := range cfg.frozenTTLs {
		maxTTL = max(maxTTL, t)
	}
	stop := watchdog("scenario 7, frozen servers", 2*maxTTL+90*time.Second)
	fr, err := runFrozen(servers, cfg.frozenTTLs, cfg.frozenTries, "f")
	stop()
	fmt.Fprintf(&b, "\n**%d of %d servers frozen** (SIGSTOP: the kernel still accepts their connections, "+
		"nothing answers): how long one `TryLock` takes to fail. Each try has its own client, connected "+
		"and warmed up (a lock taken and released on every server) before the freeze, and its own free "+
		"name; the tries (%d per contender and TTL), of every contender and TTL, run at the same time "+
		"during one freeze, and the servers are resumed (SIGCONT) once all have returned. A try still "+
		"running at 2 × TTL + 15 s is ended by the bench's context (\"cut\"). Addresses in the errors "+
		"are shortened to \"…\".\n\n",
		frozenCount, redlockServers, cfg.frozenTries)
	if err != nil {
		fmt.Fprintf(&b, "Not measured: %s.\n", oneLine(err))
		cfg.logf("scenario 7, frozen servers: %v", err)
		return b.String(), false
	}
	b.WriteString("| contender | TTL | TryLock fails after (median) | fastest | slowest | tries | returned (median try) |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---|\n")
	for ci, fc := range frozenContenders {
		for _, ttl := range cfg.frozenTTLs {
			tries := fr[frozenKey{ci, ttl}]
			var took []float64
			var got, cut int
			for _, t := range tries {
				took = append(took, ms(t.took))
				if t.err == nil {
					got++
				}
				if t.cap {
					cut++
				}
				cfg.logf("scenario 7, frozen, %s, TTL %v: TryLock returned after %v: %v", fc.name, ttl, t.took.Round(time.Millisecond), t.err)
			}
			if len(tries) == 0 {
				continue
			}
			// The error of the try whose time is the median.
			sorted := slices.Clone(tries)
			slices.SortFunc(sorted, func(a, b frozenTry) int { return compareInt(int64(a.took), int64(b.took)) })
			mid := sorted[len(sorted)/2]
			returned := errCell(mid.err)
			switch {
			case mid.err == nil:
				returned = "**acquired** (with a majority frozen)"
			case mid.cap:
				returned = "cut by the bench: " + returned
			case errors.Is(mid.err, dlock.ErrNotAcquired):
				returned = "`ErrNotAcquired`: " + returned
			}
			if got > 0 {
				ok = ok && !strings.HasPrefix(fc.name, "dlock") // a peer's is a finding
				cfg.logf("scenario 7, frozen, %s, TTL %v: %d tries ACQUIRED the lock with %d of %d servers frozen", fc.name, ttl, got, frozenCount, redlockServers)
			}
			if ci == 0 && cfg.fig != nil {
				slowest := slices.Max(took)
				cfg.fig.target(fmt.Sprintf("7, %d of %d servers frozen, TTL %v", frozenCount, redlockServers, ttl), "TryLock fails within 100 ms",
					slowest <= 100 && got == 0, "slowest %s", seconds(slowest))
			}
			fmt.Fprintf(&b, "| %s | %v | %s | %s | %s | %d%s | %s |\n", fc.name, ttl, seconds(median(took)), seconds(slices.Min(took)),
				seconds(slices.Max(took)), len(tries), cutNote(cut), returned)
		}
	}
	b.WriteString("\n")
	for _, fc := range frozenContenders {
		fmt.Fprintf(&b, "- **%s**: %s.\n", fc.name, fc.config)
	}
	return b.String(), ok
}

// loopbackAddr is a server address as the errors give it.
var loopbackAddr = regexp.MustCompile(`\[?127\.0\.0\.1:\d+( 127\.0\.0\.1:\d+)*\]?`)

// shortAddrs replaces the servers' addresses (ports change from run to run) in s by "…", and
// drops the lock's name, so that what a TryLock returned fits a table cell.
func shortAddrs(s string) string {
	s = lockName.ReplaceAllString(s, "lock")
	return loopbackAddr.ReplaceAllString(s, "…")
}

var lockName = regexp.MustCompile(`lock "[^"]*"`)

// errCell is err on one line for a table cell: addresses shortened, at most 200 characters.
func errCell(err error) string {
	s := strings.Join(strings.Fields(shortAddrs(fmt.Sprint(err))), " ")
	s = strings.ReplaceAll(s, "|", "/")
	if r := []rune(s); len(r) > 200 {
		s = string(r[:200]) + "…"
	}
	return s
}

// msText writes d in milliseconds with a space ("1 ms"), as the docs do.
func msText(d time.Duration) string { return fmt.Sprintf("%g ms", ms(d)) }

func seconds(msec float64) string {
	if msec >= 1000 {
		return fmt.Sprintf("%.2f s", msec/1000)
	}
	return fmt.Sprintf("%.0f ms", msec)
}

func cutNote(cut int) string {
	if cut == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d cut)", cut)
}
