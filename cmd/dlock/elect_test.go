package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// dialElect dials the test server for the test's own candidates and checks.
func dialElect(t *testing.T, s *redistest.Server, opts ...dlock.ClientOption) *dlock.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := dlock.Dial(ctx, s.URL(), append([]dlock.ClientOption{dlock.WithLogger(discardLogger())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// termLine is a line a command under dlock elect writes: what, then its environment's
// DLOCK_TERM, DLOCK_TOKEN and DLOCK_NAME, its own pid and its dlock elect's.
type termLine struct {
	what        string
	term, token uint64
	name        string
	pid, elect  int
}

// termFn defines the shell function w, which appends "$1 $DLOCK_TERM $DLOCK_TOKEN $DLOCK_NAME
// $$ $PPID" to the file $0 (the script's first argument with sh -c).
const termFn = `w() { echo "$1 $DLOCK_TERM $DLOCK_TOKEN $DLOCK_NAME $$ $PPID" >> "$0"; }; `

// termLines reads the lines of termFn from file; a last line not ended yet is left out.
func termLines(t *testing.T, file string) []termLine {
	t.Helper()
	b, err := os.ReadFile(file)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []termLine
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if !strings.HasSuffix(l, "\n") {
			break
		}
		var x termLine
		if _, err := fmt.Sscan(l, &x.what, &x.term, &x.token, &x.name, &x.pid, &x.elect); err != nil {
			t.Fatalf("line %q of %s: %v", l, file, err)
		}
		out = append(out, x)
	}
	return out
}

// waitLines waits until file has at least n lines of termFn, and returns them.
func waitLines(t *testing.T, within time.Duration, file string, n int, p ...*dlockProc) []termLine {
	t.Helper()
	var lines []termLine
	waitFor(t, within, fmt.Sprintf("%d lines in %s", n, filepath.Base(file)), func(context.Context) error {
		lines = termLines(t, file)
		if len(lines) < n {
			var out string
			for _, x := range p {
				out += x.stderr.String()
			}
			return fmt.Errorf("%d lines; stderr of dlock: %q", len(lines), out)
		}
		return nil
	})
	return lines
}

// queued waits until the election name has at least n candidates queued on the server.
func queued(t *testing.T, c *dlock.Client, name string, n int) {
	t.Helper()
	waitFor(t, 20*time.Second, fmt.Sprintf("%d candidates queued for %q", n, name), func(ctx context.Context) error {
		info, err := c.Inspect(ctx, name)
		if err == nil && info.Waiters < n {
			err = fmt.Errorf("%d waiting", info.Waiters)
		}
		return err
	})
}

// dlock elect runs its command only while it leads: not while another candidate leads, at
// once when that one resigns (with DLOCK_TERM, the term, in its environment); a forced unlock
// deposes it, its command is terminated, and it campaigns again for a new term; SIGTERM is
// forwarded to the command, and dlock exits with the command's code, having stepped down.
func TestElect_RunsOnlyWhileLeading(t *testing.T) {
	s := redistest.Start(t)
	c := dialElect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const name = "sched"
	first, err := c.Election(name, dlock.WithTTL(5*time.Second)).Campaign(ctx, "library candidate")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "terms")
	p := startDlock(t, "elect", "--redis", s.URL(), "--ttl", "1s", "--grace", "2s", "--value", "cli replica", name, "--",
		"sh", "-c", termFn+`w start; trap 'exit 42' TERM; while :; do sleep 0.02; done`, file)
	queued(t, c, name, 1)
	// Queued, not leading: its command has not run.
	if l := termLines(t, file); len(l) != 0 {
		t.Fatalf("the command ran while another candidate led: %+v", l)
	}
	resigned := time.Now()
	if err := first.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	lines := waitLines(t, 10*time.Second, file, 1, p)
	t.Logf("the command started %v after the leader resigned", time.Since(resigned))
	l := lines[0]
	if l.term <= first.Term() || l.token != l.term || l.name != name || l.elect != p.cmd.Process.Pid {
		t.Errorf("the command saw %+v; want a term above %d, DLOCK_TOKEN the same, DLOCK_NAME %q, started by pid %d", l, first.Term(), name, p.cmd.Process.Pid)
	}
	info, err := c.Election(name).Leader(ctx)
	if err != nil || info.Term != l.term || info.Value != "cli replica" || info.Holder.PID != p.cmd.Process.Pid || info.Holder.Label != "dlock elect sh" {
		t.Errorf("Leader: %+v, %v; want term %d, value \"cli replica\", pid %d, label \"dlock elect sh\"", info, err, l.term, p.cmd.Process.Pid)
	}

	// Deposed: the command is terminated, and dlock elect leads again, with a new term.
	if _, errOut, code := dlockCmd(t, "unlock", "--force", "--redis", s.URL(), name); code != 0 {
		t.Fatalf("unlock --force: exit %d, %s", code, errOut)
	}
	waitFor(t, 10*time.Second, "the deposed leader's command terminated", exited(l.pid))
	lines = waitLines(t, 10*time.Second, file, 2, p)
	if again := lines[1]; again.term <= l.term || again.elect != p.cmd.Process.Pid {
		t.Errorf("after the forced unlock the command saw %+v; want a term above %d", again, l.term)
	}
	if !strings.Contains(p.stderr.String(), `leadership of "sched" lost: terminating the command`) {
		t.Errorf("stderr does not say the leadership was lost: %q", p.stderr.String())
	}

	// SIGTERM: forwarded to the command (which exits 42), then dlock steps down and exits 42.
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 10*time.Second); code != 42 {
		t.Errorf("after SIGTERM: exit %d, want the command's 42\nstderr: %s", code, p.stderr.String())
	}
	waitFor(t, 5*time.Second, "the command ended", exited(lines[1].pid))
	if _, err := c.Election(name).Leader(ctx); !errors.Is(err, dlock.ErrNoLeader) {
		t.Errorf("after dlock elect exited: %v; want no leader", err)
	}
}

// A command that exits non-zero ends dlock elect with its code, having stepped down; one that
// exits 0 is run again at the next term; one that cannot start is 127; a SIGINT while
// campaigning is 130.
func TestElect_ExitCodes(t *testing.T) {
	s := redistest.Start(t)
	c := dialElect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	file := filepath.Join(t.TempDir(), "terms")
	// Exits 0 twice, then 7.
	script := termFn + `w run; [ $(wc -l < "$0") -ge 3 ] && exit 7; exit 0`
	start := time.Now()
	_, errOut, code := dlockCmd(t, "elect", "--redis", s.URL(), "--ttl", "1s", "codes", "--", "sh", "-c", script, file)
	if code != 7 {
		t.Errorf("exit %d, want the command's 7\nstderr: %s", code, errOut)
	}
	lines := termLines(t, file)
	if len(lines) != 3 || lines[0].term >= lines[1].term || lines[1].term >= lines[2].term {
		t.Errorf("terms %+v; want 3 runs with increasing terms", lines)
	}
	if d := time.Since(start); d < 2*electRestartGap {
		t.Errorf("3 terms in %v: the campaigns again came sooner than %v apart", d, electRestartGap)
	}
	if _, err := c.Election("codes").Leader(ctx); !errors.Is(err, dlock.ErrNoLeader) {
		t.Errorf("after the exit: %v; want no leader", err)
	}

	_, errOut, code = dlockCmd(t, "elect", "--redis", s.URL(), "codes", "--", "no-such-command-dlock-test")
	if code != 127 || strings.Count(errOut, "\n") != 1 {
		t.Errorf("missing command: exit %d, stderr %q; want 127 and one line", code, errOut)
	}
	if _, err := c.Election("codes").Leader(ctx); !errors.Is(err, dlock.ErrNoLeader) {
		t.Errorf("after a command that could not start: %v; want no leader", err)
	}

	ld, err := c.Election("codes").Campaign(ctx, "in the way")
	if err != nil {
		t.Fatal(err)
	}
	defer ld.Resign(ctx)
	p := startDlock(t, "elect", "--redis", s.URL(), "codes", "--", "touch", file+".ran")
	queued(t, c, "codes", 1)
	p.signal(t, syscall.SIGINT)
	if code := p.wait(t, 10*time.Second); code != exitInterrupt || !strings.Contains(p.stderr.String(), "interrupted while campaigning") {
		t.Errorf("SIGINT while campaigning: exit %d, stderr %q; want %d", code, p.stderr.String(), exitInterrupt)
	}
	queued(t, c, "codes", 0)
	if _, err := os.Stat(file + ".ran"); err == nil {
		t.Error("the command ran although another candidate led")
	}
}

// Two dlock elect of one name never run their commands at once: each command writes "start"
// and "end" lines with its term; the lines pair up, terms grow, and both candidates lead in
// turn.
func TestElect_TwoNeverOverlap(t *testing.T) {
	s := redistest.Start(t)
	file := filepath.Join(t.TempDir(), "terms")
	script := termFn + `w start; sleep 0.2; w end`
	var procs []*dlockProc
	for range 2 {
		procs = append(procs, startDlock(t, "elect", "--redis", s.URL(), "--ttl", "2s", "pair", "--", "sh", "-c", script, file))
	}
	waitLines(t, 60*time.Second, file, 16, procs...)
	for _, p := range procs {
		p.signal(t, syscall.SIGTERM)
	}
	for _, p := range procs {
		p.wait(t, 10*time.Second)
	}
	lines := termLines(t, file)
	var last uint64
	leaders := map[int]int{}
	for i := 0; i < len(lines); i += 2 {
		st := lines[i]
		if st.what != "start" || st.term <= last {
			t.Fatalf("line %d %+v: want the start of a term above %d\n%+v", i, st, last, lines)
		}
		last = st.term
		leaders[st.elect]++
		if i+1 == len(lines) {
			break // stopped by the SIGTERM before its end
		}
		if end := lines[i+1]; end.what != "end" || end.term != st.term {
			t.Fatalf("line %d %+v does not end the term started on the line before: two commands overlapped\n%+v", i+1, end, lines)
		}
	}
	if len(leaders) != 2 {
		t.Errorf("terms by dlock elect pid: %v; want both to lead in turn", leaders)
	}
	t.Logf("%d terms, by leader: %v", (len(lines)+1)/2, leaders)
}

// SIGKILL of the leading dlock elect: the other's command starts within TTL + 1 s, and the
// killed leader's command does not outlive it.
func TestElect_KilledLeaderReplaced(t *testing.T) {
	s := redistest.Start(t)
	c := dialElect(t, s)
	file := filepath.Join(t.TempDir(), "terms")
	script := termFn + `w lead; exec sleep 60`
	a := startDlock(t, "elect", "--redis", s.URL(), "--ttl", "1s", "killed", "--", "sh", "-c", script, file)
	first := waitLines(t, 20*time.Second, file, 1, a)[0]
	b := startDlock(t, "elect", "--redis", s.URL(), "--ttl", "1s", "killed", "--", "sh", "-c", script, file)
	queued(t, c, "killed", 1)
	if l := termLines(t, file); len(l) != 1 {
		t.Fatalf("the second candidate's command runs while the first leads: %+v", l)
	}
	killed := time.Now()
	a.signal(t, syscall.SIGKILL)
	lines := waitLines(t, 10*time.Second, file, 2, b)
	d := time.Since(killed)
	t.Logf("the other's command started %v after the leader was killed (TTL 1s)", d)
	if d > 2*time.Second {
		t.Errorf("the other's command started %v after the leader was killed, want within TTL + 1s = 2s", d)
	}
	if next := lines[1]; next.elect != b.cmd.Process.Pid || next.term <= first.term {
		t.Errorf("after the kill: %+v; want the second dlock elect (pid %d) with a term above %d", next, b.cmd.Process.Pid, first.term)
	}
	waitFor(t, 5*time.Second, "the killed leader's command to die with it", exited(first.pid))
}

// dlock leader prints the leader (value, term, holder, since) and exits 0, or says there is
// none and exits 1; --json has the documented fields, a name that is not UTF-8 round-trips
// through name_b64 (--b64 addresses it), the value through value and value_b64. status and list show
// the leader too.
func TestLeader_TextAndJSON(t *testing.T) {
	s := redistest.Start(t)
	c := dialElect(t, s, dlock.WithLabel("leader test"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The name is not UTF-8; the value is (the library keeps it in JSON text), with a tab and
	// quotes that text output must not print raw.
	const name, value = "jobs\xff", "réplica \"1\"\t2"
	b64 := base64.StdEncoding.EncodeToString([]byte(name))

	out, errOut, code := dlockCmd(t, "leader", "--redis", s.URL(), "--b64", b64)
	if code != exitFailure || out != `"jobs\xff": no leader`+"\n" || errOut != "" {
		t.Errorf("no leader: exit %d, %q %q; want 1 and \"no leader\"", code, out, errOut)
	}
	out, _, code = dlockCmd(t, "leader", "--json", "--redis", s.URL(), "--b64", b64)
	var none map[string]any
	if err := json.Unmarshal([]byte(out), &none); code != exitFailure || err != nil || none["term"] != float64(0) || none["name_b64"] != b64 || len(none) != 3 {
		t.Errorf("no leader, --json: exit %d, %v (%v); want 1 and {name, name_b64, term 0}", code, none, err)
	}

	ld, err := c.Election(name, dlock.WithTTL(time.Minute)).Campaign(ctx, value)
	if err != nil {
		t.Fatal(err)
	}
	defer ld.Resign(ctx)
	host, _ := os.Hostname()
	out, errOut, code = dlockCmd(t, "leader", "--redis", s.URL(), "--b64", b64)
	for _, want := range []string{`"jobs\xff": led by "réplica \"1\"\t2"` + "\n", "term:    " + strconv.FormatUint(ld.Term(), 10) + "\n",
		"pid " + strconv.Itoa(os.Getpid()), `label "leader test"`, "since:   "} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("leader: exit %d, %q (stderr %q); want %q in it", code, out, errOut, want)
		}
	}

	out, _, code = dlockCmd(t, "leader", "--json", "--redis", s.URL(), "--b64", b64)
	var j struct {
		NameB64  string         `json:"name_b64"`
		ValueB64 string         `json:"value_b64"`
		Since    string         `json:"since"`
		Term     uint64         `json:"term"`
		Holder   map[string]any `json:"holder"`
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil || code != 0 {
		t.Fatalf("leader --json: exit %d, %v\n%s", code, err, out)
	}
	for _, f := range []string{"name", "name_b64", "value", "value_b64", "term", "holder", "since"} {
		if _, ok := raw[f]; !ok {
			t.Errorf("leader --json lacks %q: %s", f, out)
		}
	}
	json.Unmarshal([]byte(out), &j)
	if v, err := base64.StdEncoding.DecodeString(j.ValueB64); err != nil || string(v) != value {
		t.Errorf("value_b64 %q decodes to %q (%v), want %q", j.ValueB64, v, err, value)
	}
	if n, err := base64.StdEncoding.DecodeString(j.NameB64); err != nil || string(n) != name {
		t.Errorf("name_b64 %q decodes to %q (%v), want %q", j.NameB64, n, err, name)
	}
	since, err := time.Parse(time.RFC3339Nano, j.Since)
	if j.Term != ld.Term() || err != nil || absDur(time.Since(since)) > 10*time.Second {
		t.Errorf("term %d since %q (%v); want %d and about now", j.Term, j.Since, err, ld.Term())
	}
	if j.Holder["host"] != host || j.Holder["pid"] != float64(os.Getpid()) || j.Holder["label"] != "leader test" {
		t.Errorf("holder %v", j.Holder)
	}
	if _, err := time.Parse(time.RFC3339, fmt.Sprint(j.Holder["start"])); err != nil {
		t.Errorf("holder start: %v", err)
	}

	// status and list show the lock's leader.
	out, _, _ = dlockCmd(t, "status", "--redis", s.URL(), "--b64", b64)
	if !strings.Contains(out, `  leader:   "réplica \"1\"\t2"`) {
		t.Errorf("status does not show the leader:\n%s", out)
	}
	out, _, _ = dlockCmd(t, "list", "--json", "--redis", s.URL())
	var list []struct {
		Leader *struct {
			ValueB64 string `json:"value_b64"`
			Term     uint64 `json:"term"`
			Since    string `json:"since"`
		} `json:"leader"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 || list[0].Leader == nil ||
		list[0].Leader.Term != ld.Term() || list[0].Leader.ValueB64 != base64.StdEncoding.EncodeToString([]byte(value)) || list[0].Leader.Since == "" {
		t.Errorf("list --json: %s (%v); want the lock with its leader", out, err)
	}
}

func absDur(x time.Duration) time.Duration { return max(x, -x) }

// dlock leader --watch prints the state first (nobody leads), then a line at each change: a
// leader, its new value (Proclaim), nobody again; --json one object a line; SIGINT ends it
// with 0.
func TestLeader_Watch(t *testing.T) {
	s := redistest.Start(t)
	c := dialElect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, asJSON := range []bool{false, true} {
		t.Run(fmt.Sprintf("json=%v", asJSON), func(t *testing.T) {
			name := fmt.Sprintf("watched-%v", asJSON)
			args := []string{"leader", "--watch", "--redis", s.URL(), name}
			if asJSON {
				args = append(args, "--json")
			}
			p := startDlock(t, args...)
			lines := func(n int) []string {
				t.Helper()
				var l []string
				waitFor(t, 20*time.Second, fmt.Sprintf("%d lines of --watch", n), func(context.Context) error {
					l = strings.SplitAfter(p.stdout.String(), "\n")
					l = l[:len(l)-1]
					if len(l) < n {
						return fmt.Errorf("%q; stderr %q", p.stdout.String(), p.stderr.String())
					}
					return nil
				})
				return l
			}
			type watchLine struct {
				Value *string `json:"value"`
				Term  uint64  `json:"term"`
				Seen  string  `json:"seen"`
			}
			check := func(line string, term uint64, value string) {
				t.Helper()
				if asJSON {
					var w watchLine
					if err := json.Unmarshal([]byte(line), &w); err != nil || w.Term != term || (term == 0) != (w.Value == nil) ||
						w.Value != nil && *w.Value != value || w.Seen == "" || strings.Count(line, "\n") != 1 || !strings.HasPrefix(line, "{") {
						t.Errorf("line %q (%v): want term %d, value %q, one compact object", line, err, term, value)
					}
					return
				}
				want := "no leader\n"
				if term != 0 {
					want = fmt.Sprintf("led by %q: term %d, host ", value, term)
				}
				seen, rest, _ := strings.Cut(line, " ")
				if _, err := time.Parse(time.RFC3339Nano, seen); err != nil || !strings.HasPrefix(rest, want) {
					t.Errorf("line %q: want the time seen, then %q", line, want)
				}
			}
			check(lines(1)[0], 0, "")
			ld, err := c.Election(name, dlock.WithTTL(time.Minute)).Campaign(ctx, "first value")
			if err != nil {
				t.Fatal(err)
			}
			check(lines(2)[1], ld.Term(), "first value")
			if err := ld.Proclaim(ctx, "second value"); err != nil {
				t.Fatal(err)
			}
			check(lines(3)[2], ld.Term(), "second value")
			if err := ld.Resign(ctx); err != nil {
				t.Fatal(err)
			}
			check(lines(4)[3], 0, "")
			p.signal(t, syscall.SIGINT)
			if code := p.wait(t, 10*time.Second); code != 0 {
				t.Errorf("after SIGINT: exit %d, want 0\nstderr: %s", code, p.stderr.String())
			}
			if n := len(lines(4)); n != 4 {
				t.Errorf("%d lines, want 4:\n%s", n, p.stdout.String())
			}
		})
	}
}

// The usage of elect and leader.
func TestElectLeaderUsage(t *testing.T) {
	tests := []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{args: []string{"elect", "--help"}, code: exitOK, stdout: "DLOCK_TERM"},
		{args: []string{"elect", "--help"}, code: exitOK, stdout: "the command's   it exited non-zero"},
		{args: []string{"leader", "--help"}, code: exitOK, stdout: "1 nobody leads"},
		{args: []string{"leader", "--help"}, code: exitOK, stdout: "value_b64"},
		{args: []string{"help"}, code: exitOK, stdout: "  elect "},
		{args: []string{"help"}, code: exitOK, stdout: "  leader "},
		{args: []string{"elect"}, code: exitUsage, stderr: "missing lock name"},
		{args: []string{"elect", "x"}, code: exitUsage, stderr: "missing command"},
		{args: []string{"elect", "x", "y", "--", "true"}, code: exitUsage, stderr: "one election NAME only"},
		{args: []string{"elect", "--ttl", "1ms", "x", "--", "true"}, code: exitUsage, stderr: "--ttl must be"},
		{args: []string{"elect", "--value", strings.Repeat("v", dlock.MaxLeaderValue+1), "x", "--", "true"}, code: exitUsage, stderr: "longer than 4096"},
		{args: []string{"leader"}, code: exitUsage, stderr: "missing lock name"},
		{args: []string{"leader", "a", "b"}, code: exitUsage, stderr: "unexpected argument"},
		{args: []string{"leader", "--b64", "not base64!"}, code: exitUsage, stderr: "not standard base64"},
	}
	for _, tt := range tests {
		t.Run(clip(strings.Join(tt.args, " "), 60), func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := dispatch(context.Background(), &stdio{in: strings.NewReader(""), out: &out, err: &errOut}, tt.args)
			if code != tt.code || !strings.Contains(out.String(), tt.stdout) || !strings.Contains(errOut.String(), tt.stderr) {
				t.Errorf("exit %d (want %d)\nstdout: %.300s (want %q)\nstderr: %s (want %q)", code, tt.code, out.String(), tt.stdout, errOut.String(), tt.stderr)
			}
		})
	}
}
