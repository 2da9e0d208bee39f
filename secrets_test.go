package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
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

// What the client logs at every level (acquisitions, releases, a loss, failed renewal rounds,
// the subscription dropping) never holds an owner secret or a password.
func TestSecrets_EventLogsNeverShowOwnersOrPasswords(t *testing.T) {
	s := redistest.Start(t, redistest.WithArgs(redistest.ACLUserArgs("user", secret, "~*", "&*", "+@all")...))
	p := redistest.NewProxy(t, s.Addr)
	var logs logBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx := ctxT(t)
	u, err := url.Parse(p.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("user", secret)
	c, err := dlock.Dial(ctx, u.String(), dlock.WithLogger(logger), dlock.WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	other, err := dlock.Dial(ctx, s.URLAs("user", secret), dlock.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	name := uniqueName(t)
	var owners []string
	owner := func(name string) {
		v, err := s.Do(ctx, "GET", keyOf(name))
		if err != nil {
			t.Fatal(err)
		}
		o, _, _ := strings.Cut(v, " ")
		owners = append(owners, o)
	}
	// An acquisition and a release; a waiter; a lease lost to a force unlock.
	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	owner(name)
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l, err = c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	owner(name)
	if _, err := other.ForceUnlock(ctx, name); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the loss logged", func(context.Context) error {
		if !strings.Contains(logs.String(), "lease lost") {
			return errors.New("not yet")
		}
		return nil
	})
	l.Unlock(ctx)
	// Renewal rounds that fail, and the subscription dropping, while a lease is held and a
	// goroutine waits.
	held, err := other.Mutex(name + "-busy").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(ctx)
	l, err = c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	owner(name)
	wctx, stop := context.WithCancel(ctx)
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		c.Mutex(name + "-busy").Lock(wctx)
	}()
	waitFor(t, 10*time.Second, "the waiter subscribed", func(ctx context.Context) error {
		if chs, err := s.Do(ctx, "PUBSUB", "CHANNELS", keyOf(name+"-busy")+":rel:*"); err != nil || chs == "" {
			return fmt.Errorf("channels %q, %v", chs, err)
		}
		return nil
	})
	p.Close()
	waitFor(t, 10*time.Second, "failed renewals and the subscription's drop logged", func(context.Context) error {
		out := logs.String()
		if !strings.Contains(out, "renewal round failed") || !strings.Contains(out, "subscription dropped") {
			return fmt.Errorf("log so far: %s", out)
		}
		return nil
	})
	stop()
	<-waited
	out := logs.String()
	for _, want := range []string{"dlock: acquired", "dlock: released", "lease lost", "renewal round failed"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %q: the test would prove less than it says", want)
		}
	}
	noSecret(t, "log", out)
	for _, o := range owners {
		secretPart, _, _ := strings.Cut(o, ":")
		if o == "" || strings.Contains(out, secretPart) {
			t.Fatalf("the log shows an owner secret (%q): %s", o, out)
		}
	}
}
