package dlock_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/dlock-go/dlock"
)

// Many readers hold a read-write lock at once; a writer holds it alone, and its token is larger
// than every earlier reader's and writer's.
func ExampleClient_RWMutex() {
	ctx := context.Background()
	c, err := dlock.Dial(ctx, exampleURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	rw := c.RWMutex("catalog")
	r1, _ := rw.RLock(ctx)
	r2, err := rw.RLock(ctx) // a second reader, at once
	fmt.Println("two readers:", err == nil)
	_, err = rw.TryLock(ctx) // a writer must wait for them
	fmt.Println("writer refused:", errors.Is(err, dlock.ErrNotAcquired))
	r1.Unlock(ctx)
	r2.Unlock(ctx)

	w, _ := rw.Lock(ctx)
	fmt.Println("writer's token above the readers':", w.Token() > r1.Token())
	w.Unlock(ctx)
	// Output:
	// two readers: true
	// writer refused: true
	// writer's token above the readers': true
}

// At most 3 exports run at once, across every process that uses the semaphore "exports".
func ExampleClient_Semaphore() {
	ctx := context.Background()
	c, err := dlock.Dial(ctx, exampleURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	s := c.Semaphore("exports", 3)
	l, err := s.Acquire(ctx, 2) // two of the three permits
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = s.TryAcquire(ctx, 2) // only one is left
	fmt.Println("refused:", errors.Is(err, dlock.ErrNotAcquired))
	l.Unlock(ctx)

	err = c.DoAcquire(ctx, "exports", 3, 1, func(ctx context.Context) error {
		fmt.Println("exporting under one permit")
		return nil
	})
	fmt.Println("done:", err)
	// Output:
	// refused: true
	// exporting under one permit
	// done: <nil>
}
