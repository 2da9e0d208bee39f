// Package errs holds dlock's sentinel errors and the typed errors and helpers that both the
// engine (the root package) and the backends (internal/backend) make errors with: the
// classification of a transport's error, a quorum's per-server error, one server's PING error,
// and errors.Join on one line.
package errs

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"
)

// The sentinel errors. The root package re-exports each under the same name (the same value,
// so errors.Is matches either) and documents when it is returned.
var (
	ErrNotAcquired = errors.New("dlock: not acquired: held by another owner")
	ErrNotHeld     = errors.New("dlock: not held")
	ErrLost        = errors.New("dlock: lock lost")
	ErrExpired     = errors.New("dlock: lease expired")
	ErrClosed      = errors.New("dlock: client closed")
	ErrReplicaAck  = errors.New("dlock: not acknowledged by enough replicas")
	ErrOutOfMemory = errors.New("dlock: server out of memory")
	ErrInvalid     = errors.New("dlock: invalid argument")
	ErrDenied      = errors.New("dlock: permission denied")
	ErrNotFound    = errors.New("dlock: not found")
	ErrStale       = errors.New("dlock: stale token")
	ErrUnavailable = errors.New("dlock: server unavailable")
	ErrNoQuorum    = errors.New("dlock: no quorum")
	ErrNoLeader    = errors.New("dlock: no leader")
)

// Classify returns the sentinel error a transport error falls under, or nil.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	var ne net.Error
	msg := err.Error()
	switch {
	case strings.Contains(msg, "NOPERM"), strings.Contains(msg, "WRONGPASS"), strings.Contains(msg, "NOAUTH"),
		strings.Contains(msg, "can't run this command"), strings.Contains(msg, "invalid username-password"):
		return ErrDenied
	case strings.Contains(msg, "OOM command not allowed"):
		return ErrOutOfMemory
	case SpeaksOtherProtocol(err):
		return ErrUnavailable // no Redis server at that address (a NotRedisError)
	case errors.As(err, &ne), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		strings.Contains(msg, "connection refused"), strings.Contains(msg, "connection reset"),
		strings.Contains(msg, "cannot reach redis"), strings.Contains(msg, "unreachable"):
		return ErrUnavailable
	}
	return nil
}

// SpeaksOtherProtocol reports whether err is a transport's failure to read a reply in the
// Redis protocol: what answered at the address is something else (an HTTP server, say).
func SpeaksOtherProtocol(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "received unknown message type") || // rueidis
		strings.Contains(msg, "redis: can't parse") || strings.Contains(msg, "redis: invalid reply") // go-redis
}

// NotRedisError is the error of an address where something answered, but not in the Redis
// protocol: a port of an HTTP server given for Redis's, say. Like a closed port it matches
// ErrUnavailable: no Redis server answers there.
type NotRedisError struct {
	Addr string
	Err  error // what the transport made of the reply
}

// NewNotRedis is the NotRedisError of addr for the transport's err, without the dial's
// "cannot reach redis at …" (it could be reached).
func NewNotRedis(addr string, err error) *NotRedisError {
	if inner := errors.Unwrap(err); inner != nil && strings.HasPrefix(err.Error(), "cannot reach redis") {
		err = inner
	}
	return &NotRedisError{Addr: addr, Err: err}
}

func (e *NotRedisError) Error() string {
	return fmt.Sprintf("%s is not a Redis server: it answered in another protocol (%v); check the host and port given for Redis", e.Addr, e.Err)
}

// Is reports whether target is ErrUnavailable.
func (e *NotRedisError) Is(target error) bool { return target == ErrUnavailable }

func (e *NotRedisError) Unwrap() error { return e.Err }

// PingErr is the error of one server's PING: it names the server and matches ErrUnavailable
// (ErrDenied for a refusal by its access rules).
func PingErr(addr string, err error) error {
	switch kind := Classify(err); {
	case SpeaksOtherProtocol(err):
		return fmt.Errorf("dlock: ping: %w", NewNotRedis(addr, err))
	case kind == ErrDenied:
		return fmt.Errorf("dlock: ping: server %s: %w (%w)", addr, err, ErrDenied)
	default:
		return fmt.Errorf("dlock: ping: server %s: %w (%w)", addr, err, ErrUnavailable)
	}
}

// QuorumError says, server by server, why an operation in quorum mode could not be decided.
type QuorumError struct {
	Op      string        // what was attempted: "lock", ...
	Need    int           // the majority
	Wait    time.Duration // how long the answers were waited for; 0 when every server answered
	Servers []ServerState // one per server, in the order given to DialQuorum or NewQuorum
}

// ServerState is one server's part in a quorum operation.
type ServerState struct {
	Addr  string
	State string // "granted", "held by another owner", "answered" (Ping), "error", "no answer"
	Err   error  // with "error"
}

func (e *QuorumError) Error() string {
	answered := 0
	var b strings.Builder
	for i, s := range e.Servers {
		if s.State != "no answer" && s.State != "error" {
			answered++
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(s.Addr + ": " + s.State)
		if s.State == "no answer" && e.Wait > 0 {
			b.WriteString(" within " + e.Wait.String())
		}
		if s.Err != nil {
			b.WriteString(": " + s.Err.Error())
		}
	}
	return fmt.Sprintf("no quorum: %d of %d servers answered the %s, a majority needs %d (%s)", answered, len(e.Servers), e.Op, e.Need, b.String())
}

// Is reports whether target is ErrNoQuorum or ErrUnavailable.
func (e *QuorumError) Is(target error) bool { return target == ErrNoQuorum || target == ErrUnavailable }

// Unwrap returns the servers' errors.
func (e *QuorumError) Unwrap() []error {
	var errs []error
	for _, s := range e.Servers {
		if s.Err != nil {
			errs = append(errs, s.Err)
		}
	}
	return errs
}

// Join is errors.Join on one line: its message separates the errors with "; " (a
// multi-line error splits log lines). It returns nil when every error is nil.
func Join(errs ...error) error {
	var kept []error
	for _, err := range errs {
		if err != nil {
			kept = append(kept, err)
		}
	}
	switch len(kept) {
	case 0:
		return nil
	case 1:
		return kept[0]
	}
	return joined(kept)
}

type joined []error

func (j joined) Error() string {
	msgs := make([]string, len(j))
	for i, err := range j {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

func (j joined) Unwrap() []error { return j }
