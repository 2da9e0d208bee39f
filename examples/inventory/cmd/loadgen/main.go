// Command loadgen sends a bounded number of purchases to inventory replicas, round-robin, and
// prints the answers by status.
//
//	go run ./cmd/loadgen -targets http://127.0.0.1:8081,http://127.0.0.1:8082,http://127.0.0.1:8083 \
//		-sku widget -n 5000 -c 64
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/dlock-go/dlock/examples/inventory/loadgen"
)

func main() {
	targets := flag.String("targets", "http://127.0.0.1:8081,http://127.0.0.1:8082,http://127.0.0.1:8083", "comma-separated replica URLs")
	sku := flag.String("sku", "widget", "SKU to buy")
	qty := flag.Int("qty", 1, "items per purchase")
	n := flag.Int("n", 5000, "purchases in all")
	c := flag.Int("c", 64, "purchases in flight at once")
	timeout := flag.Duration("timeout", 30*time.Second, "per request")
	deadline := flag.Duration("deadline", 5*time.Minute, "whole run")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := loadgen.Run(ctx, loadgen.Config{
		Targets: strings.Split(*targets, ","), SKU: *sku, Qty: *qty,
		N: *n, Concurrency: *c, Timeout: *timeout, Deadline: *deadline,
	})
	if res != nil {
		fmt.Println(res)
		if len(res.Sales) > 0 {
			low := res.Sales[0].QtyLeft
			for _, s := range res.Sales {
				low = min(low, s.QtyLeft)
			}
			fmt.Printf("sold %d; lowest qty_left seen %d\n", len(res.Sales)*(*qty), low)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}
