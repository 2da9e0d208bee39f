package dlock

import (
	"context"
	"fmt"
	"strconv"
)

// MaxSemaphoreSize is the largest size a Semaphore may have.
const MaxSemaphoreSize = rwAll

// Semaphore is a handle on one named counting semaphore: at most its size permits are held at
// once, across every process. It is cheap to make (no I/O) and safe for concurrent use; each
// Acquire that succeeds returns its own Lease for the permits it took, with its own lease on
// the server: a holder that crashes frees its permits when its lease runs out, whoever else
// holds.
//
// Waiting callers are served first-in first-out, as golang.org/x/sync/semaphore.Weighted
// serves them: a request for many permits is not overtaken by later requests for fewer, so
// it is not starved by a stream of them. The size is stored with the semaphore on the server
// while it is held, and for the token retention after (WithTokenRetention); a handle that
// declares another size fails with ErrInvalid. Client.ResizeSemaphore changes it. There is no
// re-entry: every Acquire takes permits of its own, whatever its context carries.
type Semaphore struct {
	h    sharedHandle
	size int
}

// Semaphore returns a handle on the semaphore called name, of size permits (1 to
// MaxSemaphoreSize). Options override the client's defaults for its leases, as for Mutex. A
// bad name, size or option, or a client in quorum mode (which has no semaphores), is reported
// by every call with an error wrapping ErrInvalid.
func (c *Client) Semaphore(name string, size int, opts ...Option) *Semaphore {
	s := &Semaphore{h: c.newSharedHandle(name, semSuffix, "semaphore", opts), size: size}
	if s.h.err == nil && (size < 1 || size > MaxSemaphoreSize) {
		s.h.err = fmt.Errorf("%w: semaphore %q: size %d is not between 1 and %d", ErrInvalid, name, size, MaxSemaphoreSize)
	}
	return s
}

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.h.name }

// Size returns the size the handle declares.
func (s *Semaphore) Size() int { return s.size }

// Acquire takes n permits, waiting as long as ctx and WithWait allow (see Semaphore). Asking
// for more than the size fails at once with an error wrapping ErrInvalid. A wait that ends
// returns a *NotAcquiredError (errors.Is ErrNotAcquired). The lease's token is unique to it and
// larger than the token of every earlier Acquire of this semaphore.
func (s *Semaphore) Acquire(ctx context.Context, n int) (*Lease, error) {
	return s.acquire(ctx, n, true)
}

// TryAcquire makes one attempt to take n permits: it fails with a *NotAcquiredError when they
// are not free, or when callers that came first wait.
func (s *Semaphore) TryAcquire(ctx context.Context, n int) (*Lease, error) {
	return s.acquire(ctx, n, false)
}

func (s *Semaphore) acquire(ctx context.Context, n int, wait bool) (*Lease, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: nil semaphore", ErrInvalid)
	}
	if err := s.h.check(ctx); err != nil {
		return nil, err
	}
	if n < 1 || n > s.size {
		return nil, fmt.Errorf("%w: semaphore %q: %d permits asked for, of a size of %d", ErrInvalid, s.h.name, n, s.size)
	}
	spec := s.h.spec(sharedPermits, n, s.size)
	if o := s.h.e.obs; o != nil {
		return o.lockShared(ctx, s.h.e, spec, wait)
	}
	return s.h.e.acquireShared(ctx, spec, wait)
}

// Permits returns how many permits of a semaphore the lease holds: 0 for a lock's lease.
func (l *Lease) Permits() int {
	if l == nil || l.st.spec.shared == nil || l.st.spec.shared.kind != sharedPermits {
		return 0
	}
	return l.st.spec.shared.units
}

// DoAcquire takes n permits of the semaphore called name, of size permits (waiting as Acquire
// does), runs fn with a context that is cancelled when ctx is or when the lease is lost
// (cause ErrLost), and releases them when fn returns or panics; as Do does, with the same
// outcomes.
func (c *Client) DoAcquire(ctx context.Context, name string, size, n int, fn func(ctx context.Context) error, opts ...Option) error {
	if fn == nil {
		return fmt.Errorf("%w: nil function", ErrInvalid)
	}
	l, err := c.Semaphore(name, size, opts...).Acquire(ctx, n)
	if err != nil {
		return err
	}
	return runUnder(ctx, l, fn)
}

// ResizeSemaphore stores size as the size of the semaphore called name and returns the former
// one (0 when none was stored: nobody held it within the token retention). Handles that
// declare another size fail from then on (ErrInvalid); make them anew with the new size.
// Growing it grants the permits now free to the callers waiting, in order; shrinking it takes
// nothing from the holders, and new permits are granted once the held ones fit in the new
// size. The stored size lasts while the semaphore is held and for the token retention after.
func (c *Client) ResizeSemaphore(ctx context.Context, name string, size int) (int, error) {
	if err := c.checkAdmin(name); err != nil {
		return 0, err
	}
	if size < 1 || size > MaxSemaphoreSize {
		return 0, fmt.Errorf("%w: semaphore %q: size %d is not between 1 and %d", ErrInvalid, name, size, MaxSemaphoreSize)
	}
	if !c.e.traits.shared {
		return 0, fmt.Errorf("%w: semaphore %q: not available in quorum mode", ErrInvalid, name)
	}
	key := c.lockKey(name) + semSuffix
	reply, err := c.e.b.evalAny(ctx, scriptShared, sharedKeys(key),
		sharedResizeArgs(size, ms(c.opts.retention), releaseChannel(key), c.e.traits.sharded)...)
	if err != nil {
		return 0, c.e.redisErr("resize semaphore "+strconv.Quote(name), err)
	}
	old, ok := reply.(int64)
	if !ok {
		return 0, c.badReply("resize semaphore", name, reply)
	}
	return int(old), nil
}
