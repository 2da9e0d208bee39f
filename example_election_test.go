package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
)

// Two replicas campaign to run the scheduler; the first leads, the second takes over when the
// first resigns, with a larger term.
func ExampleElection_Campaign() {
	ctx := context.Background()
	a, err := dlock.Dial(ctx, exampleURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()
	b, err := dlock.Dial(ctx, exampleURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()

	first, err := a.Election("example:scheduler").Campaign(ctx, "replica-a")
	if err != nil {
		fmt.Println(err)
		return
	}
	info, _ := b.Election("example:scheduler").Leader(ctx)
	fmt.Println("leader:", info.Value)

	next := make(chan *dlock.Leadership)
	go func() {
		ld, err := b.Election("example:scheduler").Campaign(ctx, "replica-b") // waits, queued
		if err != nil {
			fmt.Println(err)
		}
		next <- ld
	}()
	for range 5000 { // until replica-b is queued, at most 5 s (a real service does not need this)
		if in, err := a.Inspect(ctx, "example:scheduler"); err != nil || in.Waiters == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	first.Resign(ctx)
	second := <-next
	defer second.Resign(ctx)
	info, _ = a.Election("example:scheduler").Leader(ctx)
	fmt.Println("leader:", info.Value, "term grew:", second.Term() > first.Term())
	// Output:
	// leader: replica-a
	// leader: replica-b term grew: true
}

// RunElected is the loop of a singleton worker: it runs the function while leading and
// campaigns again when the function returns or leadership is lost.
func ExampleClient_RunElected() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dlock.Dial(ctx, exampleURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	runs := 0
	err = c.RunElected(ctx, "example:outbox-relay", "replica-a", func(ctx context.Context) error {
		term, _ := dlock.TokenFromContext(ctx) // fence the relay's writes with the term
		runs++
		if runs == 3 {
			return errors.New("relay stopped") // a real error ends the loop
		}
		_ = term
		return nil // done for now: resign, campaign again
	})
	fmt.Println(runs, "terms;", err)
	// Output:
	// 3 terms; relay stopped
}
