package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
)

// Scenario 9: transfers between accounts, each under the locks of its two balances. dlock's
// MultiMutex (one script takes both names, one releases them) beside what a careful
// user writes without it: nested Do in sorted name order (two acquisitions and two releases,
// the first name held while waiting for the second). Both on dlock (rueidis), two Clients,
// the goroutines split between them.

// transferShapes are the measurements of scenario 9: accounts, goroutines.
var transferShapes = []struct{ accounts, goroutines int }{{64, 1}, {1024, 16}, {64, 16}, {4, 16}}

// transferResult is one measurement.
type transferResult struct {
	transfers int64
	elapsed   time.Duration
	overlaps  int64         // an account held by two transfers at once
	drift     int64         // the total of the balances minus what it started as
	scripts   int64         // scripts the server ran while measuring (EVALSHA and EVAL calls)
	cpu       time.Duration // the server's CPU time while measuring
	err       error
}

func (r transferResult) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.transfers) / r.elapsed.Seconds()
}

// runTransfers measures transfers/s for one shape, with the multi-lock or nested Do.
func runTransfers(srv *server, cfg config, multi bool, accounts, goroutines int) transferResult {
	srv.flush()
	ctx, cancel := context.WithTimeout(context.Background(), cfg.transfersDuration+time.Minute)
	defer cancel()
	var clients []*dlock.Client
	for range 2 {
		c, err := dlock.Dial(ctx, "redis://"+srv.Addr+"/0")
		if err != nil {
			return transferResult{err: err}
		}
		defer c.Close()
		clients = append(clients, c)
	}
	names := make([]string, accounts)
	balance := make([]int64, accounts)
	inside := make([]atomic.Int32, accounts)
	for i := range names {
		names[i] = fmt.Sprintf("transfer:acct:%d", i)
		balance[i] = 1000
	}
	var res transferResult
	var count, overlaps atomic.Int64
	var measuring atomic.Bool
	var firstErr error
	var errOnce sync.Once
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range goroutines {
		c := clients[g%len(clients)]
		rng := rand.New(rand.NewPCG(uint64(g), 8))
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := rng.IntN(accounts)
				j := (i + 1 + rng.IntN(accounts-1)) % accounts
				work := func(context.Context) error {
					for _, k := range []int{i, j} {
						if inside[k].Add(1) != 1 {
							overlaps.Add(1)
						}
					}
					amount := rng.Int64N(10)
					balance[i] -= amount
					balance[j] += amount
					for _, k := range []int{i, j} {
						inside[k].Add(-1)
					}
					return nil
				}
				var err error
				if multi {
					err = c.DoMulti(ctx, []string{names[i], names[j]}, work)
				} else {
					first, second := names[i], names[j]
					if second < first {
						first, second = second, first
					}
					err = c.Do(ctx, first, func(ctx context.Context) error {
						return c.Do(ctx, second, work)
					})
				}
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				if measuring.Load() {
					count.Add(1)
				}
			}
		})
	}
	time.Sleep(cfg.warmUp)
	scripts, cpu := srv.scriptCalls(), srv.cpu()
	start := time.Now()
	measuring.Store(true)
	time.Sleep(cfg.transfersDuration)
	measuring.Store(false)
	res.elapsed = time.Since(start)
	res.scripts, res.cpu = srv.scriptCalls()-scripts, srv.cpu()-cpu
	close(stop)
	wg.Wait()
	res.transfers, res.overlaps, res.err = count.Load(), overlaps.Load(), firstErr
	var total int64
	for _, b := range balance {
		total += b
	}
	res.drift = total - int64(1000*accounts)
	return res
}

// scriptCalls returns how many scripts the server has run (INFO commandstats: EVALSHA, EVAL).
func (s *server) scriptCalls() int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := s.admin.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:calls=")
		if !ok {
			rest, ok = strings.CutPrefix(strings.TrimSpace(line), "cmdstat_eval:calls=")
		}
		if ok {
			v, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
			n += v
		}
	}
	return n
}

// measureTransfers runs scenario 9 and returns its markdown; ok is false when a transfer failed
// or two transfers overlapped on an account.
func measureTransfers(srv *server, cfg config) (string, bool) {
	var b strings.Builder
	ok := true
	b.WriteString("### 9. Transfers: a multi-lock beside nested Do\n\n")
	fmt.Fprintf(&b, "Each transfer moves an amount between two random accounts (balances in the bench's memory) "+
		"while holding the locks of both, for %v per measurement after %v of warm-up; the goroutines share "+
		"two dlock Clients (rueidis). **multi-lock**: `Client.DoMulti(ctx, {from, to}, fn)`, one script to take "+
		"both names, one script to release them. **nested Do**: `Do(first, Do(second, fn))` with the names in "+
		"sorted order (the order a user must pick by hand to avoid deadlock): two acquisitions and two "+
		"releases, the first name held while the second is awaited. Every run checks that no account was held "+
		"by two transfers at once and that the balances' total is unchanged. Scripts per transfer: the server's "+
		"script calls while measuring (`INFO commandstats`) divided by the transfers, and the server's CPU time "+
		"(`INFO cpu`) per transfer: figures the machine's load moves much less than transfers/s.\n\n", cfg.transfersDuration, cfg.warmUp)
	b.WriteString("| accounts | goroutines | multi-lock transfers/s | nested Do transfers/s | multi ÷ nested | scripts per transfer, multi / nested | Redis CPU µs per transfer, multi / nested | exclusion, total |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---|\n")
	stopDog := watchdog("scenario 9", time.Duration(cfg.reps*len(transferShapes)*2)*(cfg.transfersDuration+cfg.warmUp+time.Minute))
	defer stopDog()
	var ratios []float64
	for _, sh := range transferShapes {
		rates, scripts, cpus := map[bool][]float64{}, map[bool][]float64{}, map[bool][]float64{}
		check := "ok"
		for range cfg.reps {
			for _, multi := range []bool{true, false} {
				r := runTransfers(srv, cfg, multi, sh.accounts, sh.goroutines)
				cfg.logf("bench: scenario 9, %d accounts, %d goroutines, multi=%v: %.0f transfers/s (%v)", sh.accounts, sh.goroutines, multi, r.rate(), r.err)
				switch {
				case r.err != nil:
					ok, check = false, "error: "+oneLine(r.err)
				case r.overlaps > 0 || r.drift != 0:
					ok, check = false, fmt.Sprintf("BROKEN: %d overlaps, total off by %d", r.overlaps, r.drift)
				default:
					rates[multi] = append(rates[multi], r.rate())
					if r.transfers > 0 {
						scripts[multi] = append(scripts[multi], float64(r.scripts)/float64(r.transfers))
						cpus[multi] = append(cpus[multi], float64(r.cpu.Microseconds())/float64(r.transfers))
					}
				}
			}
		}
		m, n := median(rates[true]), median(rates[false])
		fmt.Fprintf(&b, "| %d | %d | %s | %s | %s | %.2f / %.2f | %.0f / %.0f | %s |\n", sh.accounts, sh.goroutines, thousands(m), thousands(n), ratio(m, n),
			median(scripts[true]), median(scripts[false]), median(cpus[true]), median(cpus[false]), check)
		if m > 0 && n > 0 {
			ratios = append(ratios, m/n)
			cfg.fig.target(fmt.Sprintf("9, %d accounts × %d goroutines", sh.accounts, sh.goroutines),
				"multi-lock transfers/s ≥ 1.5× nested Do (one server)", m >= 1.5*n, "%.2f×", m/n)
		}
	}
	if len(ratios) > 0 {
		fmt.Fprintf(&b, "\n- The multi-lock makes **%.2f×–%.2f×** the transfers of nested Do.\n", slices.Min(ratios), slices.Max(ratios))
	}
	return b.String(), ok
}
