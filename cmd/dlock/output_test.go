package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

func TestDisplay(t *testing.T) {
	for in, want := range map[string]string{
		"orders:42":          "orders:42",
		"with space é 日本":    "with space é 日本",
		`back\slash`:         `back\slash`,
		`mid"quote`:          `mid"quote`,
		"a\nb":               `"a\nb"`,
		"\x1b[2Jclear":       `"\x1b[2Jclear"`,
		"tab\there":          `"tab\there"`,
		"cr\rhere":           `"cr\rhere"`,
		"bad\xffutf8":        `"bad\xffutf8"`,
		"rtl\u202eoverride":  `"rtl\u202eoverride"`,
		"nbsp\u00a0x":        `"nbsp\u00a0x"`,
		`"a\nb"`:             `"\"a\\nb\""`, // a name that looks quoted is quoted
		"\u0085next-line":    `"\u0085next-line"`,
		"\u2028line-sep":     `"\u2028line-sep"`,
		"del\x7f":            `"del\x7f"`,
		"nul\x00":            `"nul\x00"`,
		"plain-but-long-...": "plain-but-long-...",
	} {
		if got := display(in); got != want {
			t.Errorf("display(%q) = %s, want %s", in, got, want)
		}
	}
}

// rawLock writes a held lock value for name straight into the server, as docs/PROTOCOL.md
// ("The value of a lock key") describes it, with the holder description desc, and returns its
// token.
func rawLock(t *testing.T, s *redistest.Server, name string, desc any, ttl time.Duration) uint64 {
	t.Helper()
	d, err := json.Marshal(desc)
	if err != nil {
		t.Fatal(err)
	}
	token := uint64(time.Now().UnixMicro())
	value := fmt.Sprintf("%s:1 %d 1 %s", strings.Repeat("A", 22), token, d)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.Do(ctx, "SET", keyOf(name), value, "PX", strconv.FormatInt(ttl.Milliseconds(), 10)); err != nil {
		t.Fatal(err)
	}
	return token
}

// Names, hosts and labels with newlines and escape sequences print escaped in the text of
// list and status: one lock is one line, and nothing reaches the terminal raw.
func TestOutput_EscapesNamesAndLabels(t *testing.T) {
	s := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := dlock.Dial(ctx, s.URL(), dlock.WithLabel("label\nfake line\x1b[0m"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	names := []string{
		"fake\nother  1  1  10s  web-1:1  2030-01-01T00:00:00Z  0",
		"esc\x1b[2J\x1b[Hclear",
		`"looks quoted"`,
		"plain:name",
	}
	for _, name := range names {
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(context.Background())
	}
	// A holder description is whatever a writer of the key put there.
	crafted := "crafted\rname"
	rawLock(t, s, crafted, map[string]any{"host": "evil\nhost\x1b]0;title\x07", "pid": 1, "start": time.Now().Unix(), "label": "l\x1b[31m"}, time.Minute)
	names = append(names, crafted)

	noRaw := func(t *testing.T, out string) {
		t.Helper()
		for _, ctl := range []string{"\x1b", "\r", "\x07"} {
			if strings.Contains(out, ctl) {
				t.Errorf("output holds a raw %q:\n%s", ctl, out)
			}
		}
	}

	out, errOut, code := dlockCmd(t, "list", "--redis", s.URL())
	if code != exitOK {
		t.Fatalf("list: exit %d\n%s", code, errOut)
	}
	noRaw(t, out)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 1+len(names) {
		t.Errorf("list printed %d lines, want a header and %d locks:\n%s", len(lines), len(names), out)
	}
	for _, name := range names {
		n := 0
		for _, line := range lines[1:] {
			if strings.HasPrefix(line, clip(display(name), listNameWidth)+" ") { // long names are cut in the table
				n++
			}
		}
		if n != 1 {
			t.Errorf("list: %d lines start with %s, want 1:\n%s", n, display(name), out)
		}
	}
	for _, want := range []string{`"fake\nother`, `"esc\x1b[2J\x1b[Hclear"`, `"\"looks quoted\""`, `"crafted\rname"`,
		`"label\nfake line\x1b[0m"`, `"evil\nhost\x1b]0;title\a"`, `"l\x1b[31m"`} {
		if !strings.Contains(out, want) {
			t.Errorf("list output lacks %s:\n%s", want, out)
		}
	}

	for _, name := range names {
		out, errOut, code := dlockCmd(t, "status", "--redis", s.URL(), name)
		if code != exitOK {
			t.Fatalf("status %q: exit %d\n%s", name, code, errOut)
		}
		noRaw(t, out)
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if lines[0] != display(name)+": held" {
			t.Errorf("status %q: first line %q, want %q", name, lines[0], display(name)+": held")
		}
		for _, line := range lines[1:] {
			if !strings.HasPrefix(line, "  ") {
				t.Errorf("status %q: line %q is not one of the lock's fields:\n%s", name, line, out)
			}
		}
	}

	// JSON keeps the exact strings.
	out, _, code = dlockCmd(t, "status", "--json", "--redis", s.URL(), crafted)
	var st jsonInfo
	if err := json.Unmarshal([]byte(out), &st); code != exitOK || err != nil {
		t.Fatalf("status --json: exit %d, %v\n%s", code, err, out)
	}
	if st.Name != crafted || st.Holder == nil || st.Holder.Host != "evil\nhost\x1b]0;title\x07" || st.Holder.Label != "l\x1b[31m" {
		t.Errorf("status --json = %+v, want the exact name, host and label", st)
	}
}
