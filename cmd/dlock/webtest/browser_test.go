// Package webtest drives "dlock web" from a real browser: headless Chromium (Debian's chromium
// package), through the DevTools protocol with chromedp. It is a module of its own so that
// chromedp and its protocol bindings stay out of the library's dependencies.
package webtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// screenshotEnv names the file the test writes its screenshot to (make web-screenshot sets it
// to docs/img/dlock-web.png); without it the screenshot goes to a temporary directory.
const screenshotEnv = "DLOCK_WEB_SCREENSHOT"

// chromium returns the browser's path. Under -short a missing browser skips the test; in a
// full run it fails it ("make deps-chromium" installs Debian's package).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if testing.Short() {
		t.Skip("-short, and no chromium on PATH")
	}
	t.Fatal("no chromium on PATH: run make deps-chromium (Debian's chromium package)")
	return ""
}

// buildDlock builds the command into a temporary directory.
func buildDlock(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dlock")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = ".." // cmd/dlock, in the library's module
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// startWeb runs "dlock web" and returns its base URL once it serves.
func startWeb(t *testing.T, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"web", "--listen", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(os.Environ(), "DLOCK_REDIS_URL=")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		re := regexp.MustCompile(`serving (http://127\.0\.0\.1:\d+)/`)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
		io.Copy(io.Discard, out)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("dlock web: %v\n%s", err, stderr.String())
			}
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("dlock web did not stop on SIGINT within 20s")
		}
	})
	select {
	case a := <-addr:
		return a
	case <-time.After(30 * time.Second):
		t.Fatalf("dlock web does not serve after 30s\n%s", stderr.String())
	}
	return ""
}

// browser starts headless Chromium and returns a tab's context, ended when the test ends.
func browser(t *testing.T, path string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // root in a container: Chromium's sandbox cannot start
		chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 860),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	// The browser starts with the first action, on a context without a timeout.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	return ctx
}

// run runs steps in the tab, bounded by within.
func run(t *testing.T, tab context.Context, within time.Duration, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, within)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// get runs one action that returns a value, bounded by within.
func get[T any](t *testing.T, tab context.Context, within time.Duration, what string, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, within)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// text is the text of the element sel (CSS).
func text(t *testing.T, tab context.Context, sel string) string {
	t.Helper()
	return get(t, tab, 10*time.Second, "read "+sel, chromedp.Text(chromedp.CSS(sel)))
}

// poll evaluates expr in the page until check accepts its value, failing after within.
func poll[T any](t *testing.T, tab context.Context, within time.Duration, what, expr string, check func(T) error) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, within)
	defer cancel()
	var last error
	for {
		v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
		if err == nil {
			if err = check(v); err == nil {
				return v
			}
		}
		last = err
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v (last: %v)", what, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func row(name string) string { return `tr[data-name="` + name + `"]` }

// css is a CSS selector.
func css(sel string) chromedp.CSS { return chromedp.CSS(sel) }

// The page in a real browser: it shows a lock a test client takes, with its holder; its lease
// counts down; a semaphore and a read-write lock show with their kind and holders; a release
// removes the row without reloading the page (from the release notice: the history says
// "released"); a force-unlock from the page, confirmed in its dialog, frees a lock.
func TestBrowser(t *testing.T) {
	chrome := chromium(t)
	s := redistest.Start(t)
	bin := buildDlock(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	dial := func() *dlock.Client {
		c, err := dlock.Dial(ctx, s.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	worker, reporter, other := dial(), dial(), dial()
	lock := func(c *dlock.Client, name, label string, ttl time.Duration) *dlock.Lease {
		l, err := c.Mutex(name, dlock.WithTTL(ttl), dlock.WithLabel(label)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	order := lock(worker, "orders:42", "checkout worker", time.Minute)
	report := lock(reporter, "reports:nightly", "dlock run ./report.sh", time.Minute)
	lock(worker, "inventory:sku-7", "stock sync", 30*time.Second)
	lock(reporter, "billing:invoice-981", "invoice mailer", 45*time.Second)

	base := startWeb(t, bin, "--redis", s.URL(), "--allow-unlock")
	tab := browser(t, chrome)
	run(t, tab, 30*time.Second, "open the page",
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(css(row("orders:42"))),
	)
	get(t, tab, 10*time.Second, "mark the page", chromedp.Evaluate[string](`window.loadedOnce = "yes"`)) // gone if the page reloads

	// The lock and its holder.
	holder := text(t, tab, row("orders:42")+" td.holder")
	if !strings.Contains(holder, "checkout worker") || !strings.Contains(holder, fmt.Sprint(os.Getpid())) {
		t.Errorf("holder cell %q: want the label and this process's pid %d", holder, os.Getpid())
	}
	token := text(t, tab, row("orders:42")+" td.token")
	if token != fmt.Sprint(order.Token()) {
		t.Errorf("token cell %q, want %d", token, order.Token())
	}

	// The countdown moves: the lease left it shows shrinks while the page is open.
	leftExpr := `+document.querySelector('` + row("orders:42") + ` td.lease').dataset.leftMs`
	first := poll(t, tab, 10*time.Second, "a lease shown", leftExpr, func(ms float64) error {
		if ms <= 0 || ms > 60000 {
			return fmt.Errorf("lease left %v ms", ms)
		}
		return nil
	})
	firstText := text(t, tab, row("orders:42")+" td.lease .lease-text")
	poll(t, tab, 10*time.Second, "the countdown moving", leftExpr, func(ms float64) error {
		if ms > first-500 {
			return fmt.Errorf("lease left %v ms, first %v ms", ms, first)
		}
		return nil
	})
	poll(t, tab, 10*time.Second, "the lease text changing", `document.querySelector('`+row("orders:42")+` td.lease .lease-text').textContent`, func(s string) error {
		if s == firstText {
			return fmt.Errorf("the lease text stays %q", s)
		}
		return nil
	})

	// A lock seen taken and released, then taken again: the page shows its typical hold time.
	batch := lock(worker, "payments:batch-3", "payments runner", 20*time.Second)
	run(t, tab, 10*time.Second, "a new lock shown", chromedp.WaitVisible(css(row("payments:batch-3"))))
	if err := batch.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	run(t, tab, 10*time.Second, "its release shown", chromedp.WaitNotPresent(css(row("payments:batch-3"))))
	lock(worker, "payments:batch-3", "payments runner", 20*time.Second)
	poll(t, tab, 10*time.Second, "a typical hold time", `document.querySelector('`+row("payments:batch-3")+` td.typical')?.textContent || ""`, func(s string) error {
		if !strings.HasSuffix(s, "s") {
			return fmt.Errorf("typical hold %q", s)
		}
		return nil
	})

	// A semaphore and a read-write lock are rows too: their kind beside the name, every holder
	// with what it holds; readers alone have no age (their token is the last writer's).
	exports, err := reporter.Semaphore("exports:nightly", 3, dlock.WithTTL(time.Minute), dlock.WithLabel("export job")).Acquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer exports.Unlock(ctx)
	catalog := worker.RWMutex("catalog", dlock.WithTTL(time.Minute), dlock.WithLabel("catalog reader"))
	for range 2 {
		r, err := catalog.RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Unlock(ctx)
	}
	run(t, tab, 10*time.Second, "the semaphore and the read-write lock shown",
		chromedp.WaitVisible(css(row("exports:nightly"))), chromedp.WaitVisible(css(row("catalog"))))
	var cells []string
	for _, sel := range []string{row("exports:nightly") + " .kind", row("exports:nightly") + " td.holder", row("catalog") + " .kind",
		row("catalog") + " td.holder", row("catalog") + " td.age"} {
		cells = append(cells, `(document.querySelector('`+sel+`')?.textContent ?? "")`)
	}
	poll(t, tab, 10*time.Second, "their kinds and holders", "["+strings.Join(cells, ", ")+`].join("|")`,
		func(s string) error {
			f := strings.Split(s, "|")
			if len(f) != 5 || f[0] != "semaphore" || !strings.Contains(f[1], "export job 2 permits") ||
				f[2] != "rwmutex" || strings.Count(f[3], "catalog reader reads") != 2 || f[4] != "–" {
				return fmt.Errorf("%q", s)
			}
			return nil
		})

	// A client waits for inventory:sku-7's holder; the screenshot shows it as a waiter.
	waiting, stopWaiting := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		l, err := other.Mutex("inventory:sku-7", dlock.WithLabel("stock sync (replica 2)")).Lock(waiting)
		if err == nil {
			err = l.Unlock(ctx)
		}
		waited <- err
	}()
	defer func() {
		stopWaiting()
		if err := <-waited; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("waiter: %v", err)
		}
	}()
	poll(t, tab, 20*time.Second, "the waiter shown", `document.querySelector('`+row("inventory:sku-7")+` td.waiters > span').textContent`, func(s string) error {
		if s != "1" {
			return fmt.Errorf("waiters %q", s)
		}
		return nil
	})
	// Wait for the notices to be live, so that the release below is heard, and let the page
	// settle before the screenshot.
	poll(t, tab, 20*time.Second, "notices live", `document.getElementById('notices').textContent`, func(s string) error {
		if !strings.HasSuffix(s, "live") {
			return fmt.Errorf("%q", s)
		}
		return nil
	})
	shot := get(t, tab, 20*time.Second, "screenshot", chromedp.CaptureScreenshot())
	if img, err := png.Decode(bytes.NewReader(shot)); err != nil || img.Bounds().Dx() < 800 {
		t.Fatalf("screenshot: not a PNG of the page (%v)", err)
	}
	dest := os.Getenv(screenshotEnv)
	if dest == "" {
		dest = filepath.Join(t.TempDir(), "dlock-web.png")
	}
	if err := os.WriteFile(dest, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", dest, len(shot))

	// A release removes the row at once, without a reload.
	if err := order.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	run(t, tab, 10*time.Second, "the released lock's row removed", chromedp.WaitNotPresent(css(row("orders:42"))))
	run(t, tab, 10*time.Second, "a released entry in the history",
		chromedp.WaitVisible(css(`li.ev[data-kind="released"][data-name="orders:42"]`)))
	if loaded := get(t, tab, 10*time.Second, "check for a reload", chromedp.Evaluate[string](`window.loadedOnce || "reloaded"`)); loaded != "yes" {
		t.Errorf("the page was reloaded")
	}

	// Force-unlock from the page, with its confirmation: the lock is freed.
	run(t, tab, 10*time.Second, "open the confirmation",
		chromedp.Click(css(row("reports:nightly")+" button.unlock")),
		chromedp.WaitVisible(css("#confirm")),
	)
	dialogName := text(t, tab, "#confirm-name")
	if dialogName != "reports:nightly" {
		t.Errorf("the confirmation names %q", dialogName)
	}
	// Cancel first: nothing happens.
	run(t, tab, 10*time.Second, "cancel", chromedp.Click(css("#confirm-cancel")), chromedp.WaitNotVisible(css("#confirm")))
	if info, err := reporter.Inspect(ctx, "reports:nightly"); err != nil || !info.Held {
		t.Fatalf("after Cancel: %+v, %v; want still held", info, err)
	}
	run(t, tab, 10*time.Second, "confirm the force-unlock",
		chromedp.Click(css(row("reports:nightly")+" button.unlock")),
		chromedp.WaitVisible(css("#confirm")),
		chromedp.Click(css("#confirm-ok")),
		chromedp.WaitNotVisible(css("#confirm")),
		chromedp.WaitNotPresent(css(row("reports:nightly"))),
		chromedp.WaitVisible(css(`li.ev[data-kind="force-unlocked"][data-name="reports:nightly"]`)),
	)
	info, err := reporter.Inspect(ctx, "reports:nightly")
	if err != nil || info.Held {
		t.Fatalf("after the force-unlock: %+v, %v; want free", info, err)
	}
	if info.Token != report.Token() {
		t.Errorf("the released token %d, want the holder's %d", info.Token, report.Token())
	}
	if loaded := get(t, tab, 10*time.Second, "check for a reload", chromedp.Evaluate[string](`window.loadedOnce || "reloaded"`)); loaded != "yes" {
		t.Errorf("the page was reloaded")
	}
}
