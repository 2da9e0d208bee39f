package main

import (
	"slices"
	"time"
)

// The scenarios: every fact about one lives in its row of the table below (what it runs
// against, how long it may run, and which guarantees the analysis holds it to), and the rest
// of the checker reads the row instead of testing the scenario's name.

// scenario is one row of the table.
type scenario struct {
	name string // on the command line (--scenarios), in the report, in the lock's name
	help string // its line in --help

	deploy     deployment
	replicaAck int // > 0: workers lock WithReplicaAck(replicaAck, replicaAckWait)
	// memory is the memory limit and policy of the scenario's redis-server, and whether the
	// harness loads it as a cache (memory.go). The zero value sets no limit.
	memory memorySetup
	// unsafeEviction: the workers dial WithUnsafeEviction, so a server that can evict lock keys
	// is used anyway. The client must then only warn (WithLogger): a lease ended, or an
	// acquisition refused, for the eviction policy fails the run.
	unsafeEviction bool
	// adaptive: the workers lock with the adaptive lease, at most the TTL (adaptive.go).
	adaptive bool
	// turnSlice > 0: the workers' Mutex takes WithTurnSlice(turnSlice), so between holds the
	// lock stays with the process for the rest of its turn, parked (turns.go). A parked lock
	// is a held lock: such a row is held to the guarantees of its plain counterpart, and its
	// fault (turnFault) also lands between holds, where the lock may be parked.
	turnSlice time.Duration

	fault fault
	// fullRunOnly: --short (CI) leaves the row out unless --scenarios names it; the full run
	// has it. For rows whose fault another row already plays in CI on the same engine, and
	// whose own run is long (a Sentinel failover takes seconds).
	fullRunOnly bool
	// minFaults is the least number of faults a run plays out, whatever --min-faults says: the
	// pause fault alternates between two variants, and a run plays one of each.
	minFaults int

	// What the analysis expects of the scenario (analyze.go). Every scenario is held to unique
	// tokens, an acquisition after every fault and, fenced, no lost update and a linearizable
	// history; these say where a scenario differs.

	// forgetsLocks: the deployment can lose a lock while it is held (a redis-server restarted
	// empty, a failover to a replica the lock had not reached, a quorum member restarted empty
	// at once). The holder's client then believes it holds the lock until its next renewal or
	// server handoff, and meanwhile passes it to its other goroutines (local handoffs), while
	// the server may grant it to someone else: doc.go documents it (Fencing tokens). So a lease
	// context that says "held" after the next holder's grant, and a local handoff of the lost
	// hold that comes after a larger token, are noted, not failed.
	forgetsLocks bool
	// tokensUnclaimed: a quorum member restarts empty while the holder holds the lock on a bare
	// majority including it. In quorum mode tokens are promised to increase only if no server
	// loses its data while it holds a lock (doc.go, "Quorum mode"), so token order, and the
	// fenced lost updates and linearizability that rest on it, are noted, not failed.
	tokensUnclaimed bool
	// mustSignal: the fault leaves the server's record of the lock intact while the holder
	// cannot renew (it is frozen or cut off past its TTL), so dlock must tell it: a hit holder
	// that never gets a lost-lock signal fails the run.
	mustSignal bool
	// boundedRecovery: the holder died and its lease simply runs out, so a waiter must get the
	// lock within TTL + killRecoverySlack of the fault.
	boundedRecovery bool
	// dialRefused: every worker's Dial must fail with an error wrapping this error (an errKind
	// of worker.go), and no operation may run. Such a run is the refusal alone: it plays no
	// fault, and runs once, in the first mode asked for (without traffic the resource's mode
	// does not matter; the report says "dial-only").
	dialRefused string
	// evictsLocks: the server evicts keys, the lock's among them, while the workers hold it
	// (the harness's filler makes it). dlock documents that it cannot protect a lock whose key
	// is evicted (WithUnsafeEviction), so such a row is also forgetsLocks. The run must show
	// that the lock's key was evicted while a lease was held: else it proves nothing.
	evictsLocks bool
	// outOfMemory: the fault puts the server out of memory (maxmemory below used_memory under
	// noeviction). Every Unlock that overlaps it must succeed and leave the lock released (each
	// worker reads the key right after its Unlock), and one at least must release it on the
	// server; the server must grant no acquisition meanwhile but by a release (grant on release:
	// the releasing holder's Unlock gives the lock to the first client queued, and Redis lets a
	// script that has written go on writing), and one refused for memory must
	// say so (an error wrapping ErrOutOfMemory), one at least; and once memory is back the
	// server must grant the lock again: recovery is measured from the fault's end to the next
	// grant by the server.
	outOfMemory bool
	// shared: the workers hold a read-write lock (rwLoad) or a semaphore (semLoad) instead of
	// a Mutex, and the analysis checks what those promise (shared.go).
	shared sharedLoad
	// waiterFaults: the fault hits a process waiting for the lock (queued on the server), not
	// the holder (waiter.go). The run's TTL is --waiter-ttl, so that a waiter can be frozen
	// past its acceptance window and yet within its TTL. The analysis measures, per fault, how
	// long the others go without the lock: from the fault to the next acquisition by another
	// process after the hit waiter's grant (its recovery figure); one over the acceptance
	// window + TTL means the queue stalled, and fails the run. A run in which no hit waiter was
	// granted the lock while frozen or dead proves nothing, and fails too.
	waiterFaults bool
	// frozenWaiters: a shared row's fault freezes a process waiting for the read-write lock or
	// semaphore (queued on the server, holding nothing) past its acceptance window while the
	// others keep releasing, so that the server grants units to the frozen entries and the
	// grants lapse before the process runs again (frozen.go). The run's TTL is --waiter-ttl. The
	// believed-held check (shared.go) is what such a grant can break: a resumed waiter that made
	// a lease of a lapsed grant believes it holds beside the units' next holders. The analysis
	// also measures, per fault, the longest time the other processes went without an
	// acquisition (its recovery figure): one over the acceptance window + TTL fails the run, and
	// so does a run in which no hit waiter was granted units that lapsed while it was frozen (it
	// proves nothing).
	frozenWaiters bool
	// noPoll: every goroutine waits in Lock; no worker polls with TryLock. A poller tries every
	// 10 ms, so it finds a grant's window run out at once and passes the lock on to the queue:
	// it would hide how long the waiters in Lock alone take.
	noPoll bool
	// accounts > 0: a multi-lock scenario (transfers.go). The workers move money between random
	// pairs of that many accounts, each transfer under a MultiMutex of its two accounts' locks,
	// against a ledger instead of the register; fenced, the total must stay constant.
	accounts int
	// permits > 0: every hold of a semaphore row takes this many permits (else 1 and 2 in turn).
	permits int
	// store: where the resource server keeps the register (store.go): in its memory (the zero
	// value), fenced by its own comparison of tokens, or in an SQLite row fenced by package
	// fence, or a Redis key fenced by the Client's fenced operations. Fenced, the lost updates
	// and the linearizability of such a row are then the library helpers' own figures, and a
	// request the store's fence decides otherwise than the largest token accepted fails the run.
	store storeKind
	// election: every goroutine is a candidate of one election instead of a Mutex's client,
	// leading for a few sections a term, fenced by the term (election.go). The analysis adds
	// what an election promises (checkLeadership): two terms believed at once fail the run
	// (where forgetsLocks, they are the deployment's hazard: counted, not failed).
	election bool
	// deposes: the fault takes the leader out (frozen, killed, cut off): a term of another
	// process must follow each fault (election rows).
	deposes bool
	// persist: the redis-server writes every change to an append-only file, fsynced at each
	// write, and a restart loads it back: the leases it acknowledged survive (persistArgs).
	persist bool
	// goroutines > 0: each worker process runs at least this many goroutines, whatever
	// --goroutines says (the frozen-waiters rows: many waiters queued, several of them in the
	// frozen process).
	goroutines int
}

// frozenGoroutines is how many goroutines each worker process of a frozen-waiters row runs: 30
// clients of the lock, most of them queued, 6 in the frozen process, whose grants each race,
// when it runs again, with that goroutine's next attempt (at 2 goroutines a process, the
// library as it was before its stale-grant fix showed no over-admission in 3 runs; at 6 it did
// in the first).
const frozenGoroutines = 6

// killRecoverySlack is how long past the TTL a dead holder's lock may stay out of reach
// (boundedRecovery).
const killRecoverySlack = 250 * time.Millisecond

// replicaAckWait is the WAIT timeout of the scenarios with replicaAck.
const replicaAckWait = 250 * time.Millisecond

// scenarios, in the order they run.
var scenarios = []scenario{
	{
		name:       "pause",
		help:       "SIGSTOP the holder's process (all its goroutines) past the TTL, then SIGCONT: alternately between the holder's last context check and its write reaching the resource, and right after its read",
		deploy:     standalone,
		fault:      pauseHolder,
		minFaults:  2,
		mustSignal: true,
	},
	// The pause fault on a register kept where an application keeps its data, fenced by the
	// library's helpers instead of the resource server's own comparison (store.go).
	{
		name:       "pause-sql",
		help:       "as pause, the register kept in a row of an SQLite file: fenced, a read is fence.Table.Claim then SELECT in one transaction and a write fence.Table.Update; unfenced, plain SELECT and UPDATE",
		deploy:     standalone,
		fault:      pauseHolder,
		minFaults:  2,
		mustSignal: true,
		store:      sqliteStore,
	},
	{
		name:       "pause-redis",
		help:       "as pause, the register kept in a key of a redis-server of its own: fenced, read with Client.FencedGet and written with Client.FencedSet; unfenced, plain GET and SET",
		deploy:     standalone,
		fault:      pauseHolder,
		minFaults:  2,
		mustSignal: true,
		store:      redisStore,
	},
	{
		name:            "kill",
		help:            "SIGKILL the holder's process inside the holder's critical section; a new worker process takes its place",
		deploy:          standalone,
		fault:           killHolder,
		boundedRecovery: true,
	},
	{
		name: "adaptive-pause", help: "as pause, the workers locking with the adaptive lease (WithAdaptiveTTL(50ms, TTL))",
		deploy: standalone, adaptive: true, fault: pauseHolder, minFaults: 2, mustSignal: true,
	},
	{
		name: "adaptive-kill", help: "as kill, the workers locking with the adaptive lease (WithAdaptiveTTL(50ms, TTL))",
		deploy: standalone, adaptive: true, fault: killHolder, boundedRecovery: true,
	},
	{
		name:       "partition",
		help:       "cut the link to Redis of the holder's process (its proxy holds every byte) past the TTL while the holder works",
		deploy:     standalone,
		fault:      cutHolderOff,
		mustSignal: true,
	},
	// Turns per process (turns.go): as pause, kill and partition, the workers' Mutex keeping
	// the lock for a turn of 2 ms after its last Unlock; every other fault (every third for
	// pause) hits the process right after a holder's Unlock, while its lock may be parked.
	{
		name:       "turn-pause",
		help:       "as pause, the workers' Mutex taking WithTurnSlice(2ms); one fault in three freezes the process right after a holder's Unlock, while the lock may be parked for the rest of its turn",
		deploy:     standalone,
		turnSlice:  turnSlice,
		fault:      turnFault(pauseHolder, len(pauseVariants), pauseTurn),
		minFaults:  len(pauseVariants) + 1,
		mustSignal: true,
	},
	{
		name:            "turn-kill",
		help:            "as kill, the workers' Mutex taking WithTurnSlice(2ms); every other fault kills the process right after a holder's Unlock, while the lock may be parked: the others wait out its lease",
		deploy:          standalone,
		turnSlice:       turnSlice,
		fault:           turnFault(killHolder, 1, killTurn),
		minFaults:       2,
		boundedRecovery: true,
	},
	{
		name:       "turn-partition",
		help:       "as partition, the workers' Mutex taking WithTurnSlice(2ms); every other fault cuts the process off right after a holder's Unlock, while the lock may be parked",
		deploy:     standalone,
		turnSlice:  turnSlice,
		fault:      turnFault(cutHolderOff, 1, cutTurn),
		minFaults:  2,
		mustSignal: true,
	},
	{
		name:   "latency",
		help:   "50 ms ± 25 ms on the link to Redis of the holder's process for 2–3 s",
		deploy: standalone,
		fault:  slowHolderLinks,
	},
	{
		name:         "restart",
		help:         "kill redis-server and start it again empty (no persistence) while the holder works",
		deploy:       standalone,
		fault:        restartRedis,
		forgetsLocks: true,
	},
	{
		name:         "sentinel-failover",
		help:         "a Sentinel group: SIGKILL the master while the holder works; Sentinel promotes a replica, the old master comes back empty as a replica",
		deploy:       sentinelGroup,
		fault:        failOver,
		forgetsLocks: true, // replication is asynchronous: a lock not yet copied to the promoted replica is gone
	},
	{
		name:         "sentinel-failover-ack",
		help:         "as sentinel-failover, with WithReplicaAck(1, 250ms)",
		deploy:       sentinelGroup,
		fault:        failOver,
		replicaAck:   1,
		forgetsLocks: true, // Sentinel may promote the replica that did not acknowledge (doc.go)
	},
	{
		name:   "redlock-minority",
		help:   "DialQuorum over 5 servers: kill 2 of them while the holder works; they restart empty after more than a lease",
		deploy: quorum,
		fault:  killMinority,
	},
	{
		name:            "redlock-restart",
		help:            "DialQuorum over 5 servers: while a worker holds the lock, its links to 2 servers are cut, leaving it a bare majority; once its keys on those 2 expired, one server of that majority restarts empty at once",
		deploy:          quorum,
		fault:           restartMajorityMember,
		forgetsLocks:    true,
		tokensUnclaimed: true,
	},
	{
		name:   "redlock-restart-delayed",
		help:   "as redlock-restart, but the server stays down longer than the lease before it restarts empty",
		deploy: quorum,
		fault:  restartMajorityMemberLate,
	},
	{
		name:   "eviction",
		help:   "a redis-server with maxmemory 3 MB and maxmemory-policy allkeys-lru, kept full by the harness's filler (64 KB keys with a 30 s TTL, as a cache writes them): every worker's Dial must be refused with ErrEvictionPolicy, and no operation runs",
		deploy: standalone,
		// allkeys-lru, not volatile-lru: every key here has a TTL (the filler's, as a cache
		// sets them, the lock's always), so both pick among the same keys, and both evicted the
		// lock's key alike when tried (5 s of 64 KB keys at 100/s into 3 MB while 3 goroutines
		// locked: 26 and 29 lock-key evictions with allkeys-lru, 32 and 22 with volatile-lru);
		// allkeys-lru is what a cache runs with. volatile-lru would single lock keys out only
		// if the cache's keys had no TTL. Why lock keys are evicted at all: evictingCache.
		memory:      evictingCache,
		dialRefused: errKindEvictionPolicy,
	},
	{
		name:           "eviction-unsafe",
		help:           "as eviction, but the workers dial WithUnsafeEviction; while a holder works, the filler writes until the server evicts the lock's key (it also writes a key every 50 ms all through the run). Fenced: no lost update; unfenced: lost updates are counted",
		deploy:         standalone,
		memory:         evictingCache,
		unsafeEviction: true,
		fault:          evictHeldLock,
		evictsLocks:    true,
		// A lock whose key is evicted is free on the server while its holder's client still
		// believes it holds it (until its next renewal, within a third of the TTL, and it may
		// pass it on locally meanwhile): a second client takes it, so two holders at once and a
		// context that says "held" after the next grant are expected, as after a restart.
		// Tokens still increase (a new token is the server's clock when the old one is gone),
		// so the fence, and with it the fenced lost updates and linearizability, stay claimed.
		forgetsLocks: true,
	},
	{
		name:        "oom",
		help:        "a redis-server with maxmemory-policy noeviction: while a holder works, maxmemory is set below used_memory for TTL + 0.5–1 s, then set back. Every Unlock must succeed and leave the lock released (or granted on to a waiter); acquisitions fail with ErrOutOfMemory, but for grants made by a release; the server grants the lock again once memory is back",
		deploy:      standalone,
		memory:      boundedNoEviction,
		fault:       exhaustMemory,
		outOfMemory: true,
	},
	// Elections (election.go): the workers' goroutines campaign on one election and lead a
	// few sections a term, fenced by the term.
	{
		name:       "elect-pause",
		help:       "an election (half the candidates Campaign and Resign, half RunElected), each leader running 3 sections a term fenced by its term: SIGSTOP the leader's process past the TTL, then SIGCONT (as pause); another process must lead after each",
		deploy:     standalone,
		fault:      pauseHolder,
		minFaults:  2,
		mustSignal: true,
		election:   true,
		deposes:    true,
	},
	{
		name:            "elect-kill",
		help:            "an election: SIGKILL the leader's process inside its term (as kill); a new worker process takes its place, and another process must lead within TTL + 250 ms",
		deploy:          standalone,
		fault:           killHolder,
		boundedRecovery: true,
		election:        true,
		deposes:         true,
	},
	{
		name:       "elect-partition",
		help:       "an election: cut the leader's process off Redis past the TTL while it works (as partition); another process must lead after each",
		deploy:     standalone,
		fault:      cutHolderOff,
		mustSignal: true,
		election:   true,
		deposes:    true,
	},
	{
		name:         "elect-restart",
		help:         "an election: kill redis-server while the leader works and start it again empty (no persistence): two terms believed at once are the hazard figure, not a failure",
		deploy:       standalone,
		fault:        restartRedis,
		forgetsLocks: true,
		election:     true,
	},
	{
		name:     "elect-restart-persist",
		help:     "as elect-restart, the server persisting every write (appendonly, appendfsync always) and loading it back: the leader's lease survives the restart, so no two terms may be believed at once",
		deploy:   standalone,
		fault:    restartRedis,
		persist:  true,
		election: true,
	},
	{
		name:         "elect-sentinel-failover",
		help:         "an election on a Sentinel group: SIGKILL the master while the leader works (as sentinel-failover): two terms believed at once are the hazard figure, not a failure",
		deploy:       sentinelGroup,
		fault:        failOver,
		forgetsLocks: true, // replication is asynchronous: a lease not yet copied to the promoted replica is gone
		election:     true,
		fullRunOnly:  true, // the Sentinel lock rows play the failover in CI
	},
	{
		name:        "elect-sentinel-failover-ack",
		help:        "as elect-sentinel-failover, with WithReplicaAck(2, 250ms): both replicas hold every lease before it counts, so whichever Sentinel promotes has the leader's, and no two terms may be believed at once",
		deploy:      sentinelGroup,
		fault:       failOver,
		replicaAck:  2,
		election:    true,
		fullRunOnly: true, // the Sentinel lock rows play the failover in CI
	},
	// Read-write locks and semaphores (shared.go).
	{name: "rw-pause", help: "read-write lock (a writer in four cycles): as pause", deploy: standalone, fault: pauseHolder, minFaults: 2, mustSignal: true, shared: rwLoad},
	{name: "rw-kill", help: "read-write lock: as kill", deploy: standalone, fault: killHolder, shared: rwLoad},
	{name: "rw-partition", help: "read-write lock: as partition", deploy: standalone, fault: cutHolderOff, mustSignal: true, shared: rwLoad},
	{name: "sem-pause", help: "semaphore of 3, holders of 1 or 2 permits: as pause (unfenced only)", deploy: standalone, fault: pauseHolder, minFaults: 2, mustSignal: true, shared: semLoad},
	{name: "sem-kill", help: "semaphore: as kill (unfenced only)", deploy: standalone, fault: killHolder, shared: semLoad},
	{name: "sem-partition", help: "semaphore: as partition (unfenced only)", deploy: standalone, fault: cutHolderOff, mustSignal: true, shared: semLoad},
	// The server forgets the holds (forgetsLocks): a holder believes it holds until its next
	// renewal finds its hold gone, while the server may grant its units to others (doc.go), so
	// holds believed held past the limits are noted, not failed; fenced, a read-write lock must
	// still lose nothing.
	{name: "rw-restart", help: "read-write lock: as restart", deploy: standalone, fault: restartRedis, forgetsLocks: true, shared: rwLoad},
	{name: "rw-sentinel-failover", help: "read-write lock: as sentinel-failover", deploy: sentinelGroup, fault: failOver, forgetsLocks: true, shared: rwLoad},
	{name: "sem-restart", help: "semaphore: as restart (unfenced only)", deploy: standalone, fault: restartRedis, forgetsLocks: true, shared: semLoad},
	{name: "sem-sentinel-failover", help: "semaphore: as sentinel-failover (unfenced only)", deploy: sentinelGroup, fault: failOver, forgetsLocks: true, shared: semLoad},
	// A waiter frozen past its window while the server grants it units (frozen.go).
	{
		name:          "sem-frozen-waiters",
		help:          "semaphore of 3, every hold 1 permit (unfenced only), 6 goroutines per process: a process whose goroutines all wait (queued on the server, holding nothing) is SIGSTOPped past its acceptance window (min(TTL, 1 s)), within the TTL or past it in turn, while the others keep releasing, so its entries are granted permits that lapse; then SIGCONT under load. TTL --waiter-ttl. Never more than 3 permits believed held; the others must get permits within the window + TTL",
		deploy:        standalone,
		fault:         freezeWaiter,
		minFaults:     len(frozenVariants),
		frozenWaiters: true,
		shared:        semLoad,
		permits:       1,
		goroutines:    frozenGoroutines,
	},
	{
		name:          "rw-frozen-waiters",
		help:          "read-write lock (a writer in four cycles): as sem-frozen-waiters; never a writer believed held with anyone",
		deploy:        standalone,
		fault:         freezeWaiter,
		minFaults:     len(frozenVariants),
		frozenWaiters: true,
		shared:        rwLoad,
		goroutines:    frozenGoroutines,
	},
	{
		name:         "waiter-faults",
		help:         "grant on release: while the holder reads, the process first in the lock's server-side queue (a waiter, not the holder) is SIGSTOPped past its acceptance window (min(TTL, 1 s)) but within the TTL, or past the TTL, or SIGKILLed (a new worker process takes its place), in turn; TTL --waiter-ttl. The others must get the lock within the window + TTL of the fault",
		deploy:       standalone,
		fault:        hitWaiter,
		minFaults:    len(waiterVariants), // one of each
		waiterFaults: true,
		noPoll:       true,
	},
	{
		name:       "multi-pause",
		help:       "transfers between random pairs of 6 accounts, each under a multi-lock of both: SIGSTOP the holder's process past the TTL, then SIGCONT (as pause). Fenced: the balances' total never changes",
		deploy:     standalone,
		fault:      pauseHolder,
		minFaults:  2,
		mustSignal: true,
		accounts:   6,
	},
	{
		name:            "multi-kill",
		help:            "as multi-pause, SIGKILL the holder's process inside its section; a new worker process takes its place",
		deploy:          standalone,
		fault:           killHolder,
		boundedRecovery: true,
		accounts:        6,
	},
	{
		name:       "multi-partition",
		help:       "as multi-pause, cut the holder's process off Redis past the TTL while it works",
		deploy:     standalone,
		fault:      cutHolderOff,
		mustSignal: true,
		accounts:   6,
	},
}

// notRun are scenarios the checker was built for whose deployment or API is not in the
// library yet: listed in the report, never faked.
var notRun = []struct{ name, why string }{}

// scenarioNamed returns the scenario called name.
func scenarioNamed(name string) (*scenario, bool) {
	for i := range scenarios {
		if scenarios[i].name == name {
			return &scenarios[i], true
		}
	}
	return nil, false
}

// scenarioNames lists the scenarios in the order they run.
func scenarioNames() []string {
	names := make([]string, len(scenarios))
	for i, s := range scenarios {
		names[i] = s.name
	}
	return names
}

// ttl is the lease TTL of s's runs: --waiter-ttl where the fault hits waiters, persistTTL at
// least where the server persists, else its deployment's.
func (s *scenario) ttl(o options) time.Duration {
	if s.hitsWaiters() {
		return o.waiterTTL
	}
	if s.persist {
		// A lease must outlast the restart (the kill, the start, the reload) for the row to
		// show it coming back.
		return max(s.deploy.ttl(o), persistTTL)
	}
	return s.deploy.ttl(o)
}

// persistTTL is the least lease TTL of a row whose server persists: two seconds, against a
// restart of a few hundred milliseconds.
const persistTTL = 2 * time.Second

// goroutinesPerProcess is how many goroutines each worker process of s runs: --goroutines, or
// more where the row asks for more.
func (s *scenario) goroutinesPerProcess(o options) int { return max(o.goroutines, s.goroutines) }

// hitsWaiters reports whether s's fault hits a process waiting for the lock, not the holder.
func (s *scenario) hitsWaiters() bool { return s.waiterFaults || s.frozenWaiters }

// faults is the number of faults a run of s needs: its deployment's flag, but at least
// s.minFaults (where the fault hits waiters, rounded up to whole rounds of its variants); none
// where the run is a refused Dial.
func (s *scenario) faults(o options) int {
	if s.dialRefused != "" {
		return 0
	}
	n := max(s.deploy.faults(o), s.minFaults)
	if s.waiterFaults {
		n = (n + len(waiterVariants) - 1) / len(waiterVariants) * len(waiterVariants) // whole rounds of the variants
	}
	if s.frozenWaiters {
		n = (n + len(frozenVariants) - 1) / len(frozenVariants) * len(frozenVariants)
	}
	return n
}

// modes are the modes s runs in, of those asked for: the first one alone where the run is a
// refused Dial (no traffic reaches the resource, so its mode does not matter).
func (s *scenario) modes(asked []bool) []bool {
	if s.dialRefused != "" && len(asked) > 1 {
		return asked[:1]
	}
	if s.shared == semLoad { // a register fence means nothing to holders that hold at once (shared.go)
		return slices.DeleteFunc(slices.Clone(asked), func(fenced bool) bool { return fenced })
	}
	return asked
}

// deployment is what a scenario's workers lock against. It also decides which flags bound a
// run: the Sentinel ones (--sentinel-ttl, --sentinel-faults) and the Redlock one
// (--max-run-redlock) are named after it.
type deployment int

const (
	// standalone is one redis-server; each worker reaches it through a fault proxy of its own.
	standalone deployment = iota
	// quorum is five redis-servers locked with DialQuorum (Redlock); each worker reaches each
	// server through a fault proxy of its own.
	quorum
	// sentinelGroup is a Sentinel group (a master, its replicas and Sentinels), reached through
	// go-redis's failover client, without fault proxies.
	sentinelGroup
)

// servers is how many standalone redis-servers the deployment needs (each worker has a fault
// proxy in front of each); a Sentinel group brings its own.
func (d deployment) servers() int {
	switch d {
	case quorum:
		return 5
	case sentinelGroup:
		return 0
	}
	return 1
}

// ttl is the lease TTL: --sentinel-ttl in a Sentinel group (longer than a failover, so that a
// lock can outlive one), else --ttl.
func (d deployment) ttl(o options) time.Duration {
	if d == sentinelGroup {
		return o.sentTTL
	}
	return o.ttl
}

// faults is the number of faults a run needs: --sentinel-faults failovers in a Sentinel group,
// else --min-faults.
func (d deployment) faults(o options) int {
	if d == sentinelGroup {
		return o.sentFaults
	}
	return o.minFaults
}

// maxRun bounds one run: --max-run-redlock in quorum mode (quorum handoffs under contention are
// slower), else --max-run.
func (d deployment) maxRun(o options) time.Duration {
	if d == quorum {
		return o.quorumMax
	}
	return o.maxRun
}
