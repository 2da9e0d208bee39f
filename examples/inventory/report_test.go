//go:build linux

package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// GET /report runs under the "report" semaphore: across three replicas, never more reports at
// once than --report-slots, each with a token of its own; with every slot taken a report waits
// --lock-wait and answers 503 report_busy, and gets its slot once one is free.
func TestReportSemaphore(t *testing.T) {
	const slots, reports = 2, 9
	redisURL := startRedis(t)
	db := filepath.Join(t.TempDir(), "report.db")
	var rs []*replica
	for i := range 3 {
		rs = append(rs, startReplica(t, fmt.Sprintf("r%d", i), redisURL, db, "--report-slots", fmt.Sprint(slots),
			"--work", "150ms", "--lock-wait", "10s", "--seed-stock", "apple=5", "--seed-stock", "pear=7"))
	}
	var mu sync.Mutex
	var bodies []ReportBody
	var wg sync.WaitGroup
	for i := range reports {
		wg.Go(func() {
			var b ReportBody
			code, err := callErr("GET", rs[i%len(rs)].URL+"/report", &b)
			if err != nil || code != 200 {
				t.Errorf("report %d: %d, %v", i, code, err)
				return
			}
			mu.Lock()
			bodies = append(bodies, b)
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(bodies) != reports {
		t.Fatalf("%d reports answered, want %d", len(bodies), reports)
	}
	want := []StockRow{{SKU: "apple", Qty: 5}, {SKU: "pear", Qty: 7}}
	type edge struct {
		at   time.Time
		open int
	}
	var edges []edge
	var tokens []uint64
	for _, b := range bodies {
		if !slices.Equal(b.Stock, want) {
			t.Errorf("report %+v, want %+v", b.Stock, want)
		}
		edges = append(edges, edge{b.SlotFrom, 1}, edge{b.SlotUntil, -1})
		tokens = append(tokens, b.Token)
	}
	sort.Slice(edges, func(i, j int) bool {
		if !edges[i].at.Equal(edges[j].at) {
			return edges[i].at.Before(edges[j].at)
		}
		return edges[i].open > edges[j].open // touching intervals count as overlapping
	})
	open, most := 0, 0
	for _, e := range edges {
		open += e.open
		most = max(most, open)
	}
	t.Logf("%d reports over %d replicas, at most %d at once (slots %d)", reports, len(rs), most, slots)
	if most > slots {
		t.Errorf("%d reports ran at once, want at most %d", most, slots)
	}
	if most < 2 {
		t.Errorf("reports never ran together (at most %d at once): the semaphore admitted one at a time", most)
	}
	slices.Sort(tokens)
	if len(slices.Compact(slices.Clone(tokens))) != len(tokens) {
		t.Errorf("report tokens repeat: %v", tokens)
	}

	// Every slot taken from outside: a report waits its --lock-wait, then 503 report_busy.
	busy := startReplica(t, "busy", redisURL, db, "--report-slots", fmt.Sprint(slots), "--lock-wait", "200ms")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := dlock.Dial(ctx, redisURL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Semaphore("report", slots).Acquire(ctx, slots)
	if err != nil {
		t.Fatal(err)
	}
	var e errorBody
	if code := call(t, "GET", busy.URL+"/report", &e); code != 503 || e.Reason != "report_busy" {
		t.Errorf("report with every slot held: %d %+v, want 503 report_busy", code, e)
	}
	if s := busy.stats(t); s.ReportBusy != 1 {
		t.Errorf("report_busy = %d, want 1", s.ReportBusy)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var b ReportBody
	if code := call(t, "GET", busy.URL+"/report", &b); code != 200 || b.Token <= slices.Max(tokens) {
		t.Errorf("report once the slots are free: %d, token %d; want 200 with a token above %d", code, b.Token, slices.Max(tokens))
	}
}
