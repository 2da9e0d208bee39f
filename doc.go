// Package dlock provides distributed locks for Go services on Redis: a lease that renews
// itself and tells its holder when it is lost, a fencing token with every acquisition,
// waiting woken by releases (no polling), and re-entry; several locks taken together without
// deadlock (MultiMutex), and countdown latches.
//
// # Which primitive for what
//
//	primitive   for                                                section
//	Mutex       one holder at a time (Client.Mutex)                What is guaranteed; Waiting; Re-entry
//	RWMutex     many readers or one writer (Client.RWMutex)        Read-write locks and semaphores
//	Semaphore   at most size permits held at once (Semaphore)      Read-write locks and semaphores
//	MultiMutex  several names taken together, no deadlock          Multi-locks
//	Latch       wait until N workers have counted down             Countdown latches
//	Election    one leader among replicas, everyone knows who      Elections
//	Do helpers  fn under a hold (Do, DoRead, DoWrite, DoAcquire,   Do and outcomes
//	            DoMulti), released when fn returns
//	Fenced*     Redis keys and SQL rows (package fence) that       Fenced writes
//	            refuse a holder paused past its lease
//
// All of them come from a Client (Dial, New; DialQuorum and NewQuorum for quorum mode, which
// has Mutex and MultiMutex and their Do forms only); Deployments, Quorum mode and Operating a
// client apply to every one.
//
// Sections: [What is guaranteed], [Fenced writes], [What is not guaranteed], [Deployments],
// [Quorum mode (Redlock)], [Waiting], [Adaptive lease], [Read-write locks and semaphores],
// [Do and outcomes], [Re-entry], [Errors], [Operating a client], [Multi-locks],
// [Countdown latches], [Elections], [Inspection], [Observability].
//
// # Use
//
//	c, err := dlock.Dial(ctx, "redis://127.0.0.1:6379/0")
//	...
//	defer c.Close()
//	err = c.Do(ctx, "orders:42", func(ctx context.Context) error {
//		// ctx is cancelled (errors.Is(context.Cause(ctx), dlock.ErrLost)) if the lock is lost.
//		return chargeCard(ctx)
//	})
//
// Or, when the hold does not fit one function: l, err := c.Mutex("orders:42").Lock(ctx),
// then l.Token(), l.Context(), and l.Unlock(ctx).
//
// # Options
//
//   - An option cannot land where it means nothing: per-lock options and client options are
//     two types, and the compiler tells them apart.
//   - Leases have bounds: MinTTL to MaxTTL (10 minutes) with renewal, up to MaxFixedTTL (7
//     days) without; outside them, ErrInvalid.
//
// An Option (WithTTL, WithAdaptiveTTL, WithoutRenewal, WithLabel, WithWait, WithReplicaAck,
// WithTurnSlice) configures one lock when passed to Mutex, RWMutex, Semaphore or a Do, and the
// default of every lock of a client when passed to Dial, New, DialQuorum or NewQuorum
// (WithTurnSlice as a default applies to Mutexes; passed to a lock of another kind it is
// refused with ErrInvalid). A ClientOption
// (WithPrefix, WithTLSConfig, WithCAFile, WithLogger, WithObserver, WithUnsafeEviction,
// WithTokenRetention, WithHoldStatsRetention) is taken by those four alone: passing one to
// Mutex or Do does not compile. A CA file is read once, when Dial applies the option; New and
// NewQuorum, which dial nothing, refuse the TLS options (ErrInvalid).
//
// # What is guaranteed
//
//   - Exclusion by lease: a holder keeps the lock while its client renews the lease; the lock
//     is free again at its Unlock or, if the holder crashed, paused or lost its connection, at
//     most TTL after its last successful renewal.
//   - The loss is told first: the lease context is cancelled with cause ErrLost before the
//     server can give the lock to anyone else (the clocks of holder and server running within
//     1% of each other).
//   - Fencing tokens: every acquisition's token is strictly larger than every earlier one of
//     the same name, by any client (with the exception and the conditions below), and below
//     2^53.
//
// Mutual exclusion is by lease. A holder keeps the lock while its client renews the lease
// (every TTL/3, batched for all locks of the client). The lock is free again when the holder
// unlocks, or, if it crashed, paused or lost its connection, when its lease runs out on the
// server: at most TTL after its last successful renewal.
//
// The lease context (Lease.Context, or the context inside Do) is cancelled with cause ErrLost
// when the lock is, or may be, lost: a renewal was refused, or no renewal succeeded in time.
// "In time" means before T + TTL − drift on the holder's monotonic clock, where T is when the
// last successful acquire or renewal was SENT and the drift allowance is TTL/100 + 2 ms (clock
// drift) plus TTL/20, at most 50 ms (scheduling delays). The server started its lease no
// earlier than T, so the holder's context ends before the server can give the lock to anyone
// else. This assumes the holder's and the server's clocks run at about the same rate (within
// 1%), and it cannot stop a holder that is paused (GC, SIGSTOP, a VM freeze) between its last
// check of the context and its next write: the context is cancelled the instant the holder
// runs again (Err checks the deadline itself), but a write already under way is not recalled.
// That is what fencing tokens are for.
//
// Fencing tokens: Lease.Token is strictly larger than the token of every earlier acquisition
// of the same lock name, by any client, including holders that crashed and whose lease
// expired. The server makes a token as max(previous token + 16, the server's clock in
// microseconds); a lock that passes among one client's waiters without the server (see
// Waiting) gives them the next 15 tokens, each holder previous + 1, below the server's next
// one. The previous token is kept with the lock while it is held and for the token retention
// after its release (one minute unless WithTokenRetention says otherwise). One exception: when
// the server loses a held lock (a restart without persistence, a failover without replica
// acknowledgement, a ForceUnlock), the holder's client learns of it only at its next renewal
// (within a third of the TTL) or its 16th handoff in a row, and until then may pass the lock
// to its other waiters; such a lease is lost from the start, its token can be smaller than
// that of a holder the server granted the lock to meanwhile, and it is told (context cancelled
// with ErrLost) only if it is still held when the client finds out: one unlocked before that
// never is (its Unlock returns nil). A resource that checks tokens refuses it once it has seen
// the newer token; the checker (docs/CORRECTNESS.md) counts these cases. So tokens keep
// increasing as long as the Redis server's wall clock does not step back by more than the
// time since the name's state expired (at least the token retention after a release, at least
// the lease after a crash), and the server's data is not lost with its clock behind (a restart
// without persistence or a failover to a replica, with clocks stepped back). Redis memory does
// not grow with the number of names ever locked: a released name's key expires after the
// token retention, a crashed holder's within its lease (docs/PROTOCOL.md, "Memory", gives the
// footprint of many distinct names).
//
// A token's range: it is below 2^53 (9,007,199,254,740,992, about 9.0e15), so the scripts'
// Lua numbers (doubles) and anything that reads it as a JSON number into a float64
// (JavaScript, encoding/json into an interface{}) hold it exactly. Today's tokens are about
// 1.8e15: the server's clock in microseconds since the Unix epoch. The rule max(previous
// token + 16, clock) puts a token ahead of that clock only by what acquisitions of its name
// less than 16 µs after the previous one added (at most 16 µs each; local handoffs add at most
// 15 in all), and by whatever a server clock once set ahead left in the stored token; so
// tokens pass 2^53 when the server's clock passes 2^53 µs, in June 2255, or earlier by that
// lead. docs/PROTOCOL.md gives the rule for every kind of lock.
//
// Have the protected resource remember the largest token it has seen and refuse requests with
// a smaller one. For a read-modify-write, check the token on the read as well as on the write
// (or make the write conditional on what was read): with a fenced write alone, an old holder's
// late write can land between a newer holder's read and write.
//
// # Fenced writes
//
// For the two stores most services protect, the library does that checking:
//
//   - Redis keys of the application's own: Client.FencedGet, FencedSet, FencedIncrBy,
//     FencedDel, FencedHGet, FencedHSet and FencedHIncrBy each run one script that refuses a
//     token older than the key's fence (a *StaleError matching ErrStale, naming both; nothing
//     changes), runs the command and moves the fence to the token. A read claims the key too,
//     so a read-modify-write under one token is safe: a holder paused between its read and its
//     write finds the write refused once a newer holder has read or written. The fence is a key
//     beside the value (<key>:dlock-fence when the key has a hash tag, else
//     {<key>}:dlock-fence: the key's Cluster slot either way) and outlives the value by the
//     token retention, so a late holder cannot recreate a key deleted or expired meanwhile.
//     Not in quorum mode (ErrInvalid: the data lives on one server); WithReplicaAck does not
//     apply to them; the ACL rule must add the application's keys (docs/SECURITY.md).
//   - SQL rows: package fence (database/sql, no driver) claims a row for a token in the
//     caller's transaction (Table.Claim: the row's fence moves forward or the call fails with
//     fence.ErrStale), writes in one fenced statement (Table.Update, Table.Upsert), and runs a
//     function in a transaction bound to the lease's context with its rows claimed first
//     (fence.InTx). PostgreSQL, MySQL/MariaDB and SQLite; its package documentation gives the
//     isolation levels it was tested at and the schema.
//
// What a fence cannot do: it protects only what goes through it — a plain SET or UPDATE of the
// same data, another table, a message sent, a card charged is not checked (make such side
// effects idempotent, or key them by the token). A key or row must be fenced with the tokens
// of one lock name (tokens of different names are not ordered). It refuses a late holder once
// a newer holder has touched the data; until then the late holder's write lands, which is
// correct (no newer holder has relied on the old value). It rests on the token guarantee above
// (tokens below 2^53, increasing while the server's data and clock hold), and a fence is as
// durable as the data beside it: a Redis failover that loses recent writes can lose a fence
// with its value.
//
// # What is not guaranteed
//
//   - A failover to a replica that had not received a lock, or a restart without persistence,
//     can give the lock to a second client before the first learns of the loss (within TTL/3);
//     WithReplicaAck narrows that window, and fencing tokens keep the resource safe.
//   - Clock jumps on the server shorten or lengthen leases.
//   - A server that evicts keys can drop a held lock: Dial and New refuse one unless told
//     WithUnsafeEviction.
//
// Redis replication is asynchronous: if the master fails over to a replica that had not yet
// received a lock, a second client can acquire it while the first still believes it holds it
// (the first learns of the loss at its next renewal, which finds the key gone on the new
// master, within TTL/3). Fencing tokens keep the resource safe in that case too, as long as
// the new master's clock is not behind. WithReplicaAck(n, timeout) narrows the window: an
// acquisition counts only once n replicas have it (WAIT), and renewals too; a failover to one
// of those replicas keeps the lock. It cannot close the window entirely: Sentinel may promote
// a replica other than the ones that acknowledged, and WAIT does not make the write durable on
// the replica's disk. A restart without persistence loses locks the same way. Clock jumps on
// the server shorten or lengthen leases.
//
// A server that evicts keys under memory pressure (maxmemory with any maxmemory-policy but
// noeviction, typical of a cache) can drop a held lock's key and give the lock to a second
// client before the holder learns of it. Dial and New refuse such a server (ErrEvictionPolicy)
// unless given WithUnsafeEviction. While leases are held, a client reads its servers' settings
// again every second: if one can now evict, or evicted keys since the last reading, every lease
// of the client is treated as lost (context cause wrapping ErrLost and ErrEvictionPolicy) and
// acquisitions fail until the server is safe again. A lease can still be overtaken within that
// second; fencing tokens protect the resource then too. On a server out of memory under
// noeviction, releases and renewals still work (a release still grants the lock to the first
// queued client) and acquisitions fail with ErrOutOfMemory. A
// release that fails on the network is retried in the background until it succeeds or the
// lease would have run out.
//
// # Deployments
//
//   - The same API and guarantees on one server, through Sentinel (following failovers) and
//     on a Redis Cluster, through rueidis (Dial) or go-redis (New).
//   - On a Cluster every key and channel of a lock shares one slot, and a lock stays held
//     through a slot migration or a manual failover of its shard, or its holder is told it
//     was lost.
//   - Batching changes no outcome: each lock of a batch gets exactly the outcome it would have
//     had alone.
//
// Dial accepts one server, a Sentinel URL (redis+sentinel://…, following failovers) and a
// Cluster's seed nodes; New accepts a rueidis or go-redis client of any of those kinds. An
// empty URL is ErrInvalid (it is not read as localhost), and an address where something other
// than a Redis server answers (an HTTP server, say) fails Dial and New with ErrUnavailable
// saying so. On a Cluster, every key and channel of a lock shares one slot (the name is the
// hash tag), release notices use sharded pub/sub (SPUBLISH/SSUBSCRIBE) and renewals are
// batched per slot; a lock stays held through a slot migration or a manual failover of its
// shard (its renewals follow the slot), or its holder is told it was lost. On one server or
// through Sentinel, a client's concurrent acquisitions and releases go to the server in
// batches, one script call for many locks, each lock with exactly the outcome it would have
// had alone (docs/PROTOCOL.md, "Batches"); a call made while the client has nothing else on
// its way leaves at once, alone. On a Cluster each call goes alone. WithCAFile and
// WithTLSConfig set up TLS; docs/SECURITY.md gives the minimal ACL rule.
//
// # Quorum mode (Redlock)
//
//   - Survives a minority of servers down, slow or partitioned: an acquisition holds when a
//     majority granted it before its validity ran out, at the speed of the fastest majority.
//   - Too few servers answering is said, not waited for silently: TryLock fails at once, and
//     a Lock whose wait ends then returns, a *QuorumError (ErrNoQuorum), never ErrNotAcquired.
//   - Fencing tokens increase across acquisitions under the conditions below (no server loses
//     its data while it matters; server clocks within a TTL of each other).
//   - Not survived: a server that restarts without its data while a lock is held.
//
// DialQuorum and NewQuorum make a Client over N independent Redis masters (typically 5) with
// the same Mutex, Lease and Do API. An acquisition runs the acquire script on every server in
// parallel and succeeds when a majority granted it within a short timeout (50 ms, less only
// for TTLs under 150 ms, longer only when every server is slow) and before its validity ran
// out (validity = TTL − the time the acquisition took − the drift allowance above); its
// latency is that of the fastest majority, not of the slowest server. A failed acquisition is
// released on every server. Renewals and releases go to every server; the lease context is
// cancelled (ErrLost) when no majority confirmed a renewal in time. When fewer than a majority
// of servers answer (down, frozen, unreachable), TryLock fails at once with a *QuorumError
// (errors.Is ErrNoQuorum) that says what each server answered, and Lock keeps waiting, trying
// again every 100 ms, until a majority answers or its wait ends (its context, WithWait); a
// wait that ends while too few servers answer returns that *QuorumError (with the context's
// error, if the context ended it), not ErrNotAcquired. Waiting clients queue on every server
// at the same place, so that the servers grant the lock to the same client; a client that
// gets grants from only some servers (a split) gives them back and tries again after a random
// pause of a few milliseconds. Within a client, locks pass among waiters without the servers,
// as on one server (the 16th handoff in a row is a release).
//
// Quorum mode survives a minority of servers down, slow or partitioned. It does not survive a
// server that restarts without its data while a lock is held: that server can then grant the
// lock to a second client, which reaches a majority with the servers the first holder could
// not reach. Restart a server without persistence only after a delay longer than the longest
// lease (Redlock's "delayed restart"); with it, the first holder's lease is lost (and its
// context cancelled) before the server is back.
//
// Fencing tokens in quorum mode: each server has its own counter, and two majorities can
// return unrelated maxima, so a per-server token alone would not do. A lease's token is the
// largest token among the majority that granted it, and every release stores that token on
// each server (the kept token is the larger of the server's and the lease's). Any later
// majority shares a server with the earlier one, and that server either kept the earlier
// lease's token (released) or let it expire at least a lease later. So tokens strictly
// increase across acquisitions provided no server loses its data while it holds a lock or a
// released token (delayed restart, as above), and the servers' clocks differ by less than the
// lease TTL (a lease that expired without a release leaves no token, and the next is taken
// from the clock of a server in the new majority). Outside those conditions, say a server
// clock set ahead by more than a TTL, a token can repeat or go down.
//
// Admin calls in quorum mode: Inspect and List read the first server (in the order given) that
// answers; ForceUnlock releases on every server. Client.Ping passes while a majority answers
// (see Operating a client).
//
// # Waiting
//
//   - No polling while the holder lives, and no pooled connection per waiter.
//   - First come, first served: one client's waiters per name in the order they called, and
//     clients in the order they queued on the server.
//   - While other clients wait, a client holds a lock at most 16 times in a row.
//   - A queued client that crashed delays the others by at most one second; a holder that
//     crashed, by the rest of its lease.
//
// Lock waits without polling. Waiters of one client queue first-in first-out per lock name and
// only the first of them talks to Redis; when the lock is held, its attempt queues the client
// on the server (once however many of its goroutines wait). A release hands the lock straight
// to the first client queued there — the server makes that client's waiter the holder and
// announces it on the lock's channel, where each Client holds one subscription — so clients are
// served in the order they asked, and a handoff between clients costs the release and one
// message, with no race. A queued client that crashed or froze delays the others by at most one
// second (its acceptance window; less with a shorter TTL, or an adaptive lease's shorter min),
// and several such clients queued one after another delay the next live one by about one
// window in all, not one each (1.0 s measured, two dead clients ahead, TTL 10 s). A holder that
// crashed sends no notice: the waiters retry when its lease runs out. A waiter resumed after
// its grant's window (its process was paused) never gets that grant's lease: it queues again.
// Waiting holds no pooled connection.
//
// On a hot lock, Unlock hands the lock straight to the next waiter of the same client. Up to 15
// times in a row this costs no round trip: the lock stays with the client on the server, under
// the same lease, renewed as before, and the waiter's lease gets the next token. The 16th
// handoff goes through the server (one script: release and acquisition in one step, a new
// server token), which refuses it when another client is queued: the client then releases the
// lock, which goes to the first client queued. So while other clients wait, a client holds a
// lock at most 16 times in a row. A waiter whose Mutex asks for another TTL, label or renewal
// setting, and every waiter of a lock with the adaptive lease, gets the lock through the
// server. docs/PROTOCOL.md ("The queue") states the protocol and its failure cases.
//
// Turns per process (WithTurnSlice(d), for a Mutex): the same local handoff, extended to the
// goroutine that unlocks. After the last Unlock the client keeps the lock on the server,
// parked and renewed, until d has passed since it got the lock from the server; a Lock or
// TryLock of the name by this client meanwhile takes it back at once with the next token, no
// round trip. When the turn ends the lock is released as Unlock would have released it, to the
// first client queued. The fairness it gives: clients are still served first-in first-out,
// each for a turn of at most d and at most 16 holds; a client queued behind k others waits at
// most k turns. What it costs: between holds the lock is held, so a process that crashes during
// its turn holds the others for the rest of the lease's TTL (as a crashed holder does), and
// one that pauses past its lease loses the parked lock (a Lock after the pause goes to the
// server). It is off by default: strict turns (a release at every Unlock) are what a user of
// a lock expects, and the slice is a latency the other clients pay for this client's
// throughput, a trade to choose where one process locks the same name in a loop. Quorum mode
// has turns too (the parked lock stays held on its majority); there, where every hold that
// changes process costs a round through five servers, they pay the most (docs/BENCHMARKS.md).
//
// # Adaptive lease
//
// WithAdaptiveTTL(min, max) sizes each acquisition's lease by how long the lock's holds really
// last, so that a lease neither runs out under typical work nor keeps a crashed holder's lock
// blocked for a long fixed TTL.
//
// What it guarantees:
//   - everything above holds for the lease chosen, as for a lease of that TTL: the lease
//     context ends before the server can give the lock to anyone else, a crashed holder's lock
//     frees within the lease it got, tokens increase;
//   - the lease is within [min, max], and max for a name with no hold recorded;
//   - a renewed adaptive lease is renewed no sooner than a fixed lease of its length, and each
//     renewal is sent with at least the lesser of 300 ms and two thirds of the lease left.
//
// What it does not guarantee:
//   - the chosen lease is a statistical guess: without renewal, a hold longer than three times
//     the recent high-water mark outlives it (ErrExpired, as any fixed lease);
//   - a holder that crashes right after a long hold was recorded blocks the name for up to
//     three times that hold (at most max);
//   - fewer renewal round trips than a fixed lease of the same recovery (below).
//
// How: the server measures every hold of such a lock on its own clock, from the acquisition
// (the token is the server's time of it) to the final Unlock, and keeps per name one record:
// the number of holds, their weighted average (0.8 × the old average + 0.2 × the new hold, the
// first hold setting it) and a high-water mark (the larger of the new hold and 0.99 × the old
// mark: a maximum that fades by 1% per hold). The acquire script reads the record and takes
// three times the high-water mark, within [min, max], as the lease (max for a name with no
// record), in the same round trip; the client counts its deadline from that lease exactly as
// from WithTTL's. With renewal, the lease is renewed when the greater of a third of it and
// 300 ms is left (a lease under 450 ms at a third, as a fixed lease), instead of after a third:
// a hold no longer than the mark never needs a renewal, nor, with a lease of 900 ms or more,
// one up to one and a half times the mark. Without renewal
// (WithoutRenewal), holds up to three times the mark fit the fixed lease; a longer one loses the
// lock as any fixed lease would, and its Unlock still records it, so the next holders get a
// longer lease.
//
// Measured on the bench's workload (docs/BENCHMARKS.md, "The adaptive lease": 64 names, log-normal
// holds with a median of 50 ms, one in 500 a 3 s outlier): beside a renewed fixed lease whose
// TTL equals the adaptive lease's median recovery after a SIGKILL (about 1.3 s), it renewed a
// quarter as many leases (16 against 63 per 1,000 holds) at the same recovery, but in about as
// many round trips (1.1 times the renew.lua calls: the fixed lease's renewals, all of one
// length, share rounds); its recovery has a tail the fixed lease lacks (p99 7.2 s against
// 1.3 s) on names whose mark an outlier had just raised. Against the 30 s watchdog it frees a
// killed holder's lock 25 times sooner; without renewal, at the watchdog's zero renewals, it
// does too, losing 0.4 % of holds to their lease. What it saves is choosing, and keeping up to
// date, a TTL per name.
//
// Details. Holds that end without an Unlock (a crash, Close) are not recorded; a release
// retried after a network failure records none (it may have been recorded already). The hold
// is measured from the token, so a server clock stepped back, or in quorum mode a token floor
// from a faster server's clock, shortens it (never below zero). Records are kept only for
// names locked with the option, and expire after WithHoldStatsRetention (a day by default)
// without a hold: about 165 bytes each. An adaptive lock passes among the waiters of one
// client through the server, never locally (each hold must be measured): a hot lock within
// one client costs a round trip per handoff that a fixed lease does not. A grant's first lease
// (the acceptance window) is min's, at most one second, so a queued client that crashes delays
// the others by at most that. Of WithTTL and WithAdaptiveTTL the last given applies. On a
// Cluster the record shares the lock's hash tag (same slot); in quorum mode every server keeps
// its own record, chooses its own lease, and the lease is the majority-th longest of the
// granting servers' choices (a majority holds the lock that long; renewals then give every
// server the same). Inspect, List, dlock status and dlock list --json show the record
// (Info.HoldStats); dlock run --adaptive uses the option. docs/PROTOCOL.md ("The hold record")
// gives the record and the scripts' arguments.
//
// # Read-write locks and semaphores
//
//   - While their leases last, a writer holds alone and a semaphore's permits held never
//     exceed its size, on one server (standalone, Sentinel, Cluster); not in quorum mode.
//   - First come, first served, with writer preference: a stream of readers, or of small
//     requests, cannot starve a writer or a large request.
//   - Every hold is its own lease, renewed and told lost as a Mutex's; fencing tokens as below.
//
// Client.RWMutex(name) is a read-write lock: RLock and TryRLock take a read hold (many at
// once), Lock and TryLock the write hold (alone). Client.Semaphore(name, size) is a counting
// semaphore: Acquire(ctx, n) and TryAcquire take n permits, at most size held at once across
// every process. Client.DoRead, DoWrite and DoAcquire run a function under a hold, as Do does.
// Each takes the Options of a Mutex and returns a *Lease, and every hold is its own lease, on
// the server and in the client: renewed by the client's one renewal loop with its other
// leases, its context cancelled with ErrLost on the same signal as a Mutex's (see What is
// guaranteed: before the server could give its units to anyone else), its Extend, TTL and
// Unlock as a Mutex lease's. A reader or permit holder that crashed frees its units when its
// own lease runs out, at most its TTL after its last renewal, whatever the other holders do.
// RWMutex("x"), Semaphore("x", n) and Mutex("x") are three objects that do not exclude one
// another.
//
// Guaranteed, on one server (standalone, Sentinel, Cluster) and under the conditions of the
// lease above: while their leases last, a writer holds alone, and the permits held of a
// semaphore never exceed its size (a size made smaller with Client.ResizeSemaphore takes
// nothing from the holders: new permits are granted once the held ones fit). Waiting callers
// are served first-in first-out, each with an entry of its own in the server's queue: a request
// that does not fit keeps the later ones waiting, so a request for many permits is not starved
// by smaller ones, and a writer that waits keeps the readers that came after it waiting (writer
// preference: a steady stream of readers cannot starve writers; TryRLock fails while a writer
// holds or waits). A release grants the freed units to the callers queued, announced in one
// message: waiting costs no polling while holders live.
//
// Fencing tokens: a writer's token is larger than every earlier writer's, and so than every
// earlier reader's; a reader's token is the token of the last writer before it (the last write
// it may have seen): no writer with a larger token holds while it does, so a resource that
// refuses reads and writes below the largest token it has seen refuses a paused reader's late
// read as well as a paused writer's late write. A semaphore holder's token is unique and larger
// than every earlier holder's. They keep increasing under the conditions given above for a
// Mutex's (the server's clock, its data, the token retention).
//
// Re-entry: a read lease's context passed to RLock, or the write lease's to Lock, re-enters
// (same token, one more hold). The write lease's context passed to RLock takes a read hold
// under it at once, with the writer's token, which outlives the write hold (a downgrade). A
// read lease's context passed to Lock fails at once with ErrInvalid: two readers upgrading
// would wait for each other for ever. Semaphores have no re-entry: every Acquire takes permits
// of its own. A semaphore's size is the server's: the size a handle declares only creates the
// semaphore when none is stored, and every handle follows the stored one, so a resize applies
// at once to running processes. A size stored by use lasts while the semaphore is held and for
// the token retention after; one set by Client.ResizeSemaphore (dlock resize) is sticky until
// the next resize or Client.ResetSemaphoreSize (dlock resize --reset). A request for more
// permits than the size fails with ErrInvalid naming it.
//
// Not guaranteed: what a Mutex does not guarantee either (failover without replica
// acknowledgement, a restart without persistence, clock jumps). There are no local handoffs:
// every hold comes from the server. Quorum mode has neither: the calls of a DialQuorum or
// NewQuorum client fail with ErrInvalid (a semaphore counted on each of a majority of servers
// is not safe, and dlock has no quorum grants for shared holds; docs/PROTOCOL.md, "Read-write
// locks and semaphores").
//
// # Do and outcomes
//
//   - A nil error from Do (and DoRead, DoWrite, DoAcquire, DoMulti) means fn ran to
//     completion while the lock was held.
//   - A lock lost while fn ran makes Do's error wrap ErrLost and name the lock, with fn's own
//     error; when fn returned the lease's cause (context.Cause(ctx)), the cause is said once.
//   - The lock is released when fn returns or panics.
//
// A nil error from Do means fn ran to completion while the lock was held. The converse does
// not hold: the lock can be lost, or its release fail, after fn did all its work, and Do then
// returns an error wrapping ErrLost or the release error. Record the outcome of the work
// itself (a committed transaction, say) rather than inferring it from Do. To bound only the
// wait for the lock, not fn, pass WithWait(d) to Do: ctx bounds both, WithWait the wait alone.
//
// When another goroutine of the same client waits for the lock, Unlock usually passes the
// lock to it without asking the server (see Waiting): it then returns nil without learning
// whether the server still had the lock, and the waiter's lease reports the loss instead.
//
// # Re-entry
//
//   - A lock call whose context carries this client's lease on the same name re-enters it:
//     same token, one more hold; the lock is released when the last hold is unlocked.
//   - A re-entry never changes the held lease silently: one asking for another lease fails.
//   - A context without the lease waits like any other caller, even in the goroutine that
//     holds the lock.
//
// Lock, TryLock and Do re-enter a lock when their context carries a lease on the same name
// from the same Client (a Lease's Context, or the context inside Do): same token, one more
// hold; the lock is released when the last hold is unlocked:
//
//	l, err := c.Mutex("orders:42").Lock(ctx)
//	...
//	inner, err := c.Mutex("orders:42").Lock(l.Context()) // re-enters: inner.Token() == l.Token()
//	// c.Mutex("orders:42").Lock(ctx) here would wait for l: ctx does not carry it.
//	inner.Unlock(ctx) // l still holds the lock; l.Unlock(ctx) releases it
//
// A re-entry that asks for another lease (TTL, renewal, label, replica acknowledgement,
// adaptive lease) fails with ErrInvalid naming the difference; nothing of the held lease is
// changed silently. A context without the lease, even in the goroutine that holds the lock,
// waits like any other caller — for itself, if that goroutine holds it: the client cannot tell
// goroutines apart, and it does not guess. Such a wait that ends (WithWait, a deadline), or a
// TryLock, says the holder is this client (NotAcquiredError.Mine, and the message: "held by
// this client ... to re-enter, lock with the lease's Context").
//
// # Errors
//
//   - Every error wraps one of these, to be told apart with errors.Is.
//   - Error messages are one line, say what to do, and never show a password.
//
// The sentinel errors:
//
//	ErrNotAcquired    busy: another owner holds the lock (TryLock; a Lock whose wait ended:
//	                  WithWait, or its context, whose error and cause it then wraps too).
//	                  *NotAcquiredError names the holder (Mine: this very client).
//	ErrNoQuorum       quorum mode: fewer than a majority of the servers answered (TryLock, or
//	                  a Lock whose wait ended then; *QuorumError says what each did). Also
//	                  matches ErrUnavailable; never ErrNotAcquired.
//	ErrUnavailable    the server cannot be reached, or its connection failed, or what answers
//	                  at its address is not a Redis server (Dial, New, Ping say so).
//	ErrDenied         the server refused the login or a command (ACL; docs/SECURITY.md).
//	ErrInvalid        bad input: a name, an option, a TTL, a URL; a read lock asked to upgrade;
//	                  a semaphore size out of range, or permits above the semaphore's size.
//	ErrLost           the lock was (or may have been) lost: the lease context's cause, and the
//	                  error of later calls on the lease (an Unlock's matches ErrNotHeld too).
//	ErrExpired        a fixed lease reached its end (with ErrLost); a latch expired before zero.
//	ErrNotFound       a latch that does not exist, through a handle of count 0.
//	ErrNotHeld        the lease was already unlocked, or is nil.
//	ErrClosed         the Client was closed.
//	ErrReplicaAck     WithReplicaAck: too few replicas acknowledged (or the server has none).
//	ErrEvictionPolicy the server can evict lock keys (WithUnsafeEviction).
//	ErrOutOfMemory    the server is out of memory: acquisitions fail, releases work.
//
// A context's own errors (context.Canceled, context.DeadlineExceeded) are wrapped where the
// context ended the call. Error messages are one line and never show a password.
//
// # Operating a client
//
//   - Client.Ping is a readiness probe: nil when every server the client needs answers (in
//     quorum mode, a majority), else an error naming the servers that did not (ErrUnavailable).
//   - Close releases every lease the client holds and cancels their contexts with cause
//     ErrClosed; calls waiting for a lock return ErrClosed, and so does every later call.
//   - So shut a service down in this order: stop accepting requests, drain those in flight,
//     then Close the client.
//
// Ping sends PING to the server (through Sentinel, to the current master; on a Cluster, to
// every master the slot map names). A server that refuses the connection, does not answer
// within ctx, or is not a Redis server gives an error that names it and wraps ErrUnavailable
// and the cause. In quorum mode Ping passes once a majority answered, as a lock needs no more:
// one server of five down does not fail it (the Observer's NodeError reports that server);
// three of five do, with a *QuorumError (ErrNoQuorum) saying what each server did. Ping takes
// no lock and reads no setting; give it the probe's deadline.
//
// Close, in order: it marks the client closed (every call from then on returns ErrClosed),
// wakes every call waiting for a lock, a read-write lock, a semaphore or a latch, which
// returns ErrClosed, stops the renewal loop and the subscription, and then releases on the
// server, in one round within 2 s, every lease still held and every release still being
// retried in the background; each held lease ends with its context cancelled with cause
// ErrClosed (not ErrLost: nobody else had the lock). A Do whose fn is running sees fn's
// context cancelled so and returns an error matching ErrClosed; its Unlock, and any later call
// on such a lease, returns ErrClosed. Close returns the errors of held leases' releases that
// failed (those locks free themselves when their leases run out) and closes the connection if
// Dial made it.
//
// A service that closes its client while requests still run fails them: their leases end
// under them. Close it last:
//
//	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
//	defer stop()
//	go srv.Serve(ln)
//	<-ctx.Done()
//	shutdown, cancel := context.WithTimeout(context.Background(), 15*time.Second)
//	defer cancel()
//	srv.Shutdown(shutdown) // stops accepting; returns once the requests in flight are done
//	c.Close()              // only now: releases what is still held
//
// examples/inventory does so, and its end-to-end tests stop a replica with SIGTERM while a
// purchase holds its lock: the purchase completes and the lock is released.
//
// # Multi-locks
//
// A MultiMutex takes several named locks together, as a transfer between two balances needs.
// What holds:
//
//   - All or nothing: Lock and TryLock return a Lease that holds every name, or an error and
//     hold none (an attempt that failed, or a wait that ended, releases what it took first).
//   - The names are Mutex's locks (same keys, values, queues and fencing tokens): a Mutex
//     holding one of them blocks a MultiMutex that contains it, and the other way round; a
//     name that the caller's context holds is re-entered, as Mutex does.
//   - One fencing token per name (Lease.Tokens), with Mutex's guarantee for that name; Token
//     is the largest, for logs. Tokens of different names are not ordered with each other:
//     a resource must be given its own name's token.
//   - Each name's lease is renewed by the client's one renewal loop (the names of one
//     acquisition fall due at about the same time and share a round). Lease.Context is
//     cancelled as soon as one of them is lost, with that lease's cause (ErrLost, naming the
//     lock). Unlock releases them all: one script per server (per slot on a Cluster), all in
//     one round trip; a name that a waiter of the same client waits for is passed to it, as
//     Mutex's Unlock does.
//   - Cost: on one server (standalone or Sentinel), and on a Cluster when every name shares one
//     hash slot (the part of each name before its first '}', as in "acct:7}usd" and
//     "acct:7}eur"), one script takes all the names or none: one round trip, and one to
//     release. On a Cluster, names of several slots are taken slot by slot, one script per
//     slot, one after the other in slot order, so k slots cost k round trips, and a wait for
//     a name of a later slot holds the names of the earlier ones. In quorum mode the names are
//     taken one by one, each an ordinary quorum lock, in the same order.
//   - At most MaxMultiNames (64) distinct names; none, a name twice, an invalid name, or an
//     adaptive lease (WithAdaptiveTTL: the multi-lock's scripts record no holds) is ErrInvalid.
//   - No deadlock and no starvation, among multi-locks and with Mutexes, provided every
//     holder releases in time (Waiting and No deadlock, below).
//
// For a transfer:
//
//	mm := c.MultiMutex([]string{"balance:alice", "balance:bob"})
//	l, err := mm.Lock(ctx) // or TryLock; l holds both names, or err and neither
//	...
//	debit(l.Tokens()["balance:alice"]) // each resource gets the token of its own name
//	credit(l.Tokens()["balance:bob"])
//	l.Unlock(ctx) // releases both
//
// or c.DoMulti(ctx, names, fn), whose fn finds the tokens with TokensFromContext.
//
// Waiting. Every client takes names in one global order: by the Cluster hash slot of the key
// (computed on one server too), then by key. An attempt takes all the names of a server (of
// a slot) at once or none of them, and, when one is busy, queues the client at the first busy
// name, in that name's queue like any waiter (see Waiting): the release that comes to its turn
// grants it that name.
// While it waits there it holds none of the names of that server: the others stay free for
// everyone. (When other callers of the same client already wait for the first name it lacks,
// it queues behind them at once, as Mutex's Lock does, without an attempt that could only
// fail.) Once its turn came in the queue it waited in (the name was granted or passed to
// it), or the name it waited for stopped being the first busy one, the waiter keeps what it
// has: from then on each attempt takes the free names before the first busy one and holds
// them while it waits for that one. That holding is what makes progress certain: a waiter that
// let them go could find one of them taken each time it got the one it waited for. Before
// waiting for a name, a waiter gives back every name it holds that comes after it in the order
// (this happens at most once: to a name granted while it held nothing).
//
// No deadlock: a waiting multi-lock holds only names that come before the one it waits for,
// so every chain of waits climbs the order and ends at a holder that waits for nothing. No
// starvation: each name's queue serves clients in the order they queued (and a client holds a
// name at most 16 times in a row while others queue); a waiter that holds nothing waits in
// such a queue until it is given its name or moves to a name earlier in the order; after that
// it only moves forward in the order and never gives a name back, so it gets every name
// after finitely many turns of others, provided every holder releases in time (a holder that
// never releases blocks its names for everyone, as with Mutex).
//
// Not guaranteed: names re-entered from the caller's context were held before the acquisition,
// whatever their place in the order, so a MultiMutex nested inside other locks is free of
// deadlock only if those come first in the order (as for any nested locking). Across Cluster
// slots and quorum servers the names are not taken in one atomic step: a TryLock of some of
// them can find some held and others free while an acquisition is under way (each name stays
// exclusive).
//
// # Countdown latches
//
//   - Wait returns nil once the count is zero (at once if it is already), woken by the
//     count-down that reaches zero: no polling, no connection per waiter.
//   - Each CountDown counts at most once, even when retried; CountDownAs counts once per id.
//   - A latch whose TTL ran out before zero is expired: its calls return ErrExpired.
//
// A Latch is a count on the server that workers lower and a coordinator waits to see at zero:
//
//	lt := c.Latch("batch-7", 5, dlock.WithTTL(10*time.Minute)) // 5 workers; gone after 10 min
//	// each of the 5 workers, once its share of the batch is done:
//	err := lt.CountDownAs(ctx, workerID) // or lt.CountDown(ctx)
//	// the coordinator:
//	err := lt.Wait(ctx) // nil when all 5 counted down; ErrExpired if the 10 minutes ran out first
//
// The first CountDown, CountDownAs, Wait or Count on a name creates the latch with the
// handle's count, for its TTL (WithTTL; DefaultLatchTTL, an hour, by default), counted from
// creation and never extended. Count returns what is left. Wait returns nil once the count is
// zero, at once if it is: it is woken by the count-down that reaches zero (published on the
// latch's channel and carried by the client's one subscription, as release notices are: no
// polling, no connection per waiter), and by a timer at the latch's deadline. A latch that
// reached zero stays open until its TTL; counting down past zero changes nothing. A latch whose
// TTL ran out before it reached zero is expired: Wait (also one under way), CountDown and
// Count return an error wrapping ErrExpired, for the token retention after the deadline (one
// minute by default); then the name is free for a new latch. A handle whose count differs from
// the stored one gets ErrInvalid; a handle of count 0 uses the stored count and never creates
// the latch (ErrNotFound when there is none).
//
// Idempotency: each CountDown call counts at most once (it carries an id of its own, and a try
// that failed on the network is made again with that id, which the server does not count
// twice); one that returned an error may or may not have counted. CountDownAs(ctx, id) counts
// once per id, however often it is called: give each worker (or task) its own id, and a worker
// that retries or runs again after a crash counts once.
//
// Not guaranteed: a Redis failover without the latch on the promoted replica, or a restart
// without persistence, loses the latch, and the next call creates it anew at its initial
// count (a Wait then waits for count-downs made before the loss, until its TTL). Latches need
// one server (standalone, Sentinel or Cluster): in quorum mode their calls return ErrInvalid.
//
// # Elections
//
//   - At most one leader per election at a time, as a Mutex has one holder: a leadership is
//     the lease of the election's lock, and its context is cancelled with cause ErrLost before
//     another candidate can lead (the same guarantee, and the same hazards, as "What is
//     guaranteed" and "What is not guaranteed" state for a Mutex).
//   - Each term's token (Leadership.Term) is larger than every earlier term's: a resource that
//     refuses smaller tokens than it has seen (Fenced writes) refuses a deposed leader.
//   - Candidates lead in the order they campaigned (the server's queue). A resigned leader is
//     followed at once (one or two round trips: 1-3 ms in the package's tests); a crashed or
//     paused one when its lease runs out (within the TTL of its last renewal: 0.84-1.0 s at
//     TTL 1 s in the tests), and a candidate that dies queued costs the next at most its
//     acceptance window, as for a Mutex.
//   - Observe sees every term that lasts longer than a read of the lock, in order; a slow
//     reader gets the latest state, not every step.
//
// An election is a Mutex of the same name whose holder advertises a value:
//
//	e := c.Election("scheduler", dlock.WithTTL(5*time.Second))
//	ld, err := e.Campaign(ctx, "replica-3") // waits, queued, until this caller leads
//	// lead while ld.Context() is live; fence writes with ld.Term()
//	err = ld.Proclaim(ctx, "replica-3 draining") // a new advertised value
//	err = ld.Resign(ctx)
//
// Campaign waits as Lock does (no polling; as long as ctx and WithWait allow) and then
// announces the term: proclaim.lua checks that the caller still holds the lock and publishes
// on the lock's release channel, where the election's observers listen. The value (at most
// MaxLeaderValue bytes) is stored in the lock's holder description, so it comes and goes with
// the lease; Leader reads it with the term, the holder (host, process, label) and the term's
// start by the server's clock (ErrNoLeader when the lock is free). Client.Inspect and List
// report it as Info.Leader.
//
// Observe's channel gives the state first (the zero LeaderInfo while nobody leads), then each
// change. It is driven by the announcements on the client's one subscription: a term
// beginning, a Proclaim, a release with nobody queued; each makes the observer read the lock
// once. Because a crashed leader announces nothing, the observer also reads the lock when the
// lease it last saw would have run out (at most once per lease period): that is how it sees a
// leader gone with no candidate to follow it. A term that begins and ends between two reads
// is not seen.
//
// RunElected is the loop most services want: campaign, run fn with the leadership's context,
// resign when fn returns, campaign again; it returns when ctx ends (ctx's error) or fn fails
// (fn's error; an error that is the leadership context's own cancellation means the
// leadership was lost, and the loop campaigns again). Errors of the deployment (a server
// down) make it campaign again, 50 ms to 2 s apart; bad input and a closed client return at
// once.
//
// The lease options apply to the leadership. WithAdaptiveTTL is accepted, but it sizes each
// lease by how long the name's holds last, and a leader holds for long: it then chooses its
// greatest lease, so it does not shorten the failover; a short WithTTL does (a renewal every
// third of it).
//
// Two campaigns of one client never pass leadership between them locally: each term goes
// through the server, so that its token and announcement are the server's. WithTurnSlice is
// refused. Elections need one server (standalone, Sentinel or Cluster): in quorum mode every
// call of an Election returns ErrInvalid.
//
// # Inspection
//
//   - Inspect and List only read, and see every kind of lock of a name.
//   - ForceUnlock releases a lock whoever holds it, as its Unlock would (the first queued
//     client gets it); the former holder's lease is lost at its next renewal.
//
// Client.Inspect reads one lock (held or free, holder's host, pid and label, token, holds,
// remaining lease, waiting clients and their waiting goroutines, the inspecting client's own
// waiting goroutines, and for an adaptive lock its hold statistics), Client.List the held locks
// by name prefix (with SCAN),
// and Client.ForceUnlock releases a lock whoever holds it, granting it to the first queued
// client as the holder's Unlock would; the former
// holder's lease is lost at its next renewal. They see read-write locks and semaphores too
// (Info.Kind, Info.Shared: readers, writer, permits and size, each holder, callers queued): a
// name's Mutex first, then its read-write lock, then its semaphore. Client.ResizeSemaphore
// changes a semaphore's size. The dlock command (cmd/dlock) offers them as dlock status, list,
// unlock --force and resize, dlock web serves a live page of them (with JSON and Prometheus
// gauges), and dlock run runs a command under a lock (--read, --write and --permits N/SIZE for
// the others).
//
// # Observability
//
//   - Every acquisition reported acquired is followed by exactly one Released or Lost report
//     for its lease, after it; every Waiting start by exactly one stop, before the
//     acquisition's report; re-entries are not acquisitions.
//   - Without an observer (and with the logger below DEBUG) acquisitions and releases do no
//     extra work.
//
// WithObserver gives a client an Observer: functions it calls for each acquisition of a Mutex,
// RWMutex, Semaphore or MultiMutex (its name and kind,
// wait, outcome: acquired, busy, timed out, cancelled or error; whether it came from the
// server or by a local handoff; its token), each goroutine that starts or stops waiting, each
// release (how long the lock was held), each lost lease and why (refused by the server, force
// unlocked, no renewal before the deadline, a server that may evict keys, a fixed lease run
// out, the client closed), each renewal round (leases, latency, errors), the subscription
// dropping and coming back, and, in quorum mode, each server's errors. The modules
// github.com/dlock-go/dlock/dlockprom (Prometheus) and github.com/dlock-go/dlock/dlockotel
// (OpenTelemetry metrics, and spans for each wait and hold in the caller's trace) are built on
// it. Without an observer (and with the logger below DEBUG) acquisitions and releases do no
// extra work; with one they make one small allocation each (docs/BENCHMARKS.md, "Observer
// overhead").
//
// Not guaranteed: a lease is reported lost
// when this client finds out (its context is cancelled first), not when the server dropped it;
// the functions run on the goroutines that make the events, so a slow one slows them; and a
// lock passed on inside the client (a local handoff) is reported as a release and an
// acquisition (path local), though the server saw neither.
//
// WithLogger's logger gets a WARN line for every lost lease (name, token, cause; never the
// owner secret) and for failed renewal rounds (at most one every 10 s while they keep
// failing, then an INFO line when they succeed again), INFO lines when the release
// subscription drops and when it is back, and DEBUG lines for acquisitions, releases, renewal
// rounds and quorum servers' errors. No line holds an owner secret or a password.
//
// Trace context: the transports run each lock command under the context of the call that made
// it, so that go-redis and rueidis hooks (tracing, metrics) attribute it to its request. A
// command that serves several callers (the client sends concurrent acquisitions or releases on
// one server as one script call; the go-redis adapter sends concurrent calls together in one
// pipeline) runs with its first caller's context values, and names every caller:
// conn.Callers gives the callers of a script call, goredisconn.CallerContexts those of each
// command of a pipeline; dlockotel.GoRedisHook links such a command's span to every caller's
// span.
//
// docs/PROTOCOL.md describes the keys, values, scripts and channels; docs/CORRECTNESS.md and
// docs/BENCHMARKS.md give the measured figures.
//
// [What is guaranteed]: https://pkg.go.dev/github.com/dlock-go/dlock#hdr-What_is_guaranteed
// [Fenced writes]: https://pkg.go.dev/github.com/dlock-go/dlock#hdr-Fenced_writes
// [What is not guaranteed]: https://pkg.go.dev/github.com/dlock-go/dlock#hdr-What_is_not_guaranteed
// [Deployments]: https://pkg.go.dev/github.com/dlock-go/dlock#hdr-Deployments
// [Quorum mode (Redlock)]: https://pkg.go.dev/github.com/dlock-go/dlock#hdr-Quorum_mode__Redlock_
// [Waiting]: https://pkg.go.dev/github.com/dlock-go/dlock#hdr-Waiting
// [Adaptive lease]: https://pkg.go.dev/github.com/dlock-go/dlock#hdr-Adaptive_lease
// [Read-write locks and semaphores]: https://pkg.go.dev/github.com/dlock-go/dlock#hdr-Read_write_locks_and_semaphores
// [Do and outcomes]: https://pkg.go.dev/github.com/dlock-go/dlock#hdr-Do_and_outcomes
// [Re-entry]: https://pkg.go.dev/github.com/dlock-go/dlock#hdr-Re_entry
// [Errors]: https://pkg.go.dev/github.com/dlock-go/dlock#hdr-Errors
// [Operating a client]: https://pkg.go.dev/github.com/dlock-go/dlock#hdr-Operating_a_client
// [Multi-locks]: https://pkg.go.dev/github.com/dlock-go/dlock#hdr-Multi_locks
// [Countdown latches]: https://pkg.go.dev/github.com/dlock-go/dlock#hdr-Countdown_latches
// [Elections]: https://pkg.go.dev/github.com/dlock-go/dlock#hdr-Elections
// [Inspection]: https://pkg.go.dev/github.com/dlock-go/dlock#hdr-Inspection
// [Observability]: https://pkg.go.dev/github.com/dlock-go/dlock#hdr-Observability
package dlock
