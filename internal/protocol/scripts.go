package protocol

import (
	"embed"
	"fmt"
	"strings"

	"github.com/dlock-go/dlock/conn"
)

// The Lua scripts, embedded, and their assembly from the script library: each script is its
// file with the blocks of scripts/lib/common.lua it asks for put in.

//go:embed scripts/*.lua scripts/lib/*.lua
var scriptFS embed.FS

func mustScript(name string) *conn.Script {
	src, err := scriptFS.ReadFile("scripts/" + name)
	if err != nil {
		panic("dlock: missing embedded script " + name) // a build defect, not a runtime condition
	}
	lib, err := scriptFS.ReadFile("scripts/lib/common.lua")
	if err != nil {
		panic("dlock: missing the embedded script library")
	}
	full, err := assemble(string(lib), string(src))
	if err != nil {
		panic("dlock: script " + name + ": " + err.Error()) // a build defect too
	}
	return conn.NewScript(name, full)
}

// assemble puts the blocks of the script library lib that src asks for on its first line
// ("-- uses: a, b") into src, each once, with the blocks they need (scripts/lib/common.lua says
// how a block is written). A script that asks for none is src as it is. The blocks go before
// the script's text, or where it has marks (lines of their own):
//
//	-- (library: a, b)  here blocks a and b, and those they need that are not placed yet
//	-- (library)        here every other block asked for
//
// So a path that returns before a mark builds none of the blocks placed there (a Lua local
// function costs a closure on every call). Blocks placed together are in lib's order; a block
// named at a mark must be one the first line asks for.
func assemble(lib, src string) (string, error) {
	first, _, _ := strings.Cut(src, "\n")
	uses, ok := strings.CutPrefix(strings.TrimSpace(first), "-- uses:")
	if !ok {
		return src, nil
	}
	l := parseLibrary(lib)
	want := map[string]bool{}
	for _, name := range names(uses) {
		if err := l.with(want, name); err != nil {
			return "", err
		}
	}
	lines := strings.SplitAfter(src, "\n")
	marks, claimed, full, err := findMarks(lines, want)
	if err != nil {
		return "", err
	}
	unclaimed := func() []string {
		var out []string
		for name := range want {
			if !claimed[name] {
				out = append(out, name)
			}
		}
		return out
	}
	placed := map[string]bool{}
	if !full {
		// The blocks no mark names go first, before the script's text.
		text, err := l.place(placed, unclaimed())
		if err != nil {
			return "", err
		}
		lines[0] = text + lines[0]
	}
	for _, m := range marks {
		todo := m.named
		if todo == nil {
			todo = unclaimed()
		}
		text, err := l.place(placed, todo)
		if err != nil {
			return "", err
		}
		lines[m.line] = text
	}
	return strings.Join(lines, ""), nil
}

// library is the script library's blocks, in its file's order, and by name.
type library struct {
	blocks []*libBlock
	byName map[string]*libBlock
}

type libBlock struct {
	name  string
	needs []string
	text  strings.Builder
}

// parseLibrary reads the blocks of lib: each starts at a line "--- <name>", optionally
// followed by "(needs: a, b)".
func parseLibrary(lib string) *library {
	l := &library{byName: map[string]*libBlock{}}
	var cur *libBlock
	for _, line := range strings.SplitAfter(lib, "\n") {
		if head, ok := strings.CutPrefix(line, "--- "); ok {
			name, rest, _ := strings.Cut(strings.TrimSpace(head), " ")
			cur = &libBlock{name: name}
			if needs, ok := strings.CutPrefix(strings.TrimSpace(rest), "(needs:"); ok {
				for _, n := range strings.Split(strings.TrimSuffix(needs, ")"), ",") {
					cur.needs = append(cur.needs, strings.TrimSpace(n))
				}
			}
			l.blocks = append(l.blocks, cur)
			l.byName[name] = cur
			continue
		}
		if cur != nil {
			cur.text.WriteString(line)
		}
	}
	return l
}

// with adds name and every block it needs to set.
func (l *library) with(set map[string]bool, name string) error {
	b := l.byName[name]
	if b == nil {
		return fmt.Errorf("uses %q, which the script library does not have", name)
	}
	if set[name] {
		return nil
	}
	set[name] = true
	for _, n := range b.needs {
		if err := l.with(set, n); err != nil {
			return err
		}
	}
	return nil
}

// place returns the text of the blocks todo and those they need, in the library's order, but
// for those placed already (recorded in placed).
func (l *library) place(placed map[string]bool, todo []string) (string, error) {
	set := map[string]bool{}
	for _, name := range todo {
		if err := l.with(set, name); err != nil {
			return "", err
		}
	}
	var out strings.Builder
	for _, b := range l.blocks {
		if set[b.name] && !placed[b.name] {
			placed[b.name] = true
			out.WriteString(strings.TrimRight(b.text.String(), "\n"))
			out.WriteString("\n")
		}
	}
	return out.String(), nil
}

// libMark is a library mark in a script: at line, the blocks named (nil: "-- (library)", the
// blocks no other mark names).
type libMark struct {
	line  int
	named []string
}

// findMarks finds the library marks in a script's lines, in order, with the blocks named at
// partial marks (claimed; each must be one the script asks for, in want) and whether a full
// mark is among them.
func findMarks(lines []string, want map[string]bool) (marks []libMark, claimed map[string]bool, full bool, err error) {
	claimed = map[string]bool{}
	for i, line := range lines {
		t := strings.TrimSpace(line)
		if t == libraryMark {
			marks = append(marks, libMark{line: i})
			full = true
		} else if rest, ok := strings.CutPrefix(t, libraryMarkOf); ok && strings.HasSuffix(rest, ")") {
			m := libMark{line: i, named: names(strings.TrimSuffix(rest, ")"))}
			for _, n := range m.named {
				if !want[n] {
					return nil, nil, false, fmt.Errorf("places %q at a mark, but its first line does not ask for it", n)
				}
				claimed[n] = true
			}
			marks = append(marks, m)
		}
	}
	return marks, claimed, full, nil
}

// names splits a list "a, b" into its names.
func names(list string) []string {
	var out []string
	for _, n := range strings.Split(list, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// libraryMark, a line of its own in a script, is where assemble puts the library's blocks that
// no other mark places (instead of before the script's text): what comes before it runs
// without them. libraryMarkOf starts a mark that places the blocks it names: "-- (library: a, b)".
const (
	libraryMark   = "-- (library)"
	libraryMarkOf = "-- (library:"
)

// The scripts, each assembled once, at start-up. docs/PROTOCOL.md describes their keys,
// arguments and replies.
var (
	ScriptAcquire      = mustScript("acquire.lua")
	ScriptRelease      = mustScript("release.lua")
	ScriptRenew        = mustScript("renew.lua")
	ScriptPTTL         = mustScript("pttl.lua")
	ScriptHandover     = mustScript("handover.lua")
	ScriptQueue        = mustScript("queue.lua")
	ScriptProbe        = mustScript("probe.lua")
	ScriptInspect      = mustScript("inspect.lua")
	ScriptForceUnlock  = mustScript("forceunlock.lua")
	ScriptShared       = mustScript("shared.lua")       // read-write locks and semaphores: shared.go
	ScriptMultiAcquire = mustScript("multiacquire.lua") // multi-locks
	ScriptMultiRelease = mustScript("multirelease.lua")
	ScriptLatch        = mustScript("latch.lua")
	ScriptFenced       = mustScript("fenced.lua")   // fenced operations on the caller's own keys
	ScriptProclaim     = mustScript("proclaim.lua") // elections: a leader's announcement
)

// Scripts returns every script, for inspection and for loading them ahead of time (SCRIPT
// LOAD) on servers that restrict EVAL.
func Scripts() []*conn.Script {
	return []*conn.Script{ScriptAcquire, ScriptRelease, ScriptRenew, ScriptPTTL, ScriptHandover, ScriptQueue, ScriptInspect, ScriptForceUnlock, ScriptProbe,
		ScriptMultiAcquire, ScriptMultiRelease, ScriptLatch, ScriptShared, ScriptFenced, ScriptProclaim}
}
