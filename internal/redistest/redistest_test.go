package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustDo(t *testing.T, s *Server, args ...string) string {
	t.Helper()
	v, err := s.Do(ctxTimeout(t, 5*time.Second), args...)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return v
}

func TestStartDo(t *testing.T) {
	t.Parallel()
	s := Start(t)

	if want := "redis://127.0.0.1:" + strconv.Itoa(s.Port) + "/0"; s.URL() != want {
		t.Errorf("URL = %q, want %q", s.URL(), want)
	}
	if s.Addr != "127.0.0.1:"+strconv.Itoa(s.Port) {
		t.Errorf("Addr = %q, Port = %d", s.Addr, s.Port)
	}
	if fi, err := os.Stat(s.Dir); err != nil || !fi.IsDir() {
		t.Fatalf("Dir %q: %v", s.Dir, err)
	}
	if got := mustDo(t, s, "PING"); got != "PONG" {
		t.Errorf("PING = %q", got)
	}
	if got := mustDo(t, s, "SET", "k", "v a l\r\nue"); got != "OK" {
		t.Errorf("SET = %q", got)
	}
	if got := mustDo(t, s, "GET", "k"); got != "v a l\r\nue" {
		t.Errorf("GET = %q", got)
	}
	if got := mustDo(t, s, "GET", "missing"); got != "" {
		t.Errorf("GET missing = %q", got)
	}
	if got := mustDo(t, s, "INCRBY", "n", "-7"); got != "-7" {
		t.Errorf("INCRBY = %q", got)
	}
	mustDo(t, s, "RPUSH", "l", "a", "b", "c")
	if got := mustDo(t, s, "LRANGE", "l", "0", "-1"); got != "a\nb\nc" {
		t.Errorf("LRANGE = %q", got)
	}
	if got := mustDo(t, s, "CONFIG", "GET", "save"); got != "save\n" {
		t.Errorf("CONFIG GET save = %q, want persistence off", got)
	}
	if got := mustDo(t, s, "CONFIG", "GET", "appendonly"); got != "appendonly\nno" {
		t.Errorf("CONFIG GET appendonly = %q", got)
	}

	_, err := s.Do(ctxTimeout(t, 5*time.Second), "SET", "l", "x", "BOGUS")
	var re *Error
	if !errors.As(err, &re) || !strings.HasPrefix(re.Msg, "ERR") {
		t.Errorf("bad SET: err = %v, want *Error starting with ERR", err)
	}
	if _, err := s.Do(ctxTimeout(t, 5*time.Second), "LPUSH", "k", "x"); !errors.As(err, &re) || !strings.HasPrefix(re.Msg, "WRONGTYPE") {
		t.Errorf("LPUSH on string: err = %v", err)
	}
	if !strings.Contains(s.Log(), "Ready to accept connections") {
		t.Errorf("log lacks readiness line:\n%s", s.Log())
	}
}

func TestCloseRemovesEverything(t *testing.T) {
	Require(t)
	t.Parallel()
	s, err := StartProcess()
	if err != nil {
		t.Fatal(err)
	}
	pid := s.PID()
	if pid == 0 {
		t.Fatal("PID = 0 for a running server")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := os.Stat(s.Dir); !os.IsNotExist(err) {
		t.Errorf("Dir still exists after Close: %v", err)
	}
	// The child was reaped, so its pid no longer exists (not even a zombie).
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("kill(%d, 0) = %v, want ESRCH", pid, err)
	}
	if !strings.Contains(s.Log(), "Redis version") {
		t.Errorf("Log after Close lost the log:\n%s", s.Log())
	}
	if err := s.Kill(); err != nil {
		t.Errorf("Kill after Close: %v", err)
	}
	if err := s.Restart(); err == nil {
		t.Error("Restart after Close succeeded")
	}
}

func TestKillRestart(t *testing.T) {
	t.Parallel()
	s := Start(t)
	mustDo(t, s, "SET", "k", "v")
	port, oldPID := s.Port, s.PID()

	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := s.Kill(); err != nil {
		t.Fatalf("second Kill: %v", err)
	}
	if _, err := s.Do(ctxTimeout(t, time.Second), "PING"); err == nil {
		t.Fatal("PING succeeded on a killed server")
	}
	if err := s.Pause(); err == nil {
		t.Error("Pause on a killed server succeeded")
	}

	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if s.Port != port || s.Addr != "127.0.0.1:"+strconv.Itoa(port) {
		t.Fatalf("port changed: %d -> %d", port, s.Port)
	}
	if s.PID() == oldPID {
		t.Error("PID unchanged after Restart")
	}
	if got := mustDo(t, s, "GET", "k"); got != "" {
		t.Errorf("GET after Restart = %q, want empty data", got)
	}
	if got := mustDo(t, s, "DBSIZE"); got != "0" {
		t.Errorf("DBSIZE after Restart = %q", got)
	}
	// Restart of a running server kills it first.
	mustDo(t, s, "SET", "k", "v2")
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if got := mustDo(t, s, "DBSIZE"); got != "0" {
		t.Errorf("DBSIZE after second Restart = %q", got)
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := Start(t)
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := s.Do(ctxTimeout(t, 200*time.Millisecond), "PING")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("PING on paused server: err = %v, want deadline exceeded", err)
	}
	if el := time.Since(start); el < 190*time.Millisecond {
		t.Errorf("PING failed after %v, before its deadline", el)
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	if got := mustDo(t, s, "PING"); got != "PONG" {
		t.Errorf("PING after Resume = %q", got)
	}
	// Close must also work on a paused server.
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
}

func TestCancelInterruptsDo(t *testing.T) {
	t.Parallel()
	s := Start(t)
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	defer s.Resume()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := s.Do(ctx, "PING")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("cancel took %v", el)
	}
}

func TestRequirepass(t *testing.T) {
	t.Parallel()
	s := Start(t, WithArgs("--requirepass", "s3cret"))
	if got := mustDo(t, s, "SET", "k", "v"); got != "OK" {
		t.Errorf("SET with auto-AUTH = %q", got)
	}
	_, err := Do(ctxTimeout(t, 5*time.Second), s.Addr, "GET", "k")
	var re *Error
	if !errors.As(err, &re) || !strings.HasPrefix(re.Msg, "NOAUTH") {
		t.Errorf("unauthenticated GET: err = %v, want NOAUTH", err)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if got := mustDo(t, s, "PING"); got != "PONG" {
		t.Errorf("PING after Restart = %q", got)
	}
}

func TestBadArgsFailFast(t *testing.T) {
	Require(t)
	t.Parallel()
	start := time.Now()
	_, err := StartProcess(WithArgs("--no-such-option", "1"))
	if err == nil {
		t.Fatal("StartProcess with a bad option succeeded")
	}
	if !strings.Contains(err.Error(), "no-such-option") {
		t.Errorf("error does not include the server's complaint: %v", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("failing start took %v", el)
	}
}

// fatalTB records Fatalf and Skipf and stops the calling goroutine like testing.T does.
type fatalTB struct {
	testing.TB
	msg     string
	skipped bool
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (f *fatalTB) Skipf(format string, args ...any) {
	f.msg, f.skipped = fmt.Sprintf(format, args...), true
	runtime.Goexit()
}

// stopped runs f with a fatalTB on its own goroutine and returns the fatalTB once f has
// returned or stopped.
func stopped(t *testing.T, f func(tb testing.TB)) *fatalTB {
	ftb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(ftb)
	}()
	<-done
	return ftb
}

// Without redis-server, Start fails the test with a hint at the fix; under -short it skips
// it instead, and so does Require, which otherwise lets the test go on.
func TestNotInstalled(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := StartProcess()
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
	const hint = "redis-server not found on PATH; install it with: apt-get install -y redis-server"
	ftb := stopped(t, func(tb testing.TB) {
		Start(tb)
		t.Error("Start returned without calling Fatalf or Skipf")
	})
	if !strings.Contains(ftb.msg, hint) {
		t.Errorf("Start's message %q lacks %q", ftb.msg, hint)
	}
	if ftb.skipped != testing.Short() {
		t.Errorf("Start without redis-server: skipped = %v with -short %v; want a skip under -short only", ftb.skipped, testing.Short())
	}
	ftb = stopped(t, func(tb testing.TB) { Require(tb) })
	if ftb.skipped != testing.Short() || (ftb.skipped && !strings.Contains(ftb.msg, hint)) {
		t.Errorf("Require without redis-server: skipped = %v (%q) with -short %v; want a skip under -short only", ftb.skipped, ftb.msg, testing.Short())
	}
}

func TestManyParallel(t *testing.T) {
	t.Parallel()
	for i := range 8 {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			s := Start(t)
			if got := mustDo(t, s, "SET", "i", strconv.Itoa(i)); got != "OK" {
				t.Fatal(got)
			}
			if got := mustDo(t, s, "GET", "i"); got != strconv.Itoa(i) {
				t.Fatalf("GET = %q: servers share data?", got)
			}
		})
	}
}

// TestChildDiesWithTestBinary re-runs this test binary as a helper that
// starts a server, then SIGKILLs the helper: Pdeathsig must take the server
// down with it.
func TestChildDiesWithTestBinary(t *testing.T) {
	Require(t)
	if os.Getenv("REDISTEST_HELPER") == "1" {
		s, err := StartProcess()
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Printf("pid=%d dir=%s\n", s.PID(), s.Dir)
		select {} // wait to be killed
	}
	if runtime.GOOS != "linux" {
		t.Skip("Pdeathsig is Linux-only")
	}
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestChildDiesWithTestBinary$")
	cmd.Env = append(os.Environ(), "REDISTEST_HELPER=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	var pid int
	var dir string
	if _, serr := fmt.Sscanf(line, "pid=%d dir=%s", &pid, &dir); err != nil || serr != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper said %q (%v)", line, err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) }) // the helper cannot clean up
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	err = Poll(ctxTimeout(t, 5*time.Second), "redis-server to die with its parent", func(context.Context) error {
		if processAlive(pid) {
			return fmt.Errorf("redis-server %d alive", pid)
		}
		return nil
	})
	if err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		t.Fatal(err)
	}
}

// processAlive reports whether pid exists and is not a zombie (an orphaned
// child may wait for a reaper that never comes in a container).
func processAlive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// Format: pid (comm) state ...
	i := strings.LastIndexByte(string(stat), ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}
