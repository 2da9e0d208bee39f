// Package webtest drives "dlock web" from a real browser: headless Chromium (Debian's chromium
// package), through the DevTools protocol with chromedp. It is a module of its own so that
// chromedp and its protocol bindings stay out of the library's dependencies.
package webtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(cleanup{m})
}

// cleanup removes the command built for the tests once they have run.
type cleanup struct{ m *testing.M }

func (c cleanup) Run() int {
	code := c.m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	return code
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

// built is the command, built once for every test.
var built struct {
	sync.Once
	dir, bin string
	err      error
}

// buildDlock builds the command into a temporary directory (once).
func buildDlock(t *testing.T) string {
	t.Helper()
	built.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "dlock-webtest-"); built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "dlock")
		cmd := exec.Command("go", "build", "-o", built.bin, ".")
		cmd.Dir = ".." // cmd/dlock, in the library's module
		if out, err := cmd.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
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
	// Generous: on a loaded machine (make test runs the modules side by side) the page's timers
	// were once seen to stall for 10 s.
	poll(t, tab, 30*time.Second, "the countdown moving", leftExpr, func(ms float64) error {
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
	// An election: its leader's lock shows as one, with the candidate queued behind it.
	if _, err := reporter.Election("scheduler", dlock.WithTTL(time.Minute), dlock.WithLabel("dlock elect ./scheduler")).Campaign(ctx, "replica-1 (10.0.0.5:8080)"); err != nil {
		t.Fatal(err)
	}
	campaigning, stopCampaign := context.WithCancel(ctx)
	campaigned := make(chan error, 1)
	go func() {
		ld, err := other.Election("scheduler", dlock.WithLabel("dlock elect ./scheduler")).Campaign(campaigning, "replica-2")
		if err == nil {
			err = ld.Resign(ctx)
		}
		campaigned <- err
	}()
	defer func() {
		stopCampaign()
		if err := <-campaigned; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("candidate: %v", err)
		}
	}()
	poll(t, tab, 20*time.Second, "the election shown", `document.querySelector('`+row("scheduler")+` .leader')?.textContent || ""`, func(s string) error {
		if !strings.Contains(s, "replica-1 (10.0.0.5:8080)") || !strings.HasSuffix(s, "1 candidate waiting") {
			return fmt.Errorf("leader %q", s)
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
	// A hot lock: two clients hand "sessions:gc" to each other a few hundred times; the
	// history folds it into one row (what the screenshot shows under the rare entries).
	hot, stopHot := context.WithTimeout(ctx, 30*time.Second)
	var hotWG sync.WaitGroup
	for i, c := range []*dlock.Client{worker, reporter} {
		hotWG.Add(1)
		go func() {
			defer hotWG.Done()
			m := c.Mutex("sessions:gc", dlock.WithTTL(10*time.Second), dlock.WithLabel(fmt.Sprintf("gc %d", i+1)))
			for n := 0; n < 200 && hot.Err() == nil; n++ {
				if l, err := m.Lock(hot); err == nil {
					l.Unlock(ctx)
				}
			}
		}()
	}
	hotWG.Wait()
	stopHot()
	run(t, tab, 10*time.Second, "the hot lock folded", chromedp.WaitVisible(css(`li.handoffs[data-name="sessions:gc"]`)))
	shot := get(t, tab, 20*time.Second, "screenshot", chromedp.FullScreenshot(100)) // the whole page: the history too
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

	// Force-unlock from the page, with its confirmation: the lock is freed. The table is drawn
	// anew as the page's data changes, so a click can land between two drawings; a person
	// whose click did nothing clicks again.
	openConfirm := func(what string) {
		t.Helper()
		for try := 1; ; try++ {
			ctx, cancel := context.WithTimeout(tab, 5*time.Second)
			err := chromedp.Do(ctx, chromedp.Click(css(row("reports:nightly")+" button.unlock")), chromedp.WaitVisible(css("#confirm")))
			cancel()
			if err == nil {
				return
			}
			if try == 3 {
				t.Fatalf("%s: %v", what, err)
			}
		}
	}
	openConfirm("open the confirmation")
	dialogName := text(t, tab, "#confirm-name")
	if dialogName != "reports:nightly" {
		t.Errorf("the confirmation names %q", dialogName)
	}
	// Cancel first: nothing happens.
	run(t, tab, 10*time.Second, "cancel", chromedp.Click(css("#confirm-cancel")), chromedp.WaitNotVisible(css("#confirm")))
	if info, err := reporter.Inspect(ctx, "reports:nightly"); err != nil || !info.Held {
		t.Fatalf("after Cancel: %+v, %v; want still held", info, err)
	}
	openConfirm("open the confirmation again")
	{
		ctx, cancel := context.WithTimeout(tab, 10*time.Second)
		err := chromedp.Do(ctx, chromedp.Click(css("#confirm-ok")), chromedp.WaitNotVisible(css("#confirm")))
		cancel()
		if err != nil {
			t.Fatalf("confirm the force-unlock: %v; the dialog says %q", err, text(t, tab, "#confirm-error"))
		}
	}
	run(t, tab, 10*time.Second, "the force-unlocked lock's row removed", chromedp.WaitNotPresent(css(row("reports:nightly"))))
	run(t, tab, 10*time.Second, "a force-unlocked entry in the history",
		chromedp.WaitVisible(css(`li.ev[data-kind="force-unlocked"][data-name="reports:nightly"]`)))
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

// dialT dials the test server; the client closes when the test ends.
func dialT(t *testing.T, ctx context.Context, url string) *dlock.Client {
	t.Helper()
	c, err := dlock.Dial(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func lockT(t *testing.T, ctx context.Context, c *dlock.Client, name, label string, ttl time.Duration) *dlock.Lease {
	t.Helper()
	l, err := c.Mutex(name, dlock.WithTTL(ttl), dlock.WithLabel(label)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// openPage starts the browser on path and waits until sel shows and the release notices are live.
func openPage(t *testing.T, base, path, sel string) context.Context {
	t.Helper()
	tab := browser(t, chromium(t))
	run(t, tab, 30*time.Second, "open "+path, chromedp.Navigate(base+path), chromedp.WaitVisible(css(sel)))
	poll(t, tab, 20*time.Second, "notices live", `document.getElementById('notices').textContent`, func(s string) error {
		if !strings.HasSuffix(s, "live") {
			return fmt.Errorf("%q", s)
		}
		return nil
	})
	return tab
}

// eval evaluates expr in the page.
func eval[T any](t *testing.T, tab context.Context, expr string) T {
	t.Helper()
	return get(t, tab, 10*time.Second, "evaluate "+expr, chromedp.Evaluate[T](expr))
}

// historyRows is the history as the page shows it, newest first: "kind name" per row.
const historyRows = `Array.from(document.querySelectorAll('#history li')).map(li => li.dataset.kind + " " + li.dataset.name)`

// A hot lock, handed between two clients as fast as they can, is one row of the history that
// counts its handoffs ("N handoffs in the last 10 s") and keeps counting while the page is
// open; a force-unlock of another lock meanwhile stays in view beside it. The kind checkboxes
// hide and show the rows of their kinds, and the name filter the rows of other names.
func TestBrowser_HotLockFoldsHistory(t *testing.T) {
	s := redistest.Start(t)
	bin := buildDlock(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stuckHolder := dialT(t, ctx, s.URL())
	stuck := lockT(t, ctx, stuckHolder, "batch:stuck", "stuck job", time.Minute)
	base := startWeb(t, bin, "--redis", s.URL(), "--allow-unlock")
	tab := openPage(t, base, "/", row("batch:stuck"))

	// Two clients take "hot:counter" in turn: every release grants it to the other one. They go
	// on until the test has seen the fold, the force-unlock and some holds after both (or 40 s,
	// or 100,000 holds each, have passed): a fixed number of holds could all be done before the
	// page's first look, leaving nothing to count on.
	hotCtx, stopHot := context.WithTimeout(ctx, 40*time.Second)
	var wg sync.WaitGroup
	var locked atomic.Int64
	for i := range 2 {
		c := dialT(t, ctx, s.URL())
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := c.Mutex("hot:counter", dlock.WithTTL(10*time.Second), dlock.WithLabel(fmt.Sprintf("hot worker %d", i)))
			for n := 0; n < 100_000 && hotCtx.Err() == nil; n++ {
				l, err := m.Lock(hotCtx)
				if err != nil {
					return
				}
				locked.Add(1)
				l.Unlock(ctx)
			}
		}()
	}
	defer func() {
		stopHot()
		wg.Wait()
	}()

	foldExpr := `(() => { const li = document.querySelector('#history li.handoffs[data-name="hot:counter"]');
		return li ? li.dataset.count + "|" + li.querySelector('.fold-text').textContent : "" })()`
	foldText := regexp.MustCompile(`^[\d,]+ handoffs? in the last 10 s · [\d,]+ since \d\d:\d\d:\d\d\.\d{3}$`)
	foldCount := func(s string) int {
		var n int
		fmt.Sscan(strings.SplitN(s, "|", 2)[0], &n)
		return n
	}
	seen := poll(t, tab, 30*time.Second, "the hot lock folded into one row", foldExpr, func(s string) error {
		f := strings.SplitN(s, "|", 2)
		if len(f) != 2 || foldCount(s) < 50 || !foldText.MatchString(f[1]) {
			return fmt.Errorf("fold row %q", s)
		}
		return nil
	})
	t.Logf("fold row: %s (%d locks taken so far)", seen, locked.Load())

	// A rare event while the hot lock goes on: the force-unlock of batch:stuck, from the page.
	run(t, tab, 20*time.Second, "force-unlock batch:stuck",
		chromedp.Click(css(row("batch:stuck")+" button.unlock")),
		chromedp.WaitVisible(css("#confirm")),
		chromedp.Click(css("#confirm-ok")),
		chromedp.WaitNotVisible(css("#confirm")),
	)
	forced := `li.ev[data-kind="force-unlocked"][data-name="batch:stuck"]`
	run(t, tab, 10*time.Second, "the force-unlock in the history", chromedp.WaitVisible(css(forced)))
	if info, err := stuckHolder.Inspect(ctx, "batch:stuck"); err != nil || info.Held || info.Token != stuck.Token() {
		t.Fatalf("batch:stuck after the force-unlock: %+v, %v", info, err)
	}

	// The hot lock goes on for 200 more holds, then stops; its one row has counted on, and the
	// force-unlock is still among the first rows.
	more := locked.Load() + 200
	for deadline := time.Now().Add(20 * time.Second); locked.Load() < more && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	stopHot()
	wg.Wait()
	total := locked.Load()
	if total < more {
		t.Fatalf("the hot lock was taken %d times only, %d after the force-unlock; want 200 more for the test to mean something", total, total-more+200)
	}
	final := poll(t, tab, 20*time.Second, "the fold counting on", foldExpr, func(s string) error {
		if foldCount(s) <= foldCount(seen) {
			return fmt.Errorf("fold row %q, first seen %q", s, seen)
		}
		return nil
	})
	rows := poll(t, tab, 10*time.Second, "the history rows", historyRows, func(r []string) error {
		hot, folds := 0, 0
		for _, x := range r {
			if strings.HasSuffix(x, " hot:counter") {
				hot++
				if strings.HasPrefix(x, "handoffs ") {
					folds++
				}
			}
		}
		// At most the handoffs before the fold began and after it would end.
		if folds != 1 || hot > 6 {
			return fmt.Errorf("%d rows of hot:counter, %d of them folds, for %d locks taken: %q", hot, folds, total, r)
		}
		for i, x := range r {
			if x == "force-unlocked batch:stuck" && i < 8 {
				return nil
			}
		}
		return fmt.Errorf("the force-unlock is not among the first rows: %q", r)
	})
	t.Logf("%d locks taken; fold row %s; history %q", total, final, rows)

	// The kind filter: without force-unlocked, that row goes and the fold stays; without the
	// handoff kinds the fold goes; with force-unlocked again its row is back.
	box := func(v string) chromedp.CSS { return css(`#history-kinds input[value="` + v + `"]`) }
	fold := `li.handoffs[data-name="hot:counter"]`
	run(t, tab, 10*time.Second, "hide the force-unlocks", chromedp.Click(box("forced")), chromedp.WaitNotPresent(css(forced)), chromedp.WaitVisible(css(fold)))
	run(t, tab, 10*time.Second, "hide the handoffs",
		chromedp.Click(box("acquired")), chromedp.Click(box("released")), chromedp.Click(box("granted")),
		chromedp.WaitNotPresent(css(fold)))
	if loc := get(t, tab, 10*time.Second, "the address", chromedp.Location()); !strings.Contains(loc, "kinds=lost") {
		t.Errorf("the address %s does not keep the kinds shown", loc)
	}
	run(t, tab, 10*time.Second, "show the force-unlocks again", chromedp.Click(box("forced")), chromedp.WaitVisible(css(forced)))
	if r := eval[[]string](t, tab, historyRows); len(r) != 1 || r[0] != "force-unlocked batch:stuck" {
		t.Errorf("with force-unlocked alone ticked, the history shows %q", r)
	}
	// Every kind again, and the name filter: only the rows of names containing "STUCK" (any case).
	run(t, tab, 10*time.Second, "tick every kind",
		chromedp.Click(box("acquired")), chromedp.Click(box("released")), chromedp.Click(box("granted")),
		chromedp.WaitVisible(css(fold)),
		chromedp.SendKeys(css("#history-name"), "STUCK"),
		chromedp.WaitNotPresent(css(fold)),
	)
	if r := eval[[]string](t, tab, historyRows); len(r) < 2 || slices.ContainsFunc(r, func(x string) bool { return !strings.HasSuffix(x, " batch:stuck") }) {
		t.Errorf("filtered by the name STUCK, the history shows %q", r)
	}
}

// A lock released to a client queued for it (granted by the server) shows its new holder at
// once: the holder's label, host and pid as Inspect and "dlock list" give them, never the
// empty holder ("- · pid 0") the grant's notice alone would give. The page lists the locks
// only every hour here: the notice and what the page learns from it show the holder.
func TestBrowser_GrantedLockShowsHolder(t *testing.T) {
	s := redistest.Start(t)
	bin := buildDlock(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	first, second := dialT(t, ctx, s.URL()), dialT(t, ctx, s.URL())
	held := lockT(t, ctx, first, "jobs:handoff", "first holder", time.Minute)
	base := startWeb(t, bin, "--redis", s.URL(), "--refresh", "1h")
	tab := openPage(t, base, "/", row("jobs:handoff"))
	cell := row("jobs:handoff") + " td.holder"
	if h := text(t, tab, cell); !strings.Contains(h, "first holder") {
		t.Fatalf("holder cell %q before the handoff", h)
	}
	// Every text the holder cell shows from now on.
	eval[string](t, tab, `window.holderTexts = [];
		new MutationObserver(() => { const c = document.querySelector('`+cell+`'); if (c) window.holderTexts.push(c.textContent); })
			.observe(document.getElementById('rows'), { subtree: true, childList: true, characterData: true }); "ok"`)

	got := make(chan *dlock.Lease, 1)
	go func() {
		l, err := second.Mutex("jobs:handoff", dlock.WithTTL(time.Minute), dlock.WithLabel("queued worker")).Lock(ctx)
		if err != nil {
			t.Errorf("the queued client: %v", err)
		}
		got <- l
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := first.Inspect(ctx, "jobs:handoff")
		if err == nil && info.Waiters >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no client queued: %+v, %v", info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var next *dlock.Lease
	select {
	case next = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("the queued client did not get the lock")
	}
	if next == nil {
		t.FailNow()
	}
	defer next.Unlock(ctx)

	info, err := first.Inspect(ctx, "jobs:handoff")
	if err != nil || info.Token != next.Token() || info.Holder.Label != "queued worker" {
		t.Fatalf("Inspect after the handoff: %+v, %v", info, err)
	}
	out, err := exec.CommandContext(ctx, bin, "list", "--json", "--redis", s.URL()).Output()
	if err != nil {
		t.Fatalf("dlock list --json: %v", err)
	}
	var list []struct {
		Name   string `json:"name"`
		Token  uint64 `json:"token"`
		Holder struct {
			Host  string `json:"host"`
			PID   int    `json:"pid"`
			Label string `json:"label"`
		} `json:"holder"`
	}
	if err := json.Unmarshal(out, &list); err != nil || len(list) != 1 {
		t.Fatalf("dlock list --json: %s (%v)", out, err)
	}
	lh := list[0].Holder
	if lh.Host != info.Holder.Host || lh.PID != info.Holder.PID || lh.Label != info.Holder.Label || list[0].Token != info.Token {
		t.Fatalf("dlock list %+v, Inspect %+v", list[0], info)
	}
	// The cell reads host · pid N, then the label.
	want := fmt.Sprintf("%s · pid %d%s", lh.Host, lh.PID, lh.Label)
	poll(t, tab, 10*time.Second, "the new holder shown", `document.querySelector('`+cell+`').textContent`, func(s string) error {
		if s != want {
			return fmt.Errorf("holder cell %q, want %q", s, want)
		}
		return nil
	})
	if tok := text(t, tab, row("jobs:handoff")+" td.token"); tok != fmt.Sprint(next.Token()) {
		t.Errorf("token cell %q, want the new holder's %d", tok, next.Token())
	}
	shown := eval[[]string](t, tab, `window.holderTexts`)
	for _, s := range shown {
		if strings.Contains(s, "pid 0") {
			t.Errorf("the holder cell showed %q during the handoff (all: %q)", s, shown)
		}
	}
	t.Logf("the holder cell showed %q", shown)
}

// The page's address sets its filters: ?name_prefix= the table's (and the history's) name
// prefix, ?history_name= the history's name filter, ?kinds= the kinds of entries shown; and it
// keeps them as they change.
func TestBrowser_FiltersFromURL(t *testing.T) {
	s := redistest.Start(t)
	bin := buildDlock(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := dialT(t, ctx, s.URL())
	for _, name := range []string{"orders:1", "orders:2", "reports:daily"} {
		lockT(t, ctx, c, name, "url test", time.Minute)
	}
	base := startWeb(t, bin, "--redis", s.URL())
	tab := openPage(t, base, "/?name_prefix=orders:&history_name=2&kinds=acquired", row("orders:1"))
	if v := get(t, tab, 10*time.Second, "the filter", chromedp.Value(css("#filter"))); v != "orders:" {
		t.Errorf("the filter box holds %q, want orders:", v)
	}
	if v := get(t, tab, 10*time.Second, "the history's name filter", chromedp.Value(css("#history-name"))); v != "2" {
		t.Errorf("the history's name filter holds %q, want 2", v)
	}
	run(t, tab, 10*time.Second, "orders shown, reports not",
		chromedp.WaitVisible(css(row("orders:2"))), chromedp.WaitNotPresent(css(row("reports:daily"))))
	if n := text(t, tab, "#count"); n != "2 of 3 held" {
		t.Errorf("count %q, want 2 of 3 held", n)
	}
	ticked := eval[[]string](t, tab, `Array.from(document.querySelectorAll('#history-kinds input:checked')).map(b => b.value)`)
	if !slices.Equal(ticked, []string{"acquired"}) {
		t.Errorf("kinds ticked %q, want acquired alone", ticked)
	}
	poll(t, tab, 10*time.Second, "the history of orders:2 alone", historyRows, func(r []string) error {
		if !slices.Equal(r, []string{"acquired orders:2"}) {
			return fmt.Errorf("history %q", r)
		}
		return nil
	})
	// Typing in the filter changes the rows and the address.
	run(t, tab, 10*time.Second, "filter by reports",
		chromedp.SendKeys(css("#filter"), strings.Repeat(kb.Backspace, len("orders:"))+"reports"),
		chromedp.WaitVisible(css(row("reports:daily"))), chromedp.WaitNotPresent(css(row("orders:1"))))
	if loc := get(t, tab, 10*time.Second, "the address", chromedp.Location()); !strings.Contains(loc, "name_prefix=reports") || strings.Contains(loc, "orders") {
		t.Errorf("the address %s does not keep the filter", loc)
	}
}

// Durations read well at every scale: the formatter of the page, and a hold of a few
// milliseconds as the history shows it (not "0.0s").
func TestBrowser_DurationFormat(t *testing.T) {
	s := redistest.Start(t)
	bin := buildDlock(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := dialT(t, ctx, s.URL())
	lockT(t, ctx, c, "slow:job", "slow", time.Minute)
	base := startWeb(t, bin, "--redis", s.URL())
	tab := openPage(t, base, "/", row("slow:job"))

	cases := []struct {
		ms   float64
		want string
	}{
		{0, "0 µs"}, {0.0004, "0 µs"}, {0.85, "850 µs"}, {0.9996, "1.0 ms"}, {4.24, "4.2 ms"}, {9.96, "10 ms"},
		{12.4, "12 ms"}, {999.4, "999 ms"}, {999.6, "1.0 s"}, {1400, "1.4 s"}, {9940, "9.9 s"}, {9960, "10 s"},
		{59400, "59 s"}, {59600, "1 min"}, {185000, "3 min 5 s"}, {3600000, "1 h"}, {7500000, "2 h 5 min"},
		{47 * 3600000, "47 h"}, {(3*24 + 4) * 3600000, "3 d 4 h"}, {-5, "0 µs"},
	}
	var in []string
	for _, tc := range cases {
		in = append(in, fmt.Sprint(tc.ms))
	}
	got := eval[[]string](t, tab, `[`+strings.Join(in, ",")+`].map(ms => dlockPage.fmtDur(ms)).concat([dlockPage.fmtDur(null)])`)
	for i, tc := range cases {
		if got[i] != tc.want {
			t.Errorf("fmtDur(%v ms) = %q, want %q", tc.ms, got[i], tc.want)
		}
	}
	if got[len(cases)] != "–" {
		t.Errorf("fmtDur(null) = %q, want –", got[len(cases)])
	}

	// On the page: a lock held for a moment; its release reads "held N ms" (or µs), the figure
	// the server measured; a minute's lease reads in seconds.
	l := lockT(t, ctx, c, "fast:job", "fast", time.Minute)
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	released := `li.ev[data-kind="released"][data-name="fast:job"]`
	run(t, tab, 10*time.Second, "the release in the history", chromedp.WaitVisible(css(released)))
	held := text(t, tab, released+" .held")
	ev := eval[map[string]any](t, tab, `dlockPage.events().find(e => e.name === "fast:job" && e.kind === "released")`)
	us, _ := ev["hold_us"].(float64)
	want := eval[string](t, tab, fmt.Sprintf(`"held " + dlockPage.fmtDur(%v / 1000)`, us))
	if held != want {
		t.Errorf("the release reads %q; its hold of %v µs is %q", held, us, want)
	}
	if us < 1e6 && !regexp.MustCompile(`^held \d+(\.\d)? (µs|ms)$`).MatchString(held) {
		t.Errorf("a hold of %v µs reads %q", us, held)
	}
	// A fresh minute's lease may still read "1 min" (59.6 s and more round up).
	if lease := text(t, tab, row("slow:job")+" td.lease .lease-text"); !regexp.MustCompile(`^(\d\d s|1 min)$`).MatchString(lease) {
		t.Errorf("a minute's lease reads %q", lease)
	}
}

// A lock whose name is not UTF-8 ("\xff\xfe x") shows with its bytes written out, and the
// page's Force unlock releases that very lock (the page sends the name's bytes, name_b64).
func TestBrowser_NotUTF8Name(t *testing.T) {
	s := redistest.Start(t)
	bin := buildDlock(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := dialT(t, ctx, s.URL())
	const name = "\xff\xfe x"
	b64 := base64.StdEncoding.EncodeToString([]byte(name))
	l := lockT(t, ctx, c, name, "binary name", time.Minute)
	lockT(t, ctx, c, "\ufffd\ufffd x", "its look-alike", time.Minute) // what the name becomes as JSON text
	base := startWeb(t, bin, "--redis", s.URL(), "--allow-unlock")
	sel := `tr[data-name-b64="` + b64 + `"]`
	tab := openPage(t, base, "/", sel)
	if shown := text(t, tab, sel+" td.name button"); shown != `\xff\xfe x` {
		t.Errorf("the name reads %q, want \\xff\\xfe x", shown)
	}

	resp, err := http.Get(base + "/api/locks")
	if err != nil {
		t.Fatal(err)
	}
	var api []map[string]any
	err = json.NewDecoder(resp.Body).Decode(&api)
	resp.Body.Close()
	if err != nil || len(api) != 2 || !slices.ContainsFunc(api, func(m map[string]any) bool { return m["name_b64"] == b64 }) {
		t.Errorf("/api/locks: %v (%v), want an entry with name_b64 %s", api, err, b64)
	}

	run(t, tab, 20*time.Second, "force-unlock it from the page",
		chromedp.Click(css(sel+" button.unlock")),
		chromedp.WaitVisible(css("#confirm")),
	)
	if n := text(t, tab, "#confirm-name"); n != `\xff\xfe x` {
		t.Errorf("the confirmation names %q", n)
	}
	run(t, tab, 20*time.Second, "confirm",
		chromedp.Click(css("#confirm-ok")),
		chromedp.WaitNotVisible(css("#confirm")),
		chromedp.WaitNotPresent(css(sel)),
		chromedp.WaitVisible(css(`li.ev[data-kind="force-unlocked"][data-name-b64="`+b64+`"]`)),
	)
	info, err := c.Inspect(ctx, name)
	if err != nil || info.Held || info.Token != l.Token() {
		t.Errorf("after the force-unlock: %+v, %v; want free, released from token %d", info, err, l.Token())
	}
	if other, err := c.Inspect(ctx, "\ufffd\ufffd x"); err != nil || !other.Held {
		t.Errorf("the look-alike: %+v, %v; want still held", other, err)
	}
	if n := text(t, tab, `li.ev[data-kind="force-unlocked"] .name`); n != `\xff\xfe x` {
		t.Errorf("the history names %q", n)
	}
}

// An election in the page: the row of its leader's lock says "election", with the leader's
// value, its term and the candidates waiting; when the leader resigns, the next candidate's
// value and term replace them without a reload.
func TestBrowser_Election(t *testing.T) {
	s := redistest.Start(t)
	bin := buildDlock(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, b := dialT(t, ctx, s.URL()), dialT(t, ctx, s.URL())
	first, err := a.Election("scheduler", dlock.WithTTL(time.Minute), dlock.WithLabel("replica one")).Campaign(ctx, "replica-1")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *dlock.Leadership, 1)
	go func() {
		ld, err := b.Election("scheduler", dlock.WithTTL(time.Minute), dlock.WithLabel("replica two")).Campaign(ctx, "replica-2")
		if err != nil {
			t.Errorf("the second candidate: %v", err)
		}
		got <- ld
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := a.Inspect(ctx, "scheduler")
		if err == nil && info.Waiters == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no candidate queued: %+v, %v", info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	base := startWeb(t, bin, "--redis", s.URL())
	tab := openPage(t, base, "/", row("scheduler"))
	leader := `(() => { const r = document.querySelector('` + row("scheduler") + `');
		return [r.querySelector('.kind').textContent, r.querySelector('.leader .value').textContent,
			r.querySelector('.leader .term').textContent, r.querySelector('.leader').textContent,
			r.querySelector('td.token').textContent, r.querySelector('td.holder').textContent].join("|") })()`
	want := func(value string, term uint64, waiting, label string) func(string) error {
		return func(s string) error {
			f := strings.Split(s, "|")
			if len(f) != 6 || f[0] != "election" || f[1] != value || f[2] != fmt.Sprint(term) || !strings.HasSuffix(f[3], waiting) ||
				f[4] != fmt.Sprint(term) || !strings.Contains(f[5], label) {
				return fmt.Errorf("kind|value|term|leader|token|holder = %q; want election, %s, term %d, %q, holder %q", s, value, term, waiting, label)
			}
			return nil
		}
	}
	poll(t, tab, 20*time.Second, "the election and its first leader", leader, want("replica-1", first.Term(), "1 candidate waiting", "replica one"))
	get(t, tab, 10*time.Second, "mark the page", chromedp.Evaluate[string](`window.loadedOnce = "yes"`))

	if err := first.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	var second *dlock.Leadership
	select {
	case second = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("the second candidate does not lead after the first resigned")
	}
	if second == nil {
		t.FailNow()
	}
	defer second.Resign(ctx)
	if second.Term() <= first.Term() {
		t.Fatalf("terms %d then %d", first.Term(), second.Term())
	}
	poll(t, tab, 10*time.Second, "the next leader", leader, want("replica-2", second.Term(), "0 candidates waiting", "replica two"))
	if loaded := get(t, tab, 10*time.Second, "check for a reload", chromedp.Evaluate[string](`window.loadedOnce || "reloaded"`)); loaded != "yes" {
		t.Errorf("the page was reloaded")
	}
}
