package dlock

import (
	"testing"

	"github.com/dlock-go/dlock/internal/slot"
)

// A key's fence is named as docs/PROTOCOL.md says and shares the key's Cluster slot; a key whose
// fence could not (a '}' without a hash tag) is refused.
func TestFenceKey(t *testing.T) {
	for _, tc := range []struct {
		key, fence string
		ok         bool
	}{
		{"stock:{sku-7}", "stock:{sku-7}:dlock-fence", true},
		{"{a}", "{a}:dlock-fence", true},
		{"x{a}y{b}", "x{a}y{b}:dlock-fence", true},
		{"stock:sku-7", "{stock:sku-7}:dlock-fence", true},
		{"a{b", "{a{b}:dlock-fence", true}, // no '}': the whole key is the tag, and hashes as the key
		{"a{}b", "{a{}b}:dlock-fence", false},
		{"a}b", "{a}b}:dlock-fence", false},
		{"{}", "{{}}:dlock-fence", false},
	} {
		fence, ok := fenceKey(tc.key)
		if fence != tc.fence || ok != tc.ok {
			t.Errorf("fenceKey(%q) = %q, %v; want %q, %v", tc.key, fence, ok, tc.fence, tc.ok)
		}
		if ok && slot.Of(fence) != slot.Of(tc.key) {
			t.Errorf("fence %q is in slot %d, its key %q in %d", fence, slot.Of(fence), tc.key, slot.Of(tc.key))
		}
	}
	// Any key without '}' has a fence in its slot.
	for _, key := range []string{"", "a", "stock:9", "{", "{{", "a{b{c", "é{ü"} {
		fence, ok := fenceKey(key + "x")
		if !ok || slot.Of(fence) != slot.Of(key+"x") {
			t.Errorf("fenceKey(%q) = %q, %v: want a fence in its slot", key+"x", fence, ok)
		}
	}
}
