package dlock_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/goredisconn"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/rueidisconn"
)

// shared is one redis-server for the tests that need nothing special; each test uses its own
// lock names.
var shared *redistest.Server

func TestMain(m *testing.M) {
	switch role := os.Getenv(helperEnv); role {
	case "":
	case "hot":
		os.Exit(runHotHelper())
	default:
		os.Exit(runHelper(role))
	}
	s, err := redistest.StartProcess()
	if err != nil {
		fmt.Fprintln(os.Stderr, "dlock tests:", err)
		os.Exit(1)
	}
	shared = s
	exampleURL = s.URL()
	code := m.Run()
	s.Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// transport makes Clients through one adapter.
type transport struct {
	name string
	dial func(t testing.TB, url string, opts ...dlock.Option) *dlock.Client
}

var transports = []transport{
	{"rueidis", func(t testing.TB, url string, opts ...dlock.Option) *dlock.Client {
		t.Helper()
		c, err := dlock.Dial(context.Background(), url, opts...)
		if err != nil {
			t.Fatalf("Dial(%s): %v", url, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}},
	{"goredis", func(t testing.TB, url string, opts ...dlock.Option) *dlock.Client {
		t.Helper()
		o, err := redis.ParseURL(url)
		if err != nil {
			t.Fatal(err)
		}
		o.ContextTimeoutEnabled = true // as goredisconn.New recommends
		rc := redis.NewClient(o)
		c, err := dlock.New(goredisconn.New(rc), opts...)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		t.Cleanup(func() {
			c.Close()
			rc.Close()
		})
		return c
	}},
}

// eachTransport runs f once per adapter, as subtests.
func eachTransport(t *testing.T, f func(t *testing.T, tr transport)) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) { f(t, tr) })
	}
}

var nameSeq atomic.Int64

// uniqueName returns a lock name no other test uses.
func uniqueName(t testing.TB) string {
	return fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "."), nameSeq.Add(1))
}

// keyOf is the Redis key of a lock with the default prefix (see docs/PROTOCOL.md).
func keyOf(name string) string { return dlock.DefaultPrefix + "{" + name + "}" }

// lockValue splits the lock's value: owner, token, holds, description (docs/PROTOCOL.md).
func lockValue(t testing.TB, name string) []string {
	t.Helper()
	v := strings.SplitN(redisDo(t, shared, "GET", keyOf(name)), " ", 4)
	if len(v) < 3 {
		t.Fatalf("value of %s = %q, want at least owner, token and holds", keyOf(name), v)
	}
	return v
}

func redisDo(t testing.TB, s *redistest.Server, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := s.Do(ctx, args...)
	if err != nil {
		t.Fatalf("redis %v: %v", args, err)
	}
	return out
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var _ = rueidisconn.Dial
