package dlock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/goredisconn"
	"github.com/dlock-go/dlock/internal/redistest"
)

// dialErr makes a Client through tr's adapter and returns the error instead of failing.
func dialErr(t *testing.T, tr string, url string, opts ...dlock.ClientOption) (*dlock.Client, error) {
	t.Helper()
	var c *dlock.Client
	var err error
	switch tr {
	case "rueidis":
		c, err = dlock.Dial(ctxT(t), url, opts...)
	default:
		o, perr := redis.ParseURL(url)
		if perr != nil {
			t.Fatal(perr)
		}
		o.ContextTimeoutEnabled = true
		rc := redis.NewClient(o)
		t.Cleanup(func() { rc.Close() })
		c, err = dlock.New(goredisconn.New(rc), opts...)
	}
	if c != nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// logBuffer collects what a client logs.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

// A server whose memory policy can evict keys is refused, with an error that names the setting
// and the fix, unless the client opts in; then it logs a warning once.
func TestEviction_DialRefusesEvictingServer(t *testing.T) {
	for _, policy := range []string{"allkeys-lru", "volatile-lru", "volatile-ttl", "allkeys-random"} {
		s := redistest.Start(t, redistest.WithArgs("--maxmemory", "64mb", "--maxmemory-policy", policy))
		eachTransport(t, func(t *testing.T, tr transport) {
			_, err := dialErr(t, tr.name, s.URL())
			if !errors.Is(err, dlock.ErrEvictionPolicy) || !strings.Contains(err.Error(), policy) || !strings.Contains(err.Error(), "noeviction") {
				t.Fatalf("%s: got %v, want an error wrapping ErrEvictionPolicy that names %s and noeviction", policy, err, policy)
			}
			var logs logBuffer
			c, err := dialErr(t, tr.name, s.URL(), dlock.WithUnsafeEviction(), dlock.WithLogger(logs.logger()))
			if err != nil {
				t.Fatalf("%s with WithUnsafeEviction: %v", policy, err)
			}
			l, err := c.Mutex(uniqueName(t)).Lock(ctxT(t))
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Unlock(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			if got := logs.String(); strings.Count(got, "level=WARN") != 1 || !strings.Contains(got, policy) {
				t.Fatalf("%s: log = %q, want one warning naming the policy", policy, got)
			}
		})
	}
	// maxmemory 0 (no limit) evicts nothing, whatever the policy.
	s := redistest.Start(t, redistest.WithArgs("--maxmemory", "0", "--maxmemory-policy", "allkeys-lru"))
	eachTransport(t, func(t *testing.T, tr transport) {
		if _, err := dialErr(t, tr.name, s.URL()); err != nil {
			t.Fatalf("no maxmemory: %v", err)
		}
	})
}

// A policy changed to an evicting one while leases are held: within a check period the
// leases are lost (cause wrapping ErrLost and ErrEvictionPolicy), acquisitions are refused,
// and they work again once the policy is back to noeviction.
func TestEviction_PolicyChangedAtRunTime(t *testing.T) {
	s := redistest.Start(t, redistest.WithArgs("--maxmemory", "64mb", "--maxmemory-policy", "noeviction"))
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, s.URL(), dlock.WithLogger(slog.New(slog.DiscardHandler)))
		name := uniqueName(t)
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Do(ctx, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru"); err != nil {
			t.Fatal(err)
		}
		changed := time.Now()
		select {
		case <-l.Context().Done():
		case <-time.After(10 * time.Second):
			t.Fatal("lease not lost 10 s after the policy became allkeys-lru")
		}
		t.Logf("lease lost %v after the policy changed", time.Since(changed))
		cause := context.Cause(l.Context())
		if !errors.Is(cause, dlock.ErrLost) || !errors.Is(cause, dlock.ErrEvictionPolicy) {
			t.Fatalf("cause = %v, want ErrLost and ErrEvictionPolicy", cause)
		}
		if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrLost) {
			t.Fatalf("Unlock after the loss = %v, want ErrLost", err)
		}
		if _, err := c.Mutex(uniqueName(t)).TryLock(ctx); !errors.Is(err, dlock.ErrEvictionPolicy) {
			t.Fatalf("TryLock on an evicting server = %v, want ErrEvictionPolicy", err)
		}
		if _, err := s.Do(ctx, "CONFIG", "SET", "maxmemory-policy", "noeviction"); err != nil {
			t.Fatal(err)
		}
		err = redistest.Poll(ctx, "acquisitions resume", func(ctx context.Context) error {
			l, err := c.Mutex(name).TryLock(ctx)
			if err != nil {
				return err
			}
			return l.Unlock(ctx)
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// Out of memory under noeviction: every Unlock still releases (a release only frees memory),
// and an acquisition fails with an error that says the server is out of memory.
func TestOOM_UnlockWorksAcquireSaysSo(t *testing.T) {
	s := redistest.Start(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		if _, err := s.Do(ctx, "FLUSHALL"); err != nil {
			t.Fatal(err)
		}
		c := tr.dial(t, s.URL())
		var held []*dlock.Lease
		for i := range 50 {
			l, err := c.Mutex(fmt.Sprintf("%s-%d", uniqueName(t), i)).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, l)
		}
		// Put the server over its memory limit: some data, then a maxmemory below what it uses.
		for i := range 32 {
			if _, err := s.Do(ctx, "SET", fmt.Sprintf("filler:%d", i), strings.Repeat("x", 64<<10)); err != nil {
				t.Fatal(err)
			}
		}
		info, err := s.Do(ctx, "INFO", "memory")
		if err != nil {
			t.Fatal(err)
		}
		used := infoField(t, info, "used_memory")
		if _, err := s.Do(ctx, "CONFIG", "SET", "maxmemory", strconv.Itoa(used/2)); err != nil {
			t.Fatal(err)
		}
		defer s.Do(context.WithoutCancel(ctx), "CONFIG", "SET", "maxmemory", "0")
		if _, err := s.Do(ctx, "SET", "one-more", "x"); err == nil || !strings.Contains(err.Error(), "OOM") {
			t.Fatalf("a write on the full server: %v, want OOM", err)
		}
		_, err = c.Mutex(uniqueName(t)).TryLock(ctx)
		if !errors.Is(err, dlock.ErrOutOfMemory) || strings.Contains(err.Error(), "script") {
			t.Fatalf("TryLock out of memory = %v, want ErrOutOfMemory without the raw script error", err)
		}
		for _, l := range held {
			if err := l.Unlock(ctx); err != nil {
				t.Fatalf("Unlock out of memory: %v", err)
			}
			v, err := s.Do(ctx, "GET", keyOf(l.Name()))
			if err != nil || heldValue(v) {
				t.Fatalf("%s after Unlock: %q, %v; want released", l.Name(), v, err)
			}
		}
	})
}

// infoField returns an integer field of an INFO reply.
func infoField(t *testing.T, info, field string) int {
	t.Helper()
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("INFO %s: %v", field, err)
			}
			return n
		}
	}
	t.Fatalf("INFO has no %s", field)
	return 0
}
