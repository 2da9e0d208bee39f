package fence

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
)

// Lease is what InTx needs of a lock's lease. A *dlock.Lease has both methods; inside
// dlock's Do, use Held(lctx, token).
type Lease interface {
	// Token is the lease's fencing token.
	Token() uint64
	// Context is cancelled when the lease ends; its Err also reports a lease past its
	// deadline.
	Context() context.Context
}

type held struct {
	ctx   context.Context
	token uint64
}

func (h held) Token() uint64            { return h.token }
func (h held) Context() context.Context { return h.ctx }

// Held makes a Lease of a lease's context and token, as dlock's Do hands them to its function
// (token from dlock.TokenFromContext(lctx)).
func Held(ctx context.Context, token uint64) Lease { return held{ctx, token} }

// InTx runs fn in a transaction of db that lives inside the lease: the transaction's context
// is the lease's context (also cancelled when ctx is), so a lease that ends rolls it back.
// Before fn it claims the rows of t with the given keys under the lease's token, in sorted
// order and each once, so that two InTx calls on overlapping keys cannot deadlock each other.
// It commits when fn returns nil and the lease is still live just before COMMIT, and rolls
// back otherwise.
//
// A claim refused because a newer token holds a row returns a *StaleError (ErrStale); a
// missing row, ErrNoRow; a lease that ended, an error matching ErrLeaseEnded and the lease
// context's cause (dlock.ErrLost for a lost lock). fn's error is returned as is (wrapped with
// the cause when the lease ended under it).
//
// The lease can still end between the last check and COMMIT. Then the commit goes through,
// and that is safe: the rows stay locked by this transaction until it ends, so a newer holder's
// claim of them waits for the commit (PostgreSQL: without limit unless lock_timeout is set;
// MySQL: up to innodb_lock_wait_timeout, 50 s by default, then error 1205; SQLite: up to the
// connection's busy timeout, then SQLITE_BUSY) and then builds on what this transaction
// wrote. An older holder's write can land before a newer holder's claim, never after it.
func InTx[K cmp.Ordered](ctx context.Context, db *sql.DB, lease Lease, t Table, keys []K, fn func(ctx context.Context, tx *sql.Tx) error) error {
	token := lease.Token()
	if _, err := t.statements(); err != nil {
		return err
	}
	if _, err := tokenArg(token); err != nil {
		return err
	}
	lctx := lease.Context()
	if err := live(ctx, lctx); err != nil {
		return fmt.Errorf("fence: %w before the transaction: %w", ErrLeaseEnded, err)
	}
	txCtx, cancel := context.WithCancelCause(lctx)
	defer cancel(nil)
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	defer stop()

	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)

	tx, err := db.BeginTx(txCtx, nil)
	if err != nil {
		return ended(fmt.Errorf("fence: begin: %w", err), ctx, lctx)
	}
	for _, k := range sorted {
		if err := t.Claim(txCtx, tx, k, token); err != nil {
			tx.Rollback()
			return ended(err, ctx, lctx)
		}
	}
	if err := fn(txCtx, tx); err != nil {
		tx.Rollback()
		return ended(err, ctx, lctx)
	}
	if err := live(ctx, lctx); err != nil {
		tx.Rollback()
		return fmt.Errorf("fence: %w before COMMIT, rolled back: %w", ErrLeaseEnded, err)
	}
	if err := tx.Commit(); err != nil {
		return ended(fmt.Errorf("fence: commit: %w", err), ctx, lctx)
	}
	return nil
}

// live returns the cause of the first of ctx and the lease's context to have ended, or nil.
// Checking the lease's context itself (not a context derived from it) lets its Err see a
// lease past its deadline before its Done closes.
func live(ctx, lctx context.Context) error {
	if lctx.Err() != nil {
		return context.Cause(lctx)
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return nil
}

// ended adds the lease's end to err when the lease (or ctx) ended under it.
func ended(err error, ctx, lctx context.Context) error {
	var stale *StaleError
	if errors.As(err, &stale) {
		return err
	}
	if cause := live(ctx, lctx); cause != nil {
		return fmt.Errorf("%w (%w: %w)", err, ErrLeaseEnded, cause)
	}
	return err
}
