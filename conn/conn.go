// Package conn defines the small transport interface that dlock's core speaks to Redis through.
//
// The core never imports a Redis client directly: adapters in dlock/rueidisconn (rueidis) and
// dlock/goredisconn (go-redis v9) implement Conn. A third adapter needs only this package.
package conn

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"time"
)

// Script is a Lua script that adapters run by SHA, falling back to the full source when the server
// answers NOSCRIPT (after a restart, failover or SCRIPT FLUSH).
type Script struct {
	Name string // file name, for error messages
	Src  string
	SHA  string // hex SHA-1 of Src, as SCRIPT LOAD returns it
}

// NewScript returns a Script with its SHA computed from src.
func NewScript(name, src string) *Script {
	sum := sha1.Sum([]byte(src))
	return &Script{Name: name, Src: src, SHA: hex.EncodeToString(sum[:])}
}

// Call is one script invocation in a pipeline, or, with a nil Script, a WAIT.
type Call struct {
	Script *Script
	Keys   []string
	Args   []string

	// A Call with a nil Script is a WAIT: the server answers once WaitReplicas replicas have
	// acknowledged every write sent before it on the same connection, or after WaitTimeout
	// (WAIT numreplicas timeout-ms). Its Result.Ints is {replicas that acknowledged}. An adapter
	// sends a batch that holds a WAIT on one connection, in order, so the WAIT covers the
	// scripts before it in the batch (also when a NOSCRIPT fallback re-sends them).
	WaitReplicas int
	WaitTimeout  time.Duration
}

// Result is the reply to one Call. Every dlock script replies with an integer or an array of
// integers; an integer reply is returned as a one-element slice (Int makes it). dlock only
// reads a reply: an adapter may hand out the same slice to several callers.
type Result struct {
	Ints []int64
	Err  error
}

// Handler receives pub/sub events. Both functions are called from the listener's own goroutine,
// one event at a time, and must not block.
type Handler struct {
	// Message is called for each message published on a subscribed channel.
	Message func(channel, payload string)
	// Subscribed is called when the server confirms a subscription to channel (also after a
	// reconnect re-subscribes it).
	Subscribed func(channel string)
}

// Clustered is implemented by a Conn whose deployment may be a Redis Cluster.
type Clustered interface {
	// Cluster reports whether the deployment is a Redis Cluster. Then keys of one script call
	// must share a hash slot, and a Listener subscribes with SSUBSCRIBE (sharded pub/sub, on
	// the node that owns each channel's slot), so that scripts announce with SPUBLISH.
	Cluster() bool
}

// Listener is one pub/sub subscription: a dedicated connection, or on a Cluster one per node
// that owns a subscribed channel's slot.
type Listener interface {
	// Subscribe asks the server to subscribe to channels. Confirmation arrives later through
	// Handler.Subscribed; the call may return before it.
	Subscribe(ctx context.Context, channels ...string) error
	// Unsubscribe asks the server to unsubscribe from channels.
	Unsubscribe(ctx context.Context, channels ...string) error
	// Done is closed when the connection is lost or the listener closed, after at most one
	// error saying why; no event is delivered after it.
	Done() <-chan error
	// Close closes the connection and waits for the listener's goroutines to exit.
	Close() error
}

// smallInts backs Int's slices for the integers scripts reply most (a release's holds left, a
// refusal's -1 or -2).
var smallInts = [...]int64{-2, -1, 0, 1, 2, 3, 4, 5, 6, 7}

// Int returns an integer reply as the one-element slice a Result holds: for the common small
// values a shared, read-only slice (capacity 1), so that the most frequent reply allocates
// nothing; else a new one.
func Int(v int64) []int64 {
	if i := v + 2; i >= 0 && i < int64(len(smallInts)) {
		return smallInts[i : i+1 : i+1]
	}
	return []int64{v}
}

// Conn is what dlock needs from a Redis client.
type Conn interface {
	// Eval runs s by SHA (EVALSHA), falling back to EVAL on NOSCRIPT.
	Eval(ctx context.Context, s *Script, keys, args []string) ([]int64, error)
	// EvalMulti sends calls in one pipeline (one round trip where the client allows) and
	// returns one Result per call, in order.
	EvalMulti(ctx context.Context, calls []Call) []Result
	// Command sends one command (args[0] is its name, e.g. "GET", "SCAN", "EVALSHA") and
	// returns the reply as a string (simple, bulk or verbatim string), an int64, nil (a nil
	// reply), or a []any of such values (arrays, sets, and nested arrays). Other RESP3 types
	// are returned as the adapter's client decodes them (maps as a Go map, doubles as float64,
	// booleans as bool); dlock does not send commands that reply with them. An error reply
	// is returned as an error. dlock uses it for inspection and admin (Client.Inspect, List,
	// ForceUnlock); it does not retry EVALSHA on NOSCRIPT.
	Command(ctx context.Context, args ...string) (any, error)
	// Listen opens a dedicated pub/sub connection whose events go to h.
	Listen(ctx context.Context, h Handler) (Listener, error)
	// Addr names the server(s) for error messages, e.g. "127.0.0.1:6379".
	Addr() string
	// Close releases what the adapter owns. An adapter wrapping a caller's client does not close it.
	Close() error
}

// Masters is implemented by a Conn whose deployment has several masters (a Redis Cluster).
// dlock runs there the checks that every master must pass, such as its eviction policy.
type Masters interface {
	// CommandMasters runs args (as Command does) on every master of the deployment the client
	// knows of, and returns one reply per master.
	CommandMasters(ctx context.Context, args ...string) []MasterReply
}

// MasterReply is one master's reply to CommandMasters.
type MasterReply struct {
	Addr  string
	Reply any
	Err   error
}

// callersKey is the context key of WithCallers.
type callersKey struct{}

// WithCallers returns ctx carrying callers: the contexts of the calls that one command sent
// under it serves (dlock sends the concurrent acquisitions or releases of several callers as one
// script call). Transports pass it to their client's hooks like any context; a tracing or
// metrics hook reads the callers back with Callers, to attribute the command to each request.
func WithCallers(ctx context.Context, callers []context.Context) context.Context {
	return context.WithValue(ctx, callersKey{}, callers)
}

// Callers returns the contexts WithCallers put in ctx (or in a context derived from it): the
// callers whose calls a command sent under ctx serves; nil when there are none. They are for
// their values: their callers may have stopped waiting.
func Callers(ctx context.Context) []context.Context {
	callers, _ := ctx.Value(callersKey{}).([]context.Context)
	return callers
}
