package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(cleanupM{m})
}

// cleanupM removes the binary built for run_test.go once the tests have run.
type cleanupM struct{ m *testing.M }

func (c cleanupM) Run() int {
	defer removeBuilt()
	return c.m.Run()
}

// smallDemo keeps a full three-mode run to a few seconds.
var smallDemo = []string{"demo", "--stock", "60", "--procs", "3", "--goroutines", "4", "--ttl", "200ms", "--pauses", "1"}

// buildFlags are added to the go build of the command.
var buildFlags []string

// buildDlock builds this command into a temporary directory and returns the binary's path.
func buildDlock(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "dlock")
	args := append(append([]string{"build"}, buildFlags...), "-o", bin, ".")
	out, err := exec.Command(goBin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// runDlock runs bin with args and env (added to this process's environment), and returns its
// output and exit code.
func runDlock(t *testing.T, bin string, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 5 * time.Second
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = cmd.ProcessState.ExitCode()
	if err != nil && code < 0 {
		t.Fatalf("dlock %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, o.String(), e.String())
	}
	return o.String(), e.String(), code
}

// row is one line of the demo's table.
type row struct {
	sold, left, oversold int64
	rejected             string
}

// parseRows finds the table rows of the demo's output, by mode title.
func parseRows(t *testing.T, out string) map[string]row {
	t.Helper()
	rows := make(map[string]row)
	for _, line := range strings.Split(out, "\n") {
		for mode, title := range modeTitles {
			rest, ok := strings.CutPrefix(line, title+" ")
			if !ok || strings.HasPrefix(line, "  ") {
				continue
			}
			f := strings.Fields(rest)
			if len(f) != 6 {
				continue // a progress line
			}
			var r row
			var err error
			for i, p := range []*int64{&r.sold, &r.left, &r.oversold} {
				if *p, err = strconv.ParseInt(f[i], 10, 64); err != nil {
					t.Fatalf("row %q: column %d: %v", line, i+1, err)
				}
			}
			r.rejected = f[3]
			rows[mode] = r
		}
	}
	return rows
}

// checkRows checks the rows of a run of smallDemo.
func checkRows(t *testing.T, out string) {
	t.Helper()
	rows := parseRows(t, out)
	for _, mode := range []string{modeNoLock, modeNaive, modeDlock} {
		if _, ok := rows[mode]; !ok {
			t.Errorf("no %q row in the output", modeTitles[mode])
		}
	}
	if r, ok := rows[modeDlock]; ok {
		if r.sold != 60 || r.left != 0 || r.oversold != 0 {
			t.Errorf("dlock row: sold %d, stock left %d, oversold %d; want 60, 0, 0", r.sold, r.left, r.oversold)
		}
	}
	// Twelve buyers reading and writing 60 items without a lock cannot help overselling.
	if r, ok := rows[modeNoLock]; ok && r.oversold <= 0 {
		t.Errorf("no lock row: oversold %d, want > 0", r.oversold)
	}
}

func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command and runs the demo for several seconds")
	}
	bin := buildDlock(t)

	t.Run("redis-server", func(t *testing.T) {
		s := redistest.Start(t)
		out, errOut, code := runDlock(t, bin, nil, append(smallDemo, "--redis", s.URL())...)
		if code != 0 {
			t.Fatalf("exit code %d, want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
		}
		if !strings.Contains(out, "server: external server at "+s.URL()) {
			t.Errorf("output does not name the server %s:\n%s", s.URL(), out)
		}
		checkRows(t, out)
		// The demo deletes its own keys (dlock may keep its lock's last token for a while).
		if keys, err := s.Do(context.Background(), "KEYS", "demo:*"); err != nil || keys != "" {
			t.Errorf("demo keys left on the server: %q (%v)", keys, err)
		}
		if t.Failed() {
			t.Logf("output:\n%s", out)
		}
	})

	t.Run("embedded", func(t *testing.T) {
		// A PATH without redis-server; the demo finds its workers through os.Executable.
		out, errOut, code := runDlock(t, bin, []string{"PATH=" + t.TempDir()}, smallDemo...)
		if code != 0 {
			t.Fatalf("exit code %d, want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
		}
		if !strings.Contains(out, "server: embedded (miniredis)") {
			t.Errorf("output does not say the server is embedded:\n%s", out)
		}
		checkRows(t, out)
		if t.Failed() {
			t.Logf("output:\n%s", out)
		}
	})
}

func TestCommandLine(t *testing.T) {
	tests := []struct {
		args     []string
		code     int
		stdout   string // a substring of the standard output
		stderr   string // a substring of the standard error
		noStdout bool
	}{
		{args: nil, code: exitUsage, stderr: "Commands:", noStdout: true},
		{args: []string{"help"}, code: exitOK, stdout: "demo"},
		{args: []string{"--help"}, code: exitOK, stdout: "Commands:"},
		{args: []string{"help", "demo"}, code: exitOK, stdout: "Example"},
		{args: []string{"help", "nosuch"}, code: exitUsage, stderr: "unknown command"},
		{args: []string{"demo", "--help"}, code: exitOK, stdout: "-stock"},
		{args: []string{"demo", "--stock", "0"}, code: exitUsage, stderr: "--stock must be"},
		{args: []string{"demo", "--mode", "fast"}, code: exitUsage, stderr: "--mode must be"},
		{args: []string{"demo", "--nosuch"}, code: exitUsage, stderr: "flag provided but not defined"},
		{args: []string{"demo", "extra"}, code: exitUsage, stderr: "unexpected argument"},
		{args: []string{"version"}, code: exitOK, stdout: "dlock "},
		{args: []string{"nosuch"}, code: exitUsage, stderr: `unknown command "nosuch"`},
		{args: []string{demoWorkerCmd}, code: exitUsage, stderr: "need --redis"},
	}
	for _, tt := range tests {
		name := strings.Join(tt.args, " ")
		if name == "" {
			name = "no arguments"
		}
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := dispatch(context.Background(), &stdio{in: strings.NewReader(""), out: &out, err: &errOut}, tt.args)
			if code != tt.code {
				t.Errorf("exit code %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, out.String(), errOut.String())
			}
			if !strings.Contains(out.String(), tt.stdout) {
				t.Errorf("stdout %q does not contain %q", out.String(), tt.stdout)
			}
			if !strings.Contains(errOut.String(), tt.stderr) {
				t.Errorf("stderr %q does not contain %q", errOut.String(), tt.stderr)
			}
			if tt.noStdout && out.Len() > 0 {
				t.Errorf("stdout %q, want nothing", out.String())
			}
		})
	}
	// demo-worker is internal: help does not list it.
	var out bytes.Buffer
	dispatch(context.Background(), &stdio{out: &out, err: &out}, []string{"help"})
	if strings.Contains(out.String(), demoWorkerCmd) {
		t.Errorf("help lists the internal %s command:\n%s", demoWorkerCmd, out.String())
	}
}
