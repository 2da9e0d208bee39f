package protocol

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// copiedLinesLimit is the largest share of the scripts' lines that may be copies (see
// TestScripts_CopiedLines).
const copiedLinesLimit = 0.05

// The lines of a script that a copy is counted in (scriptLines): trimmed of surrounding
// whitespace, a line counts unless it is
//   - blank, or a comment (it starts with "--");
//   - shorter than 12 characters: "end", "else", "end)", "return r", "break", "local t, n";
//   - a local given an empty table: "local out = {}";
//   - the header of a block on one plain test or count: "if not v then", "if mode == 'q' then",
//     "elseif ARGV[2] ~= 's' then", "for i = 1, #KEYS / 3 do".
//
// Those are the grammar every script repeats; a line that does something (a call, a value
// built, a condition of more than one name) counts, however short its words.
var (
	emptyTable  = regexp.MustCompile(`^local \w+ = \{\}$`)
	plainHeader = regexp.MustCompile(`^(if|elseif) (not )?[A-Za-z_]\w*(\[\d+\])?( (==|~=) ('[^']*'|\d+|nil|true|false))? then$` +
		`|^for \w+ = [^,]+, [^,]+ do$`)
)

// scriptLines returns the lines of src that count, in order.
func scriptLines(src string) []string {
	var out []string
	for _, line := range strings.Split(src, "\n") {
		line = strings.TrimSpace(line)
		if len(line) < 12 || strings.HasPrefix(line, "--") || emptyTable.MatchString(line) || plainHeader.MatchString(line) {
			continue
		}
		out = append(out, line)
	}
	return out
}

// copiedLines measures files (name -> source, as written): of all their lines that count
// (scriptLines), how many appear verbatim in another of the files, and which they are.
func copiedLines(files map[string]string) (copied, total int, which map[string][]string) {
	in := map[string]map[string]bool{} // line -> the files it is in
	lines := map[string][]string{}
	for name, src := range files {
		lines[name] = scriptLines(src)
		for _, l := range lines[name] {
			if in[l] == nil {
				in[l] = map[string]bool{}
			}
			in[l][name] = true
		}
	}
	which = map[string][]string{}
	for name := range files {
		for _, l := range lines[name] {
			total++
			if len(in[l]) > 1 {
				copied++
				which[l] = append(which[l], name)
			}
		}
	}
	return copied, total, which
}

// The scripts share their helpers through the script library instead of copying them: of the
// lines of scripts/*.lua as written (not assembled) that count (scriptLines above), at most
// 5 % appear verbatim, after trimming, in another script of scripts/. A line repeated within
// one script is not a copy. The library, scripts/lib/common.lua, is not one of the scripts:
// its blocks are what the scripts ask for, not copies of them (a helper moved there out of two
// scripts leaves neither with a copy).
func TestScripts_CopiedLines(t *testing.T) {
	entries, err := scriptFS.ReadDir("scripts")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".lua") {
			continue // scripts/lib: the library
		}
		src, err := scriptFS.ReadFile("scripts/" + e.Name())
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = string(src)
	}
	if len(files) < 10 {
		t.Fatalf("found %d scripts in scripts/; the test reads the wrong place", len(files))
	}
	copied, total, which := copiedLines(files)
	share := float64(copied) / float64(total)
	t.Logf("copied lines: %d of %d (%.1f %%) across %d scripts", copied, total, 100*share, len(files))
	var report []string
	for l, names := range which {
		sort.Strings(names)
		report = append(report, fmt.Sprintf("%v: %s", slices.Compact(names), l))
	}
	sort.Strings(report)
	for _, r := range report {
		t.Log(r)
	}
	if share > copiedLinesLimit {
		t.Errorf("%.1f %% of the scripts' lines are copies (%d of %d), above %.0f %%: move what two scripts share into scripts/lib/common.lua",
			100*share, copied, total, 100*copiedLinesLimit)
	}
}

// The measure itself: a line in two scripts counts in each, a line repeated within one script
// does not, and short lines, comments, empty tables and plain block headers never count.
func TestScripts_CopiedLinesRule(t *testing.T) {
	copied, total, _ := copiedLines(map[string]string{
		"a.lua": "-- a comment line, long enough\nlocal x = redis.call('GET', k)\nend\nlocal x = redis.call('GET', k)\n\nreturn x\n" +
			"local out = {}\nif mode == 'q' then\nfor i = 1, #KEYS / 3 do\nif v and mode == 'q' then\n",
		"b.lua": "  local x = redis.call('GET', k)  \nlocal y = redis.call('TIME')\nlocal out = {}\nif mode == 'q' then\n" +
			"for i = 1, #KEYS / 3 do\nif v and mode == 'q' then\n",
	})
	if copied != 5 || total != 6 {
		t.Errorf("copiedLines = %d of %d; want 5 of 6 (a.lua's two GET lines and b.lua's, and the two-name test in each)", copied, total)
	}
	if _, err := scriptFS.ReadFile("scripts/lib/common.lua"); err != nil {
		t.Fatalf("the library is not where TestScripts_CopiedLines leaves it out: %v", err)
	}
}
