// Package redisproc runs redis-server child processes: each on free loopback ports, in a
// private directory, without persistence. It starts one, waits until it answers, and stops,
// kills, pauses, resumes and restarts it.
//
// It is the launcher shared by the test helper internal/redistest, the bench module and the
// dlock demo command. It depends on the standard library only. On Linux a child is killed by
// the kernel when the process that started it dies (Pdeathsig); pausing needs a Unix system.
package redisproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// ErrNotFound is returned (wrapped) by LookPath, New and Start when no redis-server binary
// can be found on PATH.
var ErrNotFound = errors.New("redis-server not found on PATH; install it with: apt-get install -y redis-server")

// errExited marks a start in which the child exited before it was ready, typically because
// another process bound the port between the pick and redis-server's own bind.
var errExited = errors.New("redis-server exited before it was ready")

var errClosed = errors.New("redis-server process is closed")

// File names in Process.Dir.
const (
	LogFile   = "redis.log" // written by redis-server itself (--logfile)
	StdioFile = "stdio.log" // the child's stdout and stderr: errors from before logging starts
)

const (
	// DefaultStartTimeout bounds each wait for a start to answer unless Config says otherwise.
	DefaultStartTimeout = 10 * time.Second
	// startAttempts bounds the starts tried when the child exits before it is ready: with
	// fresh ports each time for Start, on the same ports (after a pause) for Restart.
	startAttempts = 5
	// logTail is how much of the log an error quotes.
	logTail = 8 << 10
)

// Ports are the loopback ports of one process. Start picks them; Restart keeps them.
type Ports struct {
	Port  int   // what redis-server listens on (--port)
	Extra []int // Config.ExtraPorts further ports, all distinct, e.g. a cluster bus port
}

// Config says how to run redis-server. The command line is:
//
//	redis-server [ConfigFile] --port PORT --bind 127.0.0.1 --dir DIR --save "" --appendonly no
//	    --logfile DIR/redis.log --daemonize no --protected-mode no Args... ArgsFunc(ports)...
//
// Later arguments override earlier ones in redis-server, so Args and ArgsFunc may replace
// any default (for example "--port 0 --tls-port PORT" for a TLS-only server).
type Config struct {
	// Bin is the redis-server executable; empty looks "redis-server" up on PATH.
	Bin string
	// DirPrefix starts the name of the private temporary directory (default "redisproc-").
	DirPrefix string
	// ConfigFile, when set, is passed as the first argument: a configuration file that
	// redis-server reads before the options (a Sentinel's sentinel.conf, say). A relative
	// path is in Dir, the child's working directory, where New lets the caller write it.
	ConfigFile string
	// Args are extra arguments, after the defaults.
	Args []string
	// ArgsFunc, when set, is called before every start (so a Restart sees what changed
	// since) and its arguments come last. It is called with the process's lock held: it must
	// not call the Process's methods.
	ArgsFunc func(Ports) []string
	// ExtraPorts is how many more free loopback ports to pick besides Port.
	ExtraPorts int
	// Ready reports whether the server started as process pid answers on addr (nil: ready),
	// and is called until it does, the child exits or StartTimeout passes; each call gets a
	// context bounded to at most a second. Nil means Ping. It is called with the process's
	// lock held: it must not call the Process's methods.
	Ready func(ctx context.Context, addr string, pid int) error
	// StartTimeout bounds each wait for a start to answer (default DefaultStartTimeout).
	StartTimeout time.Duration
	// OwnProcessGroup puts the child in a process group of its own, so that a Ctrl-C at the
	// terminal reaches only this program, which then stops the child itself (Unix).
	OwnProcessGroup bool
}

// Process is one redis-server child process and its private directory. Its methods are safe
// for concurrent use; a start (Start, Restart) holds the process's lock until the server
// answers, so calls made meanwhile wait for it.
type Process struct {
	cfg  Config
	bin  string
	dir  string
	addr string // "127.0.0.1:PORT" once started

	mu       sync.Mutex
	ports    Ports  // zero until a Start succeeded
	child    *child // nil while the server is down
	closed   bool
	finalLog string // the log read by Close before it removed dir
}

// child is one running redis-server; done is closed once it has been reaped.
type child struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // result of cmd.Wait, valid once done is closed
}

// LookPath returns the path of redis-server on PATH; its error wraps ErrNotFound.
func LookPath() (string, error) {
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("%w (%v)", ErrNotFound, err)
	}
	return p, nil
}

// New finds the binary and makes the private directory, without starting anything yet, so
// that files the server needs can be written into Dir first. The caller must call Close.
func New(cfg Config) (*Process, error) {
	bin := cfg.Bin
	if bin == "" {
		var err error
		if bin, err = LookPath(); err != nil {
			return nil, err
		}
	}
	prefix := cfg.DirPrefix
	if prefix == "" {
		prefix = "redisproc-"
	}
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, err
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	if cfg.Ready == nil {
		cfg.Ready = Ping
	}
	cfg.Args = append([]string(nil), cfg.Args...)
	return &Process{cfg: cfg, bin: bin, dir: dir}, nil
}

// Start is New followed by Process.Start; on failure nothing is left behind.
func Start(ctx context.Context, cfg Config) (*Process, error) {
	p, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if err := p.Start(ctx); err != nil {
		_ = p.Close()
		return nil, err
	}
	return p, nil
}

// Start picks free loopback ports and starts the server, returning once it answers (see
// Config.Ready). A port is free when it is picked but another process may bind it before
// redis-server does; redis-server then exits and Start tries again on other ports. On error
// no child is left running, and Start may be called again. It fails once a start succeeded:
// use Restart.
func (p *Process) Start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errClosed
	}
	if p.ports.Port != 0 {
		return errors.New("redis-server already started (Restart starts it again)")
	}
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(1 + p.cfg.ExtraPorts)
		if err != nil {
			return fmt.Errorf("pick free ports: %w", err)
		}
		p.ports = ports
		err = p.launchLocked(ctx)
		if err == nil {
			p.addr = hostPort(ports.Port)
			return nil
		}
		p.ports = Ports{}
		if !errors.Is(err, errExited) || attempt == startAttempts || ctx.Err() != nil {
			return err
		}
	}
}

// Restart starts the server again on the same ports and returns once it answers; a running
// server is killed first. Files in Dir are left as they are. The ports cannot change, so if
// another process took one meanwhile, Restart waits a little and tries again, a few times.
func (p *Process) Restart(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errClosed
	}
	if p.ports.Port == 0 {
		return errors.New("redis-server was never started")
	}
	p.killLocked()
	var err error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		if err = p.launchLocked(ctx); err == nil || !errors.Is(err, errExited) || attempt == startAttempts {
			break
		}
		t := time.NewTimer(time.Duration(attempt) * 50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (after: %v)", ctx.Err(), err)
		case <-t.C:
		}
	}
	return err
}

// Addr returns "127.0.0.1:PORT", or "" before the first successful Start.
func (p *Process) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// Port returns the port the server listens on (0 before the first successful Start).
func (p *Process) Port() int { return p.Ports().Port }

// Ports returns the process's ports (zero before the first successful Start).
func (p *Process) Ports() Ports {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Ports{Port: p.ports.Port, Extra: append([]int(nil), p.ports.Extra...)}
}

// Dir returns the private directory: the server's working directory and where its logs are.
// Close removes it.
func (p *Process) Dir() string { return p.dir }

// PID returns the process id of the running child, or 0 while it is down.
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.child == nil {
		return 0
	}
	return p.child.cmd.Process.Pid
}

// Kill sends SIGKILL and returns once the child has been reaped. The server stays down until
// Restart. Killing a server that is down, or closed, does nothing.
func (p *Process) Kill() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.killLocked()
	return nil
}

// Stop asks the server to shut down (SIGTERM; a paused one is resumed to hear it) and waits
// for it to exit; after timeout it kills it. It returns once the child has been reaped. Like
// Kill, it leaves the server down until Restart. Where there are no Unix signals it kills.
func (p *Process) Stop(timeout time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.child
	if c == nil {
		return nil
	}
	err := terminate(c.cmd.Process)
	if errors.Is(err, os.ErrProcessDone) {
		err = nil // it has exited by itself
	}
	if err == nil {
		t := time.NewTimer(timeout)
		select {
		case <-c.done:
		case <-t.C:
			err = fmt.Errorf("redis-server on %s did not exit within %v of SIGTERM; killed", p.addr, timeout)
		}
		t.Stop()
	}
	p.killLocked()
	return err
}

// Pause stops the child with SIGSTOP: the kernel still accepts connections, but nothing is
// answered until Resume.
func (p *Process) Pause() error { return p.signal("pause", pause) }

// Resume continues a paused child with SIGCONT.
func (p *Process) Resume() error { return p.signal("resume", resume) }

func (p *Process) signal(what string, send func(*os.Process) error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.child == nil {
		return fmt.Errorf("%s: redis-server %s is not running", what, p.addr)
	}
	if err := send(p.child.cmd.Process); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// Log returns the server's log file followed by anything it wrote to stdout or stderr. After
// Close it returns the log as it was when Close removed Dir.
func (p *Process) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return p.finalLog
	}
	return p.readLog()
}

// Close kills the child, reaps it and removes Dir. It is idempotent; afterwards Log still
// returns the final log.
func (p *Process) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	p.killLocked()
	p.finalLog = p.readLog()
	return os.RemoveAll(p.dir)
}

func (p *Process) readLog() string {
	logText, _ := os.ReadFile(filepath.Join(p.dir, LogFile))
	stdio, _ := os.ReadFile(filepath.Join(p.dir, StdioFile))
	if len(stdio) == 0 {
		return string(logText)
	}
	return string(logText) + "\n--- stdout/stderr ---\n" + string(stdio)
}

// launchLocked starts the child on p.ports and waits until it is ready. On error no child is
// left running. Called with p.mu held.
func (p *Process) launchLocked(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var args []string
	if p.cfg.ConfigFile != "" {
		args = append(args, p.cfg.ConfigFile)
	}
	args = append(args,
		"--port", strconv.Itoa(p.ports.Port),
		"--bind", "127.0.0.1",
		"--dir", p.dir,
		"--save", "",
		"--appendonly", "no",
		"--logfile", filepath.Join(p.dir, LogFile),
		"--daemonize", "no",
		"--protected-mode", "no",
	)
	args = append(args, p.cfg.Args...)
	if p.cfg.ArgsFunc != nil {
		args = append(args, p.cfg.ArgsFunc(Ports{Port: p.ports.Port, Extra: append([]int(nil), p.ports.Extra...)})...)
	}

	// An *os.File as Stdout and Stderr goes to the child as it is: exec starts no goroutine
	// to copy its output.
	stdio, err := os.OpenFile(filepath.Join(p.dir, StdioFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, args...)
	cmd.Dir = p.dir
	cmd.Stdout = stdio
	cmd.Stderr = stdio
	cmd.SysProcAttr = sysProcAttr(p.cfg.OwnProcessGroup)
	err = cmd.Start()
	_ = stdio.Close()
	if err != nil {
		return fmt.Errorf("start %s: %w", p.bin, err)
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	p.child = c
	if err := p.waitReady(ctx, c); err != nil {
		p.killLocked()
		return err
	}
	return nil
}

// waitReady polls Config.Ready until it reports the server ready, the child exits
// (errExited), ctx ends or the start timeout passes.
func (p *Process) waitReady(ctx context.Context, c *child) error {
	addr := hostPort(p.ports.Port)
	pid := c.cmd.Process.Pid
	wctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer cancel()
	backoff := 2 * time.Millisecond
	var lastErr error
	for {
		select {
		case <-c.done:
			return fmt.Errorf("%w on %s (%v); log tail:\n%s", errExited, addr, c.err, Tail(p.readLog(), logTail))
		default:
		}
		// A probe may block on a listener that is not the child's (one that won the race for
		// the port): it ends when the child exits.
		pctx, pcancel := context.WithTimeout(wctx, time.Second)
		go func() {
			select {
			case <-c.done:
				pcancel()
			case <-pctx.Done():
			}
		}()
		err := p.cfg.Ready(pctx, addr, pid)
		pcancel()
		if err == nil {
			return nil
		}
		lastErr = err
		t := time.NewTimer(backoff)
		select {
		case <-c.done:
		case <-wctx.Done():
		case <-t.C:
		}
		t.Stop()
		if ctx.Err() != nil {
			return fmt.Errorf("redis-server on %s: %w", addr, ctx.Err())
		}
		if wctx.Err() != nil {
			return fmt.Errorf("redis-server on %s not ready after %v (last error: %v); log tail:\n%s",
				addr, p.cfg.StartTimeout, lastErr, Tail(p.readLog(), logTail))
		}
		backoff = min(backoff*2, 100*time.Millisecond)
	}
}

// killLocked kills and reaps the child if there is one. Called with p.mu held.
func (p *Process) killLocked() {
	c := p.child
	if c == nil {
		return
	}
	p.child = nil
	select {
	case <-c.done:
		return
	default:
	}
	// SIGKILL also ends a process stopped by Pause. The only possible error is that it has
	// exited already, which the wait covers.
	_ = c.cmd.Process.Kill()
	<-c.done
}

// freePorts returns n distinct loopback TCP ports that were free a moment ago: all are held
// open together while they are picked, so none can come up twice.
func freePorts(n int) (Ports, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	var ports Ports
	for i := 0; i < n; i++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return Ports{}, err
		}
		lns = append(lns, ln)
		port := ln.Addr().(*net.TCPAddr).Port
		if i == 0 {
			ports.Port = port
		} else {
			ports.Extra = append(ports.Extra, port)
		}
	}
	return ports, nil
}

func hostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// Tail returns the last n bytes of s, marked with a leading "..." when cut.
func Tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
