package dlock

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"
)

// Observer receives what a Client's locks do, for metrics, traces and logs (the dlockprom and
// dlockotel modules build theirs on it). Set only the events you need: the client skips the
// others, and does no work at all for events nobody listens to.
//
// It is a struct of functions rather than an interface, on purpose: its zero value is a valid
// observer; an observer sets the events it uses and nothing else; a future version adds events
// as new fields without breaking an observer written today (a new interface method would break
// every implementation, and a no-op base type to embed would hide a misspelt method that then
// never runs, where a misspelt field does not compile); and several observers combine by
// giving WithObserver more than once.
//
// The functions are called from the goroutines that make the events (the caller of Lock or
// Unlock, the renewal loop, the subscription, a quorum's calls), possibly at the same time:
// they must be safe for concurrent use, and quick. A function that blocks holds up that
// goroutine (a slow Lost or Renewal delays the renewal of other leases).
type Observer struct {
	// AcquireDone is called when Lock, TryLock or Do (its acquisition) returns, whatever the
	// outcome, with the context the caller passed; so are RWMutex's RLock, TryRLock, Lock and
	// TryLock, Semaphore's Acquire and TryAcquire, and their Do forms (Kind says which). A
	// MultiMutex acquisition is reported once per name it took, each with the whole wait (once,
	// under the name that stopped it, when it failed). Re-entries (a lease's context passed to
	// Lock) are not reported, nor calls refused for bad input (a bad name or option, a nil
	// client).
	AcquireDone func(ctx context.Context, ev AcquireEvent)
	// Waiting is called when a goroutine of this client starts waiting for a busy lock (it
	// joins this client's queue for the name: Joined is true) and when it stops waiting (it
	// got the lock, or gave up). Each start has exactly one stop, before its AcquireDone.
	Waiting func(ctx context.Context, ev WaitingEvent)
	// Released is called when a lease reported acquired by AcquireDone ends without a loss:
	// its last Unlock released it, or passed it to a waiter of this client. ctx is the
	// context given to the Lock that acquired it (its values, not its cancellation).
	Released func(ctx context.Context, ev ReleaseEvent)
	// Lost is called when a lease reported acquired by AcquireDone ends otherwise: it was (or
	// may have been) lost, its fixed lease ran out, or the client closed. The lease context is
	// already cancelled. ctx is as for Released.
	Lost func(ctx context.Context, ev LostEvent)
	// Renewal is called after each round of the renewal loop: lease renewals, refreshes of
	// this client's queue entries and background releases, sent together.
	Renewal func(ev RenewalEvent)
	// Subscription is called when the client's subscription to release notices drops, and
	// when it is back. While it is down, waiters fall back on their holders' lease times.
	Subscription func(ev SubscriptionEvent)
	// NodeError is called, in quorum mode, for each server that answered a call with an error
	// (or whose connection failed); the call may still have succeeded on a majority.
	NodeError func(ev NodeErrorEvent)
}

// AcquireEvent describes one acquisition: a call of Lock, TryLock or Do that returned.
type AcquireEvent struct {
	Name    string
	Kind    string        // KindMutex (empty), KindRWMutex or KindSemaphore: which lock of that name
	Start   time.Time     // when the call was made
	Wait    time.Duration // how long it took, waiting included
	Outcome Outcome
	// Path says how the lease came, when Outcome is OutcomeAcquired: from the server (an
	// acquisition, a grant, or a handover through the server) or passed on inside this client
	// by a local handoff, without any command.
	Path  Path
	Token uint64 // the lease's fencing token when acquired; else 0
	Err   error  // the error the call returned; nil when acquired
}

// Outcome is how an acquisition ended.
type Outcome uint8

const (
	// OutcomeAcquired: the caller holds the lock.
	OutcomeAcquired Outcome = iota + 1
	// OutcomeBusy: a single attempt (TryLock, WithWait(0)) found the lock held.
	OutcomeBusy
	// OutcomeTimedOut: the wait ended by WithWait or by the deadline of the caller's context.
	OutcomeTimedOut
	// OutcomeCancelled: the caller's context was cancelled while it waited.
	OutcomeCancelled
	// OutcomeError: any other failure (a transport error, the client closed, …).
	OutcomeError
)

// String returns the outcome as a metric label: acquired, busy, timed_out, cancelled, error.
func (o Outcome) String() string {
	switch o {
	case OutcomeAcquired:
		return "acquired"
	case OutcomeBusy:
		return "busy"
	case OutcomeTimedOut:
		return "timed_out"
	case OutcomeCancelled:
		return "cancelled"
	case OutcomeError:
		return "error"
	}
	return "unknown"
}

// Path is how an acquired lease came to its holder.
type Path uint8

const (
	// PathServer: the server granted it (acquire.lua, a grant to this client's queue entry,
	// or a handover script): at least one round trip.
	PathServer Path = iota + 1
	// PathLocal: a holder of this client passed it on at its Unlock, without any command
	// (a local handoff; see Waiting in the package documentation).
	PathLocal
)

// String returns the path as a metric label: server or local.
func (p Path) String() string {
	switch p {
	case PathServer:
		return "server"
	case PathLocal:
		return "local"
	}
	return "unknown"
}

// WaitingEvent says that a goroutine of this client started (Joined) or stopped waiting for
// the lock Name; Waiting is how many goroutines of this client wait for it after the change.
type WaitingEvent struct {
	Name    string
	Kind    string // as in AcquireEvent
	Joined  bool
	Waiting int
}

// ReleaseEvent describes the end of a hold that was not a loss.
type ReleaseEvent struct {
	Name  string
	Kind  string // as in AcquireEvent
	Token uint64
	Held  time.Duration // from the acquisition to the release
	// PassedOn: the lock went straight to a waiter of this client (a local handoff or a
	// handover through the server) instead of being released on the server.
	PassedOn bool
}

// LostEvent describes a lease that ended by a loss (or may have), by its fixed lease running
// out, or because the client closed.
type LostEvent struct {
	Name  string
	Kind  string // as in AcquireEvent
	Token uint64
	Held  time.Duration // from the acquisition to the moment the client found out
	Cause LostCause
	Err   error // the lease context's cause: wraps ErrLost, or is ErrClosed
}

// LostCause says why a lease was lost.
type LostCause uint8

const (
	// LostRefused: the server no longer had the lock for this lease when a renewal (or
	// Extend, TTL, a re-entry, Unlock) asked: its lease ran out there, or someone took it.
	LostRefused LostCause = iota + 1
	// LostForceUnlocked: a renewal found the lock released by someone else while this lease
	// held it: an administrator's ForceUnlock (dlock unlock --force).
	LostForceUnlocked
	// LostDeadline: no renewal succeeded before the lease could run out on the server: the
	// server was unreachable or too slow, or this process was paused.
	LostDeadline
	// LostEviction: a server may evict lock keys (its memory policy changed, or it evicted
	// keys): every lease of the client is treated as lost.
	LostEviction
	// LostExpired: a fixed lease (WithoutRenewal) reached its planned end.
	LostExpired
	// LostClosed: the client was closed while the lease was held.
	LostClosed
)

// String returns the cause as a metric label: refused, force_unlocked, deadline, eviction,
// expired, closed.
func (c LostCause) String() string {
	switch c {
	case LostRefused:
		return "refused"
	case LostForceUnlocked:
		return "force_unlocked"
	case LostDeadline:
		return "deadline"
	case LostEviction:
		return "eviction"
	case LostExpired:
		return "expired"
	case LostClosed:
		return "closed"
	}
	return "unknown"
}

// RenewalEvent describes one round of the renewal loop.
type RenewalEvent struct {
	Leases   int           // lease renewals in the round
	Renewed  int           // of which the server extended
	Refused  int           // of which the server no longer had (those leases are lost)
	Failed   int           // of which got no answer (a transport error): retried until the deadline
	Entries  int           // queue entries refreshed with it (this client's waiting registrations)
	Releases int           // background releases sent with it
	Latency  time.Duration // from sending the round to its answer
	Err      error         // the first transport error of a renewal; nil when Failed is 0
}

// SubscriptionEvent says the client's subscription to release notices dropped (Up false, Err
// says why) or is back (Up true).
type SubscriptionEvent struct {
	Up  bool
	Err error
}

// NodeErrorEvent is one server's error in quorum mode.
type NodeErrorEvent struct {
	Server string // its address, without a password
	Op     string // the script (acquire.lua, release.lua, renew.lua, …) or command
	Err    error
}

// WithObserver makes the client report its events to o (see Observer). Given more than once,
// every observer receives every event, in the order given. A Client option; the default is
// none. Without an observer, and unless the logger (WithLogger) enables DEBUG when the client
// is made, acquisitions and releases cost nothing extra.
func WithObserver(o Observer) ClientOption {
	return clientOnly(func(opts *options) { opts.observers = append(opts.observers, o) })
}

// observer carries a client's events to its logger and to the observers given with
// WithObserver. Every client has one (its logger is never nil); the engine's obs field points
// to it only when someone listens to the frequent events (acquisitions, waits and releases):
// an observer was given, or the logger enables DEBUG when the client is made.
type observer struct {
	fn  Observer
	log *slog.Logger
	// renewFailing: the last round had a renewal without an answer (the next success is logged).
	renewFailing atomic.Bool
	// warnedAt: mono ns of the last warning for a failed round; failedSince: rounds failed since.
	warnedAt, failedSince atomic.Int64
}

// renewWarnEvery is the least time between two warnings for failed renewal rounds: while a
// server is unreachable, rounds are retried often (a tenth of a TTL), and one line per round
// would flood the log. The rounds in between are logged at DEBUG and counted in the next one.
const renewWarnEvery = 10 * time.Second

func newObserver(log *slog.Logger, fns []Observer) *observer {
	return &observer{log: log, fn: combine(fns)}
}

// hot reports whether the frequent events are wanted by anyone.
func (o *observer) hot() bool {
	f := o.fn
	return f.AcquireDone != nil || f.Waiting != nil || f.Released != nil || f.Lost != nil ||
		o.log.Enabled(context.Background(), slog.LevelDebug)
}

// combine merges observers into one that calls each in turn, event by event.
func combine(fns []Observer) Observer {
	switch len(fns) {
	case 0:
		return Observer{}
	case 1:
		return fns[0]
	}
	var c Observer
	c.AcquireDone = fanCtx(fns, func(o Observer) func(context.Context, AcquireEvent) { return o.AcquireDone })
	c.Waiting = fanCtx(fns, func(o Observer) func(context.Context, WaitingEvent) { return o.Waiting })
	c.Released = fanCtx(fns, func(o Observer) func(context.Context, ReleaseEvent) { return o.Released })
	c.Lost = fanCtx(fns, func(o Observer) func(context.Context, LostEvent) { return o.Lost })
	c.Renewal = fan(fns, func(o Observer) func(RenewalEvent) { return o.Renewal })
	c.Subscription = fan(fns, func(o Observer) func(SubscriptionEvent) { return o.Subscription })
	c.NodeError = fan(fns, func(o Observer) func(NodeErrorEvent) { return o.NodeError })
	return c
}

func fanCtx[E any](fns []Observer, get func(Observer) func(context.Context, E)) func(context.Context, E) {
	var fs []func(context.Context, E)
	for _, o := range fns {
		if f := get(o); f != nil {
			fs = append(fs, f)
		}
	}
	if len(fs) == 0 {
		return nil
	}
	return func(ctx context.Context, ev E) {
		for _, f := range fs {
			f(ctx, ev)
		}
	}
}

func fan[E any](fns []Observer, get func(Observer) func(E)) func(E) {
	var fs []func(E)
	for _, o := range fns {
		if f := get(o); f != nil {
			fs = append(fs, f)
		}
	}
	if len(fs) == 0 {
		return nil
	}
	return func(ev E) {
		for _, f := range fs {
			f(ev)
		}
	}
}

// leaseRecord is what a lease keeps for its observer (only when the client has one): when it
// was acquired, how it came, and the handshake that makes its end reported once, after its
// acquisition was.
type leaseRecord struct {
	local bool // made by a local handoff
	// since and ctx: when its acquisition was reported (mono ns) and the context given to the
	// Lock that acquired it; set before bit 1 of seen.
	since int64
	ctx   context.Context
	// seen: bit 1 when the acquisition was reported, bit 2 when the lease ended; whoever sets
	// the second bit reports the end.
	seen    atomic.Uint32
	endedAt int64  // mono ns, set before bit 2
	how     ending // set before bit 2
}

const (
	seenAcquired uint32 = 1
	seenEnded    uint32 = 2
)

// lock makes one Lock, TryLock or Do acquisition of m (Mutex.acquire) and reports it.
func (o *observer) lock(ctx context.Context, m *Mutex, wait bool) (*Lease, error) {
	start := mono()
	l, err := m.acquire(ctx, wait)
	o.acquired(ctx, m.e, m.spec, !wait || m.spec.wait == 0, start, l, err)
	return l, err
}

// lockShared makes one acquisition of a read-write lock's or semaphore's hold (spec) and
// reports it.
func (o *observer) lockShared(ctx context.Context, e *engine, spec *lockSpec, wait bool) (*Lease, error) {
	start := mono()
	l, err := e.acquireShared(ctx, spec, wait)
	o.acquired(ctx, e, spec, !wait || spec.wait == 0, start, l, err)
	return l, err
}

// lockMulti makes one acquisition of a multi-lock and reports it: acquired, one report per
// name whose lock it took (not those it re-entered), each with the whole acquisition's wait;
// else one report, under the name that stopped it when the error names one (else the first).
func (o *observer) lockMulti(ctx context.Context, mm *MultiMutex, wait bool) (*Lease, error) {
	start := mono()
	l, err := mm.acquire(ctx, wait)
	once := !wait || mm.wait == 0
	if err == nil {
		for i, member := range l.multi.members {
			o.acquired(ctx, mm.e, mm.specs[i], once, start, member, nil)
		}
		return l, nil
	}
	spec := mm.specs[0]
	var na *NotAcquiredError
	if errors.As(err, &na) {
		for _, s := range mm.specs {
			if s.name == na.Name {
				spec = s
			}
		}
	}
	o.acquired(ctx, mm.e, spec, once, start, nil, err)
	return nil, err
}

// acquired reports the outcome of an acquisition of spec's lock (l, or err) begun at start
// (mono ns); once: it was a single attempt. It reads the clock once: clock readings are a
// good part of what an observer costs.
func (o *observer) acquired(ctx context.Context, e *engine, spec *lockSpec, once bool, start int64, l *Lease, err error) {
	// A re-entry is no acquisition: it returns a lease whose acquisition was reported, or
	// fails with one in ctx (looked up only then: ctx.Value allocates its key).
	if err == nil && (l == nil || l.st.rec != nil && l.st.rec.seen.Load()&seenAcquired != 0) {
		return
	}
	if err != nil && heldIn(ctx, e, spec.key) != nil {
		return
	}
	now := mono()
	ev := AcquireEvent{Name: spec.name, Kind: spec.kind(), Start: epoch.Add(time.Duration(start)), Wait: time.Duration(now - start), Err: err}
	switch {
	case err == nil:
		ev.Outcome, ev.Path, ev.Token = OutcomeAcquired, PathServer, l.st.token
		if rec := l.st.rec; rec != nil && rec.local {
			ev.Path = PathLocal
		}
	case errors.Is(err, context.Canceled):
		ev.Outcome = OutcomeCancelled
	case errors.Is(err, ErrNotAcquired) && once:
		ev.Outcome = OutcomeBusy
	case errors.Is(err, ErrNotAcquired), errors.Is(err, context.DeadlineExceeded):
		ev.Outcome = OutcomeTimedOut
	default:
		ev.Outcome = OutcomeError
	}
	if f := o.fn.AcquireDone; f != nil {
		f(ctx, ev)
	}
	if o.log.Enabled(ctx, slog.LevelDebug) {
		if err == nil {
			o.log.DebugContext(ctx, "dlock: acquired", "name", spec.name, "token", ev.Token, "wait", ev.Wait, "path", ev.Path.String())
		} else {
			o.log.DebugContext(ctx, "dlock: not acquired", "name", spec.name, "outcome", ev.Outcome.String(), "wait", ev.Wait, "error", err)
		}
	}
	if err == nil {
		if rec := l.st.rec; rec != nil {
			rec.since, rec.ctx = now, ctx
			if rec.seen.Or(seenAcquired)&seenEnded != 0 {
				o.reportEnd(l.st, rec) // it ended while its acquisition was being reported
			}
		}
	}
}

// ended is told by leaseState.end that st ended (how, cause): it logs a loss, and reports the
// end of a lease whose acquisition was reported (or leaves that to lock, which is reporting it).
func (o *observer) ended(st *leaseState, how ending, cause error) {
	if how == endLost {
		o.log.Warn("dlock: lease lost", "name", st.spec.name, "token", st.token, "cause", lossCause(how, cause).String(), "error", cause)
	}
	rec := st.rec
	if rec == nil {
		return
	}
	rec.endedAt, rec.how = mono(), how
	if rec.seen.Or(seenEnded)&seenAcquired != 0 {
		o.reportEnd(st, rec)
	}
}

func (o *observer) reportEnd(st *leaseState, rec *leaseRecord) {
	held := max(time.Duration(rec.endedAt-rec.since), 0) // an end before the report counts 0
	ctx := rec.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	switch rec.how {
	case endReleased, endPassedOn:
		ev := ReleaseEvent{Name: st.spec.name, Kind: st.spec.kind(), Token: st.token, Held: held, PassedOn: rec.how == endPassedOn}
		if f := o.fn.Released; f != nil {
			f(ctx, ev)
		}
		if o.log.Enabled(ctx, slog.LevelDebug) {
			o.log.DebugContext(ctx, "dlock: released", "name", ev.Name, "token", ev.Token, "held", held, "passed_on", ev.PassedOn)
		}
	default:
		st.mu.Lock()
		cause := st.cause
		st.mu.Unlock()
		ev := LostEvent{Name: st.spec.name, Kind: st.spec.kind(), Token: st.token, Held: held, Cause: lossCause(rec.how, cause), Err: cause}
		if f := o.fn.Lost; f != nil {
			f(ctx, ev)
		}
		if rec.how == endClosed && o.log.Enabled(ctx, slog.LevelDebug) {
			o.log.DebugContext(ctx, "dlock: lease ended: client closed", "name", ev.Name, "token", ev.Token, "held", held)
		}
	}
}

// waiting reports a goroutine that started (joined) or stopped waiting for spec's lock, n
// goroutines of this client waiting for it after the change.
func (o *observer) waiting(ctx context.Context, spec *lockSpec, joined bool, n int) {
	ev := WaitingEvent{Name: spec.name, Kind: spec.kind(), Joined: joined, Waiting: n}
	if f := o.fn.Waiting; f != nil {
		f(ctx, ev)
	}
}

// renewal reports a round of the renewal loop, and logs a round whose renewals failed (WARN)
// and the first round that succeeds after one (INFO).
func (o *observer) renewal(ev RenewalEvent) {
	if f := o.fn.Renewal; f != nil {
		f(ev)
	}
	switch {
	case ev.Failed > 0:
		first := o.renewFailing.CompareAndSwap(false, true)
		n := o.failedSince.Add(1)
		now, last := mono(), o.warnedAt.Load()
		if first || now-last >= int64(renewWarnEvery) {
			o.warnedAt.Store(now)
			o.failedSince.Store(0)
			o.log.Warn("dlock: renewal round failed; retrying until the leases' deadlines", "leases", ev.Leases, "failed", ev.Failed,
				"latency", ev.Latency, "failed_rounds", n, "error", ev.Err)
		} else {
			o.log.Debug("dlock: renewal round failed", "leases", ev.Leases, "failed", ev.Failed, "latency", ev.Latency, "error", ev.Err)
		}
	case ev.Leases > 0 && o.renewFailing.CompareAndSwap(true, false):
		o.failedSince.Store(0)
		o.log.Info("dlock: renewals succeed again", "leases", ev.Leases, "latency", ev.Latency)
	case o.log.Enabled(context.Background(), slog.LevelDebug):
		o.log.Debug("dlock: renewal round", "leases", ev.Leases, "refused", ev.Refused, "entries", ev.Entries, "releases", ev.Releases, "latency", ev.Latency)
	}
}

// subscription reports the subscription dropping (up false) or coming back.
func (o *observer) subscription(up bool, err error) {
	if f := o.fn.Subscription; f != nil {
		f(SubscriptionEvent{Up: up, Err: err})
	}
	if up {
		o.log.Info("dlock: release subscription restored")
	} else {
		o.log.Info("dlock: release subscription dropped; waiters fall back on lease times until it is back", "error", err)
	}
}

// nodeError reports one quorum server's error.
func (o *observer) nodeError(server, op string, err error) {
	if f := o.fn.NodeError; f != nil {
		f(NodeErrorEvent{Server: server, Op: op, Err: err})
	}
	o.log.Debug("dlock: quorum server error", "server", server, "op", op, "error", err)
}

// lossError is a lease's cause of loss that says which kind of loss it was, for observers;
// its message and what it wraps are err's.
type lossError struct {
	kind LostCause
	err  error
}

func (e *lossError) Error() string { return e.err.Error() }
func (e *lossError) Unwrap() error { return e.err }

// lossCause tells which kind of loss ended a lease (how, with cause).
func lossCause(how ending, cause error) LostCause {
	if how == endClosed {
		return LostClosed
	}
	var le *lossError
	switch {
	case errors.As(cause, &le):
		return le.kind
	case errors.Is(cause, ErrEvictionPolicy):
		return LostEviction
	}
	return LostRefused
}

// lostAs is st.lost(reason), marked as a loss of kind.
func (st *leaseState) lostAs(kind LostCause, reason string) error {
	return &lossError{kind: kind, err: st.lost(reason)}
}
