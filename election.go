package dlock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/dlock-go/dlock/internal/backend"
	"github.com/dlock-go/dlock/internal/protocol"
)

// Elections. An election is a Mutex whose holder is the leader: Campaign is a Lock that waits
// in the server's queue, and its lease is the leadership (renewed, its context cancelled with
// ErrLost before another candidate can lead, its token the term). What it adds to the lock:
// the leader's value, stored in the lock's holder description so that it comes and goes with
// the lease, and an announcement ("l <token>" on the lock's release channel, proclaim.lua) when
// a term begins or the value changes, which observers act on.

// MaxLeaderValue is the longest value, in bytes, a leader may advertise (Campaign, Proclaim).
const MaxLeaderValue = 4096

// LeaderInfo describes an election's leader as the server stores it. The zero LeaderInfo
// (Term 0) is what Observe sends while nobody leads.
type LeaderInfo struct {
	Value  string    // what the leader advertises: its Campaign's value, or its last Proclaim
	Term   uint64    // the term's fencing token: larger for every later term of the election
	Holder Holder    // the leading process
	Since  time.Time // when the term began, by the server's clock (the token's time: Info.TokenTime)
}

// same reports whether a and b describe the same leader and value.
func (a LeaderInfo) same(b LeaderInfo) bool {
	return a.Term == b.Term && a.Value == b.Value && a.Holder.Host == b.Holder.Host &&
		a.Holder.PID == b.Holder.PID && a.Holder.Label == b.Holder.Label
}

// Election is a handle on the election called name: at most one leader at a time, chosen
// among the callers of Campaign in the order they campaigned. It shares the name, and the
// lock, with c.Mutex(name): a Mutex holder of that name is the leader, with no value. Making
// it does no I/O; the lock options apply to the leadership's lease (WithTTL,
// WithAdaptiveTTL, WithReplicaAck, WithWait for Campaign's wait, WithLabel, WithPrefix's
// prefix from the client), except WithTurnSlice, which an election refuses (each term goes
// through the server, so that everyone sees it). Quorum mode (DialQuorum, NewQuorum) has no
// elections: every call of the handle returns an error wrapping ErrInvalid. An invalid name
// or option is reported by each call. An Election is safe for concurrent use.
type Election struct {
	c     *Client
	name  string
	opts  []Option
	label string
	key   string // the lock key
	rel   string // its release channel, where terms are announced
	err   error
}

// campaignSeq numbers the campaigns of this process: each campaign's holder description is
// its own, so that a leadership never passes to another campaign of the same client without
// the server (a local handoff would keep the former leader's value and announce nothing).
var campaignSeq atomic.Uint64

// Election returns a handle on the election called name (see Election).
func (c *Client) Election(name string, opts ...Option) *Election {
	e := &Election{c: c, name: name}
	if c == nil {
		e.err = fmt.Errorf("%w: nil client", ErrInvalid)
		return e
	}
	if turnAsked(opts) {
		e.err = fmt.Errorf("%w: WithTurnSlice: an election's terms each go through the server", ErrInvalid)
		return e
	}
	// A client-wide turn slice applies to Mutexes, not to elections.
	e.opts = append(append(make([]Option, 0, len(opts)+1), opts...), WithTurnSlice(0))
	m := c.Mutex(name, e.opts...)
	e.err = m.err
	if e.err == nil && c.e.traits.Majority > 1 {
		e.err = fmt.Errorf("%w: elections are not available in quorum mode: use one server, Sentinel or a Cluster", ErrInvalid)
	}
	e.label = c.opts.with(e.opts).label
	e.key, e.rel = m.spec.key, m.spec.channel
	return e
}

// Name returns the election's name.
func (e *Election) Name() string { return e.name }

func (e *Election) check() error {
	if e == nil {
		return fmt.Errorf("%w: nil election", ErrInvalid)
	}
	if e.err != nil {
		return e.err
	}
	return e.c.checkOpen()
}

func checkLeaderValue(value string) error {
	if len(value) > MaxLeaderValue {
		return fmt.Errorf("%w: leader value is %d bytes, longer than %d", ErrInvalid, len(value), MaxLeaderValue)
	}
	return nil
}

// electionMeta is the holder description of a campaign: the process's, with the advertised
// value and the campaign's number. Any bytes round-trip: a value that is not valid UTF-8 is
// stored as "value_bytes" (base64) instead of "value".
func electionMeta(label, value string, campaign uint64) string {
	host, _ := os.Hostname()
	var raw []byte // a value that is not UTF-8 goes as bytes (base64 in the JSON), not mangled
	if !utf8.ValidString(value) {
		raw, value = []byte(value), ""
	}
	b, _ := json.Marshal(struct {
		Host     string `json:"host"`
		PID      int    `json:"pid"`
		Start    int64  `json:"start"`
		Label    string `json:"label,omitempty"`
		Value    string `json:"value"`
		Raw      []byte `json:"value_bytes,omitempty"`
		Campaign uint64 `json:"campaign"`
	}{host, os.Getpid(), processStart.Unix(), label, value, raw, campaign})
	return string(b)
}

// Campaign waits until the caller leads the election, queued on the server behind the
// candidates that campaigned before it (without polling, as Mutex.Lock waits), for as long as
// ctx and WithWait allow, and returns the leadership. value is what the leader advertises
// (Leader, Observe), at most MaxLeaderValue bytes. Once it leads, it announces the new term to
// the election's observers. A wait that ends first returns Lock's error (a *NotAcquiredError
// naming the leader, with ctx's error when ctx ended it), and a ctx that ends just as the
// caller comes to lead returns ctx's error, the lock given back; a ctx that carries this
// election's own leadership is refused with ErrInvalid (a leader does not campaign again).
func (e *Election) Campaign(ctx context.Context, value string) (*Leadership, error) {
	if err := e.check(); err != nil {
		return nil, err
	}
	if err := checkLeaderValue(value); err != nil {
		return nil, err
	}
	if heldIn(ctx, e.c.e, e.key) != nil {
		return nil, fmt.Errorf("%w: Campaign(%q) with the context of a leadership of that election", ErrInvalid, e.name)
	}
	m := e.c.Mutex(e.name, e.opts...)
	m.spec.meta = electionMeta(e.label, value, campaignSeq.Add(1))
	for {
		l, err := m.Lock(ctx)
		if err != nil {
			return nil, err
		}
		ld := &Leadership{e: e, l: l, value: value}
		ok, err := ld.proclaim(ctx, "")
		if err != nil && ctx.Err() != nil {
			// The caller gave up as it came to lead: it does not lead.
			l.Unlock(context.WithoutCancel(ctx))
			return nil, ctx.Err()
		}
		if err != nil || ok {
			// Leading. An announcement that failed leaves the observers to find the new term
			// when the lease they saw runs out (Observe).
			return ld, nil
		}
		// Lost between the grant and the announcement (force-unlocked, say): the lease's
		// context says so; campaign again.
		l.Unlock(context.WithoutCancel(ctx))
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

// Leadership is one term of an election's leader: the lease of its lock. Resign it exactly
// once (or let its context end it). It is safe for concurrent use.
type Leadership struct {
	e *Election
	l *Lease

	mu    sync.Mutex
	value string
}

// Context returns a context cancelled when the leadership ends: with cause ErrLost when it was
// or may be lost (before another candidate can lead: see Lease.Context), context.Canceled
// after Resign, ErrClosed when the client closed. Check its Err before each step of the
// leader's work; fence what the leader writes with Term.
func (ld *Leadership) Context() context.Context {
	if ld == nil {
		return endedCtx
	}
	return ld.l.Context()
}

// Term returns the term's fencing token: larger than every earlier term's of this election
// (and every earlier Mutex holder's of its name). Give it to the resources the leader writes
// (Client.FencedSet and its kin, or package fence for SQL rows), which then refuse a deposed
// leader's late writes.
func (ld *Leadership) Term() uint64 {
	if ld == nil {
		return 0
	}
	return ld.l.Token()
}

// Value returns the value this leadership advertises.
func (ld *Leadership) Value() string {
	if ld == nil {
		return ""
	}
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return ld.value
}

// Lease returns the lease behind the leadership, for the calls that take one (Extend, TTL, the
// fenced writes). Unlocking it resigns.
func (ld *Leadership) Lease() *Lease {
	if ld == nil {
		return nil
	}
	return ld.l
}

// Proclaim changes the value the leader advertises and announces it to the observers. It
// returns an error wrapping ErrLost (and cancels the leadership's context) when the leadership
// was lost, ErrNotHeld after Resign.
func (ld *Leadership) Proclaim(ctx context.Context, value string) error {
	if ld == nil {
		return fmt.Errorf("%w: nil leadership", ErrNotHeld)
	}
	if err := checkLeaderValue(value); err != nil {
		return err
	}
	if err := ld.e.c.checkOpen(); err != nil {
		return err
	}
	st := ld.l.st
	if ld.l.unlocked.Load() || st.expired() || st.state.Load() != stateHeld {
		return st.endedErr()
	}
	ok, err := ld.proclaim(ctx, electionMeta(ld.e.label, value, campaignSeq.Add(1)))
	switch {
	case err != nil:
		return err
	case !ok:
		st.end(endLost, st.lost("Proclaim found it no longer held by this leadership"))
		return st.endedErr()
	}
	ld.mu.Lock()
	ld.value = value
	ld.mu.Unlock()
	return nil
}

// Resign steps down: the lock is released, and the first candidate queued leads next (within
// a round trip or two). Its errors are Lease.Unlock's (ErrLost when the leadership had been
// lost already, ErrNotHeld after a first Resign).
func (ld *Leadership) Resign(ctx context.Context) error {
	if ld == nil {
		return fmt.Errorf("%w: nil leadership", ErrNotHeld)
	}
	return ld.l.Unlock(ctx)
}

// proclaim runs proclaim.lua for the leadership: meta, when not empty, becomes the stored
// holder description. It reports false when the lease no longer holds the lock.
func (ld *Leadership) proclaim(ctx context.Context, meta string) (bool, error) {
	c := ld.e.c
	call := protocol.ProclaimCall(ld.e.key, ld.l.st.owner, meta, ld.e.rel, c.e.traits.Sharded)
	reply, err := c.e.b.EvalAny(ctx, call.Script, call.Keys, call.Args...)
	if err != nil {
		return false, c.e.redisErr("proclaim "+strconv.Quote(ld.e.name), err)
	}
	_, ok, err := protocol.ReadProclaim(reply)
	if err != nil {
		return false, fmt.Errorf("dlock: proclaim %q: %w", ld.e.name, err)
	}
	return ok, nil
}

// Leader reads who leads the election now. When nobody does it returns an error wrapping
// ErrNoLeader. A Mutex holder of the election's name reads as a leader with an empty value.
func (e *Election) Leader(ctx context.Context) (LeaderInfo, error) {
	info, _, err := e.read(ctx)
	return info, err
}

// read reads the leader and its remaining lease.
func (e *Election) read(ctx context.Context) (LeaderInfo, time.Duration, error) {
	if err := e.check(); err != nil {
		return LeaderInfo{}, 0, err
	}
	c := e.c
	reply, err := c.e.b.Inspect(ctx, []string{e.key})
	if err != nil {
		return LeaderInfo{}, 0, c.e.redisErr("leader of "+strconv.Quote(e.name), err)
	}
	arr, ok := reply.([]any)
	if !ok || len(arr) != backend.InspectWidth {
		return LeaderInfo{}, 0, c.badReply("leader of", e.name, reply)
	}
	info, err := parseLock(e.name, arr[0], arr[1])
	if err != nil {
		return LeaderInfo{}, 0, err
	}
	if !info.Held {
		return LeaderInfo{}, 0, fmt.Errorf("%w: election %q", ErrNoLeader, e.name)
	}
	if info.Leader != nil {
		return *info.Leader, info.TTL, nil
	}
	return LeaderInfo{Term: info.Token, Holder: info.Holder, Since: info.TokenTime()}, info.TTL, nil
}

// Observe returns a channel that receives the election's leader, first as it is when the
// observer starts (the zero LeaderInfo while nobody leads), then at each change: a new term,
// a new value, nobody leading. It is driven by the announcements on the client's one
// subscription, not by polling: each announcement of the election (a term beginning, a
// Proclaim, a release with no candidate queued) makes it read the lock once. One more read
// comes when the lease it last saw would have run out, which is how it sees a leader that
// crashed with no candidate waiting to follow it (at most one read per lease period). Reads
// that fail are retried, 50 ms to 2 s apart, without sending anything.
//
// It never blocks the client: the channel holds one value, and a reader that is slow gets the
// latest state, not every step. The channel is closed when ctx ends or the client closes, and
// at once when the handle is invalid (a bad name or option, quorum mode).
func (e *Election) Observe(ctx context.Context) <-chan LeaderInfo {
	out := make(chan LeaderInfo, 1)
	if e.check() != nil {
		close(out)
		return out
	}
	e.c.bg.Add(1)
	go func() {
		defer e.c.bg.Done()
		e.observe(ctx, out)
	}()
	return out
}

// observeFirstWait is how long an observer waits for its subscription before its first read,
// and observeReadTimeout how long one of its reads may take.
const (
	observeFirstWait   = time.Second
	observeReadTimeout = 5 * time.Second
)

func (e *Election) observe(ctx context.Context, out chan LeaderInfo) {
	defer close(out)
	poked := make(chan struct{}, 1)
	w := &watch{poke: func() {
		select {
		case poked <- struct{}{}:
		default:
		}
	}}
	n, done := e.c.e.notices, e.c.e.done
	// Reads end with the client too.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-done:
			cancel()
		case <-stop:
		}
	}()
	n.watch(e.rel, w)
	defer n.unwatch(e.rel, w)
	timer := time.NewTimer(observeFirstWait) // the subscription is confirmed by a poke
	defer timer.Stop()
	select {
	case <-poked:
	case <-timer.C:
	case <-ctx.Done():
		return
	case <-done:
		return
	}
	var (
		last    LeaderInfo
		sent    bool
		backoff time.Duration
	)
	for {
		rctx, rcancel := context.WithTimeout(ctx, observeReadTimeout)
		info, ttl, err := e.read(rctx)
		rcancel()
		timer.Stop()
		switch {
		case err == nil || errors.Is(err, ErrNoLeader):
			backoff = 0
			if !sent || !info.same(last) {
				select { // the reader has not taken the older state: the newer replaces it
				case <-out:
				default:
				}
				out <- info
				last, sent = info, true
			}
			if ttl > 0 {
				timer.Reset(ttl + 10*time.Millisecond) // the lease seen runs out: look again
			}
		case ctx.Err() != nil:
			return
		default:
			backoff = min(max(2*backoff, 50*time.Millisecond), 2*time.Second)
			timer.Reset(backoff)
		}
		select {
		case <-poked:
		case <-timer.C:
		case <-ctx.Done():
			return
		case <-done:
			return
		}
	}
}

// RunElected runs fn whenever this caller leads the election called name: it campaigns with
// value, runs fn with a context that ends with the leadership or with ctx (it carries the
// leadership's lease: TokenFromContext gives the term), resigns when fn returns, and campaigns
// again, until ctx ends. A leadership lost while fn runs cancels fn's context (cause ErrLost);
// when fn then returns (with any error that is that context's own cancellation, or nil) it campaigns
// again. It returns ctx's error when ctx ends (resigning first if it leads), fn's error when fn
// returns any other non-nil error (having resigned), and an error of the handle or client
// (ErrInvalid, ErrClosed) at once. Campaigns that fail otherwise (a server unreachable) are
// tried again, 50 ms to 2 s apart. opts are the Election's.
func (c *Client) RunElected(ctx context.Context, name, value string, fn func(ctx context.Context) error, opts ...Option) error {
	if fn == nil {
		return fmt.Errorf("%w: RunElected(%q) with a nil function", ErrInvalid, name)
	}
	e := c.Election(name, opts...)
	if err := e.check(); err != nil {
		return err
	}
	if err := checkLeaderValue(value); err != nil {
		return err
	}
	var backoff time.Duration
	for {
		ld, err := e.Campaign(ctx, value)
		switch {
		case ctx.Err() != nil:
			if err == nil {
				resignBounded(ctx, ld)
			}
			return ctx.Err()
		case errors.Is(err, ErrInvalid), errors.Is(err, ErrClosed), errors.Is(err, ErrDenied):
			return err
		case err != nil:
			backoff = min(max(2*backoff, 50*time.Millisecond), 2*time.Second)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
			continue
		}
		backoff = 0
		ferr, own := lead(ctx, ld, fn)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case ferr != nil && !own:
			return ferr
		}
	}
}

// lead runs fn for one term, with a context that ends with the leadership or with ctx,
// whichever ends first, and then steps down, also when fn panics (the panic goes on): before
// campaigning again or returning, the leadership is given back. own reports whether fn's error is that context's
// own cancellation.
func lead(ctx context.Context, ld *Leadership, fn func(context.Context) error) (err error, own bool) {
	// A lease's own kind of context, as Do's function gets: its Err checks the lease's deadline
	// itself, so that a leader that looks after a pause learns at once that its term is over
	// (a plain context derived from the leadership's would say so only once the renewal loop
	// had run).
	fctx, done := ld.l.st.doContext(ctx)
	defer func() {
		done()
		resignBounded(ctx, ld)
	}()
	err = fn(fctx)
	return err, err != nil && fctx.Err() != nil && errors.Is(err, fctx.Err())
}

// resignBounded resigns ld for RunElected, whether or not ctx has ended, waiting at most the
// lease's TTL (past it the lock is free anyway). A leadership already lost reports ErrLost:
// nothing to do.
func resignBounded(ctx context.Context, ld *Leadership) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(time.Duration(ld.l.st.ttl.Load()), time.Second))
	defer cancel()
	_ = ld.Resign(rctx)
}
