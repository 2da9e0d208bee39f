package dlock_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
)

// A transfer holds both balances, taken together in whatever order they are named; each
// balance is written with its own name's fencing token.
func ExampleMultiMutex_Lock() {
	ctx := context.Background()
	c, err := dlock.Dial(ctx, exampleURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	l, err := c.MultiMutex([]string{"balance:bob", "balance:alice"}).Lock(ctx)
	if err != nil {
		fmt.Println(err) // holds neither
		return
	}
	defer l.Unlock(ctx) // releases both

	tokens := l.Tokens()
	fmt.Println("one token per name:", len(tokens), tokens["balance:alice"] > 0, tokens["balance:bob"] > 0)

	// A plain Mutex of either name is refused while the transfer holds it.
	_, err = c.Mutex("balance:alice").TryLock(ctx)
	fmt.Println(err != nil)
	// Output:
	// one token per name: 2 true true
	// true
}

// Five workers each count down when their share of a batch is done; the coordinator waits,
// woken by the last count-down.
func ExampleLatch_Wait() {
	ctx := context.Background()
	c, err := dlock.Dial(ctx, exampleURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	batch := fmt.Sprintf("batch-%d", time.Now().UnixNano()) // a fresh latch per run of the example
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Go(func() {
			// ... the worker's share of the batch ...
			if err := c.Latch(batch, 5, dlock.WithTTL(10*time.Minute)).CountDownAs(ctx, fmt.Sprint("worker-", i)); err != nil {
				fmt.Println(err)
			}
		})
	}
	err = c.Latch(batch, 5, dlock.WithTTL(10*time.Minute)).Wait(ctx)
	fmt.Println("batch done:", err)
	wg.Wait()
	// Output:
	// batch done: <nil>
}
