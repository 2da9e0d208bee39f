package dlock

import "errors"

var (
	// ErrNotAcquired is returned by TryLock when another owner holds the lock.
	ErrNotAcquired = errors.New("dlock: not acquired: held by another owner")
	// ErrNotHeld is returned when an operation needs a lock the caller does not hold: a second
	// Unlock, an Unlock, Extend or TTL on a lease that has ended, or a nil lease.
	ErrNotHeld = errors.New("dlock: not held")
	// ErrLost is the cause of a lease context's cancellation when the lock may have passed to
	// someone else: a renewal was refused (the key expired or was taken over), or no renewal
	// succeeded before the lease could have expired on the server.
	ErrLost = errors.New("dlock: lock lost")
	// ErrClosed is returned by every call on a closed Client, and is the cause of the lease
	// contexts that Close ended.
	ErrClosed = errors.New("dlock: client closed")
	// ErrReplicaAck is wrapped by the error of an acquisition that fewer replicas than
	// WithReplicaAck asks for acknowledged in time; the lock was released again.
	ErrReplicaAck = errors.New("dlock: not acknowledged by enough replicas")
	// ErrOutOfMemory is wrapped by the error of an acquisition that a Redis server refused
	// because its memory is full (maxmemory reached under the noeviction policy). Releases and
	// renewals still work on such a server.
	ErrOutOfMemory = errors.New("dlock: server out of memory")
	// ErrInvalid wraps every error about bad input: an empty or oversized name, a TTL below the
	// minimum, a bad option or URL.
	ErrInvalid = errors.New("dlock: invalid argument")
)
