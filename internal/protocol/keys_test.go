package protocol

import (
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/slot"
)

// defaultPrefix is the root package's DefaultPrefix, the prefix of most keys on a server.
const defaultPrefix = "dlock:"

// braceNames are names that a naive "<prefix>{<name>}" key would get wrong on a Cluster.
var braceNames = []string{
	"}", "{", "}}", "{{", "{}", "}{", "}a", "{a", "a}", "a{", "a}b", "a{b}", "}a{b}", "{a}b",
	"orders:42", "-", " ", "}\x00{", "é}", "{:rel", "}:rel",
}

// checkKeyForm checks, for one name, what every key form must give: the name back from the
// key, and the key, the channel and the queue keys in one cluster slot.
func checkKeyForm(t *testing.T, prefix, name string) {
	t.Helper()
	key := LockKey(prefix, name)
	got, ok := NameOfKey(prefix, key)
	if !ok || got != name {
		t.Fatalf("NameOfKey(%q) = %q, %v; want %q (key of %q)", key, got, ok, name, name)
	}
	if ks, cs := slot.Of(key), slot.Of(ReleaseChannel(key)); ks != cs {
		t.Fatalf("name %q: key %q in slot %d, channel in slot %d", name, key, ks, cs)
	}
	q, w := QueueKeys(key)
	if ks, qs, ws := slot.Of(key), slot.Of(q), slot.Of(w); qs != ks || ws != ks {
		t.Fatalf("name %q: key %q in slot %d, queue keys %q and %q in slots %d and %d", name, key, ks, q, w, qs, ws)
	}
	if tag := hashTag(key); tag == "" {
		t.Fatalf("name %q: key %q has no hash tag", name, key)
	}
}

// hashTag is the part of key Redis Cluster hashes when it is not the whole key.
func hashTag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return ""
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return ""
	}
	return key[i+1 : i+1+j]
}

func TestLockKey_EveryNameKeepsOneSlot(t *testing.T) {
	for _, prefix := range []string{defaultPrefix, "", "app:"} {
		for _, name := range braceNames {
			checkKeyForm(t, prefix, name)
		}
	}
}

// Keys made by LockKey are one-to-one, and other keys under the prefix are told apart.
func TestNameOfKey_RejectsOtherKeys(t *testing.T) {
	for _, key := range []string{"dlock:", "dlock:{}", "dlock:{", "dlock:{a", "dlock:{{a}", "dlock:{}a}", "other:{a}", "dlock:{a}:rel", "dlock:{{}"} {
		if name, ok := NameOfKey(defaultPrefix, key); ok {
			t.Errorf("NameOfKey(%q) = %q, true; want false", key, name)
		}
	}
}

func TestKeyPattern_MatchesItsNames(t *testing.T) {
	for _, name := range braceNames {
		for i := 0; i <= len(name); i++ {
			pat := KeyPattern(defaultPrefix, name[:i])
			if !globMatch(pat, LockKey(defaultPrefix, name)) {
				t.Fatalf("pattern %q for prefix %q does not match the key of %q", pat, name[:i], name)
			}
		}
	}
}

// globMatch is the subset of Redis glob matching KeyPattern uses: literal bytes, '\' escapes
// and one trailing "*}".
func globMatch(pat, s string) bool {
	var lit strings.Builder
	for i := 0; i < len(pat); i++ {
		switch {
		case pat[i] == '\\' && i+1 < len(pat):
			i++
			lit.WriteByte(pat[i])
		case pat[i] == '*':
			rest := pat[i+1:]
			return strings.HasPrefix(s, lit.String()) && strings.HasSuffix(s, rest) && len(s) >= lit.Len()+len(rest)
		default:
			lit.WriteByte(pat[i])
		}
	}
	return s == lit.String()
}

func FuzzLockKey(f *testing.F) {
	for _, name := range braceNames {
		f.Add(name)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if name == "" { // the one name a lock cannot have that the key form would get wrong
			return
		}
		checkKeyForm(t, defaultPrefix, name)
	})
}

// KeyPattern (the SCAN pattern of dlock's List) quotes the glob characters of a name prefix, byte by byte.
func TestGlobEscape(t *testing.T) {
	for in, want := range map[string]string{
		"":            "",
		"orders:":     "orders:",
		`a*b?c[d]e\f`: `a\*b\?c\[d\]e\\f`,
		"\xff[":       "\xff\\[",
		"{tag}":       "{tag}",
	} {
		if got := globEscape(in); got != want {
			t.Errorf("globEscape(%q) = %q, want %q", in, got, want)
		}
	}
}
