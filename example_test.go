package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
)

// exampleURL is the tests' private server (set in TestMain); yours is e.g.
// "redis://127.0.0.1:6379/0".
var exampleURL = "redis://127.0.0.1:6379/0"

// Do takes the lock, runs the function with a context that ends if the lock is lost, and
// releases the lock.
func ExampleClient_Do() {
	ctx := context.Background()
	c, err := dlock.Dial(ctx, exampleURL) // e.g. "redis://127.0.0.1:6379/0"
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	err = c.Do(ctx, "orders:42", func(ctx context.Context) error {
		// Work here while ctx is live; errors.Is(context.Cause(ctx), dlock.ErrLost) if the lock was lost.
		fmt.Println("charging the card for order 42")
		return nil
	}, dlock.WithWait(2*time.Second)) // wait at most 2 s for the lock; then errors.Is(err, dlock.ErrNotAcquired)
	fmt.Println("done:", err)
	// Output:
	// charging the card for order 42
	// done: <nil>
}

// A Lease carries a fencing token for the protected resource to check.
func ExampleMutex_Lock() {
	ctx := context.Background()
	c, err := dlock.Dial(ctx, exampleURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	m := c.Mutex("stock:sku-7")
	l, err := m.Lock(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Unlock(ctx)

	// Pass l.Token() with every write; the resource refuses tokens smaller than the largest
	// it has seen, so a holder that was paused past its lease cannot overwrite newer data.
	fmt.Println("token > 0:", l.Token() > 0)

	// Someone else trying now is refused at once.
	_, err = m.TryLock(ctx)
	fmt.Println(err != nil)
	// Output:
	// token > 0: true
	// true
}

// A lock is re-entered through its lease's context. A context without the lease waits for the
// lock like any other caller, even in the goroutine that holds it; a TryLock (or a wait that
// ends) then says that the holder is this client.
func ExampleMutex_Lock_reentry() {
	ctx := context.Background()
	c, err := dlock.Dial(ctx, exampleURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	m := c.Mutex("report:nightly")
	l, err := m.Lock(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Unlock(ctx)

	inner, err := m.Lock(l.Context()) // re-enters: same token, one more hold
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("same token:", inner.Token() == l.Token())
	inner.Unlock(ctx) // l still holds the lock

	_, err = m.TryLock(ctx) // ctx does not carry the lease
	var na *dlock.NotAcquiredError
	fmt.Println("held by this client:", errors.As(err, &na) && na.Mine)
	// Output:
	// same token: true
	// held by this client: true
}
