package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// serverCommands are the subcommands that dial, with url as their server.
func serverCommands(url string) [][]string {
	return [][]string{
		{"status", "--redis", url, "x"},
		{"list", "--redis", url},
		{"unlock", "--force", "--redis", url, "x"},
		{"run", "--redis", url, "--wait", "0", "x", "--", "true"},
		{"web", "--redis", url, "--listen", "127.0.0.1:0"},
		{"elect", "--redis", url, "x", "--", "true"},
		{"leader", "--redis", url, "x"},
	}
}

// A refusal by the server's access rules exits 77 with a message that says access was denied
// and points to the ACL rule, for every command: a wrong password, and a user whose rule lacks
// the commands dlock sends.
func TestExit_DeniedIs77(t *testing.T) {
	const (
		user, pass       = "dlockuser", "right-pw"
		limited, limPass = "limited", "limited-pw"
		wrong            = "wrong-pw"
	)
	args := redistest.ACLUserArgs(user, pass, redistest.ACLRule...)
	// limited may log in and check the memory policy, and nothing else.
	args = append(args, redistest.ACLUserArgs(limited, limPass, "resetkeys", "~dlock:*", "resetchannels", "&dlock:*", "-@all", "+hello", "+ping", "+info")...)
	s := redistest.Start(t, redistest.WithArgs(args...))

	if out, errOut, code := dlockCmd(t, "status", "--redis", s.URLAs(user, pass), "x"); code != exitOK {
		t.Fatalf("status with the right password: exit %d\n%s%s", code, out, errOut)
	}
	for _, tc := range []struct {
		what, url, secret, reply string
		login                    bool
	}{
		{"wrong password", s.URLAs(user, wrong), wrong, "WRONGPASS", true},
		{"no such user", s.URLAs("nosuchuser", wrong), wrong, "WRONGPASS", true},
		{"user without the rule", s.URLAs(limited, limPass), limPass, "NOPERM", false},
	} {
		for _, args := range serverCommands(tc.url) {
			t.Run(tc.what+"/"+args[0], func(t *testing.T) {
				out, errOut, code := dlockCmd(t, args...)
				if code != exitDenied {
					t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, exitDenied, out, errOut)
				}
				if strings.Count(errOut, "\n") != 1 || out != "" {
					t.Errorf("stdout %q, stderr %q; want one line on stderr only", out, errOut)
				}
				for _, want := range []string{"dlock " + args[0] + ": access denied", tc.reply, s.Addr, "docs/SECURITY.md", "The minimal ACL rule"} {
					if !strings.Contains(errOut, want) {
						t.Errorf("stderr %q does not say %q", errOut, want)
					}
				}
				if strings.Contains(errOut, "cannot reach") {
					t.Errorf("stderr %q says the server cannot be reached; it answered", errOut)
				}
				if hint := strings.Contains(errOut, "user and password"); hint != tc.login {
					t.Errorf("stderr %q: mentions the user and password: %v, want %v", errOut, hint, tc.login)
				}
				if strings.Contains(errOut, tc.secret) {
					t.Errorf("stderr %q shows the password", errOut)
				}
			})
		}
	}
}

// A server that cannot be reached exits 69, for every command, and is not called a denial.
func TestExit_UnreachableIs69(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	for _, args := range serverCommands("redis://u:pw@" + addr + "/0") {
		out, errOut, code := dlockCmd(t, args...)
		if code != exitNoServer || strings.Contains(errOut, "denied") || !strings.Contains(errOut, addr) {
			t.Errorf("%v: exit %d, stderr %q; want %d naming %s\nstdout: %s", args, code, errOut, exitNoServer, addr, out)
		}
	}
}

// A bad URL is a usage error, exit 2, for every command.
func TestExit_BadURLIs2(t *testing.T) {
	for _, url := range []string{"nosuch://x", "redis://127.0.0.1:notaport/0", "redis://127.0.0.1:6379/notadb"} {
		for _, args := range serverCommands(url) {
			out, errOut, code := dlockCmd(t, args...)
			if code != exitUsage || strings.Count(errOut, "\n") != 1 {
				t.Errorf("%v: exit %d, stderr %q; want %d and one line\nstdout: %s", args, code, errOut, exitUsage, out)
			}
		}
	}
}

// errCode maps the library's error classes, however wrapped, to the documented codes.
func TestErrCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
	}{
		{fmt.Errorf("dlock: dial: bad redis url x (%w)", dlock.ErrInvalid), exitUsage},
		{fmt.Errorf("dlock: lock %q on h:1: NOPERM no (%w)", "x", dlock.ErrDenied), exitDenied},
		{fmt.Errorf("dlock: dial: refused (%w)", dlock.ErrUnavailable), exitNoServer},
		{&dlock.QuorumError{Op: "lock", Need: 2}, exitNoServer},
		{fmt.Errorf("dlock: unlock: %w", dlock.ErrNotHeld), exitFailure},
		{fmt.Errorf("lock: %w", context.Canceled), exitFailure},
		{fmt.Errorf("dial: %w", dlock.ErrEvictionPolicy), exitNoServer},
		{errors.New("something else"), exitNoServer},
	} {
		if got := errCode(tc.err); got != tc.code {
			t.Errorf("errCode(%v) = %d, want %d", tc.err, got, tc.code)
		}
	}
}

// README.md's exit-code table of dlock run lists the codes of "dlock run --help", in order.
func TestExit_ReadmeTableMatchesRunHelp(t *testing.T) {
	var out bytes.Buffer
	if code := dispatch(context.Background(), &stdio{in: strings.NewReader(""), out: &out, err: &out}, []string{"run", "--help"}); code != exitOK {
		t.Fatalf("run --help: exit %d\n%s", code, out.String())
	}
	help := out.String()
	start := strings.Index(help, "\nExit codes:\n")
	if start < 0 {
		t.Fatalf("run --help has no \"Exit codes:\" section:\n%s", help)
	}
	section, _, _ := strings.Cut(help[start+len("\nExit codes:\n"):], "\n\n")
	var fromHelp []string
	for _, m := range regexp.MustCompile(`(?m)^  (\d+|the command's)  `).FindAllStringSubmatch(section, -1) {
		fromHelp = append(fromHelp, m[1])
	}

	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, cmdSection, ok := strings.Cut(string(readme), "\n## The dlock command\n")
	if !ok {
		t.Fatal(`README.md has no "## The dlock command" section`)
	}
	cmdSection, _, _ = strings.Cut(cmdSection, "\n## ")
	_, table, ok := strings.Cut(cmdSection, "| code | meaning |\n|---|---|\n")
	if !ok {
		t.Fatal("README.md's command section has no exit-code table")
	}
	var fromReadme []string
	for _, line := range strings.Split(table, "\n") {
		if !strings.HasPrefix(line, "| ") {
			break
		}
		code, _, _ := strings.Cut(strings.TrimPrefix(line, "| "), " |")
		fromReadme = append(fromReadme, code)
	}
	if strings.Join(fromHelp, ",") != strings.Join(fromReadme, ",") || len(fromHelp) < 5 {
		t.Errorf("exit codes differ:\nrun --help: %v\nREADME.md:  %v", fromHelp, fromReadme)
	}
	for _, code := range []string{"2", "69", "75", "76", "77"} {
		if !strings.Contains(","+strings.Join(fromHelp, ",")+",", ","+code+",") {
			t.Errorf("run --help lacks exit code %s: %v", code, fromHelp)
		}
	}
}

// demo --redis exits with the same classes, and shows no password.
func TestExit_DemoServer(t *testing.T) {
	const user, pass, wrong = "demouser", "demo-pw", "wrong%zzpw"
	s := redistest.Start(t, redistest.WithArgs(redistest.ACLUserArgs(user, pass, "allkeys", "+@all")...))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	for _, tc := range []struct {
		url, want string
		code      int
	}{
		{s.URLAs(user, "wrong-pw"), "access denied", exitDenied},
		{"redis://" + user + ":wrong-pw@" + closed + "/0", closed, exitNoServer},
		{"redis://" + user + ":" + wrong + "@127.0.0.1:notaport/0", "bad redis url", exitUsage},
	} {
		out, errOut, code := dlockCmd(t, "demo", "--redis", tc.url, "--mode", "nolock", "--stock", "5", "--procs", "1", "--goroutines", "1", "--pauses", "0")
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("demo --redis %s: exit %d, stderr %q; want %d and %q", tc.url, code, errOut, tc.code, tc.want)
		}
		for _, part := range []string{"wrong-pw", wrong, "%zz", "zzpw"} {
			if strings.Contains(out+errOut, part) {
				t.Errorf("demo --redis %s printed (part of) the password:\n%s%s", tc.url, out, errOut)
			}
		}
	}
}

func TestURLPassword(t *testing.T) {
	for url, want := range map[string]string{
		"redis://u:p%zz@h:1/0":                   "p%zz",
		"redis://u:p@ss@h:1/0":                   "p@ss",
		"redis://:pw@h:1":                        "pw",
		"redis://u@h:1/0":                        "",
		"redis://h:1/0":                          "",
		"u:pw@h:1":                               "pw",
		"redis+sentinel://u:pw@s1:1,s2:2/master": "pw",
		"unix:///tmp/redis.sock":                 "",
	} {
		if got := urlPassword(url); got != want {
			t.Errorf("urlPassword(%q) = %q, want %q", url, got, want)
		}
	}
}
