// Package redistest runs real redis-server processes for tests and puts a
// fault-injecting TCP proxy in front of them.
//
// Every server listens on its own free 127.0.0.1 port and lives in its own
// temporary directory without persistence; package internal/redisproc runs
// the processes. Every goroutine the package starts has exited once the
// matching Close (or testing.TB cleanup) has returned, so callers can check
// for leaks with go.uber.org/goleak.
//
// Under go test -short, tests that need a server skip when no redis-server is
// on PATH (Start, NewCluster and NewSentinel do it themselves; see Require for
// the others), and the deployments that are slow to set up (Cluster, Sentinel,
// TLS) skip even when it is there. Without -short nothing skips: a missing
// redis-server fails every test that needs one.
//
// The package targets Linux (it relies on SIGSTOP/SIGCONT and Pdeathsig).
package redistest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redisproc"
)

// ErrNotFound is returned (wrapped) by StartProcess when no redis-server
// binary can be found on PATH.
var ErrNotFound = redisproc.ErrNotFound

const defaultStartTimeout = redisproc.DefaultStartTimeout

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

	proc     *redisproc.Process
	password string     // last --requirepass in args, used by Do
	tls      *tlsFiles  // non-nil: TLS only (WithTLS)
	cluster  bool       // cluster mode, on the process's extra (bus) port
	sentinel bool       // runs as a Sentinel (Dir/sentinel.conf)
	umu      sync.Mutex // guards the four fields below (not s.mu: Restart holds that long)
	urlUser  string     // user and password URL puts in the URL (SetURLUser)
	urlPass  string
	doUser   string // user and password Do logs in as (SetDoUser)
	doPass   string

	mu     sync.Mutex // serializes Kill, Restart and Close; guards args
	args   []string   // extra arguments from WithArgs (Sentinel's Failover changes them)
	closed bool
}

// Start starts a server like StartProcess and registers tb.Cleanup to close
// it. On failure it calls tb.Fatalf; if the test has failed by cleanup time,
// the server's log is logged before it is removed. Under -short it skips tb
// instead when redis-server is not found, and always for a TLS server
// (WithTLS).
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.tls {
		skipSlow(tb, "a TLS server")
	}
	s, err := StartProcess(opts...)
	if err != nil {
		skipMissing(tb, err)
		tb.Fatalf("redistest: %v", err)
		return nil
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("redis-server %s log (tail):\n%s", s.Addr, redisproc.Tail(s.Log(), 8<<10))
		}
		if err := s.Close(); err != nil {
			tb.Errorf("redistest: close %s: %v", s.Addr, err)
		}
	})
	return s
}

// Require skips tb under -short when no redis-server is on PATH, so that
// go test -short runs the tests that need no server on a machine without one.
// Without -short it does nothing, and a missing redis-server fails the test
// where it starts one, as it must in a full run. Start, NewCluster and
// NewSentinel need no Require; a test that starts servers otherwise
// (StartProcess, package redisproc) calls it first.
func Require(tb testing.TB) {
	tb.Helper()
	if !testing.Short() {
		return
	}
	if _, err := redisproc.LookPath(); err != nil {
		skipMissing(tb, err)
	}
}

// skipMissing skips tb under -short when err says that redis-server was not
// found.
func skipMissing(tb testing.TB, err error) {
	tb.Helper()
	if testing.Short() && errors.Is(err, ErrNotFound) {
		tb.Skipf("redistest: -short, and %v", err)
	}
}

// skipSlow skips tb under -short: the deployments that start several processes
// or take seconds to set up are left to full runs.
func skipSlow(tb testing.TB, what string) {
	tb.Helper()
	if testing.Short() {
		tb.Skipf("redistest: -short skips tests that start %s", what)
	}
}

// StartProcess starts redis-server on a free loopback port in a new temporary
// directory, without persistence, and returns once it answers commands. The
// caller must call Close. If no binary is found the error wraps ErrNotFound.
func StartProcess(opts ...Option) (*Server, error) {
	cfg := config{startTimeout: defaultStartTimeout}
	for _, o := range opts {
		o(&cfg)
	}
	s := &Server{
		args:     cfg.args,
		password: passwordFrom(cfg.args),
		cluster:  cfg.cluster,
	}
	pcfg := redisproc.Config{
		Bin:          cfg.bin,
		DirPrefix:    "redistest-",
		ArgsFunc:     s.launchArgs,
		Ready:        s.ready,
		StartTimeout: cfg.startTimeout,
	}
	if cfg.cluster {
		pcfg.ExtraPorts = 1 // the cluster bus
	}
	if cfg.sentinelConf != "" {
		pcfg.ConfigFile = sentinelConfName // in Dir, written by prepare
	}
	p, err := redisproc.New(pcfg)
	if errors.Is(err, ErrNotFound) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	s.proc, s.Dir = p, p.Dir()
	if err := s.prepare(&cfg); err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("redistest: %w", err)
	}
	// A port lost to another process between its pick and redis-server's bind
	// is retried on other ports by redisproc.
	if err := p.Start(context.Background()); err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("redistest: start redis-server: %w", err)
	}
	s.Port, s.Addr = p.Port(), p.Addr()
	return s, nil
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
func (s *Server) PID() int { return s.proc.PID() }

// Close kills the server, reaps it and removes Dir. It is idempotent; after
// it returns, Log still returns the final log.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if err := s.proc.Close(); err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	return nil
}

// Kill sends SIGKILL and returns once the process has been reaped. The server
// stays down until Restart. Killing a server that is down is a no-op.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc.Kill()
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
	if err := s.proc.Kill(); err != nil {
		return fmt.Errorf("redistest: restart: %w", err)
	}
	if err := s.clearData(); err != nil {
		return fmt.Errorf("redistest: restart: %w", err)
	}
	// The port cannot change: redisproc waits out a process that took it.
	if err := s.proc.Restart(context.Background()); err != nil {
		return fmt.Errorf("redistest: restart on port %d: %w", s.Port, err)
	}
	return nil
}

// Pause stops the process with SIGSTOP: connections are still accepted by the
// kernel but nothing is answered until Resume.
func (s *Server) Pause() error {
	if err := s.proc.Pause(); err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	return nil
}

// Resume continues a paused process with SIGCONT.
func (s *Server) Resume() error {
	if err := s.proc.Resume(); err != nil {
		return fmt.Errorf("redistest: %w", err)
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
func (s *Server) target() target { return s.targetAt(s.Addr) }

// targetAt is how Do would reach the server if it listened on addr.
func (s *Server) targetAt(addr string) target {
	t := target{addr: addr, password: s.password}
	if s.tls != nil {
		t.tls = s.tls.client
	}
	return t
}

// Log returns the server's log file followed by anything it wrote to stdout
// or stderr, for printing when a test fails.
func (s *Server) Log() string { return s.proc.Log() }

// launchArgs returns the arguments for a start on ports, after redisproc's
// defaults (which they override). Called by redisproc before every start:
// before s is shared, or with s.mu held (Restart).
func (s *Server) launchArgs(ports redisproc.Ports) []string {
	var args []string
	if s.sentinel {
		args = append(args, "--sentinel")
	}
	if s.tls != nil {
		args = append(args, "--port", "0", "--tls-port", strconv.Itoa(ports.Port),
			"--tls-cert-file", s.tls.certFile, "--tls-key-file", s.tls.keyFile,
			"--tls-ca-cert-file", s.tls.caFile, "--tls-auth-clients", "no")
	}
	if s.cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(ports.Extra[0]),
			"--cluster-config-file", "nodes.conf")
	}
	return append(args, s.args...)
}

// ready reports whether the server answering on addr is ready and is the
// process pid (so a stranger that won the port race is not mistaken for it),
// speaking TLS and logging in as Do does.
func (s *Server) ready(ctx context.Context, addr string, pid int) error {
	t := s.targetAt(addr)
	s.umu.Lock()
	if s.doUser != "" {
		t.user, t.password = s.doUser, s.doPass
	}
	s.umu.Unlock()
	info, err := do(ctx, t, []string{"INFO", "server"})
	if err != nil {
		var re *Error
		if !errors.As(err, &re) {
			return err // not listening yet
		}
		if strings.HasPrefix(re.Msg, "LOADING") || strings.HasPrefix(re.Msg, "BUSY") {
			return err
		}
		// It speaks Redis but refuses INFO (e.g. ACL rules from WithArgs):
		// accept it, since the pid cannot be checked.
		return nil
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			if v == strconv.Itoa(pid) {
				return nil
			}
			return fmt.Errorf("%s is served by pid %s, not %d", addr, v, pid)
		}
	}
	return nil
}

// clearData removes everything in Dir except the logs, so that a restarted
// server comes up empty even if WithArgs enabled persistence.
func (s *Server) clearData() error {
	entries, err := os.ReadDir(s.Dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		switch e.Name() {
		case redisproc.LogFile, redisproc.StdioFile, tlsDirName, sentinelConfName:
			continue
		}
		if err := os.RemoveAll(filepath.Join(s.Dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
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
