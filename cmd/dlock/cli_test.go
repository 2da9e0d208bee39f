package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// oneLineOn asserts that stderr is exactly one line holding every part of want.
func oneLineOn(t *testing.T, what, stderr string, want ...string) {
	t.Helper()
	if strings.Count(stderr, "\n") != 1 || !strings.HasSuffix(stderr, "\n") {
		t.Errorf("%s: stderr is not one line:\n%s", what, stderr)
	}
	for _, w := range want {
		if !strings.Contains(stderr, w) {
			t.Errorf("%s: stderr lacks %q:\n%s", what, w, stderr)
		}
	}
}

// On a server whose maxmemory-policy can evict keys, the commands that only read or administer
// work with one line of warning; run and the latch's count-down refuse it, naming
// --unsafe-eviction, and work with it.
func TestCLI_EvictingServer(t *testing.T) {
	dlockBin(t)
	s := redistest.Start(t, redistest.WithArgs("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := dlock.Dial(ctx, s.URL(), dlock.WithUnsafeEviction(), dlock.WithLogger(discardLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Mutex("evict:held").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)
	if _, err := c.Mutex("evict:other").Lock(ctx); err != nil {
		t.Fatal(err)
	}
	warning := []string{"warning: server", "may evict lock keys (maxmemory 67108864 bytes, maxmemory-policy allkeys-lru)"}

	for _, args := range [][]string{
		{"status", "evict:held"},
		{"list"},
		{"latch", "status", "evict:latch"},
		{"resize", "evict:sem", "3"},
		{"unlock", "--force", "evict:other"},
	} {
		out, errOut, code := dlockCmd(t, append(args, "--redis", s.URL())...)
		if code != exitOK {
			t.Errorf("%v on an evicting server: exit %d\n%s%s", args, code, out, errOut)
		}
		oneLineOn(t, fmt.Sprint(args), errOut, append(warning, "dlock "+strings.Join(args[:1], " "))...)
	}
	out, _, _ := dlockCmd(t, "status", "--redis", s.URL(), "evict:held")
	if !strings.Contains(out, "evict:held: held") {
		t.Errorf("status on an evicting server does not show the held lock:\n%s", out)
	}

	// Taking locks: refused, the flag named.
	for cmd, args := range map[string][]string{
		"dlock run":              {"run", "--redis", s.URL(), "evict:job", "--", "true"},
		"dlock latch count-down": {"latch", "count-down", "--count", "2", "--redis", s.URL(), "evict:latch"},
	} {
		_, errOut, code := dlockCmd(t, args...)
		if code != exitNoServer {
			t.Errorf("%v on an evicting server: exit %d, want %d\n%s", args, code, exitNoServer, errOut)
		}
		oneLineOn(t, fmt.Sprint(args), errOut, "may evict lock keys", cmd+" --unsafe-eviction")
		if strings.Contains(errOut, "WithUnsafeEviction") {
			t.Errorf("%v: the error names the Go option:\n%s", args, errOut)
		}
	}
	_, errOut, code := dlockCmd(t, "run", "--unsafe-eviction", "--redis", s.URL(), "evict:job", "--", "true")
	if code != exitOK {
		t.Errorf("run --unsafe-eviction: exit %d\n%s", code, errOut)
	}
	oneLineOn(t, "run --unsafe-eviction", errOut, append(warning, "going on as --unsafe-eviction allows")...)
	if _, errOut, code := dlockCmd(t, "latch", "count-down", "--unsafe-eviction", "--count", "2", "--redis", s.URL(), "evict:latch"); code != exitOK {
		t.Errorf("latch count-down --unsafe-eviction: exit %d\n%s", code, errOut)
	}

	// web serves the page.
	p := startDlock(t, "web", "--listen", "127.0.0.1:0", "--redis", s.URL())
	waitFor(t, 20*time.Second, "dlock web serving", func(context.Context) error {
		if !strings.Contains(p.stdout.String(), "serving http://") {
			return errors.New("not serving yet: " + p.stderr.String())
		}
		return nil
	})
	oneLineOn(t, "web", p.stderr.String(), append(warning, "dlock web")...)
	p.signal(t, syscall.SIGTERM)
	p.wait(t, 20*time.Second)
}

// A name that is not valid UTF-8 (and ends with a space) round-trips: list --json gives its
// bytes in name_b64, and --b64 addresses it: status, then unlock --force releases it. Text
// output quotes it.
func TestCLI_B64Names(t *testing.T) {
	dlockBin(t)
	s := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := dlock.Dial(ctx, s.URL(), dlock.WithLogger(discardLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const name = "\xff\xfe x "
	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code := dlockCmd(t, "list", "--json", "--redis", s.URL())
	var locks []struct {
		Name    string `json:"name"`
		NameB64 string `json:"name_b64"`
	}
	if err := json.Unmarshal([]byte(out), &locks); code != 0 || err != nil || len(locks) != 1 {
		t.Fatalf("list --json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	if locks[0].Name == name {
		t.Fatalf("the JSON string kept invalid UTF-8?")
	}
	b, err := base64.StdEncoding.DecodeString(locks[0].NameB64)
	if err != nil || string(b) != name {
		t.Fatalf("name_b64 %q decodes to %q, %v; want %q", locks[0].NameB64, b, err, name)
	}
	b64 := locks[0].NameB64

	out, _, code = dlockCmd(t, "list", "--redis", s.URL())
	if code != 0 || !strings.Contains(out, "\n"+`"\xff\xfe x "`+" ") {
		t.Errorf("list shows the name unquoted:\n%s", out)
	}
	out, _, code = dlockCmd(t, "status", "--b64", "--redis", s.URL(), b64)
	if code != 0 || !strings.HasPrefix(out, `"\xff\xfe x ": held`) {
		t.Errorf("status --b64: exit %d:\n%s", code, out)
	}
	out, _, code = dlockCmd(t, "status", "--json", "--b64", "--redis", s.URL(), b64)
	if code != 0 || !strings.Contains(out, `"name_b64": "`+b64+`"`) || !strings.Contains(out, `"held": true`) {
		t.Errorf("status --json --b64: exit %d:\n%s", code, out)
	}
	out, errOut, code = dlockCmd(t, "unlock", "--force", "--b64", "--redis", s.URL(), b64)
	if code != 0 || !strings.HasPrefix(out, `released "\xff\xfe x ": it was held by`) || !strings.Contains(out, "1 hold,") {
		t.Errorf("unlock --force --b64: exit %d, %q %q", code, out, errOut)
	}
	select {
	case <-l.Context().Done():
	case <-time.After(10 * time.Second):
		t.Error("the holder's lease was not lost after unlock --force --b64")
	}
	if info, err := c.Inspect(ctx, name); err != nil || info.Held {
		t.Errorf("after unlock --force --b64: %+v, %v; want free", info, err)
	}
	_, errOut, code = dlockCmd(t, "status", "--b64", "--redis", s.URL(), "not base64!")
	if code != exitUsage || !strings.Contains(errOut, "not standard base64") {
		t.Errorf("status --b64 with a bad NAME: exit %d, %q", code, errOut)
	}

	// A name with spaces at its ends is quoted; a long one is cut in list's table only.
	long := strings.Repeat("n", 60)
	for _, n := range []string{" lead", long} {
		ln, err := c.Mutex(n).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Unlock(ctx)
	}
	out, _, _ = dlockCmd(t, "list", "--redis", s.URL())
	if !strings.Contains(out, "\n"+`" lead"`+" ") || !strings.Contains(out, "\n"+strings.Repeat("n", 47)+"… ") || strings.Contains(out, long) {
		t.Errorf("list: want \" lead\" quoted and the 60-character name cut to 47 and …:\n%s", out)
	}
	out, _, _ = dlockCmd(t, "list", "--json", "--redis", s.URL())
	if !strings.Contains(out, `"name": "`+long+`"`) {
		t.Errorf("list --json does not have the long name whole:\n%s", out)
	}
}

// The flags common to every command that talks to a server may come before the command or
// after it, with the same result; another flag before the command is refused in one line.
func TestCLI_CommonFlagsBeforeCommand(t *testing.T) {
	dlockBin(t)
	s := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := dlock.Dial(ctx, s.URL(), dlock.WithPrefix("app:"), dlock.WithLogger(discardLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Mutex("orders:1").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)
	for _, args := range [][]string{
		{"--redis", s.URL(), "--key-prefix", "app:", "status", "orders:1"},
		{"--redis=" + s.URL(), "status", "--key-prefix=app:", "orders:1"},
		{"-redis", s.URL(), "status", "orders:1", "--key-prefix", "app:"},
		{"status", "orders:1", "--redis", s.URL(), "--key-prefix", "app:"},
	} {
		out, errOut, code := dlockCmd(t, args...)
		if code != 0 || !strings.HasPrefix(out, "orders:1: held\n") {
			t.Errorf("dlock %v: exit %d, %q %q; want the lock held", args, code, out, errOut)
		}
	}
	out, errOut, code := dlockCmd(t, "--redis", s.URL(), "--key-prefix", "app:", "list", "--json")
	if code != 0 || !strings.Contains(out, `"name": "orders:1"`) {
		t.Errorf("dlock --redis URL --key-prefix app: list --json: exit %d, %q %q", code, out, errOut)
	}
	_, errOut, code = dlockCmd(t, "--json", "--redis", s.URL(), "status", "orders:1")
	if code != exitUsage || strings.Count(errOut, "\n") != 2 || !strings.Contains(errOut, "only --redis and --key-prefix may come before it") {
		t.Errorf("dlock --json ... status: exit %d, %q; want a short usage error", code, errOut)
	}
	_, errOut, code = dlockCmd(t, "--redis")
	if code != exitUsage || !strings.Contains(errOut, "--redis needs a value") {
		t.Errorf("dlock --redis: exit %d, %q", code, errOut)
	}
}

// Counts are written in the singular for one: "1 reader", "1 holder", "1 permit", "1 hold",
// "1 waiting client".
func TestCLI_SingularCounts(t *testing.T) {
	dlockBin(t)
	s := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := dlock.Dial(ctx, s.URL(), dlock.WithLogger(discardLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.RWMutex("one:rw").RLock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Semaphore("one:sem", 2).Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	out, _, _ := dlockCmd(t, "status", "--redis", s.URL(), "one:rw")
	if !strings.Contains(out, "held for reading by 1 reader\n") || !strings.Contains(out, ", 1 hold, ") {
		t.Errorf("status of a read-write lock with one reader:\n%s", out)
	}
	out, _, _ = dlockCmd(t, "status", "--redis", s.URL(), "one:sem")
	if !strings.Contains(out, "1 permit:") || strings.Contains(out, "(s)") {
		t.Errorf("status of a semaphore with one permit held:\n%s", out)
	}
	out, _, _ = dlockCmd(t, "list", "--redis", s.URL())
	if !strings.Contains(out, "rw: 1 reader ") || !strings.Contains(out, "semaphore: 1/2 permits, 1 holder ") {
		t.Errorf("list:\n%s", out)
	}
	// A waiter, so that unlock --force wakes one client.
	w, err := dlock.Dial(ctx, s.URL(), dlock.WithLogger(discardLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	got := make(chan error, 1)
	go func() {
		_, err := w.RWMutex("one:rw").Lock(wctx)
		got <- err
	}()
	waitFor(t, 10*time.Second, "the writer queued", func(ctx context.Context) error {
		if info, err := c.Inspect(ctx, "one:rw"); err != nil || info.Shared == nil || info.Shared.Queued != 1 {
			return fmt.Errorf("%+v, %v", info.Shared, err)
		}
		return nil
	})
	out, _, _ = dlockCmd(t, "unlock", "--force", "--redis", s.URL(), "one:rw")
	if want := "it was held by 1 holder (no writer and 1 reader, 1 waiting (1 writer)); 1 waiting client woken\n"; !strings.HasSuffix(out, want) {
		t.Errorf("unlock --force: %q, want it to end with %q", out, want)
	}
	if err := <-got; err != nil {
		t.Errorf("the waiting writer: %v", err)
	}
}
