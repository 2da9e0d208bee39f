package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// runConcurrently starts one dlock run per args at once, each running script with the log
// file as $0, and fails the test unless every one exits 0. It returns the log's lines.
func runConcurrently(t *testing.T, file string, runs [][]string, script func(i int) string) []string {
	t.Helper()
	bin := dlockBin(t)
	var wg sync.WaitGroup
	for i, args := range runs {
		wg.Go(func() {
			args := append(append([]string{"run"}, args...), "--", "sh", "-c", script(i), file)
			cmd := exec.Command(bin, args...)
			cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("dlock %v: %v\n%s", args, err, out)
			}
		})
	}
	wg.Wait()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// Readers (dlock run --read) run at once; a writer (--write) runs alone.
func TestRun_ReadAndWrite(t *testing.T) {
	s := redistest.Start(t)
	file := filepath.Join(t.TempDir(), "log")
	var runs [][]string
	for i := range 5 {
		mode := "--read"
		if i == 2 {
			mode = "--write"
		}
		runs = append(runs, []string{"--redis", s.URL(), mode, "catalog"})
	}
	lines := runConcurrently(t, file, runs, func(i int) string {
		who := "r"
		if i == 2 {
			who = "w"
		}
		return fmt.Sprintf(`echo "%s-start $DLOCK_TOKEN" >> "$0"; sleep 0.4; echo "%s-end $DLOCK_TOKEN" >> "$0"`, who, who)
	})
	if len(lines) != 10 {
		t.Fatalf("%d lines, want 10:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	readers, most := 0, 0
	for i, l := range lines {
		switch {
		case strings.HasPrefix(l, "w-start"):
			if !strings.HasPrefix(lines[i+1], "w-end") || readers != 0 {
				t.Fatalf("the writer ran with readers:\n%s", strings.Join(lines, "\n"))
			}
		case strings.HasPrefix(l, "r-start"):
			readers++
			most = max(most, readers)
		case strings.HasPrefix(l, "r-end"):
			readers--
		}
	}
	t.Logf("at most %d readers at once", most)
	if most < 2 {
		t.Errorf("readers never ran at once:\n%s", strings.Join(lines, "\n"))
	}
}

// dlock run --permits N/SIZE: never more than SIZE permits held by the runs at once.
func TestRun_Permits(t *testing.T) {
	s := redistest.Start(t)
	file := filepath.Join(t.TempDir(), "log")
	var runs [][]string
	for range 6 {
		runs = append(runs, []string{"--redis", s.URL(), "--permits", "1/2", "backups"})
	}
	lines := runConcurrently(t, file, runs, func(int) string {
		return `echo start >> "$0"; sleep 0.3; echo end >> "$0"`
	})
	held, most := 0, 0
	for _, l := range lines {
		if l == "start" {
			held++
		} else {
			held--
		}
		most = max(most, held)
	}
	if most > 2 || len(lines) != 12 {
		t.Fatalf("%d permits held at once (size 2), %d lines:\n%s", most, len(lines), strings.Join(lines, "\n"))
	}
	for _, bad := range [][]string{{"--permits", "3/2"}, {"--permits", "x"}, {"--read", "--write"}, {"--read", "--permits", "1/2"}, {"--adaptive", "--read"}} {
		args := append(append([]string{"run", "--redis", s.URL()}, bad...), "name", "--", "true")
		if _, errOut, code := dlockCmd(t, args...); code != exitUsage {
			t.Errorf("dlock %v: exit %d (%s), want 2", args, code, errOut)
		}
	}
}

// status, list, unlock --force and resize on a read-write lock and a semaphore.
func TestStatusListUnlock_Shared(t *testing.T) {
	s := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := dlock.Dial(ctx, s.URL(), dlock.WithTTL(900*time.Millisecond), dlock.WithLabel("shared holder"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r1, err := c.RWMutex("catalog").RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c.RWMutex("catalog").RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.Semaphore("exports", 3).Acquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Unlock(ctx)

	// A writer waiting behind the readers: status shows it.
	w, err := dlock.Dial(ctx, s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	wctx, stopWriter := context.WithCancel(ctx)
	writerDone := make(chan error, 1)
	go func() {
		_, err := w.RWMutex("catalog").Lock(wctx)
		writerDone <- err
	}()
	waitFor := redistest.Poll
	if err := waitFor(ctx, "the writer queued", func(ctx context.Context) error {
		if info, err := c.Inspect(ctx, "catalog"); err != nil || info.Shared == nil || info.Shared.WritersQueued != 1 {
			return fmt.Errorf("%+v, %v", info.Shared, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	out, _, code := dlockCmd(t, "status", "--redis", s.URL(), "catalog")
	if code != 0 || !strings.Contains(out, "(1 to write)") {
		t.Errorf("status with a writer waiting: exit %d:\n%s", code, out)
	}
	out, _, _ = dlockCmd(t, "status", "--json", "--redis", s.URL(), "catalog")
	var queued struct {
		Shared struct {
			Queued        int `json:"queued"`
			WritersQueued int `json:"writers_queued"`
		} `json:"shared"`
	}
	if err := json.Unmarshal([]byte(out), &queued); err != nil || queued.Shared.Queued != 1 || queued.Shared.WritersQueued != 1 {
		t.Errorf("status --json with a writer waiting: %v\n%s", err, out)
	}
	stopWriter()
	if err := <-writerDone; !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled writer: %v", err)
	}

	out, errOut, code := dlockCmd(t, "status", "--json", "--redis", s.URL(), "catalog")
	var st map[string]any
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil {
		t.Fatalf("status --json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	sh, _ := st["shared"].(map[string]any)
	if st["kind"] != "rwmutex" || st["held"] != true || sh["readers"] != float64(2) || sh["writer"] != false {
		t.Errorf("status --json of a read-write lock held by two readers: %s", out)
	}
	if hs, _ := sh["holders"].([]any); len(hs) != 2 {
		t.Errorf("holders %v, want 2", sh["holders"])
	}
	out, _, code = dlockCmd(t, "status", "--redis", s.URL(), "catalog")
	if code != 0 || !strings.Contains(out, "held for reading by 2 readers") || !strings.Contains(out, "shared holder") {
		t.Errorf("status: exit %d:\n%s", code, out)
	}
	out, _, code = dlockCmd(t, "status", "--redis", s.URL(), "exports")
	if code != 0 || !strings.Contains(out, "semaphore, 2 of 3 permits held") {
		t.Errorf("status of the semaphore: exit %d:\n%s", code, out)
	}
	out, _, code = dlockCmd(t, "list", "--redis", s.URL())
	if code != 0 || !strings.Contains(out, "rw: 2 readers") || !strings.Contains(out, "semaphore: 2/3 permits, 1 holder") {
		t.Errorf("list: exit %d:\n%s", code, out)
	}
	out, errOut, code = dlockCmd(t, "unlock", "--force", "--redis", s.URL(), "catalog")
	if code != 0 || !strings.Contains(out, "it was held by 2 holders (no writer and 2 readers, 0 waiting (0 writers)); 0 waiting clients woken") {
		t.Errorf("unlock --force: exit %d, %q %q", code, out, errOut)
	}
	for _, l := range []*dlock.Lease{r1, r2} {
		select {
		case <-l.Context().Done():
			if !errors.Is(context.Cause(l.Context()), dlock.ErrLost) {
				t.Errorf("lease ended with %v, want ErrLost", context.Cause(l.Context()))
			}
		case <-time.After(3 * time.Second):
			t.Error("a reader's lease was not lost after unlock --force")
		}
	}
	out, errOut, code = dlockCmd(t, "resize", "--redis", s.URL(), "exports", "5")
	if want := "semaphore exports: resized 3 → 5 (sticky); 2 permits held by 1 holder\n"; code != 0 || out != want {
		t.Errorf("resize: exit %d, %q %q; want %q", code, out, errOut, want)
	}
	l, err := c.Semaphore("exports", 3).TryAcquire(ctx, 3) // declared 3: follows the stored 5
	if err != nil {
		t.Fatalf("a handle of the old size after resize: %v, want it to follow the new size", err)
	}
	out, _, code = dlockCmd(t, "status", "--redis", s.URL(), "exports")
	if code != 0 || !strings.Contains(out, "5 of 5 permits held") || !strings.Contains(out, "size:     5 (set by dlock resize") ||
		!strings.Contains(out, "3 permits:") || !strings.Contains(out, "2 permits:") {
		t.Errorf("status after the resize: exit %d:\n%s", code, out)
	}
	l.Unlock(ctx)
	if _, _, code := dlockCmd(t, "resize", "--redis", s.URL(), "exports", "0"); code != exitUsage {
		t.Errorf("resize to 0: exit %d, want 2", code)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"nosuchsem", "4"}, "semaphore nosuchsem: created: size 4 stored for a semaphore nobody holds yet (sticky)\n"},
		{[]string{"nosuchsem", "4"}, "semaphore nosuchsem: size 4 unchanged (sticky); nobody holds it\n"},
		{[]string{"--reset", "nosuchsem"}, "semaphore nosuchsem: size 4 reset: no longer sticky, forgotten at once (nobody holds it)\n"},
		{[]string{"--reset", "nosuchsem"}, "semaphore nosuchsem: no size stored: nothing to reset\n"},
		{[]string{"--reset", "exports"}, "semaphore exports: size 5 reset: no longer sticky, forgotten once the semaphore has been free for the token retention; 2 permits held by 1 holder\n"},
		{[]string{"--reset", "exports"}, "semaphore exports: size 5 was not set by dlock resize (a holder stored it): nothing to reset\n"},
	} {
		out, errOut, code := dlockCmd(t, append([]string{"resize", "--redis", s.URL()}, c.args...)...)
		if code != 0 || out != c.want {
			t.Errorf("resize %v: exit %d, %q %q; want %q", c.args, code, out, errOut, c.want)
		}
	}
	// The CLI's errors speak of the command, not of the library's API.
	for _, args := range [][]string{{"resize", "exports"}, {"resize", "--reset", "exports", "3"}, {"resize", "exports", "x"}} {
		_, errOut, code := dlockCmd(t, append(args, "--redis", s.URL())...)
		if code != exitUsage || !strings.HasPrefix(errOut, "dlock resize: ") || strings.Contains(errOut, "Semaphore") {
			t.Errorf("%v: exit %d, %q; want a usage error of dlock resize", args, code, errOut)
		}
	}
}
