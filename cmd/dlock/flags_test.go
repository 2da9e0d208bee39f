package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

func helpOf(t *testing.T, cmd string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := dispatch(context.Background(), &stdio{in: strings.NewReader(""), out: &out, err: &errOut}, []string{cmd, "--help"}); code != exitOK {
		t.Fatalf("%s --help: exit %d\n%s", cmd, code, errOut.String())
	}
	return out.String()
}

// flagHelp returns the lines --help prints for flag name ("" when it lists no such flag).
func flagHelp(help, name string) string {
	m := regexp.MustCompile(`(?m)^  -` + regexp.QuoteMeta(name) + `( \S+)?\n(\s+.*\n)*?(?:  -|\z)`).FindString(help)
	return strings.TrimSuffix(m, "  -")
}

// --redis shows its default once, as the environment variable or the built-in URL, and never
// the environment's URL (it may hold a password).
func TestFlags_RedisDefaultShownOnce(t *testing.T) {
	t.Setenv(redisEnv, "redis://user:envsecret@10.1.2.3:6379/0")
	for _, cmd := range []string{"run", "status", "list", "unlock", "elect", "leader"} {
		help := helpOf(t, cmd)
		redis := flagHelp(help, "redis")
		if redis == "" {
			t.Fatalf("%s --help lists no -redis:\n%s", cmd, help)
		}
		if n := strings.Count(redis, defaultRedisURL); n != 1 || strings.Count(redis, "default") != 1 || !strings.Contains(redis, "$"+redisEnv) {
			t.Errorf("%s --help, -redis shows the default %d times, want once with $%s:\n%s", cmd, n, redisEnv, redis)
		}
		if strings.Contains(help, "envsecret") || strings.Contains(help, "10.1.2.3") {
			t.Errorf("%s --help shows the URL of $%s:\n%s", cmd, redisEnv, redis)
		}
	}
}

// --redis, else $DLOCK_REDIS_URL, else the built-in URL.
func TestFlags_ServerURL(t *testing.T) {
	t.Setenv(redisEnv, "")
	if got := (&serverFlags{}).serverURL(); got != defaultRedisURL {
		t.Errorf("no flag, no environment: %s, want %s", got, defaultRedisURL)
	}
	t.Setenv(redisEnv, "redis://env:1/0")
	if got := (&serverFlags{}).serverURL(); got != "redis://env:1/0" {
		t.Errorf("with $%s: %s", redisEnv, got)
	}
	if got := (&serverFlags{url: "redis://flag:1/0"}).serverURL(); got != "redis://flag:1/0" {
		t.Errorf("with --redis and $%s: %s, want the flag's", redisEnv, got)
	}
}

// list's name filter is --name-prefix (--prefix still works, unlisted), and its help and
// --key-prefix's say which prefix is which; a key prefix set by dlock.WithPrefix combines
// with a name prefix.
func TestFlags_NamePrefixAndKeyPrefix(t *testing.T) {
	help := helpOf(t, "list")
	if flagHelp(help, "name-prefix") == "" || flagHelp(help, "prefix") != "" {
		t.Errorf("list --help: want -name-prefix listed and -prefix not:\n%s", help)
	}
	if np := flagHelp(help, "name-prefix"); !strings.Contains(np, "name") || !strings.Contains(np, "not --key-prefix") {
		t.Errorf("-name-prefix help does not tell it from --key-prefix:\n%s", np)
	}
	for _, cmd := range []string{"run", "status", "list", "unlock"} {
		kp := flagHelp(helpOf(t, cmd), "key-prefix")
		if !strings.Contains(kp, "dlock.WithPrefix") || !strings.Contains(kp, "Not a filter on lock names") || !strings.Contains(kp, `(default "dlock:")`) {
			t.Errorf("%s --help, -key-prefix:\n%s", cmd, kp)
		}
	}

	s := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, pc := range []struct{ keyPrefix, name string }{
		{dlock.DefaultPrefix, "orders:1"},
		{dlock.DefaultPrefix, "jobs:1"},
		{"billing:", "orders:2"},
		{"billing:", "jobs:2"},
	} {
		c, err := dlock.Dial(ctx, s.URL(), dlock.WithPrefix(pc.keyPrefix))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		l, err := c.Mutex(pc.name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(context.Background())
	}
	names := func(args ...string) []string {
		t.Helper()
		out, errOut, code := dlockCmd(t, append([]string{"list", "--json", "--redis", s.URL()}, args...)...)
		var list []jsonInfo
		if err := json.Unmarshal([]byte(out), &list); code != exitOK || err != nil {
			t.Fatalf("list %v: exit %d, %v\n%s%s", args, code, err, out, errOut)
		}
		var ns []string
		for _, i := range list {
			ns = append(ns, i.Name)
		}
		return ns
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "jobs:1,orders:1"},
		{[]string{"--name-prefix", "orders:"}, "orders:1"},
		{[]string{"--prefix", "orders:"}, "orders:1"},
		{[]string{"--key-prefix", "billing:"}, "jobs:2,orders:2"},
		{[]string{"--key-prefix", "billing:", "--name-prefix", "orders:"}, "orders:2"},
	} {
		if got := strings.Join(names(tc.args...), ","); got != tc.want {
			t.Errorf("list %v: %s, want %s", tc.args, got, tc.want)
		}
	}
}

// An empty --redis (--redis "$UNSET") and a $DLOCK_REDIS_URL set to an empty string are
// refused with a usage error naming the cause, before any connection: neither falls back to
// localhost. Leaving both out still means the built-in URL.
func TestFlags_EmptyRedisRefused(t *testing.T) {
	dlockBin(t)
	s := redistest.Start(t)
	for _, tc := range []struct {
		env  string
		args []string
		want string
	}{
		{s.URL(), []string{"status", "x", "--redis", ""}, "--redis is empty"},
		{s.URL(), []string{"--redis=", "list"}, "--redis is empty"},
		{s.URL(), []string{"unlock", "--force", "--redis", " ", "x"}, "--redis is empty"},
		{"", []string{"status", "x"}, "$" + redisEnv + " is set but empty"},
		{"", []string{"run", "x", "--", "true"}, "$" + redisEnv + " is set but empty"},
	} {
		t.Setenv(redisEnv, tc.env)
		out, errOut, code := dlockCmd(t, tc.args...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) || out != "" || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("$%s=%q dlock %q: exit %d, stdout %q, stderr %q; want exit %d and one line saying %q",
				redisEnv, tc.env, tc.args, code, out, errOut, exitUsage, tc.want)
		}
	}
	// Not set at all, with --redis given: the flag's URL is used.
	os.Unsetenv(redisEnv)
	if out, errOut, code := dlockCmd(t, "status", "x", "--redis", s.URL()); code != 0 || !strings.HasPrefix(out, "x: free") {
		t.Errorf("dlock status x --redis URL: exit %d, %q %q", code, out, errOut)
	}
}
