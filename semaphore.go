package dlock

import (
	"context"
	"fmt"
	"strconv"

	"github.com/dlock-go/dlock/internal/protocol"
)

// MaxSemaphoreSize is the largest size a Semaphore may have.
const MaxSemaphoreSize = protocol.RWAll

// Semaphore is a handle on one named counting semaphore: at most its size permits are held at
// once, across every process. It is cheap to make (no I/O) and safe for concurrent use; each
// Acquire that succeeds returns its own Lease for the permits it took, with its own lease on
// the server: a holder that crashes frees its permits when its lease runs out, whoever else
// holds.
//
// Waiting callers are served first-in first-out, as golang.org/x/sync/semaphore.Weighted
// serves them: a request for many permits is not overtaken by later requests for fewer, so
// it is not starved by a stream of them. There is no re-entry: every Acquire takes permits of
// its own, whatever its context carries.
//
// The size is the server's: the size a handle declares is only the default with which an
// Acquire creates the semaphore when the server stores no size for it, and every handle
// follows the stored size once there is one, whatever it declares. A size stored so, by use,
// lasts while the semaphore is held or waited for and for the token retention after
// (WithTokenRetention); then the next Acquire's declared size counts. A size set by
// Client.ResizeSemaphore is sticky: it stays, held or idle, until the next resize, or until
// Client.ResetSemaphoreSize makes it an ordinary one again. A resize takes effect at once for
// every process: a larger size grants the permits it frees to the callers waiting, in order; a
// smaller one takes nothing from the holders, who keep their permits until they release them,
// and no permit is granted until the held ones fit in the new size.
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

// Size returns the size the handle declares: the size an Acquire stores when the server has
// none. The semaphore's size is the stored one (Client.Inspect, SharedInfo.Size).
func (s *Semaphore) Size() int { return s.size }

// Acquire takes n permits, waiting as long as ctx and WithWait allow (see Semaphore). Asking
// for more than the size (the stored one, or the declared one when none is stored) fails with
// an error wrapping ErrInvalid, as does a wait for more than a resize leaves. A wait that ends
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
	if n < 1 || n > MaxSemaphoreSize {
		return nil, fmt.Errorf("%w: semaphore %q: %d permits asked for: want 1 to the size", ErrInvalid, s.h.name, n)
	}
	spec := s.h.spec(protocol.SharedPermits, n, s.size)
	if o := s.h.e.obs; o != nil {
		return o.lockShared(ctx, s.h.e, spec, wait)
	}
	return s.h.e.acquireShared(ctx, spec, wait)
}

// Permits returns how many permits of a semaphore the lease holds: 0 for a lock's lease.
func (l *Lease) Permits() int {
	if l == nil || l.st.spec.shared == nil || l.st.spec.shared.Kind != protocol.SharedPermits {
		return 0
	}
	return l.st.spec.shared.Units
}

// DoAcquire takes n permits of the semaphore called name, declared of size permits (the size
// it is created with when the server stores none: see Semaphore), waiting as Acquire does;
// runs fn with a context that is cancelled when ctx is or when the lease is lost (cause
// ErrLost), and releases them when fn returns or panics; as Do does, with the same outcomes.
func (c *Client) DoAcquire(ctx context.Context, name string, size, n int, fn func(ctx context.Context) error, opts ...Option) error {
	return doUnder(ctx, fn, func(ctx context.Context) (*Lease, error) { return c.Semaphore(name, size, opts...).Acquire(ctx, n) })
}

// SemaphoreResize is what Client.ResizeSemaphore or Client.ResetSemaphoreSize found and left.
type SemaphoreResize struct {
	Old       int  // the size stored before: 0 when none was
	OldSticky bool // the size before had been set by a resize
	Size      int  // the size stored now: 0 when none is (a reset of a semaphore nobody holds)
	Sticky    bool // the size now is sticky (set by ResizeSemaphore)
	Permits   int  // permits held now
	Holders   int  // holders now
}

// ResizeSemaphore stores size as the size of the semaphore called name, sticky: every handle
// uses it from now on, whatever size it declares, and it stays, held or idle, until the next
// resize or a ResetSemaphoreSize. It applies at once: growing the semaphore grants the permits
// now free to the callers waiting, in order; shrinking it takes nothing from the holders (they
// keep their permits until they release them), and no permit is granted until the held ones
// fit in the new size. A caller waiting for more permits than the new size fails with
// ErrInvalid. A name nobody holds yet gets the size all the same (Old is then 0).
func (c *Client) ResizeSemaphore(ctx context.Context, name string, size int) (SemaphoreResize, error) {
	if size < 1 || size > MaxSemaphoreSize {
		return SemaphoreResize{}, fmt.Errorf("%w: semaphore %q: size %d is not between 1 and %d", ErrInvalid, name, size, MaxSemaphoreSize)
	}
	return c.resizeSemaphore(ctx, name, size)
}

// ResetSemaphoreSize makes the sticky size of the semaphore called name (set by
// ResizeSemaphore) an ordinary one, so that an idle semaphore costs the server nothing again:
// when nobody holds or waits for it, the size goes at once (the next Acquire stores its
// declared size); otherwise it lasts while the semaphore is held or waited for and for the
// token retention after, as a size stored by use does. A size that is not sticky is left as it
// is (the result's Old and Size are both that size).
func (c *Client) ResetSemaphoreSize(ctx context.Context, name string) (SemaphoreResize, error) {
	return c.resizeSemaphore(ctx, name, 0)
}

// resizeSemaphore runs shared.lua's resize (size > 0) or reset (size 0).
func (c *Client) resizeSemaphore(ctx context.Context, name string, size int) (SemaphoreResize, error) {
	if err := c.checkAdmin(name); err != nil {
		return SemaphoreResize{}, err
	}
	if !c.e.traits.Shared {
		return SemaphoreResize{}, fmt.Errorf("%w: semaphore %q: not available in quorum mode", ErrInvalid, name)
	}
	what := "resize semaphore"
	if size == 0 {
		what = "reset the size of semaphore"
	}
	key := c.lockKey(name) + semSuffix
	reply, err := c.e.b.EvalAny(ctx, protocol.ScriptShared, protocol.SharedKeys(key),
		protocol.SharedResizeArgs(size, protocol.Millis(c.opts.retention), protocol.ReleaseChannel(key), c.e.traits.Sharded)...)
	if err != nil {
		return SemaphoreResize{}, c.e.redisErr(what+" "+strconv.Quote(name), err)
	}
	arr, _ := reply.([]any)
	var n [6]int64
	for i := range n {
		ok := len(arr) == len(n)
		if ok {
			n[i], ok = arr[i].(int64)
		}
		if !ok {
			return SemaphoreResize{}, c.badReply(what, name, reply)
		}
	}
	return SemaphoreResize{Old: int(n[0]), OldSticky: n[3] == 1, Size: int(n[4]), Sticky: n[5] == 1,
		Permits: int(n[1]), Holders: int(n[2])}, nil
}
