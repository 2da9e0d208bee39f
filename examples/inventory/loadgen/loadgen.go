// Package loadgen sends a bounded number of purchases to inventory replicas, round-robin, and
// tallies the answers.
package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Config bounds one run.
type Config struct {
	Targets     []string      // replica base URLs, e.g. http://127.0.0.1:8081
	SKU         string        // what to buy
	Qty         int           // per purchase (default 1)
	N           int           // purchases in all
	Concurrency int           // purchases in flight at once
	Timeout     time.Duration // per request (default 30s)
	Deadline    time.Duration // whole run; requests not started by then are not sent (default 5m)
}

// Sale is one 200 answer.
type Sale struct {
	Target  int    // index in Config.Targets
	QtyLeft int    `json:"qty_left"`
	Token   uint64 `json:"token"`
}

// Result tallies a run.
type Result struct {
	Sent     int            // requests sent
	ByStatus map[int]int    // HTTP status → count; 0 counts transport errors
	ByReason map[string]int // "status reason" → count, for non-200 answers
	Sales    []Sale         // every 200 answer
	Errors   []string       // up to 10 transport errors
	Elapsed  time.Duration
}

func (r *Result) String() string {
	codes := make([]int, 0, len(r.ByStatus))
	for c := range r.ByStatus {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	var b strings.Builder
	fmt.Fprintf(&b, "%d purchases in %v (%.0f/s):", r.Sent, r.Elapsed.Round(time.Millisecond), float64(r.Sent)/r.Elapsed.Seconds())
	for _, c := range codes {
		fmt.Fprintf(&b, " %d×%d", r.ByStatus[c], c)
	}
	reasons := make([]string, 0, len(r.ByReason))
	for k := range r.ByReason {
		reasons = append(reasons, k)
	}
	sort.Strings(reasons)
	for _, k := range reasons {
		fmt.Fprintf(&b, "\n  %-24s %d", k, r.ByReason[k])
	}
	for _, e := range r.Errors {
		fmt.Fprintf(&b, "\n  transport error: %s", e)
	}
	return b.String()
}

// Run sends cfg.N purchases, cfg.Concurrency at a time, to the targets in turn, and returns when
// all have been answered, or ctx or cfg.Deadline ends (requests in flight are then abandoned).
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if len(cfg.Targets) == 0 || cfg.N < 1 || cfg.Concurrency < 1 || cfg.SKU == "" {
		return nil, fmt.Errorf("loadgen: need targets, a sku, N >= 1 and concurrency >= 1")
	}
	if cfg.Qty < 1 {
		cfg.Qty = 1
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.Deadline <= 0 {
		cfg.Deadline = 5 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Deadline)
	defer cancel()
	tr := &http.Transport{MaxIdleConnsPerHost: cfg.Concurrency, MaxConnsPerHost: cfg.Concurrency}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: cfg.Timeout}

	res := &Result{ByStatus: map[int]int{}, ByReason: map[string]int{}}
	var mu sync.Mutex
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= cfg.N {
					return
				}
				t := i % len(cfg.Targets)
				status, reason, sale, err := buy(ctx, hc, cfg.Targets[t], cfg.SKU, cfg.Qty)
				mu.Lock()
				res.Sent++
				res.ByStatus[status]++
				switch {
				case err != nil:
					if len(res.Errors) < 10 {
						res.Errors = append(res.Errors, err.Error())
					}
				case status == http.StatusOK:
					sale.Target = t
					res.Sales = append(res.Sales, sale)
				default:
					res.ByReason[fmt.Sprintf("%d %s", status, reason)]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	return res, ctx.Err()
}

func buy(ctx context.Context, hc *http.Client, target, sku string, qty int) (status int, reason string, sale Sale, err error) {
	u := strings.TrimRight(target, "/") + "/buy?sku=" + url.QueryEscape(sku) + fmt.Sprintf("&qty=%d", qty)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return 0, "", sale, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", sale, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return 0, "", sale, err
	}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, &sale); err != nil {
			return 0, "", sale, fmt.Errorf("200 with bad body %q: %w", body, err)
		}
		return resp.StatusCode, "", sale, nil
	}
	var e struct {
		Reason string `json:"reason"`
	}
	json.Unmarshal(body, &e)
	return resp.StatusCode, e.Reason, sale, nil
}
