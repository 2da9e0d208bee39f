package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// exitAtOnce is a command that exits at once: this test binary running no test, which needs
// no PATH (go test -short may run with only go on it).
func exitAtOnce() *exec.Cmd { return exec.Command(os.Args[0], "-test.run=^$") }

// deadPID returns the pid of a process that has exited and been reaped.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exitAtOnce()
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

func hostname(t *testing.T) string {
	t.Helper()
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return host
}

func TestHolderAlive(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("start times are read from /proc")
	}
	host := hostname(t)
	self, _, err := procStart(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	held := func(h dlock.Holder) dlock.Info { return dlock.Info{Name: "x", Held: true, Holder: h, TTL: time.Second} }
	// A child that exited and was not reaped yet: a zombie, not a holder that runs.
	zombie := exitAtOnce()
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	defer zombie.Wait()
	waitFor(t, 5*time.Second, "the child to be a zombie", func(context.Context) error {
		_, z, err := procStart(zombie.Process.Pid)
		if err == nil && !z {
			err = fmt.Errorf("process %d is not a zombie yet", zombie.Process.Pid)
		}
		return err
	})

	for _, tc := range []struct {
		what  string
		info  dlock.Info
		alive string // "true", "false" or "null"
		why   string
	}{
		{"free", dlock.Info{Name: "x"}, "null", ""},
		{"another host", held(dlock.Holder{Host: host + "-other", PID: deadPID(t), Start: self}), "null", ""},
		{"no host", held(dlock.Holder{PID: deadPID(t), Start: self}), "null", ""},
		{"no pid", held(dlock.Holder{Host: host, Start: self}), "null", ""},
		{"exited", held(dlock.Holder{Host: host, PID: deadPID(t), Start: time.Now().Truncate(time.Second)}), "false", "no process"},
		{"zombie", held(dlock.Holder{Host: host, PID: zombie.Process.Pid, Start: time.Now().Truncate(time.Second)}), "false", "no process"},
		{"running", held(dlock.Holder{Host: host, PID: os.Getpid(), Start: self.Truncate(time.Second)}), "true", ""},
		{"pid reused", held(dlock.Holder{Host: host, PID: os.Getpid(), Start: self.Add(-time.Hour)}), "false", "another process"},
		{"started before the holder", held(dlock.Holder{Host: host, PID: os.Getpid(), Start: self.Add(time.Hour)}), "null", ""},
		{"no start stored", held(dlock.Holder{Host: host, PID: os.Getpid()}), "null", ""},
	} {
		alive, why := holderAlive(tc.info)
		got := "null"
		if alive != nil {
			got = map[bool]string{true: "true", false: "false"}[*alive]
		}
		if got != tc.alive || !strings.Contains(why, tc.why) || (tc.why == "") != (why == "") {
			t.Errorf("%s: holderAlive = %s, %q; want %s, %q", tc.what, got, why, tc.alive, tc.why)
		}
	}
}

// A holder on this host whose process is gone: status says so and when the lock frees, list
// marks it, and the JSON of both has holder_alive false; a running holder is true, one on
// another host null.
func TestStatus_DeadHolder(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("start times are read from /proc")
	}
	s := redistest.Start(t)
	host := hostname(t)
	pid := deadPID(t)
	rawLock(t, s, "dead", map[string]any{"host": host, "pid": pid, "start": time.Now().Unix(), "label": "dlock run job"}, time.Minute)
	rawLock(t, s, "elsewhere", map[string]any{"host": host + "-other", "pid": pid, "start": time.Now().Unix()}, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := dlock.Dial(ctx, s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Mutex("running").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(context.Background())

	out, errOut, code := dlockCmd(t, "status", "--redis", s.URL(), "dead")
	if code != exitOK || !strings.Contains(out, "holder process not running; lock frees in ") || !strings.Contains(out, "no process") {
		t.Errorf("status of a dead holder: exit %d\n%s%s", code, out, errOut)
	}
	// "lock frees in 59.9s": the lease left, as the lease line says it.
	if _, after, ok := strings.Cut(out, "lock frees in "); ok {
		left, err := time.ParseDuration(strings.Fields(after)[0])
		if err != nil || left <= 0 || left > time.Minute {
			t.Errorf("lock frees in %q (%v), want the lease left", strings.Fields(after)[0], err)
		}
	}
	for _, name := range []string{"running", "elsewhere"} {
		out, _, _ := dlockCmd(t, "status", "--redis", s.URL(), name)
		if strings.Contains(out, "not running") {
			t.Errorf("status %s says not running:\n%s", name, out)
		}
	}

	out, errOut, code = dlockCmd(t, "list", "--redis", s.URL())
	if code != exitOK {
		t.Fatalf("list: exit %d\n%s", code, errOut)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		dead := strings.HasPrefix(line, "dead ")
		if marked := strings.Contains(line, "[not running]"); marked != dead {
			t.Errorf("list line %q: marked not running: %v, want %v", line, marked, dead)
		}
	}

	out, errOut, code = dlockCmd(t, "list", "--json", "--redis", s.URL())
	var list []map[string]any
	if err := json.Unmarshal([]byte(out), &list); code != exitOK || err != nil {
		t.Fatalf("list --json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	want := map[string]any{"dead": false, "running": true, "elsewhere": nil}
	if len(list) != len(want) {
		t.Errorf("list --json: %d locks, want %d", len(list), len(want))
	}
	for _, m := range list {
		v, ok := m["holder_alive"]
		if !ok || v != want[m["name"].(string)] {
			t.Errorf("list --json: %v has holder_alive %v (present: %v), want %v", m["name"], v, ok, want[m["name"].(string)])
		}
	}
	out, _, _ = dlockCmd(t, "status", "--json", "--redis", s.URL(), "dead")
	var st map[string]any
	if err := json.Unmarshal([]byte(out), &st); err != nil || st["holder_alive"] != false {
		t.Errorf("status --json of a dead holder: holder_alive %v (%v)\n%s", st["holder_alive"], err, out)
	}
	out, _, _ = dlockCmd(t, "status", "--json", "--redis", s.URL(), "free")
	var free map[string]any
	if err := json.Unmarshal([]byte(out), &free); err != nil || free["holder_alive"] != nil {
		t.Errorf("status --json of a free lock: holder_alive %v (%v), want null\n%s", free["holder_alive"], err, out)
	}
	if _, ok := free["holder_alive"]; !ok {
		t.Errorf("status --json of a free lock has no holder_alive field:\n%s", out)
	}
}

// A real holder, dlock run: while it runs, status finds its process (the start it stored
// matches the system's); once it is killed, status says it is not running.
func TestStatus_KilledRunHolder(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("start times are read from /proc")
	}
	s := redistest.Start(t)
	name := "killed-holder"
	p := startDlock(t, "run", "--redis", s.URL(), "--ttl", "30s", name, "--", "sleep", "60")
	waitFor(t, 10*time.Second, "dlock run to hold the lock", heldByOther(t, s, name, 0))

	alive := func() any {
		t.Helper()
		out, errOut, code := dlockCmd(t, "status", "--json", "--redis", s.URL(), name)
		var st map[string]any
		if err := json.Unmarshal([]byte(out), &st); code != exitOK || err != nil {
			t.Fatalf("status --json: exit %d, %v\n%s%s", code, err, out, errOut)
		}
		return st["holder_alive"]
	}
	if a := alive(); a != true {
		t.Fatalf("holder_alive of a running dlock run: %v, want true", a)
	}
	p.cmd.Process.Kill()
	p.wait(t, 10*time.Second)
	if a := alive(); a != false {
		t.Errorf("holder_alive of a killed dlock run: %v, want false", a)
	}
	out, _, _ := dlockCmd(t, "status", "--redis", s.URL(), name)
	if !strings.Contains(out, "holder process not running; lock frees in ") {
		t.Errorf("status of a killed holder:\n%s", out)
	}
}
