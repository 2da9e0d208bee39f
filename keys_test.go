package dlock

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/slot"
)

// braceNames are names that a naive "<prefix>{<name>}" key would get wrong on a Cluster.
var braceNames = []string{
	"}", "{", "}}", "{{", "{}", "}{", "}a", "{a", "a}", "a{", "a}b", "a{b}", "}a{b}", "{a}b",
	"orders:42", "-", " ", "}\x00{", "é}", "{:rel", "}:rel",
}

// checkKeyForm checks, for one name, what every key form must give: the name back from the
// key, and the key, the channel and the queue keys in one cluster slot.
func checkKeyForm(t *testing.T, prefix, name string) {
	t.Helper()
	key := lockKey(prefix, name)
	got, ok := nameOfKey(prefix, key)
	if !ok || got != name {
		t.Fatalf("nameOfKey(%q) = %q, %v; want %q (key of %q)", key, got, ok, name, name)
	}
	if ks, cs := slot.Of(key), slot.Of(releaseChannel(key)); ks != cs {
		t.Fatalf("name %q: key %q in slot %d, channel in slot %d", name, key, ks, cs)
	}
	q, w := queueKeys(key)
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
	for _, prefix := range []string{DefaultPrefix, "", "app:"} {
		for _, name := range braceNames {
			checkKeyForm(t, prefix, name)
		}
	}
}

// Keys made by lockKey are one-to-one, and other keys under the prefix are told apart.
func TestNameOfKey_RejectsOtherKeys(t *testing.T) {
	for _, key := range []string{"dlock:", "dlock:{}", "dlock:{", "dlock:{a", "dlock:{{a}", "dlock:{}a}", "other:{a}", "dlock:{a}:rel", "dlock:{{}"} {
		if name, ok := nameOfKey(DefaultPrefix, key); ok {
			t.Errorf("nameOfKey(%q) = %q, true; want false", key, name)
		}
	}
}

func TestKeyPattern_MatchesItsNames(t *testing.T) {
	for _, name := range braceNames {
		for i := 0; i <= len(name); i++ {
			pat := keyPattern(DefaultPrefix, name[:i])
			if !globMatch(pat, lockKey(DefaultPrefix, name)) {
				t.Fatalf("pattern %q for prefix %q does not match the key of %q", pat, name[:i], name)
			}
		}
	}
}

// globMatch is the subset of Redis glob matching keyPattern uses: literal bytes, '\' escapes
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
		if checkName(name) != nil {
			return
		}
		checkKeyForm(t, DefaultPrefix, name)
	})
}

// The slot the library computes for a key and its channel is the slot a real cluster node
// computes (CLUSTER KEYSLOT), for names that start or end with braces and for random ones.
func TestLockKey_SlotsAgreeWithServer(t *testing.T) {
	s := redistest.Start(t, redistest.WithArgs("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names := append([]string(nil), braceNames...)
	for i := range 200 {
		b := []byte(strconv.Itoa(i * 7919))
		for j := range b {
			if (i+j)%3 == 0 {
				b[j] = "{}"[(i+j)%2]
			}
		}
		names = append(names, string(b))
	}
	for _, name := range names {
		key := lockKey(DefaultPrefix, name)
		for _, k := range []string{key, releaseChannel(key)} {
			got, err := s.Do(ctx, "CLUSTER", "KEYSLOT", k)
			if err != nil {
				t.Fatal(err)
			}
			if want := strconv.Itoa(slot.Of(key)); got != want {
				t.Fatalf("name %q: CLUSTER KEYSLOT %q = %s, the library computes %s", name, k, got, want)
			}
		}
	}
}
