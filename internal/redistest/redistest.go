// Package redistest runs real redis-server processes for tests and puts a
// fault-injecting TCP proxy in front of them.
//
// Every server listens on its own free 127.0.0.1 port and lives in its own
// temporary directory without persistence. Every goroutine the package starts
// has exited once the matching Close (or testing.TB cleanup) has returned, so
// callers can check for leaks with go.uber.org/goleak.
//
// The package targets Linux (it relies on SIGSTOP/SIGCONT and Pdeathsig).
package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ErrNotFound is returned (wrapped) by StartProcess when no redis-server
// binary can be found on PATH.
var ErrNotFound = errors.New("redis-server not found on PATH; install it with: apt-get install -y redis-server")

// errExited marks a start attempt in which the child exited before it became
// ready, typically because another process took the port first.
var errExited = errors.New("redis-server exited before it was ready")

const (
	logName   = "redis.log" // written by redis-server itself (--logfile)
	stdioName = "stdio.log" // the child's stdout and stderr (start-up errors)

	defaultStartTimeout = 10 * time.Second
	startAttempts       = 5
)

type config struct {
	args         []string
	bin          string
	startTimeout time.Duration
	tls          bool   // WithTLS
	cluster      bool   // cluster mode, with a second free port for the bus
	sentinelConf string // sentinel mode: the initial sentinel.conf
}

// Option configures StartProcess and Start.
type Option func(*config)

// WithArgs appends extra redis-server command-line arguments, for example
// WithArgs("--requirepass", "x"). They come after the defaults, so they
// override them. If they set --requirepass, Server.Do authenticates with it.
func WithArgs(args ...string) Option {
	return func(c *config) { c.args = append(c.args, args...) }
}

// WithBinary runs the given redis-server executable instead of looking it up
// on PATH.
func WithBinary(path string) Option {
	return func(c *config) { c.bin = path }
}

// WithStartTimeout bounds how long StartProcess and Restart wait for the
// server to answer (default 10s).
func WithStartTimeout(d time.Duration) Option {
	return func(c *config) { c.startTimeout = d }
}

// Server is one redis-server child process listening on 127.0.0.1:Port.
// Its methods are safe for concurrent use.
type Server struct {
	Addr string // "127.0.0.1:PORT"
	Port int
	Dir  string // its working directory (temporary, removed by Close)

	bin      string
	args     []string // extra arguments from WithArgs
	password string   // last --requirepass in args, used by Do
	timeout  time.Duration
	tls      *tlsFiles  // non-nil: TLS only (WithTLS)
	busPort  int        // cluster bus port, 0 unless in cluster mode
	sentinel bool       // runs as a Sentinel (Dir/sentinel.conf)
	umu      sync.Mutex // guards the four fields below (not s.mu: Restart holds that long)
	urlUser  string     // user and password URL puts in the URL (SetURLUser)
	urlPass  string
	doUser   string // user and password Do logs in as (SetDoUser)
	doPass   string

	mu       sync.Mutex
	proc     *process // nil while the server is down
	closed   bool
	finalLog string // log captured by Close before Dir was removed
}

// process is one running child; done is closed once it has been reaped.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // result of cmd.Wait, valid after done is closed
}

// Start starts a server like StartProcess and registers tb.Cleanup to close
// it. On failure it calls tb.Fatalf; if the test has failed by cleanup time,
// the server's log is logged before it is removed.
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	s, err := StartProcess(opts...)
	if err != nil {
		tb.Fatalf("redistest: %v", err)
		return nil
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("redis-server %s log (tail):\n%s", s.Addr, tail(s.Log(), 8<<10))
		}
		if err := s.Close(); err != nil {
			tb.Errorf("redistest: close %s: %v", s.Addr, err)
		}
	})
	return s
}

// StartProcess starts redis-server on a free loopback port in a new temporary
// directory, without persistence, and returns once it answers commands. The
// caller must call Close. If no binary is found the error wraps ErrNotFound.
func StartProcess(opts ...Option) (*Server, error) {
	cfg := config{startTimeout: defaultStartTimeout}
	for _, o := range opts {
		o(&cfg)
	}
	bin := cfg.bin
	if bin == "" {
		p, err := exec.LookPath("redis-server")
		if err != nil {
			return nil, fmt.Errorf("%w (%v)", ErrNotFound, err)
		}
		bin = p
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	s := &Server{
		Dir:      dir,
		bin:      bin,
		args:     cfg.args,
		password: passwordFrom(cfg.args),
		timeout:  cfg.startTimeout,
	}
	if err := s.prepare(&cfg); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("redistest: %w", err)
	}
	// The port is free when freePort returns but another process may bind it
	// before redis-server does; redis then exits and we try another port.
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err == nil && cfg.cluster {
			s.busPort, err = freePort()
			if err == nil && s.busPort == port {
				err = fmt.Errorf("%w (bus port equals port)", errExited)
			}
		}
		if err == nil {
			s.Port = port
			s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			err = s.launch()
		}
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, errExited) || attempt == startAttempts {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("redistest: start redis-server: %w", err)
		}
	}
}

// URL returns "redis://127.0.0.1:PORT/0" ("rediss://" for a TLS server), with
// the user and password given to SetURLUser, if any.
func (s *Server) URL() string {
	s.umu.Lock()
	user, pass := s.urlUser, s.urlPass
	s.umu.Unlock()
	return s.URLAs(user, pass)
}

// URLAs returns the server's URL logging in as user with password (no
// credentials when user is empty).
func (s *Server) URLAs(user, password string) string {
	u := url.URL{Scheme: "redis", Host: s.Addr, Path: "/0"}
	if s.tls != nil {
		u.Scheme = "rediss"
	}
	if user != "" {
		u.User = url.UserPassword(user, password)
	}
	return u.String()
}

// SetURLUser makes URL carry user and password, so that clients dialling
// URL log in as that user. Do keeps using the default user.
func (s *Server) SetURLUser(user, password string) {
	s.umu.Lock()
	defer s.umu.Unlock()
	s.urlUser, s.urlPass = user, password
}

// PID returns the process id of the running child, or 0 while it is down.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.cmd.Process.Pid
}

// Close kills the server, reaps it and removes Dir. It is idempotent; after
// it returns, Log still returns the final log.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.killLocked()
	s.finalLog = s.readLog()
	if err := os.RemoveAll(s.Dir); err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	return nil
}

// Kill sends SIGKILL and returns once the process has been reaped. The server
// stays down until Restart. Killing a server that is down is a no-op.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
	return nil
}

// Restart starts the server again on the same port with an empty data set
// and returns once it answers. A running server is killed first. Users made
// with SetUser are gone (those of ACLUserArgs come back); a cluster node
// comes back as a new node outside the cluster (its nodes.conf is removed).
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("redistest: restart: server is closed")
	}
	s.killLocked()
	if err := s.clearData(); err != nil {
		return fmt.Errorf("redistest: restart: %w", err)
	}
	// The port cannot change, so a lost race for it can only be waited out.
	var err error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		if err = s.launch(); err == nil || !errors.Is(err, errExited) {
			break
		}
		time.Sleep(time.Duration(attempt) * 50 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("redistest: restart on port %d: %w", s.Port, err)
	}
	return nil
}

// Pause stops the process with SIGSTOP: connections are still accepted by the
// kernel but nothing is answered until Resume.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume continues a paused process with SIGCONT.
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return fmt.Errorf("redistest: %v: server %s is not running", sig, s.Addr)
	}
	if err := s.proc.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("redistest: %v: %w", sig, err)
	}
	return nil
}

// Do sends one command over a fresh connection and returns the reply as
// text (see package Do). It logs in as the user given to SetDoUser, else, if
// the server was started with --requirepass, as the default user with it.
// Against a TLS server (WithTLS) it speaks TLS.
func (s *Server) Do(ctx context.Context, args ...string) (string, error) {
	s.umu.Lock()
	t := s.target()
	t.user, t.password = s.doUser, s.doPass
	if t.user == "" {
		t.password = s.password
	}
	s.umu.Unlock()
	return do(ctx, t, args)
}

// target is how Do reaches the server.
func (s *Server) target() target {
	t := target{addr: s.Addr, password: s.password}
	if s.tls != nil {
		t.tls = s.tls.client
	}
	return t
}

// Log returns the server's log file followed by anything it wrote to stdout
// or stderr, for printing when a test fails.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.finalLog
	}
	return s.readLog()
}

func (s *Server) readLog() string {
	logText, _ := os.ReadFile(filepath.Join(s.Dir, logName))
	stdio, _ := os.ReadFile(filepath.Join(s.Dir, stdioName))
	if len(stdio) == 0 {
		return string(logText)
	}
	return string(logText) + "\n--- stdout/stderr ---\n" + string(stdio)
}

// launch starts the child on s.Port and waits until it is ready. On error no
// child is left running. Called with s.mu held or before s is shared.
func (s *Server) launch() error {
	var args []string
	if s.sentinel {
		args = append(args, filepath.Join(s.Dir, sentinelConfName), "--sentinel")
	}
	if s.tls != nil {
		args = append(args, "--port", "0", "--tls-port", strconv.Itoa(s.Port),
			"--tls-cert-file", s.tls.certFile, "--tls-key-file", s.tls.keyFile,
			"--tls-ca-cert-file", s.tls.caFile, "--tls-auth-clients", "no")
	} else {
		args = append(args, "--port", strconv.Itoa(s.Port))
	}
	if s.busPort != 0 {
		args = append(args, "--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(s.busPort),
			"--cluster-config-file", "nodes.conf")
	}
	args = append(args,
		"--bind", "127.0.0.1",
		"--dir", s.Dir,
		"--save", "",
		"--appendonly", "no",
		"--logfile", filepath.Join(s.Dir, logName),
		"--daemonize", "no",
		"--protected-mode", "no",
	)
	args = append(args, s.args...)

	// An *os.File as Stdout/Stderr is handed to the child directly, so exec
	// starts no copying goroutine.
	stdio, err := os.OpenFile(filepath.Join(s.Dir, stdioName), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.Dir
	cmd.Stdout = stdio
	cmd.Stderr = stdio
	cmd.SysProcAttr = sysProcAttr()
	err = cmd.Start()
	_ = stdio.Close()
	if err != nil {
		return err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	s.proc = p
	if err := s.waitReady(p); err != nil {
		s.killLocked()
		return err
	}
	return nil
}

// waitReady polls until the server on s.Addr is our child and answers, the
// child exits (errExited), or the start timeout passes.
func (s *Server) waitReady(p *process) error {
	deadline := time.Now().Add(s.timeout)
	backoff := 2 * time.Millisecond
	var lastErr error
	for {
		select {
		case <-p.done:
			return fmt.Errorf("%w (%v); log:\n%s", errExited, p.err, s.readLog())
		default:
		}
		ok, err := s.probe(p.cmd.Process.Pid, deadline)
		if ok {
			return nil
		}
		lastErr = err
		if !time.Now().Add(backoff).Before(deadline) {
			return fmt.Errorf("redis-server on %s not ready after %v (last error: %v); log:\n%s",
				s.Addr, s.timeout, lastErr, s.readLog())
		}
		t := time.NewTimer(backoff)
		select {
		case <-p.done:
			t.Stop()
		case <-t.C:
		}
		backoff = min(backoff*2, 100*time.Millisecond)
	}
}

// probe reports whether the server answering on s.Addr is ready and is the
// process pid (so a stranger that won the port race is not mistaken for it).
func (s *Server) probe(pid int, deadline time.Time) (bool, error) {
	if d := time.Now().Add(time.Second); d.Before(deadline) {
		deadline = d
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	t := s.target()
	s.umu.Lock()
	if s.doUser != "" {
		t.user, t.password = s.doUser, s.doPass
	}
	s.umu.Unlock()
	info, err := do(ctx, t, []string{"INFO", "server"})
	if err != nil {
		var re *Error
		if !errors.As(err, &re) {
			return false, err // not listening yet
		}
		if strings.HasPrefix(re.Msg, "LOADING") || strings.HasPrefix(re.Msg, "BUSY") {
			return false, err
		}
		// It speaks Redis but refuses INFO (e.g. ACL rules from WithArgs):
		// accept it, since the pid cannot be checked.
		return true, nil
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			if v == strconv.Itoa(pid) {
				return true, nil
			}
			return false, fmt.Errorf("port %d is served by pid %s, not %d", s.Port, v, pid)
		}
	}
	return true, nil
}

// killLocked kills and reaps the child if there is one. Called with s.mu held.
func (s *Server) killLocked() {
	p := s.proc
	if p == nil {
		return
	}
	s.proc = nil
	select {
	case <-p.done:
		return
	default:
	}
	// SIGKILL also ends a process stopped by Pause. The only possible error
	// is that it has already exited, which the wait below covers.
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// clearData removes everything in Dir except the logs, so that a restarted
// server comes up empty even if WithArgs enabled persistence.
func (s *Server) clearData() error {
	entries, err := os.ReadDir(s.Dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Name() == logName || e.Name() == stdioName || e.Name() == tlsDirName || e.Name() == sentinelConfName {
			continue
		}
		if err := os.RemoveAll(filepath.Join(s.Dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ln.Close(); err != nil {
		return 0, err
	}
	return port, nil
}

// passwordFrom returns the value of the last "--requirepass" in args.
func passwordFrom(args []string) string {
	pw := ""
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--requirepass" {
			pw = args[i+1]
		}
	}
	return pw
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
