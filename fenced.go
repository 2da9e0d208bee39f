package dlock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/backend"
	"github.com/dlock-go/dlock/internal/protocol"
	"github.com/dlock-go/dlock/internal/slot"
)

// Fenced operations: reads and writes of the application's own Redis keys that the server
// allows only to a fencing token at least as new as the newest one that used the key. Each is
// one call of fenced.lua (docs/PROTOCOL.md, "Fenced operations on your own keys"), which checks
// the token, runs the operation and moves the key's fence to the token, atomically.
//
// The token is an argument, not a lease: it may come from Lease.Token, from TokenFromContext
// inside Do, or from another process (dlock run passes DLOCK_TOKEN to its command).

// fenceSuffix ends the name of a key's fence (fenceKey).
const fenceSuffix = ":dlock-fence"

// maxToken bounds the tokens the fenced operations take: a real token is below 2^53 (the
// scripts compare tokens as Lua numbers, which are doubles).
const maxToken = 1 << 53

// StaleError is the error of a fenced operation refused because the key's fence is newer than
// the token given: a holder with a newer token of the lock has used the key since, so the
// lease that token came from was lost (its holder paused, or cut off, past its end). It matches
// ErrStale. The operation changed nothing; retrying it with the same token cannot succeed.
type StaleError struct {
	Op    string // the operation: "get", "set", "incrby", "del", "hget", "hset", "hincrby"
	Key   string
	Token uint64 // the token given
	Fence uint64 // the key's fence: the newest token that used the key
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("dlock: fenced %s %q: stale token: token %d is older than the key's fence %d (a newer holder of the lock has used the key, so this token's lease was lost): give up this lease's work",
		e.Op, e.Key, e.Token, e.Fence)
}

// Is reports whether target is ErrStale.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// FencedGet returns the string value of key, once the key's fence accepts token: a token at
// least as new as the fence passes and moves the fence to it (it claims the key: from then on
// only tokens at least as new may use it), an older one is refused with a *StaleError
// (ErrStale) that names both. ok is false when key does not exist (the fence still moves).
//
// Read-modify-write is safe with it: a holder that reads with FencedGet and writes back with
// FencedSet under one token has its write refused if a newer token read or wrote the key in
// between.
//
// key is the application's own key, not under the client's prefix. Its fence is the key
// <key>:dlock-fence when key has a Redis Cluster hash tag ({…}), else {<key>}:dlock-fence: in
// either case in key's slot, so that the fenced operations work on a Cluster (a key whose
// fence could not share its slot, one with a '}' but no hash tag, is refused with ErrInvalid on
// every deployment). The fence has no expiry while the value has none, and otherwise outlives
// it by the token retention (WithTokenRetention, 60 s by default); so does it after a
// FencedDel. Fenced operations are not available in quorum mode (ErrInvalid): the application's
// data lives on one server, not on the quorum's.
//
// Errors: ErrStale; ErrInvalid for an empty key, a key under the client's prefix, a token of 0
// (no lease has it: TokenFromContext outside Do gives 0) or not below 2^53, a key of another
// type (WRONGTYPE); ErrUnavailable, ErrDenied (the ACL rule must also allow the application's
// keys and their fences: docs/SECURITY.md) as for locks; ErrClosed after Close.
func (c *Client) FencedGet(ctx context.Context, key string, token uint64) (value string, ok bool, err error) {
	return c.fencedRead(ctx, "get", "g", key, token)
}

// FencedSet sets key to value, as SET does, once the key's fence accepts token (see FencedGet),
// and moves the fence to it. ttl is the key's expiry: 0 for none (as SET without EX or PX: an
// expiry the key had is removed), else at least a millisecond (whole milliseconds); a
// negative one is ErrInvalid.
func (c *Client) FencedSet(ctx context.Context, key, value string, token uint64, ttl time.Duration) error {
	if ttl < 0 || (ttl > 0 && ttl < time.Millisecond) {
		return fmt.Errorf("%w: fenced set %q: ttl %v: give 0 (no expiry) or at least 1ms", ErrInvalid, key, ttl)
	}
	_, err := c.fencedInts(ctx, "set", "s", key, token, value, protocol.Millis(ttl))
	return err
}

// FencedIncrBy adds n (negative: subtracts) to the integer value of key, as INCRBY does (a
// missing key counts as 0; the key keeps its expiry), once the key's fence accepts token (see
// FencedGet), moves the fence to it, and returns the new value. A value that is not an
// integer is ErrInvalid. The value returned is exact below 2^53 in magnitude (the script's
// numbers are doubles); the stored value always is.
func (c *Client) FencedIncrBy(ctx context.Context, key string, n int64, token uint64) (int64, error) {
	return c.fencedInts(ctx, "incrby", "i", key, token, strconv.FormatInt(n, 10))
}

// FencedDel deletes key (of any type), once the key's fence accepts token (see FencedGet),
// and moves the fence to it. It reports whether key existed. The fence stays for the token
// retention after the delete, so that a holder with an older token cannot bring the key back
// within that time.
func (c *Client) FencedDel(ctx context.Context, key string, token uint64) (existed bool, err error) {
	n, err := c.fencedInts(ctx, "del", "d", key, token)
	return n > 0, err
}

// FencedHGet returns the value of field in the hash at key, as HGET does, once the key's fence
// accepts token (see FencedGet), and moves the fence to it. ok is false when the field or the
// key does not exist. The hash's fence is a key beside it, named as a string key's.
func (c *Client) FencedHGet(ctx context.Context, key, field string, token uint64) (value string, ok bool, err error) {
	return c.fencedRead(ctx, "hget", "G", key, token, field)
}

// FencedHSet sets field in the hash at key to value, as HSET does (the hash keeps its expiry),
// once the key's fence accepts token (see FencedGet), and moves the fence to it. It reports
// whether the field is new.
func (c *Client) FencedHSet(ctx context.Context, key, field, value string, token uint64) (created bool, err error) {
	n, err := c.fencedInts(ctx, "hset", "S", key, token, field, value)
	return n > 0, err
}

// FencedHIncrBy adds n to the integer value of field in the hash at key, as HINCRBY does,
// once the key's fence accepts token (see FencedGet), moves the fence to it, and returns the
// new value (exact below 2^53 in magnitude, as FencedIncrBy's).
func (c *Client) FencedHIncrBy(ctx context.Context, key, field string, n int64, token uint64) (int64, error) {
	return c.fencedInts(ctx, "hincrby", "I", key, token, field, strconv.FormatInt(n, 10))
}

// fenceKey returns the key of key's fence: in key's hash slot, so that both go to one script
// call on a Cluster. With a hash tag in key, the suffix keeps it; without one, key whole becomes
// the tag, which hashes as key does unless key holds a '}' (then the fence is refused: ok false).
func fenceKey(key string) (string, bool) {
	if !strings.ContainsAny(key, "{}") {
		return "{" + key + "}" + fenceSuffix, true // the tag is the whole key: the same slot
	}
	fk := key + fenceSuffix
	if !hasHashTag(key) {
		fk = "{" + key + "}" + fenceSuffix
	}
	return fk, slot.Of(fk) == slot.Of(key)
}

// hasHashTag reports whether key has a Redis Cluster hash tag: a '{' followed later by a '}',
// with something between the first '{' and the next '}'.
func hasHashTag(key string) bool {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return false
	}
	end := strings.IndexByte(key[open+1:], '}')
	return end > 0
}

// fencedCall checks a fenced operation's input and builds its call: KEYS the key and its
// fence, ARGV the operation's letter, the token, the token retention (ms), then args.
func (c *Client) fencedCall(op, letter, key string, token uint64, args []string) (conn.Call, error) {
	if err := c.checkOpen(); err != nil {
		return conn.Call{}, err
	}
	switch {
	case c.e.traits.Servers > 1:
		return conn.Call{}, fmt.Errorf("%w: %s %q: not available in quorum mode: the key lives on one server, not on the quorum's; use a client of the server that holds it (docs/PROTOCOL.md, \"Fenced operations on your own keys\")", ErrInvalid, "fenced "+op, key)
	case key == "":
		return conn.Call{}, fmt.Errorf("%w: %s: empty key", ErrInvalid, "fenced "+op)
	case strings.HasPrefix(key, c.opts.prefix):
		return conn.Call{}, fmt.Errorf("%w: %s %q: the key is under the client's prefix %q, where dlock keeps its own keys; fence the application's keys only", ErrInvalid, "fenced "+op, key, c.opts.prefix)
	case token == 0:
		return conn.Call{}, fmt.Errorf("%w: %s %q: token 0: no lease has it; pass Lease.Token() or, inside Do, TokenFromContext's", ErrInvalid, "fenced "+op, key)
	case token >= maxToken:
		return conn.Call{}, fmt.Errorf("%w: %s %q: token %d is not below 2^53: not a dlock token", ErrInvalid, "fenced "+op, key, token)
	}
	fk, ok := fenceKey(key)
	if !ok {
		return conn.Call{}, fmt.Errorf("%w: %s %q: the key holds a '}' but no hash tag, so its fence could not share its Cluster slot; put a hash tag in it, e.g. %q", ErrInvalid, "fenced "+op, key, "{"+strings.ReplaceAll(key, "}", "")+"}")
	}
	// The keys and the arguments in one allocation.
	kv := make([]string, 0, 5+len(args))
	kv = append(kv, key, fk, letter, strconv.FormatUint(token, 10), c.retentionArg)
	kv = append(kv, args...)
	return conn.Call{Script: protocol.ScriptFenced, Keys: kv[:2:2], Args: kv[2:]}, nil
}

// fencedInts runs a fenced operation whose reply is integers: {1, n} (or {1}) accepted,
// {0, fence} refused. It returns n (0 when absent).
func (c *Client) fencedInts(ctx context.Context, op, letter, key string, token uint64, args ...string) (int64, error) {
	call, err := c.fencedCall(op, letter, key, token, args)
	if err != nil {
		return 0, err
	}
	r, _, err := c.e.b.Run(ctx, call, backend.ReplicaAck{})
	if err != nil {
		return 0, c.fencedErr(op, key, err)
	}
	switch {
	case len(r) == 2 && r[0] == 0:
		return 0, &StaleError{Op: op, Key: key, Token: token, Fence: uint64(r[1])}
	case len(r) == 2 && r[0] == 1:
		return r[1], nil
	case len(r) == 1 && r[0] == 1:
		return 0, nil
	}
	return 0, fmt.Errorf("dlock: fenced %s %q: fenced.lua: unexpected reply %v", op, key, r)
}

// fencedRead runs a fenced read, whose accepted reply holds a string: {1, value}, or {1}
// when there is none.
func (c *Client) fencedRead(ctx context.Context, op, letter, key string, token uint64, args ...string) (string, bool, error) {
	call, err := c.fencedCall(op, letter, key, token, args)
	if err != nil {
		return "", false, err
	}
	reply, err := c.e.b.EvalAny(ctx, call.Script, call.Keys, call.Args...)
	if err != nil {
		return "", false, c.fencedErr(op, key, err)
	}
	arr, _ := reply.([]any)
	if len(arr) == 0 {
		return "", false, fmt.Errorf("dlock: fenced %s %q: fenced.lua: unexpected reply %v", op, key, reply)
	}
	switch status, _ := arr[0].(int64); {
	case status == 0 && len(arr) == 2:
		if fence, ok := arr[1].(int64); ok {
			return "", false, &StaleError{Op: op, Key: key, Token: token, Fence: uint64(fence)}
		}
	case status == 1 && len(arr) == 1:
		return "", false, nil
	case status == 1 && len(arr) == 2:
		if v, ok := arr[1].(string); ok {
			return v, true, nil
		}
	}
	return "", false, fmt.Errorf("dlock: fenced %s %q: fenced.lua: unexpected reply %v", op, key, reply)
}

// fencedErr is the error of a fenced operation the server failed: a key of another type, or a
// value that is not an integer, is the caller's (ErrInvalid); anything else as for locks.
func (c *Client) fencedErr(op, key string, err error) error {
	msg := err.Error()
	if strings.Contains(msg, "WRONGTYPE") || strings.Contains(msg, "not an integer") || strings.Contains(msg, "holds no token") {
		return fmt.Errorf("dlock: fenced %s %q: %w (%w)", op, key, err, ErrInvalid)
	}
	return c.e.redisErr(fmt.Sprintf("fenced %s %q", op, key), err)
}
