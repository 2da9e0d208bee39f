package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/redact"
	"github.com/dlock-go/dlock/internal/redisproc"
)

// demoServer is the Redis server the demo runs against: one given with --redis, or a private
// one that the demo started and must stop.
type demoServer struct {
	url   string
	about string // for the "server:" line
	stop  func() // stops a private server; nil for an external one
}

const serverStartTimeout = 10 * time.Second

// openServer returns the server given by url, or, when url is empty, starts a private one: a
// redis-server child process when one is on PATH, else an embedded in-process server.
func openServer(ctx context.Context, url string) (*demoServer, error) {
	if url != "" {
		if err := pingURL(ctx, url, 5*time.Second); err != nil {
			return nil, &serverError{code: serverErrCode(err),
				msg: fmt.Sprintf("cannot use --redis %s: %s", redact.URL(url), redact.Text(err.Error(), urlPassword(url)))}
		}
		return &demoServer{url: url, about: "external server at " + redact.URL(url)}, nil
	}
	if bin, err := redisproc.LookPath(); err == nil {
		return startRedisServer(ctx, bin)
	}
	return startEmbedded()
}

// serverError is a --redis server the demo cannot use; msg shows no password.
type serverError struct {
	code int // exit code: see serverErrCode
	msg  string
}

func (e *serverError) Error() string { return e.msg }

// serverErrCode is the exit code for a failed ping of the --redis server, with the classes of
// the other commands: 2 for a bad URL, 77 when the server refuses the login or the command to
// the user, else 69.
func serverErrCode(err error) int {
	switch {
	case strings.HasPrefix(err.Error(), "bad redis url"): // newRedisClient's
		return exitUsage
	case redis.HasErrorPrefix(err, "WRONGPASS"), redis.HasErrorPrefix(err, "NOAUTH"), redis.HasErrorPrefix(err, "NOPERM"):
		return exitDenied
	}
	return exitNoServer
}

// urlPassword returns the password in the user info of a Redis URL ("" when none), found the
// way redact.URL finds it, so that a message quoting the URL (a parser's error) can be
// redacted with redact.Text even when the URL does not parse.
func urlPassword(s string) string {
	if _, rest, ok := strings.Cut(s, "://"); ok {
		s = rest
	}
	if end := strings.IndexAny(s, "/?#"); end >= 0 {
		s = s[:end]
	}
	at := strings.LastIndex(s, "@")
	if at < 0 {
		return ""
	}
	_, pass, _ := strings.Cut(s[:at], ":")
	return pass
}

// startRedisServer runs bin on a free loopback port, without persistence, in a temporary
// directory. The child is killed when the demo exits, and by the kernel if the demo dies
// (Linux). It has a process group of its own, so that a Ctrl-C reaches only the demo, which
// stops its workers and then the server in order.
func startRedisServer(ctx context.Context, bin string) (*demoServer, error) {
	ver := redisServerVersion(bin)
	p, err := redisproc.Start(ctx, redisproc.Config{
		Bin:             bin,
		DirPrefix:       "dlock-demo-redis-",
		Args:            []string{"--loglevel", "warning"},
		StartTimeout:    serverStartTimeout,
		OwnProcessGroup: true,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", bin, err)
	}
	return &demoServer{
		url:   "redis://" + p.Addr() + "/0",
		about: fmt.Sprintf("redis-server %s child on %s", ver, p.Addr()),
		stop:  func() { p.Close() },
	}, nil
}

func redisServerVersion(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "(unknown version)"
	}
	// "Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=..."
	for _, f := range strings.Fields(string(out)) {
		if v, ok := strings.CutPrefix(f, "v="); ok {
			return v
		}
	}
	return "(unknown version)"
}

// startEmbedded serves Redis from this process with miniredis, for machines without
// redis-server. Worker processes reach it over loopback like any server. miniredis speaks
// RESP3 (HELLO 3), so the default rueidis transport works with it; its keys expire by the
// wall clock only with ClockTTL, which the lock leases need.
func startEmbedded() (*demoServer, error) {
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("embedded server: %w", err)
	}
	// miniredis answers CLUSTER commands as a one-node cluster, which makes rueidis (and so
	// dlock) use sharded pub/sub, which miniredis lacks. Answer as a standalone server does.
	// It has no INFO memory section either, which dlock reads to check that the server never
	// evicts lock keys: miniredis has no memory limit, so say what a server without one says.
	m.Server().SetPreHook(func(c *server.Peer, cmd string, args ...string) bool {
		switch {
		case strings.EqualFold(cmd, "CLUSTER"):
			c.WriteError("ERR This instance has cluster support disabled")
			return true
		case strings.EqualFold(cmd, "INFO") && len(args) > 0:
			c.WriteBulk("# Memory\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\n# Stats\r\nevicted_keys:0\r\n")
			return true
		}
		return false
	})
	return &demoServer{
		url:   "redis://" + m.Addr() + "/0",
		about: fmt.Sprintf("embedded (miniredis) on %s — install redis-server for a real one", m.Addr()),
		stop:  m.Close,
	}, nil
}

// newRedisClient returns a go-redis client for url with a pool of at least poolSize connections.
func newRedisClient(url string, poolSize int) (*redis.Client, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("bad redis url %q: %w", url, err)
	}
	opt.PoolSize = max(opt.PoolSize, poolSize)
	opt.DisableIdentity = true // no CLIENT SETINFO: older servers and miniredis reject it
	opt.MaxRetries = -1        // a retried script call could apply twice; the demo counts every write
	return redis.NewClient(opt), nil
}

func pingURL(ctx context.Context, url string, timeout time.Duration) error {
	rdb, err := newRedisClient(url, 1)
	if err != nil {
		return err
	}
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return rdb.Ping(ctx).Err()
}
