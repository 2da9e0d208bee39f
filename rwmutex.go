package dlock

import (
	"context"
	"fmt"

	"github.com/dlock-go/dlock/internal/protocol"
)

// RWMutex is a handle on one named read-write lock: many readers at once, or one writer,
// across every process. It is cheap to make (no I/O) and safe for concurrent use; each lock
// call that succeeds returns its own Lease, with its own lease on the server: a reader that
// crashes frees its share when its own lease runs out, whatever the other readers do.
//
// Writers are preferred: once a writer waits, readers that come after it wait behind it, so a
// steady stream of readers cannot starve writers (waiting callers are served first-in
// first-out; all the readers between two writers at once). A read-write lock is its own
// object: RWMutex("x") and Mutex("x") are two locks that do not exclude each other.
type RWMutex struct {
	h           sharedHandle
	read, write *lockSpec
}

// RWMutex returns a handle on the read-write lock called name. Options override the client's
// defaults for this lock, as for Mutex. An invalid name or option, or a client in quorum mode
// (which has no read-write locks), is reported by every lock call with an error wrapping
// ErrInvalid.
func (c *Client) RWMutex(name string, opts ...Option) *RWMutex {
	rw := &RWMutex{h: c.newSharedHandle(name, rwSuffix, "read-write lock", opts)}
	rw.read = rw.h.spec(protocol.SharedRead, 1, 0)
	rw.write = rw.h.spec(protocol.SharedWrite, protocol.RWAll, 0)
	return rw
}

// rwSuffix and semSuffix follow a name's key (keys.go) in the keys of its read-write lock and
// its semaphore.
const (
	rwSuffix  = ":rw"
	semSuffix = ":sem"
)

// Name returns the lock name.
func (rw *RWMutex) Name() string { return rw.h.name }

// RLock takes a read hold, waiting as long as ctx and WithWait allow while a writer holds the
// lock or waits for it. With a context that carries a read lease of this lock from the same
// client, it re-enters it (same token, one more hold); with one that carries the write lease,
// it takes a read hold under it at once (a downgrade: the read hold, with the writer's token,
// outlives the write hold when that is unlocked first). The lease's token is the last writer's:
// every writer before the reader has a token no larger, every later writer a larger one.
// A wait that ends returns a *NotAcquiredError (errors.Is ErrNotAcquired).
func (rw *RWMutex) RLock(ctx context.Context) (*Lease, error) { return rw.lock(ctx, false, true) }

// TryRLock makes one attempt at a read hold (or re-enters, as RLock does): it fails with a
// *NotAcquiredError (errors.Is ErrNotAcquired) when a writer holds the lock or waits for it.
func (rw *RWMutex) TryRLock(ctx context.Context) (*Lease, error) { return rw.lock(ctx, false, false) }

// Lock takes the write hold, waiting as long as ctx and WithWait allow while anyone holds the
// lock or a caller that came first waits. Its token is larger than every earlier writer's (and
// so than every earlier reader's). With a context that carries the write lease of this lock
// from the same client it re-enters it; with one that carries a read lease it fails at once
// with an error wrapping ErrInvalid: a read hold cannot be upgraded (two readers upgrading
// would wait for each other for ever).
func (rw *RWMutex) Lock(ctx context.Context) (*Lease, error) { return rw.lock(ctx, true, true) }

// TryLock makes one attempt at the write hold (or re-enters, as Lock does).
func (rw *RWMutex) TryLock(ctx context.Context) (*Lease, error) { return rw.lock(ctx, true, false) }

func (rw *RWMutex) lock(ctx context.Context, write, wait bool) (*Lease, error) {
	if rw == nil {
		return nil, fmt.Errorf("%w: nil read-write lock", ErrInvalid)
	}
	if err := rw.h.check(ctx); err != nil {
		return nil, err
	}
	e, spec := rw.h.e, rw.read
	if write {
		spec = rw.write
	}
	if st := heldIn(ctx, e, spec.key); st != nil {
		held := st.spec.shared.Kind
		switch {
		case held == protocol.SharedRead && write:
			return nil, fmt.Errorf("%w: write-lock %q: the context carries a read lock of it, which cannot be upgraded (two readers upgrading would wait for each other for ever): unlock the read lock first, or take the write lock from the start",
				ErrInvalid, rw.h.name)
		case !sameLease(st.spec, spec):
			return nil, fmt.Errorf("%w: re-enter %q: %s", ErrInvalid, rw.h.name, leaseDiff(st.spec, spec))
		case held == protocol.SharedWrite && !write:
			return e.downgrade(ctx, spec, st)
		}
		return e.reenterShared(ctx, st)
	}
	if o := e.obs; o != nil {
		return o.lockShared(ctx, e, spec, wait)
	}
	return e.acquireShared(ctx, spec, wait)
}

// DoRead takes a read hold of the read-write lock called name (waiting as RLock does), runs fn
// with a context that is cancelled when ctx is or when the hold is lost (cause ErrLost), and
// unlocks when fn returns or panics; as Do does, with the same outcomes.
func (c *Client) DoRead(ctx context.Context, name string, fn func(ctx context.Context) error, opts ...Option) error {
	return doUnder(ctx, fn, func(ctx context.Context) (*Lease, error) { return c.RWMutex(name, opts...).RLock(ctx) })
}

// DoWrite is DoRead with the write hold (Lock).
func (c *Client) DoWrite(ctx context.Context, name string, fn func(ctx context.Context) error, opts ...Option) error {
	return doUnder(ctx, fn, func(ctx context.Context) (*Lease, error) { return c.RWMutex(name, opts...).Lock(ctx) })
}
