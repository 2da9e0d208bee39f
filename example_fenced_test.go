package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/dlock-go/dlock"
)

// The stock deduction: the stock lives in Redis, and a buyer reads it, decrements it and writes
// it back under the lock. The fenced read and write make the server refuse a buyer whose lease
// was lost (paused past it) once a newer holder has used the stock.
func ExampleClient_FencedGet() {
	ctx := context.Background()
	c, err := dlock.Dial(ctx, exampleURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	const stock = "stock:{sku-7}" // the application's own key

	var first uint64
	c.Do(ctx, "stock:sku-7", func(ctx context.Context) error { // stock up
		first, _ = dlock.TokenFromContext(ctx)
		return c.FencedSet(ctx, stock, "10", first, 0) // ttl 0: no expiry
	})

	buy := func(ctx context.Context) error {
		token, _ := dlock.TokenFromContext(ctx)
		v, _, err := c.FencedGet(ctx, stock, token) // claims the stock for this token
		if err != nil {
			return err // errors.Is(err, dlock.ErrStale): a newer holder has used it
		}
		n, _ := strconv.Atoi(v)
		if n <= 0 {
			return errors.New("sold out")
		}
		return c.FencedSet(ctx, stock, strconv.Itoa(n-1), token, 0)
	}
	fmt.Println("sold:", c.Do(ctx, "stock:sku-7", buy))

	// The first holder, late, with its older token: refused, and the stock stays as it is.
	_, err = c.FencedIncrBy(ctx, stock, -1, first)
	fmt.Println("stale:", errors.Is(err, dlock.ErrStale))
	c.Do(ctx, "stock:sku-7", func(ctx context.Context) error {
		token, _ := dlock.TokenFromContext(ctx)
		v, _, err := c.FencedGet(ctx, stock, token)
		fmt.Println("stock:", v, err)
		return err
	})
	// Output:
	// sold: <nil>
	// stale: true
	// stock: 9 <nil>
}
