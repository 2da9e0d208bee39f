package main

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/redisproc"
)

// server is a private redis-server child on a free loopback port, without persistence.
type server struct {
	Addr  string
	proc  *redisproc.Process
	admin *redis.Client // for INFO and FLUSHALL; never used by a contender
}

// startServer starts redis-server on a free 127.0.0.1 port and waits until it answers PING.
func startServer() (*server, error) {
	p, err := redisproc.Start(context.Background(), redisproc.Config{
		DirPrefix: "dlock-bench-redis-",
		Args:      []string{"--maxclients", "10000"},
	})
	if err != nil {
		return nil, err
	}
	return &server{
		Addr:  p.Addr(),
		proc:  p,
		admin: redis.NewClient(&redis.Options{Addr: p.Addr(), PoolSize: 2}),
	}, nil
}

// Close kills the server and removes its directory.
func (s *server) Close() {
	s.admin.Close()
	s.proc.Close()
}

// cpu returns the server's CPU time (user + system) so far.
func (s *server) cpu() time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := s.admin.Info(ctx, "cpu").Result()
	if err != nil {
		return 0
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		for _, f := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, f); ok {
				x, _ := strconv.ParseFloat(v, 64)
				total += x
			}
		}
	}
	return time.Duration(total * float64(time.Second))
}

// flush empties the server between measurements.
func (s *server) flush() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.admin.FlushAll(ctx)
}

// pttl returns the remaining lifetime of key (negative when there is no key).
func (s *server) pttl(key string) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := s.admin.PTTL(ctx, key).Result()
	if err != nil {
		return -1
	}
	return d
}
