package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// The binary under test is built once for all the tests of this file, into builtDir
// (removed by TestMain).
var (
	buildOnce sync.Once
	builtDir  string
	builtBin  string
	buildErr  error
)

func dlockBin(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the command and runs it against redis-server")
	}
	buildOnce.Do(func() {
		builtDir, buildErr = os.MkdirTemp("", "dlock-run-test-")
		if buildErr != nil {
			return
		}
		builtBin = filepath.Join(builtDir, "dlock")
		args := append(append([]string{"build"}, buildFlags...), "-o", builtBin, ".")
		out, err := exec.Command("go", args...).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

func removeBuilt() {
	if builtDir != "" {
		os.RemoveAll(builtDir)
	}
}

// syncBuffer collects a child's output while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// dlockProc is a dlock process running in the background.
type dlockProc struct {
	cmd            *exec.Cmd
	stdout, stderr syncBuffer
	done           chan struct{}
	code           int // valid after done is closed
}

func startDlock(t *testing.T, args ...string) *dlockProc {
	t.Helper()
	p := &dlockProc{done: make(chan struct{})}
	p.cmd = exec.Command(dlockBin(t), args...)
	// GORACE: a race-enabled binary otherwise sleeps 1 s on exit.
	p.cmd.Env = append(os.Environ(), "DLOCK_REDIS_URL=", "GORACE=atexit_sleep_ms=0")
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGCONT)
		p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// wait waits for the process to exit and returns its exit code.
func (p *dlockProc) wait(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(within):
		t.Fatalf("dlock %v still running after %v\nstdout:\n%s\nstderr:\n%s", p.cmd.Args[1:], within, p.stdout.String(), p.stderr.String())
	}
	return 0
}

func (p *dlockProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// dlockCmd runs dlock to completion.
func dlockCmd(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	p := startDlock(t, args...)
	code = p.wait(t, 30*time.Second)
	return p.stdout.String(), p.stderr.String(), code
}

// waitFor polls check with redistest.Poll until it returns nil, failing the test after within.
func waitFor(t *testing.T, within time.Duration, what string, check func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := redistest.Poll(ctx, what, check); err != nil {
		t.Fatal(err)
	}
}

// exited is a check for waitFor: pid has exited (processGone).
func exited(pid int) func(context.Context) error {
	return func(context.Context) error {
		if !processGone(pid) {
			return fmt.Errorf("process %d still running", pid)
		}
		return nil
	}
}

// heldByOther is a check for waitFor: name is held with a token other than first.
func heldByOther(t *testing.T, s *redistest.Server, name string, first uint64) func(context.Context) error {
	return func(context.Context) error {
		if tok := heldToken(t, s, name); tok == 0 || tok == first {
			return fmt.Errorf("token %d (0: free), the first holder's %d", tok, first)
		}
		return nil
	}
}

func keyOf(name string) string { return dlock.DefaultPrefix + "{" + name + "}" }

// heldBy returns the token of the holder of name, or 0 when it is free.
func heldToken(t *testing.T, s *redistest.Server, name string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := s.Do(ctx, "GET", keyOf(name))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(v)
	if len(f) < 3 || f[0] == "-" {
		return 0
	}
	tok, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		t.Fatalf("value %q: %v", v, err)
	}
	return tok
}

// readPID waits for a command under test to write its process id into file.
func readPID(t *testing.T, file string) int {
	t.Helper()
	var pid int
	waitFor(t, 10*time.Second, "the command's pid in "+file, func(context.Context) error {
		b, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		if !bytes.HasSuffix(b, []byte("\n")) {
			return fmt.Errorf("%q: no full line yet", b)
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err
	})
	return pid
}

// processGone reports whether pid has exited: no such process, or a zombie (its parent died
// and nobody reaped it yet).
func processGone(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// "pid (comm) state ...": the state follows the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// Two dlock run on one name never overlap: each run appends "start <token>" and
// "end <token>" to one file, with a pause between.
func TestRun_NoOverlap(t *testing.T) {
	bin := dlockBin(t)
	s := redistest.Start(t)
	name := "overlap"
	file := filepath.Join(t.TempDir(), "log")
	script := `echo "start $DLOCK_NAME $DLOCK_TOKEN" >> "$0"; sleep 0.1; echo "end $DLOCK_NAME $DLOCK_TOKEN" >> "$0"`
	const runs = 6
	var wg sync.WaitGroup
	codes := make([]int, runs)
	for i := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(bin, "run", "--redis", s.URL(), "--ttl", "2s", name, "--", "sh", "-c", script, file)
			cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0")
			out, err := cmd.CombinedOutput()
			codes[i] = 0
			if err != nil {
				codes[i] = -1
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					codes[i] = ee.ExitCode()
				}
				t.Errorf("run %d: %v\n%s", i, err, out)
			}
		}()
	}
	wg.Wait()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2*runs {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), 2*runs, b)
	}
	var last uint64
	for i := 0; i < len(lines); i += 2 {
		var tok1, tok2 uint64
		var n1, n2 string
		if _, err := fmt.Sscanf(lines[i], "start %s %d", &n1, &tok1); err != nil {
			t.Fatalf("line %d %q: %v\n%s", i, lines[i], err, b)
		}
		if _, err := fmt.Sscanf(lines[i+1], "end %s %d", &n2, &tok2); err != nil || tok1 != tok2 {
			t.Fatalf("line %d %q does not end the run started on the line before: the runs overlap\n%s", i+1, lines[i+1], b)
		}
		if n1 != name || tok1 <= last {
			t.Errorf("run %d: name %q token %d after token %d; want %q and increasing tokens", i/2, n1, tok1, last, name)
		}
		last = tok1
	}
	if tok := heldToken(t, s, name); tok != 0 {
		t.Errorf("lock still held after all runs (token %d)", tok)
	}
}

// kill -9 of a holding dlock run lets a waiter in within TTL + 1 s; the holder's command does
// not outlive it.
func TestRun_KilledHolder(t *testing.T) {
	s := redistest.Start(t)
	dir := t.TempDir()
	name := "killed"
	holder := startDlock(t, "run", "--redis", s.URL(), "--ttl", "1s", name, "--", "sh", "-c", `echo $$ > "$0"; exec sleep 60`, filepath.Join(dir, "pid"))
	child := readPID(t, filepath.Join(dir, "pid"))
	if heldToken(t, s, name) == 0 {
		t.Fatalf("the command runs but the lock is not held\nstderr: %s", holder.stderr.String())
	}
	first := heldToken(t, s, name)
	waiter := startDlock(t, "run", "--redis", s.URL(), "--ttl", "1s", name, "--", "sh", "-c", "echo got it; sleep 0.3")
	waitFor(t, 10*time.Second, "the waiter to wait (subscribe to the release channel)", func(ctx context.Context) error {
		v, err := s.Do(ctx, "PUBSUB", "CHANNELS", keyOf(name)+":rel:*")
		if err == nil && strings.TrimSpace(v) == "" {
			err = fmt.Errorf("PUBSUB CHANNELS: no waiting client's channel")
		}
		return err
	})
	select {
	case <-waiter.done:
		t.Fatalf("the waiter ran while the lock was held: exit %d, %s%s", waiter.code, waiter.stdout.String(), waiter.stderr.String())
	default:
	}

	killed := time.Now()
	holder.signal(t, syscall.SIGKILL)
	waitFor(t, 10*time.Second, "the waiter to take the lock", heldByOther(t, s, name, first))
	if d := time.Since(killed); d > 2*time.Second {
		t.Errorf("the waiter got the lock %v after the holder was killed, want within TTL + 1s = 2s", d)
	}
	if code := waiter.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("waiter exit %d, want 0\nstderr: %s", code, waiter.stderr.String())
	}
	if !strings.Contains(waiter.stdout.String(), "got it") {
		t.Errorf("waiter's command output %q", waiter.stdout.String())
	}
	waitFor(t, 5*time.Second, "the killed holder's command to die with it", exited(child))
}

// A holding dlock run paused (SIGSTOP) past its lease loses the lock to another; when it
// resumes, it terminates its command and exits 76.
func TestRun_PausedHolderLosesLock(t *testing.T) {
	s := redistest.Start(t)
	dir := t.TempDir()
	name := "paused"
	holder := startDlock(t, "run", "--redis", s.URL(), "--ttl", "1s", "--grace", "2s", name, "--",
		"sh", "-c", `echo $$ > "$0"; exec sleep 60`, filepath.Join(dir, "pid"))
	child := readPID(t, filepath.Join(dir, "pid"))
	first := heldToken(t, s, name)
	if first == 0 {
		t.Fatal("the command runs but the lock is not held")
	}
	holder.signal(t, syscall.SIGSTOP)

	// Another dlock run gets the lock once the paused holder's lease runs out, and keeps it
	// until told to stop (its command waits for a file).
	release := filepath.Join(dir, "release")
	other := startDlock(t, "run", "--redis", s.URL(), "--ttl", "1s", name, "--",
		"sh", "-c", `while [ ! -e "$0" ]; do sleep 0.02; done`, release)
	waitFor(t, 5*time.Second, "the other run to take the lock", heldByOther(t, s, name, first))

	holder.signal(t, syscall.SIGCONT)
	if code := holder.wait(t, 5*time.Second); code != exitLost {
		t.Errorf("resumed holder exit %d, want %d\nstderr: %s", code, exitLost, holder.stderr.String())
	}
	if !strings.Contains(holder.stderr.String(), "lost") {
		t.Errorf("resumed holder's stderr does not say the lock was lost: %q", holder.stderr.String())
	}
	waitFor(t, 5*time.Second, "the paused holder's command to be terminated", exited(child))

	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := other.wait(t, 10*time.Second); code != 0 {
		t.Errorf("other run exit %d, want 0\nstderr: %s", code, other.stderr.String())
	}
}

// A busy lock with --wait 0 (or a --wait that runs out) exits 75 without running the command.
func TestRun_Busy(t *testing.T) {
	s := redistest.Start(t)
	name := "busy"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.Do(ctx, "SET", keyOf(name), `someone 42 1 {"host":"elsewhere","pid":7,"start":1}`, "PX", "20000"); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(t.TempDir(), "ran")
	for _, wait := range []string{"0", "300ms"} {
		start := time.Now()
		_, errOut, code := dlockCmd(t, "run", "--redis", s.URL(), "--wait", wait, name, "--", "touch", marker)
		if code != exitBusy {
			t.Errorf("--wait %s: exit %d, want %d\nstderr: %s", wait, code, exitBusy, errOut)
		}
		if !strings.Contains(errOut, "busy") || !strings.Contains(errOut, "elsewhere") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("--wait %s: stderr %q, want one line saying the lock is busy and who holds it", wait, errOut)
		}
		if wait == "300ms" && time.Since(start) < 300*time.Millisecond {
			t.Errorf("--wait 300ms returned after %v", time.Since(start))
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the command ran although the lock was busy")
	}
}

// An unreachable server exits 69 with its address in a one-line message, for every command.
func TestRun_Unreachable(t *testing.T) {
	dlockBin(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	url := "redis://" + addr + "/0"
	for _, args := range [][]string{
		{"run", "--redis", url, "x", "--", "true"},
		{"status", "--redis", url, "x"},
		{"list", "--redis", url},
		{"unlock", "--force", "--redis", url, "x"},
	} {
		_, errOut, code := dlockCmd(t, args...)
		if code != exitNoServer {
			t.Errorf("%v: exit %d, want %d\nstderr: %s", args, code, exitNoServer, errOut)
		}
		if !strings.Contains(errOut, addr) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: stderr %q, want one line naming %s", args, errOut, addr)
		}
	}
	// DLOCK_REDIS_URL is the default server.
	p := exec.Command(dlockBin(t), "status", "x")
	p.Env = append(os.Environ(), redisEnv+"="+url, "GORACE=atexit_sleep_ms=0")
	out, _ := p.CombinedOutput()
	if p.ProcessState.ExitCode() != exitNoServer || !strings.Contains(string(out), addr) {
		t.Errorf("with %s=%s: exit %d, output %q", redisEnv, url, p.ProcessState.ExitCode(), out)
	}
}

// The command's environment, exit code, signal forwarding and release after exit.
func TestRun_CommandAndSignals(t *testing.T) {
	s := redistest.Start(t)
	name := "cmd"
	out, errOut, code := dlockCmd(t, "run", "--redis", s.URL(), name, "sh", "-c", `echo "$DLOCK_NAME $DLOCK_TOKEN"; exit 3`)
	if code != 3 {
		t.Errorf("exit %d, want the command's 3\nstderr: %s", code, errOut)
	}
	var gotName string
	var tok uint64
	if _, err := fmt.Sscanf(out, "%s %d", &gotName, &tok); err != nil || gotName != name || tok == 0 {
		t.Errorf("command saw DLOCK_NAME, DLOCK_TOKEN = %q (%v), want %q and a token", out, err, name)
	}

	_, errOut, code = dlockCmd(t, "run", "--redis", s.URL(), name, "--", "no-such-command-dlock-test")
	if code != 127 || strings.Count(errOut, "\n") != 1 {
		t.Errorf("missing command: exit %d, stderr %q; want 127 and one line", code, errOut)
	}
	if heldToken(t, s, name) != 0 {
		t.Error("lock held after the command could not start")
	}

	// SIGTERM to dlock reaches the command, whose exit code dlock returns; then the lock is free.
	dir := t.TempDir()
	p := startDlock(t, "run", "--redis", s.URL(), name, "--", "sh", "-c",
		`trap 'exit 42' TERM; echo $$ > "$0"; while :; do sleep 0.02; done`, filepath.Join(dir, "pid"))
	readPID(t, filepath.Join(dir, "pid"))
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 10*time.Second); code != 42 {
		t.Errorf("after SIGTERM: exit %d, want the command's 42\nstderr: %s", code, p.stderr.String())
	}
	if heldToken(t, s, name) != 0 {
		t.Error("lock held after the command exited")
	}
}

// status and list print JSON with the documented fields; unlock --force takes the lock from
// its holder, whose lease is then lost.
func TestStatusListUnlock(t *testing.T) {
	s := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := dlock.Dial(ctx, s.URL(), dlock.WithTTL(900*time.Millisecond), dlock.WithLabel("test holder"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Mutex("jobs:a").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()

	checkHeld := func(t *testing.T, m map[string]any) {
		t.Helper()
		for _, f := range []string{"name", "held", "token", "token_time", "holds", "ttl_ms", "holder", "waiters"} {
			if _, ok := m[f]; !ok {
				t.Errorf("no field %q in %v", f, m)
			}
		}
		if m["name"] != "jobs:a" || m["held"] != true || m["token"] != float64(l.Token()) || m["holds"] != float64(1) || m["waiters"] != float64(0) {
			t.Errorf("fields %v, want jobs:a held, token %d, 1 hold, 0 waiters", m, l.Token())
		}
		if ttl, _ := m["ttl_ms"].(float64); ttl <= 0 || ttl > 900 {
			t.Errorf("ttl_ms %v, want in (0, 900]", m["ttl_ms"])
		}
		if _, err := time.Parse(time.RFC3339Nano, fmt.Sprint(m["token_time"])); err != nil {
			t.Errorf("token_time: %v", err)
		}
		h, _ := m["holder"].(map[string]any)
		if h["host"] != host || h["pid"] != float64(os.Getpid()) || h["label"] != "test holder" {
			t.Errorf("holder %v, want host %s, pid %d, label \"test holder\"", h, host, os.Getpid())
		}
		if _, err := time.Parse(time.RFC3339, fmt.Sprint(h["start"])); err != nil {
			t.Errorf("holder start: %v", err)
		}
	}

	out, errOut, code := dlockCmd(t, "status", "--json", "--redis", s.URL(), "jobs:a")
	if code != 0 {
		t.Fatalf("status: exit %d, stderr %s", code, errOut)
	}
	var st map[string]any
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	checkHeld(t, st)

	out, _, code = dlockCmd(t, "status", "--redis", s.URL(), "jobs:a")
	if code != 0 || !strings.Contains(out, "held") || !strings.Contains(out, strconv.FormatUint(l.Token(), 10)) || !strings.Contains(out, "test holder") {
		t.Errorf("status: exit %d, output:\n%s", code, out)
	}

	out, errOut, code = dlockCmd(t, "status", "--redis", s.URL(), "--json", "jobs:free")
	var free map[string]any
	if err := json.Unmarshal([]byte(out), &free); code != 0 || err != nil || free["held"] != false || free["holder"] != nil || free["token"] != float64(0) {
		t.Errorf("status of a free lock: exit %d, %v, %v, stderr %s", code, free, err, errOut)
	}

	other, err := c.Mutex("other:b").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Unlock(ctx)
	out, errOut, code = dlockCmd(t, "list", "--json", "--prefix", "jobs:", "--redis", s.URL())
	var list []map[string]any
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil {
		t.Fatalf("list --json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	if len(list) != 1 {
		t.Fatalf("list --prefix jobs: = %v, want jobs:a only", list)
	}
	checkHeld(t, list[0])
	out, _, code = dlockCmd(t, "list", "--redis", s.URL())
	if code != 0 || !strings.Contains(out, "jobs:a") || !strings.Contains(out, "other:b") {
		t.Errorf("list: exit %d, output:\n%s", code, out)
	}
	out, _, code = dlockCmd(t, "list", "--json", "--prefix", "none:", "--redis", s.URL())
	if code != 0 || strings.TrimSpace(out) != "[]" {
		t.Errorf("empty list --json: exit %d, %q; want []", code, out)
	}

	out, errOut, code = dlockCmd(t, "unlock", "--force", "--redis", s.URL(), "jobs:a")
	if code != 0 || !strings.Contains(out, "pid "+strconv.Itoa(os.Getpid())) || !strings.Contains(out, strconv.FormatUint(l.Token(), 10)) {
		t.Errorf("unlock --force: exit %d, stdout %q, stderr %q; want who held it", code, out, errOut)
	}
	select {
	case <-l.Context().Done():
		if !errors.Is(context.Cause(l.Context()), dlock.ErrLost) {
			t.Errorf("lease ended with %v, want ErrLost", context.Cause(l.Context()))
		}
	case <-time.After(3 * time.Second):
		t.Error("the holder's lease was not lost after unlock --force")
	}
	next, err := c.Mutex("jobs:a").TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if next.Token() <= l.Token() {
		t.Errorf("next token %d, want > %d", next.Token(), l.Token())
	}
	next.Unlock(ctx)
	_, errOut, code = dlockCmd(t, "unlock", "--force", "--redis", s.URL(), "jobs:a")
	if code != exitFailure || !strings.Contains(errOut, "not held") {
		t.Errorf("unlock --force of a free lock: exit %d, stderr %q", code, errOut)
	}
}

func TestRunStatusUsage(t *testing.T) {
	tests := []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{args: []string{"run", "--help"}, code: exitOK, stdout: "75"},
		{args: []string{"run", "--help"}, code: exitOK, stdout: "DLOCK_TOKEN"},
		{args: []string{"status", "--help"}, code: exitOK, stdout: "ttl_ms"},
		{args: []string{"list", "--help"}, code: exitOK, stdout: "Example"},
		{args: []string{"unlock", "--help"}, code: exitOK, stdout: "Example"},
		{args: []string{"help"}, code: exitOK, stdout: "unlock"},
		{args: []string{"run"}, code: exitUsage, stderr: "missing lock name"},
		{args: []string{"run", "x"}, code: exitUsage, stderr: "missing command"},
		{args: []string{"run", "x", "--"}, code: exitUsage, stderr: "missing command"},
		{args: []string{"run", "--ttl", "1ms", "x", "--", "true"}, code: exitUsage, stderr: "--ttl must be"},
		{args: []string{"run", "--wait", "-1s", "x", "--", "true"}, code: exitUsage, stderr: "must not be negative"},
		{args: []string{"run", "x", "--nosuch", "--", "true"}, code: exitUsage, stderr: "flag provided but not defined"},
		{args: []string{"run", "--redis", "nosuch://x", "x", "--", "true"}, code: exitUsage, stderr: "bad redis url"},
		{args: []string{"status"}, code: exitUsage, stderr: "missing lock name"},
		{args: []string{"status", "a", "b"}, code: exitUsage, stderr: "unexpected argument"},
		{args: []string{"list", "a"}, code: exitUsage, stderr: "unexpected argument"},
		{args: []string{"unlock", "x"}, code: exitUsage, stderr: "--force"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := dispatch(context.Background(), &stdio{in: strings.NewReader(""), out: &out, err: &errOut}, tt.args)
			if code != tt.code || !strings.Contains(out.String(), tt.stdout) || !strings.Contains(errOut.String(), tt.stderr) {
				t.Errorf("exit %d (want %d)\nstdout: %s (want %q)\nstderr: %s (want %q)", code, tt.code, out.String(), tt.stdout, errOut.String(), tt.stderr)
			}
		})
	}
}

// A command that ignores SIGTERM is killed --grace after the loss (here: a forced unlock).
func TestRun_LostLockKillsAfterGrace(t *testing.T) {
	s := redistest.Start(t)
	dir := t.TempDir()
	name := "stubborn"
	holder := startDlock(t, "run", "--redis", s.URL(), "--ttl", "600ms", "--grace", "300ms", name, "--",
		"sh", "-c", `trap '' TERM; echo $$ > "$0"; while :; do sleep 0.02; done`, filepath.Join(dir, "pid"))
	child := readPID(t, filepath.Join(dir, "pid"))
	_, errOut, code := dlockCmd(t, "unlock", "--force", "--redis", s.URL(), name)
	if code != 0 {
		t.Fatalf("unlock --force: exit %d, %s", code, errOut)
	}
	forced := time.Now()
	if code := holder.wait(t, 5*time.Second); code != exitLost {
		t.Errorf("holder exit %d, want %d\nstderr: %s", code, exitLost, holder.stderr.String())
	}
	if d := time.Since(forced); d < 300*time.Millisecond {
		t.Errorf("holder exited %v after the loss, before its 300ms grace", d)
	}
	waitFor(t, 5*time.Second, "the command to be killed", exited(child))
}
