package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/redis/go-redis/v9"
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
			return nil, fmt.Errorf("cannot use --redis %s: %w", url, err)
		}
		return &demoServer{url: url, about: "external server at " + url}, nil
	}
	if bin, err := exec.LookPath("redis-server"); err == nil {
		return startRedisServer(ctx, bin)
	}
	return startEmbedded()
}

// startRedisServer runs bin on a free loopback port, without persistence, in a temporary
// directory. The child is killed when the demo exits, and by the kernel if the demo dies.
func startRedisServer(ctx context.Context, bin string) (*demoServer, error) {
	ver := redisServerVersion(bin)
	dir, err := os.MkdirTemp("", "dlock-demo-redis-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 4; attempt++ { // another process may take the free port first
		port, err := freePort()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		log := &tailBuffer{max: 4 << 10}
		cmd := exec.Command(bin,
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir,
			"--daemonize", "no", "--loglevel", "warning")
		cmd.Stdout = log
		cmd.Stderr = log
		cmd.SysProcAttr = childAttr()
		if err := cmd.Start(); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("start %s: %w", bin, err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		kill := func() {
			cmd.Process.Kill()
			<-exited
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		url := "redis://" + addr + "/0"
		if err := waitServer(ctx, url, exited); err != nil {
			kill()
			lastErr = fmt.Errorf("%s on %s: %w (output: %s)", bin, addr, err, strings.TrimSpace(log.String()))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		return &demoServer{
			url:   url,
			about: fmt.Sprintf("redis-server %s child on %s", ver, addr),
			stop: func() {
				kill()
				os.RemoveAll(dir)
			},
		}, nil
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

// waitServer polls url with PING until it answers, the process exits or the start timeout passes.
func waitServer(ctx context.Context, url string, exited <-chan struct{}) error {
	deadline := time.Now().Add(serverStartTimeout)
	for {
		if err := pingURL(ctx, url, 200*time.Millisecond); err == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.New("exited before it was ready")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v", serverStartTimeout)
		}
	}
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

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
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
