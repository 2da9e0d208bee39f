package protocol

import (
	"crypto/sha1"
	"encoding/hex"
	"strings"
	"testing"
)

// Scripts lists every embedded script (for SCRIPT LOAD ahead of time), each with the SHA-1 of
// its source.
func TestScripts_ListsEveryEmbeddedScript(t *testing.T) {
	files, err := scriptFS.ReadDir("scripts")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, s := range Scripts() {
		listed[s.Name] = true
		sum := sha1.Sum([]byte(s.Src))
		if s.SHA != hex.EncodeToString(sum[:]) {
			t.Errorf("%s: SHA %s is not the SHA-1 of its source", s.Name, s.SHA)
		}
	}
	n := 0
	for _, f := range files {
		if f.IsDir() {
			continue // scripts/lib: the library scripts are assembled from
		}
		n++
		if !listed[f.Name()] {
			t.Errorf("scripts/%s is embedded but not in Scripts()", f.Name())
		}
	}
	if len(listed) != n {
		t.Errorf("Scripts() lists %d scripts, scripts/ holds %d", len(listed), n)
	}
}

// A script's first line "-- uses: ..." puts those blocks of the library before it, each once,
// in the library's order, with the blocks they need; a name the library lacks is an error;
// a script without the line is left as it is.
func TestAssemble_Uses(t *testing.T) {
	lib := "-- header\n\n--- a\nlocal function a() end\n\n--- b (needs: a)\nlocal function b() a() end\n\n--- c\nlocal function c() end\n"
	got, err := assemble(lib, "-- uses: b\nreturn b()\n")
	if want := "local function a() end\nlocal function b() a() end\n-- uses: b\nreturn b()\n"; err != nil || got != want {
		t.Errorf("assemble(uses b) = %q, %v; want %q", got, err, want)
	}
	got, err = assemble(lib, "-- uses: c, a, c\nreturn 1\n")
	if want := "local function a() end\nlocal function c() end\n-- uses: c, a, c\nreturn 1\n"; err != nil || got != want {
		t.Errorf("assemble(uses c, a, c) = %q, %v; want %q", got, err, want)
	}
	if _, err := assemble(lib, "-- uses: nope\n"); err == nil {
		t.Error("assemble accepted a block the library lacks")
	}
	if got, _ := assemble(lib, "return 1\n"); got != "return 1\n" {
		t.Errorf("a script without uses became %q", got)
	}
	// Every block of the real library is a function its name says, and is used by a script.
	used := map[string]bool{}
	for _, s := range Scripts() {
		for _, line := range strings.Split(s.Src, "\n") {
			if name, ok := strings.CutPrefix(line, "local function "); ok {
				name, _, _ = strings.Cut(name, "(")
				used[name] = true
			}
		}
	}
	src, _ := scriptFS.ReadFile("scripts/lib/common.lua")
	for _, line := range strings.Split(string(src), "\n") {
		if head, ok := strings.CutPrefix(line, "--- "); ok {
			name, _, _ := strings.Cut(head, " ")
			if !used[name] {
				t.Errorf("library block %q is used by no script", name)
			}
		}
	}
}

// Marks place blocks inside a script: "-- (library: a)" a and what it needs that is not placed
// yet, "-- (library)" every other block asked for, so that what returns before a mark builds
// none of its blocks. A block a mark names must be asked for; without "-- (library)" the
// blocks no mark names go before the script.
func TestAssemble_Marks(t *testing.T) {
	lib := "--- a\nlocal function a() end\n--- b (needs: a)\nlocal function b() a() end\n" +
		"--- c (needs: a)\nlocal function c() a() end\n--- d\nlocal function d() end\n"
	got, err := assemble(lib, "-- uses: b, c, d\nfast()\n-- (library: b)\nmid()\n-- (library)\nrest()\n-- (library: d)\nlast()\n")
	want := "-- uses: b, c, d\nfast()\nlocal function a() end\nlocal function b() a() end\nmid()\n" +
		"local function c() a() end\nrest()\nlocal function d() end\nlast()\n"
	if err != nil || got != want {
		t.Errorf("assemble with marks = %q, %v; want %q", got, err, want)
	}
	got, err = assemble(lib, "-- uses: c, d\nfirst()\n-- (library: d)\nlast()\n")
	want = "local function a() end\nlocal function c() a() end\n-- uses: c, d\nfirst()\nlocal function d() end\nlast()\n"
	if err != nil || got != want {
		t.Errorf("assemble with a partial mark only = %q, %v; want %q", got, err, want)
	}
	if _, err := assemble(lib, "-- uses: c\n-- (library: d)\n"); err == nil {
		t.Error("assemble accepted a mark naming a block the script does not ask for")
	}
	// The real scripts: acquire.lua answers a lock held by another before the grant machinery
	// is built, and both it and release.lua build the batch loop only for a batch.
	src := ScriptAcquire.Src
	refuse, grant, batch := strings.Index(src, "\nlocal function refuse("), strings.Index(src, "\nlocal function grantFirst("), strings.Index(src, "\nlocal function batched(")
	if refuse < 0 || grant < refuse || batch < grant || strings.Index(src, "\nif not batch then") > batch {
		t.Errorf("acquire.lua: refuse at %d, grantFirst at %d, batched at %d: want them in that order, batched after the one-lock return", refuse, grant, batch)
	}
	if src := ScriptRelease.Src; strings.Index(src, "\nlocal function batched(") < strings.Index(src, "\nif not batch then") {
		t.Error("release.lua builds the batch loop before its one-lock return")
	}
}
