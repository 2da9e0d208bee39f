package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// server is a private redis-server child on a free loopback port, without persistence.
type server struct {
	Addr  string
	cmd   *exec.Cmd
	dir   string
	admin *redis.Client // for INFO and FLUSHALL; never used by a contender
	done  chan struct{}
}

// startServer starts redis-server on a free 127.0.0.1 port and waits until it answers PING.
func startServer() (*server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found on PATH (apt-get install -y redis-server): %w", err)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		s, err := tryStart(bin)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func tryStart(bin string) (*server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir, err := os.MkdirTemp("", "dlock-bench-redis-")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--protected-mode", "no",
		"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", "redis.log",
		"--daemonize", "no", "--maxclients", "10000")
	cmd.Dir = dir
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &server{Addr: "127.0.0.1:" + strconv.Itoa(port), cmd: cmd, dir: dir, done: make(chan struct{})}
	go func() { cmd.Wait(); close(s.done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := ping(s.Addr); err == nil {
			break
		}
		select {
		case <-s.done:
			log, _ := os.ReadFile(dir + "/redis.log")
			os.RemoveAll(dir)
			return nil, fmt.Errorf("redis-server exited before it was ready: %s", strings.TrimSpace(string(log)))
		default:
		}
		if time.Now().After(deadline) {
			s.Close()
			return nil, errors.New("redis-server did not answer PING within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.admin = redis.NewClient(&redis.Options{Addr: s.Addr, PoolSize: 2})
	return s, nil
}

func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// Close kills the server and removes its directory.
func (s *server) Close() {
	if s.admin != nil {
		s.admin.Close()
	}
	s.cmd.Process.Kill()
	<-s.done
	os.RemoveAll(s.dir)
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
