package redisproc_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/internal/redisproc"
	"github.com/dlock-go/dlock/internal/redistest"
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

func start(t *testing.T, cfg redisproc.Config) *redisproc.Process {
	t.Helper()
	p, err := redisproc.Start(ctxTimeout(t, 30*time.Second), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", redisproc.Tail(p.Log(), 4<<10))
		}
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

func do(t *testing.T, p *redisproc.Process, args ...string) string {
	t.Helper()
	v, err := redistest.Do(ctxTimeout(t, 5*time.Second), p.Addr(), args...)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return v
}

func ping(p *redisproc.Process, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return redisproc.Ping(ctx, p.Addr(), p.PID())
}

// processGone reports whether pid has exited and been reaped (or is a zombie).
func processGone(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(stat), ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

func TestStartPingClose(t *testing.T) {
	redistest.Require(t)
	t.Parallel()
	p := start(t, redisproc.Config{DirPrefix: "redisproc-test-", Args: []string{"--maxclients", "123"}})

	if want := "127.0.0.1:" + strconv.Itoa(p.Port()); p.Addr() != want {
		t.Errorf("Addr = %q, want %q", p.Addr(), want)
	}
	if !strings.HasPrefix(filepath.Base(p.Dir()), "redisproc-test-") {
		t.Errorf("Dir = %q, want the prefix redisproc-test-", p.Dir())
	}
	pid := p.PID()
	if pid == 0 {
		t.Fatal("PID = 0 for a running server")
	}
	if err := ping(p, 5*time.Second); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if err := redisproc.Ping(ctxTimeout(t, 5*time.Second), p.Addr(), pid+1); err == nil || !strings.Contains(err.Error(), "pid") {
		t.Errorf("Ping with the wrong pid = %v, want a pid mismatch", err)
	}
	if got := do(t, p, "CONFIG", "GET", "maxclients"); got != "maxclients\n123" {
		t.Errorf("CONFIG GET maxclients = %q: Args not passed", got)
	}
	if got := do(t, p, "CONFIG", "GET", "save"); got != "save\n" {
		t.Errorf("CONFIG GET save = %q, want no persistence", got)
	}
	if got := do(t, p, "INFO", "server"); !strings.Contains(got, "process_id:"+strconv.Itoa(pid)) {
		t.Errorf("INFO server does not name pid %d", pid)
	}
	if !strings.Contains(p.Log(), "Ready to accept connections") {
		t.Errorf("log lacks the readiness line:\n%s", p.Log())
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Dir after Close: %v", err)
	}
	if !processGone(pid) {
		t.Errorf("pid %d still runs after Close", pid)
	}
	if p.PID() != 0 {
		t.Errorf("PID after Close = %d", p.PID())
	}
	if !strings.Contains(p.Log(), "Redis version") {
		t.Errorf("Log after Close lost the log:\n%s", p.Log())
	}
	if err := p.Kill(); err != nil {
		t.Errorf("Kill after Close: %v", err)
	}
	if err := p.Restart(ctxTimeout(t, 5*time.Second)); err == nil {
		t.Error("Restart after Close succeeded")
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestKillRestartKeepsPort(t *testing.T) {
	redistest.Require(t)
	t.Parallel()
	p := start(t, redisproc.Config{})
	port, pid := p.Port(), p.PID()
	do(t, p, "SET", "k", "v")

	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := p.Kill(); err != nil {
		t.Fatalf("second Kill: %v", err)
	}
	if p.PID() != 0 {
		t.Errorf("PID after Kill = %d", p.PID())
	}
	if !processGone(pid) {
		t.Errorf("pid %d still runs after Kill", pid)
	}
	if err := ping(p, time.Second); err == nil {
		t.Error("Ping answered after Kill")
	}
	if err := p.Pause(); err == nil {
		t.Error("Pause of a killed server succeeded")
	}

	if err := p.Restart(ctxTimeout(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if p.Port() != port {
		t.Errorf("port %d after Restart, was %d", p.Port(), port)
	}
	if p.PID() == pid || p.PID() == 0 {
		t.Errorf("PID %d after Restart, was %d", p.PID(), pid)
	}
	if got := do(t, p, "GET", "k"); got != "" {
		t.Errorf("GET after Restart = %q, want no data (no persistence)", got)
	}
	// Restart of a running server kills it first.
	pid = p.PID()
	if err := p.Restart(ctxTimeout(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if p.PID() == pid || !processGone(pid) {
		t.Errorf("second Restart: PID %d, old %d gone: %v", p.PID(), pid, processGone(pid))
	}
	if err := ping(p, 5*time.Second); err != nil {
		t.Errorf("Ping after Restart: %v", err)
	}
}

// TestRestartWaitsForTakenPort takes the port while the server is down: Restart, which cannot
// move to another port, must keep trying until the port is free again.
func TestRestartWaitsForTakenPort(t *testing.T) {
	redistest.Require(t)
	t.Parallel()
	p := start(t, redisproc.Config{})
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", p.Addr())
	if err != nil {
		t.Skipf("cannot take the port for the test: %v", err)
	}
	released := time.AfterFunc(150*time.Millisecond, func() { ln.Close() })
	defer released.Stop()
	if err := p.Restart(ctxTimeout(t, 30*time.Second)); err != nil {
		t.Fatalf("Restart while the port was taken for a moment: %v", err)
	}
	if err := ping(p, 5*time.Second); err != nil {
		t.Errorf("Ping after Restart: %v", err)
	}
	if !strings.Contains(p.Log(), "ddress already in use") {
		t.Logf("the log shows no lost bind (the port was free again before the first try?):\n%s", redisproc.Tail(p.Log(), 2<<10))
	}
}

func TestPauseResume(t *testing.T) {
	redistest.Require(t)
	t.Parallel()
	p := start(t, redisproc.Config{})
	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := ping(p, 300*time.Millisecond); err == nil {
		t.Error("a paused server answered")
	}
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := ping(p, 5*time.Second); err != nil {
		t.Errorf("Ping after Resume: %v", err)
	}
}

func TestStop(t *testing.T) {
	redistest.Require(t)
	t.Parallel()
	p := start(t, redisproc.Config{})
	pid := p.PID()
	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	// A paused server is resumed to hear SIGTERM.
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if p.PID() != 0 || !processGone(pid) {
		t.Errorf("after Stop: PID %d, pid %d gone: %v", p.PID(), pid, processGone(pid))
	}
	if !strings.Contains(p.Log(), "ready to exit") {
		t.Errorf("log shows no orderly shutdown:\n%s", redisproc.Tail(p.Log(), 2<<10))
	}
	if err := p.Stop(time.Second); err != nil {
		t.Errorf("Stop of a stopped server: %v", err)
	}
	if err := p.Restart(ctxTimeout(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
}

func TestConfigFileAndExtraPorts(t *testing.T) {
	redistest.Require(t)
	t.Parallel()
	var seen []redisproc.Ports
	p, err := redisproc.New(redisproc.Config{
		ExtraPorts: 2,
		ConfigFile: "extra.conf", // in Dir, written before Start
		ArgsFunc: func(ports redisproc.Ports) []string {
			seen = append(seen, ports)
			return []string{"--databases", strconv.Itoa(len(seen) + 3)}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := os.WriteFile(filepath.Join(p.Dir(), "extra.conf"), []byte("maxclients 77\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctxTimeout(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctxTimeout(t, 5*time.Second)); err == nil {
		t.Error("a second Start succeeded")
	}
	ports := p.Ports()
	all := append([]int{ports.Port}, ports.Extra...)
	slices.Sort(all)
	if len(ports.Extra) != 2 || slices.Compact(all)[0] == 0 || len(slices.Compact(all)) != 3 {
		t.Errorf("Ports = %+v, want three distinct ports", ports)
	}
	if got := do(t, p, "CONFIG", "GET", "maxclients"); got != "maxclients\n77" {
		t.Errorf("CONFIG GET maxclients = %q: ConfigFile not read", got)
	}
	if got := do(t, p, "CONFIG", "GET", "databases"); got != "databases\n4" {
		t.Errorf("CONFIG GET databases = %q: ArgsFunc not applied", got)
	}
	if err := p.Restart(ctxTimeout(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	// ArgsFunc is asked again at every start, with the same ports.
	if got := do(t, p, "CONFIG", "GET", "databases"); got != "databases\n5" {
		t.Errorf("after Restart, CONFIG GET databases = %q", got)
	}
	if len(seen) != 2 || seen[1].Port != ports.Port || !slices.Equal(seen[1].Extra, ports.Extra) {
		t.Errorf("ArgsFunc saw %+v, want twice %+v", seen, ports)
	}
}

func TestBadArgsFailFast(t *testing.T) {
	redistest.Require(t)
	t.Parallel()
	begin := time.Now()
	_, err := redisproc.Start(ctxTimeout(t, 30*time.Second), redisproc.Config{Args: []string{"--no-such-option", "1"}})
	if err == nil {
		t.Fatal("Start with a bad option succeeded")
	}
	if !strings.Contains(err.Error(), "no-such-option") {
		t.Errorf("error does not quote the server's complaint: %v", err)
	}
	if el := time.Since(begin); el > 5*time.Second {
		t.Errorf("failing start took %v", el)
	}
}

func TestCanceledStart(t *testing.T) {
	redistest.Require(t)
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := redisproc.Start(ctx, redisproc.Config{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Start with a canceled context: %v", err)
	}
}

func TestNotFound(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if _, err := redisproc.LookPath(); !errors.Is(err, redisproc.ErrNotFound) {
		t.Errorf("LookPath: %v, want ErrNotFound", err)
	}
	if _, err := redisproc.Start(context.Background(), redisproc.Config{}); !errors.Is(err, redisproc.ErrNotFound) {
		t.Errorf("Start: %v, want ErrNotFound", err)
	}
}
