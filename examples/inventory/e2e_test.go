//go:build linux

package main

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock/examples/inventory/loadgen"
)

const (
	e2eStock       = 500
	e2ePurchases   = 5000
	e2eConcurrency = 64
	e2eReplicas    = 3
)

// TestE2E runs three replicas of the service against one redis-server and one database, and
// a bounded load of purchases against them round-robin: exactly the stock is sold, never more.
// The sigstop scenario freezes replicas while they hold the SKU's lock, past their lease.
func TestE2E(t *testing.T) {
	for _, kind := range []string{"sqlite", "postgres"} {
		t.Run(kind, func(t *testing.T) {
			newDB := func(t *testing.T, name string) string {
				if kind == "postgres" {
					return postgresURL(t, name)
				}
				return filepath.Join(t.TempDir(), name+".db")
			}
			t.Run("steady", func(t *testing.T) { steady(t, newDB(t, "steady")) })
			t.Run("sigstop", func(t *testing.T) { sigstop(t, newDB(t, "sigstop")) })
		})
	}
}

func startReplicas(t *testing.T, redisURL, db string, extra ...string) []*replica {
	rs := make([]*replica, e2eReplicas)
	for i := range rs {
		rs[i] = startReplica(t, fmt.Sprintf("r%d", i), redisURL, db, extra...)
	}
	return rs
}

func seed(t *testing.T, r *replica, sku string, qty int) {
	if code := call(t, "POST", fmt.Sprintf("%s/admin/seed?sku=%s&qty=%d", r.URL, sku, qty), nil); code != 200 {
		t.Fatalf("seed: %d", code)
	}
}

func runLoad(rs []*replica, sku string) (*loadgen.Result, error) {
	targets := make([]string, len(rs))
	for i, r := range rs {
		targets[i] = r.URL
	}
	res, err := loadgen.Run(context.Background(), loadgen.Config{
		Targets: targets, SKU: sku, N: e2ePurchases, Concurrency: e2eConcurrency,
		Timeout: 60 * time.Second, Deadline: 2 * time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("load: %w\n%v", err, res)
	}
	return res, nil
}

// checkSold asserts what must hold after any run: every purchase answered 200, 409 or 503;
// exactly the stock sold, each unit once (the qty_left values are initial-1 … 0, each once,
// and their tokens increase in the order of the sales); the row at zero; the replicas' own
// counts agree.
func checkSold(t *testing.T, rs []*replica, sku string, res *loadgen.Result) (sum StatsBody) {
	t.Helper()
	if res.Sent != e2ePurchases {
		t.Errorf("sent %d purchases, want %d", res.Sent, e2ePurchases)
	}
	for code, n := range res.ByStatus {
		if code != 200 && code != 409 && code != 503 {
			t.Errorf("%d answers with status %d (0 = transport error); want only 200, 409, 503", n, code)
		}
	}
	sales := append([]loadgen.Sale(nil), res.Sales...)
	sort.Slice(sales, func(i, j int) bool { return sales[i].QtyLeft > sales[j].QtyLeft })
	if len(sales) != e2eStock {
		t.Errorf("sold %d, want exactly the stock, %d (oversold by %d)", len(sales), e2eStock, len(sales)-e2eStock)
	}
	for i, s := range sales {
		if want := e2eStock - 1 - i; s.QtyLeft != want {
			t.Errorf("sale %d left %d, want %d: a unit sold twice or skipped", i, s.QtyLeft, want)
			break
		}
		if i > 0 && s.Token <= sales[i-1].Token {
			t.Errorf("sale leaving %d had token %d, not above the previous sale's %d", s.QtyLeft, s.Token, sales[i-1].Token)
			break
		}
	}
	var stock StockBody
	if code := call(t, "GET", rs[0].URL+"/stock/"+sku, &stock); code != 200 || stock.Qty != 0 {
		t.Errorf("stock after the run: %d %+v; want qty 0", code, stock)
	}
	for _, r := range rs {
		s := r.stats(t)
		t.Logf("%s: %+v", r.name, s)
		sum.Sold += s.Sold
		sum.SoldOut += s.SoldOut
		sum.LockTimeout += s.LockTimeout
		sum.LeaseLost += s.LeaseLost
		sum.FenceRejected += s.FenceRejected
		sum.Failed += s.Failed
	}
	if sum.Sold != e2eStock {
		t.Errorf("replicas report %d sold, want %d", sum.Sold, e2eStock)
	}
	return sum
}

func steady(t *testing.T, db string) {
	redisURL := startRedis(t)
	rs := startReplicas(t, redisURL, db, "--ttl", "2s", "--lock-wait", "2s")
	seed(t, rs[0], "widget", e2eStock)
	res, err := runLoad(rs, "widget")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("load: %v", res)
	sum := checkSold(t, rs, "widget", res)
	// The lock metrics add up with the answers: every purchase, and the seed, took the lock
	// or timed out waiting for it; nothing is held or waiting any more.
	var acquired, timedOut, held, waiting float64
	for _, r := range rs {
		m := r.metrics(t)
		for _, path := range []string{"server", "local"} {
			acquired += m[`dlock_acquire_wait_seconds_count{lock="sku",outcome="acquired",path="`+path+`"}`]
		}
		timedOut += m[`dlock_acquire_wait_seconds_count{lock="sku",outcome="timed_out",path="none"}`]
		held += m[`dlock_leases_held{lock="sku"}`]
		waiting += m[`dlock_waiters{lock="sku"}`]
		if m[`dlock_hold_seconds_count{lock="sku"}`] == 0 {
			t.Errorf("%s: no hold in dlock_hold_seconds", r.name)
		}
	}
	if int64(acquired) != int64(res.Sent)-sum.LockTimeout+1 || int64(timedOut) != sum.LockTimeout || held != 0 || waiting != 0 {
		t.Errorf("metrics: %v acquired, %v timed out, %v held, %v waiting; want %d acquired (purchases and the seed, less the %d lock timeouts), %d timed out, none held or waiting",
			acquired, timedOut, held, waiting, int64(res.Sent)-sum.LockTimeout+1, sum.LockTimeout, sum.LockTimeout)
	}
	t.Logf("FIGURES steady: sold %d of %d, oversold %d, 409 %d, 503 %d (lock timeouts %d), fence rejections %d",
		len(res.Sales), e2eStock, max(0, len(res.Sales)-e2eStock), res.ByStatus[409], res.ByStatus[503], sum.LockTimeout, sum.FenceRejected)
}

// sigstop runs the load with a 300 ms lease and freezes two replicas in turn for 1 s (SIGSTOP,
// then SIGCONT) while they hold the SKU's lock:
//
//   - r0 as it is: when it runs again, its lease context is already over, so it rolls back
//     without writing (counted as lease_lost);
//   - r1 with its transaction detached from the lease (as if the pause had hit after its last
//     check of the lease): it does try to write, and the fence makes the database refuse
//     (counted as fence_rejected).
func sigstop(t *testing.T, db string) {
	redisURL := startRedis(t)
	rs := startReplicas(t, redisURL, db, "--ttl", "300ms", "--lock-wait", "2s", "--fault-injection")
	seed(t, rs[0], "gadget", e2eStock)

	ctl := make(chan error, 1)
	go func() { ctl <- freezes(rs) }()
	res, err := runLoad(rs, "gadget")
	if cerr := <-ctl; cerr != nil {
		t.Error(cerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("load: %v", res)
	for _, r := range rs[:2] {
		t.Logf("%s %s", r.name, r.frozen)
	}
	sum := checkSold(t, rs, "gadget", res)
	if sum.LeaseLost < 1 {
		t.Errorf("no purchase aborted by its lost lease; the freeze of r0 should have caused one")
	}
	if sum.FenceRejected < 1 {
		t.Errorf("no stale write rejected by the fence; the freeze of r1 should have caused one")
	}
	// The leases lost while frozen show in the metrics: at least one per purchase aborted
	// for it (by a deadline that passed during the freeze, or a renewal refused after it).
	var lost float64
	for _, r := range rs {
		for series, v := range r.metrics(t) {
			if strings.HasPrefix(series, "dlock_leases_lost_total{") {
				lost += v
			}
		}
	}
	if int64(lost) < sum.LeaseLost {
		t.Errorf("dlock_leases_lost_total adds up to %v, want at least the %d purchases aborted by a lost lease", lost, sum.LeaseLost)
	}
	if n := rs[1].logCount("stale write rejected by the fence"); int64(n) != rs[1].stats(t).FenceRejected {
		t.Errorf("r1 logged %d fence rejections, counted %d", n, rs[1].stats(t).FenceRejected)
	}
	t.Logf("FIGURES sigstop: sold %d of %d, oversold %d, 409 %d, 503 %d (lock timeouts %d, lease lost %d, fence rejections %d)",
		len(res.Sales), e2eStock, max(0, len(res.Sales)-e2eStock), res.ByStatus[409], res.ByStatus[503],
		sum.LockTimeout, sum.LeaseLost, sum.FenceRejected)
}

// freezes waits for the first 10 sales, then freezes r0 and r1 in turn while each holds the lock.
// It runs beside the load, so it reports errors instead of failing the test itself.
func freezes(rs []*replica) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var stock StockBody
		if code, err := callErr("GET", rs[2].URL+"/stock/gadget", &stock); err == nil && code == 200 && stock.Qty <= e2eStock-10 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no 10 sales within 30 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, f := range []struct {
		r      *replica
		detach bool
		count  func(StatsBody) int64
	}{
		{rs[0], false, func(s StatsBody) int64 { return s.LeaseLost }},
		{rs[1], true, func(s StatsBody) int64 { return s.FenceRejected }},
	} {
		if err := freezeWhileHolding(f.r, f.detach, f.count); err != nil {
			return err
		}
	}
	return nil
}

// freezeWhileHolding arms a 300 ms hold on r's next purchase, SIGSTOPs r for 1 s once that
// purchase holds the lock, resumes it, and waits for count to go up.
func freezeWhileHolding(r *replica, detach bool, count func(StatsBody) int64) error {
	s, err := r.statsErr()
	if err != nil {
		return err
	}
	before := count(s)
	d := 0
	if detach {
		d = 1
	}
	if code, err := callErr("POST", fmt.Sprintf("%s/admin/fault?hold=300ms&detach=%d", r.URL, d), nil); err != nil || code != 200 {
		return fmt.Errorf("arm fault on %s: %d %v", r.name, code, err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, err := r.statsErr()
		if err != nil {
			return err
		}
		if s.InFault > 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s never held the lock with the armed fault", r.name)
		}
		time.Sleep(time.Millisecond)
	}
	if err := r.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	time.Sleep(time.Second) // > the 300 ms lease: another replica takes the lock meanwhile
	if err := r.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	for {
		s, err := r.statsErr()
		if err != nil {
			return err
		}
		if count(s) > before {
			var stock StockBody
			callErr("GET", r.URL+"/stock/gadget", &stock)
			r.frozen = fmt.Sprintf("frozen 1 s while holding the lock (detach=%v): counter %d → %d; stock then %d",
				detach, before, count(s), stock.Qty)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: frozen while holding the lock, but its counter did not move", r.name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
