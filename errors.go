package dlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/errs"
)

var (
	// ErrNotAcquired is matched by the error of a TryLock, or of a Lock whose wait ended, while
	// another owner held the lock (a *NotAcquiredError).
	ErrNotAcquired = errs.ErrNotAcquired
	// ErrNotHeld is returned when an operation needs a lock the caller does not hold: a second
	// Unlock, an Unlock, Extend or TTL on a lease that has ended, or a nil lease.
	ErrNotHeld = errs.ErrNotHeld
	// ErrLost is the cause of a lease context's cancellation when the lock may have passed to
	// someone else: a renewal was refused (the key expired or was taken over), or no renewal
	// succeeded before the lease could have expired on the server.
	ErrLost = errs.ErrLost
	// ErrExpired is the cause of a lease context's cancellation when a fixed lease
	// (WithoutRenewal) reached its planned end. It comes with ErrLost (the lock is no longer
	// held), so errors.Is(cause, ErrExpired) tells a planned end from a loss. It is also wrapped
	// by the error of a call on a countdown latch whose TTL ran out before it reached zero.
	ErrExpired = errs.ErrExpired
	// ErrClosed is returned by every call on a closed Client, and is the cause of the lease
	// contexts that Close ended.
	ErrClosed = errs.ErrClosed
	// ErrReplicaAck is wrapped by the error of an acquisition that fewer replicas than
	// WithReplicaAck asks for acknowledged in time; the lock was released again.
	ErrReplicaAck = errs.ErrReplicaAck
	// ErrOutOfMemory is wrapped by the error of an acquisition that a Redis server refused
	// because its memory is full (maxmemory reached under the noeviction policy). Releases and
	// renewals still work on such a server.
	ErrOutOfMemory = errs.ErrOutOfMemory
	// ErrInvalid wraps every error about bad input: an empty or oversized name, a TTL below the
	// minimum, a bad option, a bad or empty URL.
	ErrInvalid = errs.ErrInvalid
	// ErrDenied is wrapped by the error of a call the server refused for its access rules: a
	// wrong user or password, or a user whose ACL lacks a command or key (docs/SECURITY.md
	// gives the rule dlock needs).
	ErrDenied = errs.ErrDenied
	// ErrNotFound is wrapped by the error of a call on a latch that does not exist, made through
	// a handle that cannot create it (Client.Latch with count 0).
	ErrNotFound = errs.ErrNotFound
	// ErrStale is matched by the error of a fenced operation (Client.FencedGet, FencedSet, …)
	// refused because the key's fence is newer than the token given: a newer holder of the lock
	// has used the key, so that token's lease was lost (a *StaleError names both tokens).
	ErrStale = errs.ErrStale
	// ErrUnavailable is wrapped by the error of a call that could not reach the server, or
	// whose connection failed (refused, reset, timed out), or that found at the server's
	// address something other than a Redis server (an HTTP server, say: the error says so);
	// in quorum mode by a *QuorumError. Client.Ping returns it when a server is down.
	ErrUnavailable = errs.ErrUnavailable
	// ErrNoLeader is wrapped by the error of Election.Leader when nobody leads the election:
	// its lock is free.
	ErrNoLeader = errs.ErrNoLeader
)

// classify returns the sentinel error a transport error falls under, or nil.
func classify(err error) error { return errs.Classify(err) }

// speaksOtherProtocol reports whether err is a transport's failure to read a reply in the
// Redis protocol: what answered at the address is something else (an HTTP server, say).
func speaksOtherProtocol(err error) bool { return errs.SpeaksOtherProtocol(err) }

// notRedisError is the error of an address where something answered, but not in the Redis
// protocol (an HTTP server's port given for Redis's, say); it matches ErrUnavailable.
type notRedisError = errs.NotRedisError

// newNotRedis is the notRedisError of addr for the transport's err.
func newNotRedis(addr string, err error) *notRedisError { return errs.NewNotRedis(addr, err) }

// notHeldError is the error of an Unlock whose lease was lost before it: its message is the
// loss's cause alone, and it matches ErrNotHeld as well as what the cause matches (ErrLost).
type notHeldError struct{ cause error }

func (e *notHeldError) Error() string { return e.cause.Error() }

// Is reports whether target is ErrNotHeld.
func (e *notHeldError) Is(target error) bool { return target == ErrNotHeld }

func (e *notHeldError) Unwrap() error { return e.cause }

// lostWhileFn is the error of a Do whose lock called name ended while fn ran: fn's error
// (fnErr, maybe nil) and that the lock ended so (what), with the lease's cause (ended). When
// fn's error is, or wraps, that cause (fn returned context.Cause(ctx)), the cause is said once.
func lostWhileFn(fnErr error, name, what string, ended error) error {
	if fnErr != nil && errors.Is(fnErr, ended) {
		return fmt.Errorf("dlock: %q %s: %w", name, what, fnErr)
	}
	return joinErrors(fnErr, fmt.Errorf("dlock: %q %s: %w", name, what, ended))
}

// withUnlockErr is the error of a Do whose fn returned fnErr and whose Unlock then returned
// uerr: both, but uerr once when fnErr already is, or wraps, it (fn returned
// context.Cause(ctx) after Close: ErrClosed).
func withUnlockErr(fnErr, uerr error) error {
	if fnErr != nil && uerr != nil && errors.Is(fnErr, uerr) {
		return fnErr
	}
	return joinErrors(fnErr, uerr)
}

// ErrNoQuorum is matched (errors.Is) by the *QuorumError of an operation in quorum mode that
// fewer than a majority of the servers answered: they are down, frozen or unreachable. It is
// not ErrNotAcquired: nobody was found holding the lock.
var ErrNoQuorum = errs.ErrNoQuorum

// QuorumError says, server by server, why an operation in quorum mode could not be decided:
// Op is what was attempted ("lock", ...), Need the majority, Wait how long the answers were
// waited for (0 when every server answered), and Servers holds one ServerState per server, in
// the order given to DialQuorum or NewQuorum. It matches ErrNoQuorum and ErrUnavailable
// (errors.Is), and unwraps to the servers' errors.
type QuorumError = errs.QuorumError

// ServerState is one server's part in a quorum operation: its Addr, its State ("granted",
// "held by another owner", "answered" (Ping), "error", "no answer") and, with "error", its Err.
type ServerState = errs.ServerState

// ctxEnded is the error of ctx, which has ended, for the wait it ended: ctx.Err(), and the
// cause it was given too (context.WithCancelCause, WithTimeoutCause, WithDeadlineCause), so
// that errors.Is finds either.
func ctxEnded(ctx context.Context) error {
	err := ctx.Err()
	cause := context.Cause(ctx)
	switch {
	case cause == nil || cause == err:
		return err
	case errors.Is(cause, err):
		return cause
	}
	return joinErrors(err, cause)
}

// joinErrors is errors.Join on one line: its message separates the errors with "; " (a
// multi-line error splits log lines). It returns nil when every error is nil.
func joinErrors(e ...error) error { return errs.Join(e...) }

// NotAcquiredError is the error of a TryLock, or of a Lock whose wait ended (WithWait, or its
// context), while another owner held the lock. It matches ErrNotAcquired, and, when the
// caller's context ended the wait, that context's error (errors.Is(err,
// context.DeadlineExceeded) tells "my request went away" from "busy"), and the cause the
// context was given, if any (context.WithCancelCause). WithWait's own bound running out is
// no context error: the error then matches ErrNotAcquired alone. In quorum mode, a wait that
// ends while too few servers answer returns their *QuorumError (ErrNoQuorum) instead.
type NotAcquiredError struct {
	Name   string
	Holder Info          // the holder as the server described it just after; Held is false when unknown
	Mine   bool          // the holder is this client: another goroutine, or a hold whose context the caller did not pass
	Waited time.Duration // how long Lock waited; 0 for TryLock
	Cause  error         // the caller's context's error (and its cause, if it was given one) when it ended the wait, else nil
}

func (e *NotAcquiredError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "dlock: not acquired: %q held by ", e.Name)
	h := e.Holder
	switch {
	case e.Mine:
		b.WriteString("this client (another goroutine, or a hold whose context was not passed: to re-enter, lock with the lease's Context)")
	case h.Holder.Host != "":
		fmt.Fprintf(&b, "%s pid %d", h.Holder.Host, h.Holder.PID)
		if h.Holder.Label != "" {
			fmt.Fprintf(&b, " (%s)", strconv.Quote(h.Holder.Label))
		}
	default:
		b.WriteString("another owner")
	}
	if h.Token != 0 {
		fmt.Fprintf(&b, ", token %d", h.Token)
	}
	if h.Held {
		fmt.Fprintf(&b, ", lease %v left", h.TTL.Round(time.Millisecond))
	}
	if h.Shared != nil { // a read-write lock or semaphore: who else holds and waits
		fmt.Fprintf(&b, " (%s)", h.Shared)
	}
	if e.Waited > 0 {
		fmt.Fprintf(&b, "; waited %v", e.Waited.Round(time.Millisecond))
	}
	if e.Cause != nil {
		b.WriteString(": " + e.Cause.Error())
	}
	return b.String()
}

// Is reports whether target is ErrNotAcquired.
func (e *NotAcquiredError) Is(target error) bool { return target == ErrNotAcquired }

// Unwrap returns the caller's context's error, if it ended the wait.
func (e *NotAcquiredError) Unwrap() error { return e.Cause }
