package dlock_test

import (
	"context"
	"errors"
	"flag"
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
// lock names. Clients reach it as a user restricted to the ACL rule of docs/SECURITY.md: its
// URL carries that user, and the default user has the same rule (so that a client dialled
// without credentials, through a fault proxy say, is held to it too). shared.Do logs in as an
// administrator for the tests' raw checks.
var shared *redistest.Server

// aclRule is the rule docs/SECURITY.md documents for a dlock user.
var aclRule = redistest.ACLRule

// testOnlyRule widens aclRule for the suite alone: the "work" helper process (helper_test.go)
// stands in for a protected resource by appending to the list <name>:writes over its dlock URL.
// A Redis 7 selector allows that one command on those keys and nothing else.
var testOnlyRule = []string{"(+rpush ~*:writes)"}

const (
	testUser, testPassword   = "dlock-test", "test-secret"
	adminUser, adminPassword = "admin", "admin-secret"
)

// restrictShared puts the shared server's users in place; see shared.
func restrictShared(s *redistest.Server) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.SetUser(ctx, adminUser, adminPassword, "~*", "&*", "+@all"); err != nil {
		return err
	}
	s.SetDoUser(adminUser, adminPassword)
	// With the selector docs/SECURITY.md adds for the fenced operations on keys under stock:
	// (fenced_test.go).
	rule := append(append(append([]string(nil), aclRule...), fencedACL...), testOnlyRule...)
	if err := s.SetUser(ctx, testUser, testPassword, rule...); err != nil {
		return err
	}
	if _, err := s.Do(ctx, append([]string{"ACL", "SETUSER", "default", "reset", "on", "nopass"}, rule...)...); err != nil {
		return err
	}
	s.SetURLUser(testUser, testPassword)
	return nil
}

func TestMain(m *testing.M) {
	switch role := os.Getenv(helperEnv); role {
	case "":
	case "hot":
		os.Exit(runHotHelper())
	default:
		os.Exit(runHelper(role))
	}
	flag.Parse() // for testing.Short
	s, err := redistest.StartProcess()
	switch {
	case err == nil:
		shared = s
		if err := restrictShared(s); err != nil {
			fmt.Fprintln(os.Stderr, "dlock tests:", err)
			s.Close()
			os.Exit(1)
		}
		exampleURL = s.URL()
	case testing.Short() && errors.Is(err, redistest.ErrNotFound):
		// go test -short on a machine without redis-server runs the tests that need none; the
		// others skip (needShared, redistest.Start), and so do the Examples, which cannot.
		fmt.Fprintln(os.Stderr, "dlock tests: -short without redis-server: tests that need a server skip, and Examples do not run:", err)
		skipExamples()
	default:
		fmt.Fprintln(os.Stderr, "dlock tests:", err)
		os.Exit(1)
	}
	code := m.Run()
	if shared != nil {
		if os.Getenv("DLOCK_ACL_LOG") != "" {
			out, _ := s.Do(context.Background(), "ACL", "LOG", "100")
			fmt.Fprintln(os.Stderr, "ACL LOG:\n"+out)
		}
		s.Close()
	}
	if code == 0 {
		// rueidis closes the connections of nodes that left a cluster's topology 5 s later,
		// from a goroutine of its own that outlives Client.Close.
		// rueidis also retries a failed dial from a goroutine that sleeps up to a second first.
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"),
			goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// needShared skips t when the suite runs without the shared server. TestMain allows that only
// under -short on a machine without redis-server; without -short a missing server fails the run.
func needShared(t testing.TB) {
	t.Helper()
	if shared == nil {
		t.Skip("no shared redis-server: -short, and redis-server is not on PATH")
	}
}

// skipExamples adds the Examples to -test.skip: they print what they do against the shared
// server, and an Example cannot skip itself. A -skip given with the command stays in force.
func skipExamples() {
	skip := "^Example"
	if old := flag.Lookup("test.skip").Value.String(); old != "" {
		skip = old + "|" + skip
	}
	if err := flag.Set("test.skip", skip); err != nil {
		fmt.Fprintln(os.Stderr, "dlock tests:", err)
	}
}

// transport makes Clients through one adapter.
type transport struct {
	name string
	dial func(t testing.TB, url string, opts ...dlock.ClientOption) *dlock.Client
}

var transports = []transport{
	{"rueidis", func(t testing.TB, url string, opts ...dlock.ClientOption) *dlock.Client {
		t.Helper()
		c, err := dlock.Dial(context.Background(), url, opts...)
		if err != nil {
			t.Fatalf("Dial(%s): %v", url, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}},
	{"goredis", func(t testing.TB, url string, opts ...dlock.ClientOption) *dlock.Client {
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

// keyOf is the key of the lock called name under the default prefix (docs/PROTOCOL.md): the
// name in braces, with one more '{' in front of a name that starts with a brace.
func keyOf(name string) string {
	if strings.HasPrefix(name, "{") || strings.HasPrefix(name, "}") {
		name = "{" + name
	}
	return dlock.DefaultPrefix + "{" + name + "}"
}

// heldValue reports whether v, a lock key's value, names a holder: its first field is an owner
// secret, not the released marker "-". (An owner secret is base64url and may itself begin
// with '-', so the first byte alone does not tell.)
func heldValue(v string) bool {
	owner, _, _ := strings.Cut(v, " ")
	return owner != "" && owner != "-"
}

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

// waitFor polls check with redistest.Poll until it returns nil, failing the test after within.
// check says what it saw when it is not satisfied; the failure quotes its last complaint.
func waitFor(t testing.TB, within time.Duration, what string, check func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := redistest.Poll(ctx, what, check); err != nil {
		t.Fatal(err)
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var _ = rueidisconn.Dial
