package dlock_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// secret is the password every URL of these tests carries; no error or log line may show it.
const secret = "s3cr%zzet-pw"

func noSecret(t *testing.T, what, text string) {
	t.Helper()
	for _, part := range []string{secret, "s3cr", "%zz", "zzet"} {
		if strings.Contains(text, part) {
			t.Fatalf("%s shows (part of) the password: %s", what, text)
		}
	}
}

// Errors name the servers but never a password: one server, Sentinel, Cluster seeds, bad URLs,
// a wrong password, and quorum mode, where each server's errors are listed.
func TestSecrets_ErrorsNeverShowPasswords(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, url := range []string{
		"redis://user:" + secret + "@127.0.0.1:1/0",
		"redis://user:" + secret + "@127.0.0.1:notaport/0",
		"redis+sentinel://user:" + secret + "@127.0.0.1:1/mymaster",
		"redis://user:" + secret + "@127.0.0.1:1?addr=127.0.0.1:2",
		"rediss://:" + secret + "@127.0.0.1:1/0",
		"user:" + secret + "@127.0.0.1:1",
	} {
		_, err := dlock.Dial(ctx, url)
		if err == nil {
			t.Fatalf("Dial(%q) succeeded", url)
		}
		noSecret(t, "Dial error", err.Error())
	}
	// A reachable server, the wrong password.
	needShared(t)
	_, err := dlock.Dial(ctx, shared.URLAs(testUser, secret))
	if err == nil {
		t.Fatal("Dial with a wrong password succeeded")
	}
	noSecret(t, "wrong-password error", err.Error())

	// Quorum: a majority down at Dial, then a majority lost while locking.
	down := "redis://user:" + secret + "@127.0.0.1:1/0"
	_, err = dlock.DialQuorum(ctx, []string{down, down + "?x", shared.URL(), down + "#y", down + "&z"})
	if err == nil {
		t.Fatal("DialQuorum with 4 of 5 servers down succeeded")
	}
	noSecret(t, "DialQuorum error", err.Error())
	var proxies []*redistest.Proxy
	var urls []string
	for range 3 {
		p := redistest.NewProxy(t, shared.Addr)
		proxies = append(proxies, p)
		urls = append(urls, strings.Replace(p.URL(), "://", "://"+testUser+":"+testPassword+"@", 1))
	}
	urls = append(urls, down, down+"?second")
	c, err := dlock.DialQuorum(ctx, urls)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	proxies[0].CutAll()
	proxies[0].Close()
	_, err = c.Mutex(uniqueName(t)).TryLock(ctx)
	if err == nil {
		t.Fatal("TryLock with 2 of 5 servers succeeded")
	}
	noSecret(t, "quorum TryLock error", err.Error())
	if strings.Contains(err.Error(), testPassword) {
		t.Fatalf("quorum TryLock error shows a password: %v", err)
	}
	if !errors.Is(err, dlock.ErrNoQuorum) {
		t.Fatalf("quorum TryLock error = %v, want ErrNoQuorum", err)
	}
}

// What the client logs never holds a password either.
func TestSecrets_LogsNeverShowPasswords(t *testing.T) {
	s := redistest.Start(t, redistest.WithArgs(append([]string{"--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"},
		redistest.ACLUserArgs("user", secret, "~*", "&*", "+@all")...)...))
	var logs logBuffer
	c, err := dlock.Dial(ctxT(t), s.URLAs("user", secret), dlock.WithUnsafeEviction(), dlock.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if logs.String() == "" {
		t.Fatal("nothing logged: the test would prove nothing")
	}
	noSecret(t, "log", logs.String())
}
