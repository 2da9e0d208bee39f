package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// holderFlag re-executes this binary as a crash-test holder: it takes a lock, says "held" and
// waits to be killed (at most a minute).
const holderFlag = "__crash-holder"

func runHolder(args []string) int {
	if len(args) != 4 {
		fmt.Println("error: usage: __crash-holder CONTENDER ADDR NAME TTL")
		return 2
	}
	c := contenderByName(args[0])
	ttl, err := time.ParseDuration(args[3])
	if c == nil || err != nil {
		fmt.Println("error: bad contender or ttl")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := c.open(ctx, args[1], ttl)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	if _, err := cl.mutex(args[2])(ctx); err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println("held")
	time.Sleep(time.Minute) // killed long before
	return 0
}

// crashResult is one crash-recovery measurement.
type crashResult struct {
	recovery time.Duration // kill → the waiter holds the lock
	lag      time.Duration // server-side expiry of the dead holder's lease → the waiter holds it
	err      error
}

// runCrash starts a holder process, lets a waiter in this process wait for the same name, kills
// the holder with SIGKILL and measures how long the waiter takes to get the lock.
func runCrash(srv *server, c *contender, cfg config, name string) crashResult {
	exe, err := os.Executable()
	if err != nil {
		return crashResult{err: err}
	}
	cmd := exec.Command(exe, holderFlag, c.name, srv.Addr, name, cfg.crashTTL.String())
	cmd.SysProcAttr = childAttr()
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return crashResult{err: err}
	}
	if err := cmd.Start(); err != nil {
		return crashResult{err: err}
	}
	exited := make(chan struct{})
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		cmd.Wait()
		close(exited)
	}()
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()
	select {
	case l, ok := <-lines:
		if !ok || l != "held" {
			return crashResult{err: fmt.Errorf("holder: %q", l)}
		}
	case <-time.After(15 * time.Second):
		return crashResult{err: errors.New("holder did not take the lock within 15s")}
	}
	heldAt := time.Now()

	octx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	cl, err := c.open(octx, srv.Addr, cfg.crashTTL)
	cancel()
	if err != nil {
		return crashResult{err: err}
	}
	defer cl.close()
	type got struct {
		at  time.Time
		err error
	}
	done := make(chan got, 1)
	wctx, wcancel := context.WithTimeout(context.Background(), 10*cfg.crashTTL+5*time.Second)
	defer wcancel()
	go func() {
		unlock, err := cl.mutex(name)(wctx)
		at := time.Now()
		if err == nil {
			unlock(context.Background())
		}
		done <- got{at, err}
	}()

	time.Sleep(time.Until(heldAt.Add(cfg.crashHold)))
	select {
	case g := <-done:
		return crashResult{err: fmt.Errorf("the waiter got the lock while the holder lived (%v)", g.err)}
	default:
	}
	if err := cmd.Process.Kill(); err != nil {
		return crashResult{err: err}
	}
	killedAt := time.Now()
	q := time.Now()
	left := srv.pttl(c.key(name))
	if left < 0 {
		return crashResult{err: fmt.Errorf("no lease on key %q when the holder was killed", c.key(name))}
	}
	expiry := q.Add(left)
	g := <-done
	if g.err != nil {
		return crashResult{err: fmt.Errorf("waiter: %w", g.err)}
	}
	return crashResult{recovery: g.at.Sub(killedAt), lag: g.at.Sub(expiry)}
}

// measureCrashRecovery is scenario 6: how long a waiter takes to get a lock whose holder process
// was SIGKILLed, for every lock (not the raw floors).
func measureCrashRecovery(srv *server, cfg config) (string, bool) {
	var locks []*contender
	for _, c := range contenders {
		if c.kind != kindRaw {
			locks = append(locks, c)
		}
	}
	res := map[*contender][]crashResult{}
	ok := true
	for rep := 0; rep < cfg.reps; rep++ {
		for i := range locks {
			c := locks[(i+rep)%len(locks)]
			stop := watchdog("scenario 6, "+c.name, 10*cfg.crashTTL+45*time.Second)
			r := runCrash(srv, c, cfg, fmt.Sprintf("crash:%d:%d", rep, i))
			stop()
			if r.err != nil {
				ok = ok && c.kind != kindDlock
				cfg.logf("scenario 6, rep %d, %s: %v", rep+1, c.name, r.err)
			} else {
				cfg.logf("scenario 6, rep %d, %-18s kill → next holder %v, after lease expiry %v",
					rep+1, c.name, r.recovery.Round(time.Millisecond), r.lag.Round(100*time.Microsecond))
			}
			res[c] = append(res[c], r)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "### 6. Crash recovery: the holder process is SIGKILLed\n\n")
	fmt.Fprintf(&b, "A helper process takes the lock with a %v lease and is killed %v later; a waiter "+
		"in this process has been waiting since the helper took it. Recovery = kill → the waiter "+
		"holds the lock, which includes what was left of the dead holder's lease (read with `PTTL` "+
		"at the kill); after expiry = the server-side expiry of that lease → the waiter holds the lock, "+
		"the part a lock library controls. Median of %d repetitions.\n\n", cfg.crashTTL, cfg.crashHold, cfg.reps)
	b.WriteString("| contender | recovery (median) | after expiry (median) | after expiry (worst) |\n")
	b.WriteString("|---|---:|---:|---:|\n")
	for _, c := range locks {
		var rec, lag []float64
		var lastErr error
		for _, r := range res[c] {
			if r.err != nil {
				lastErr = r.err
				continue
			}
			rec = append(rec, ms(r.recovery))
			lag = append(lag, ms(r.lag))
		}
		if len(rec) == 0 {
			fmt.Fprintf(&b, "| %s | error: %s | | |\n", c.name, oneLine(lastErr))
			continue
		}
		fmt.Fprintf(&b, "| %s | %.0f ms | %.1f ms | %.1f ms |\n", c.name, median(rec), median(lag), maxOf(lag))
		if c.kind == kindDlock {
			cfg.fig.target("6, "+c.name, "next holder ≤ TTL + 50 ms (≤ 50 ms after the dead holder's lease expired)", maxOf(lag) <= 50,
				"%.1f ms median, %.1f ms worst after expiry", median(lag), maxOf(lag))
		}
	}
	return b.String(), ok
}

func maxOf(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}
