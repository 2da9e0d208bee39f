package dlock_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/goredisconn"
)

// Some tests need a lock holder in another process, to kill or pause it. The test binary
// re-executes itself with helperEnv set; TestMain then runs runHelper instead of the tests.
const helperEnv = "DLOCK_TEST_HELPER"

// runHelper takes the lock DLOCK_NAME on DLOCK_URL with lease DLOCK_TTL (with
// DLOCK_ADAPTIVE_MIN set, the adaptive lease WithAdaptiveTTL(DLOCK_ADAPTIVE_MIN, DLOCK_TTL)),
// prints "locked <token>", then, by role:
//
//	hold: does nothing until killed;
//	work: appends its token to the list DLOCK_NAME:writes every 2 ms while its lease context
//	      is live, and prints "lost <cause>" and exits once it is not;
//	check: prints "live" when the lease context was live when Lock returned, else "ended
//	      <cause>", then does nothing until killed.
//
// With DLOCK_TRANSPORT=goredis it talks to Redis through go-redis (else rueidis).
func runHelper(role string) int {
	if f := moreHelpers[role]; f != nil { // the read-write lock's and semaphore's (shared_helper_test.go)
		return f()
	}
	ctx := context.Background()
	ttl, err := time.ParseDuration(os.Getenv("DLOCK_TTL"))
	if err != nil {
		fmt.Println("bad DLOCK_TTL:", err)
		return 2
	}
	url, name := os.Getenv("DLOCK_URL"), os.Getenv("DLOCK_NAME")
	var c *dlock.Client
	if os.Getenv("DLOCK_TRANSPORT") == "goredis" {
		o, perr := redis.ParseURL(url)
		if perr != nil {
			fmt.Println("bad DLOCK_URL:", perr)
			return 2
		}
		o.ContextTimeoutEnabled = true
		rc := redis.NewClient(o)
		defer rc.Close()
		c, err = dlock.New(goredisconn.New(rc), dlock.WithTTL(ttl))
	} else {
		c, err = dlock.Dial(ctx, url, dlock.WithTTL(ttl))
	}
	if err != nil {
		fmt.Println("dial:", err)
		return 2
	}
	defer c.Close()
	var opts []dlock.Option
	if v := os.Getenv("DLOCK_ADAPTIVE_MIN"); v != "" {
		least, err := time.ParseDuration(v)
		if err != nil {
			fmt.Println("bad DLOCK_ADAPTIVE_MIN:", err)
			return 2
		}
		opts = append(opts, dlock.WithAdaptiveTTL(least, ttl))
	}
	l, err := c.Mutex(name, opts...).Lock(ctx)
	if err != nil {
		fmt.Println("lock:", err)
		return 2
	}
	fmt.Printf("locked %d\n", l.Token())
	switch role {
	case "hold":
		time.Sleep(time.Minute)
		return 0
	case "check":
		if err := l.Context().Err(); err != nil {
			fmt.Printf("ended %v\n", context.Cause(l.Context()))
		} else {
			fmt.Println("live")
		}
		time.Sleep(time.Minute)
		return 0
	case "work":
		o, _ := redis.ParseURL(url)
		rc := redis.NewClient(o)
		defer rc.Close()
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
			if l.Context().Err() != nil {
				fmt.Printf("lost %v\n", context.Cause(l.Context()))
				return 0
			}
			// The protected step: only ever taken after checking the lease context.
			if err := rc.RPush(ctx, name+":writes", l.Token()).Err(); err != nil {
				fmt.Println("write:", err)
				return 2
			}
		}
		fmt.Println("timeout")
		return 1
	}
	return 2
}

// helperProc is a running helper.
type helperProc struct {
	cmd   *exec.Cmd
	lines chan string
}

func startHelper(t *testing.T, role, url, name string, ttl time.Duration) (*helperProc, uint64) {
	t.Helper()
	h := spawnHelper(t, role, url, name, ttl)
	return h, h.locked(t, 20*time.Second)
}

// locked waits for the helper's "locked <token>" line and returns the token.
func (h *helperProc) locked(t *testing.T, within time.Duration) uint64 {
	t.Helper()
	line := h.next(t, within)
	var token uint64
	if _, err := fmt.Sscanf(line, "locked %d", &token); err != nil {
		t.Fatalf("helper said %q, want \"locked <token>\"", line)
	}
	return token
}

// spawnHelper starts a helper that takes the lock (waiting for it as long as it must); env adds
// to its environment ("KEY=value").
func spawnHelper(t *testing.T, role, url, name string, ttl time.Duration, env ...string) *helperProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), helperEnv+"="+role, "DLOCK_URL="+url, "DLOCK_NAME="+name, "DLOCK_TTL="+ttl.String()), env...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helperProc{cmd: cmd, lines: make(chan string, 16)}
	go func() {
		defer close(h.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		io.Copy(io.Discard, out)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
	})
	return h
}

func (h *helperProc) next(t *testing.T, within time.Duration) string {
	t.Helper()
	select {
	case line, ok := <-h.lines:
		if !ok {
			t.Fatal("helper exited without a line")
		}
		return strings.TrimSpace(line)
	case <-time.After(within):
		t.Fatalf("no line from helper within %v", within)
	}
	return ""
}

func (h *helperProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := h.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatal(err)
	}
	if sig == syscall.SIGSTOP {
		// kill(2) returns before the process is frozen: a thread running on the other core goes
		// on for a while (milliseconds on a loaded machine), and may yet take a grant the test
		// means to reach a paused process. Return once every thread is stopped.
		pid := h.cmd.Process.Pid
		waitFor(t, 10*time.Second, "helper "+strconv.Itoa(pid)+" stopped", func(context.Context) error { return allStopped(pid) })
	}
}

// allStopped reports (nil) whether every thread of process pid is stopped ('T' or 't' in
// /proc/PID/task/TID/stat); without /proc, it cannot tell and says so as nil.
func allStopped(pid int) error {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(tasks) == 0 {
		if _, serr := os.Stat("/proc/self"); serr != nil {
			return nil // no /proc here
		}
		return fmt.Errorf("process %d: no tasks in /proc", pid)
	}
	for _, task := range tasks {
		b, err := os.ReadFile(task)
		if err != nil {
			continue // the thread exited
		}
		s := string(b) // the state follows the parenthesised command name, which may hold spaces
		i := strings.LastIndexByte(s, ')')
		if i < 0 || i+2 >= len(s) {
			return fmt.Errorf("process %d: unreadable %s", pid, task)
		}
		if st := s[i+2]; st != 'T' && st != 't' {
			return fmt.Errorf("thread %s in state %c", filepath.Base(filepath.Dir(task)), st)
		}
	}
	return nil
}
