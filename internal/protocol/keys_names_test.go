package protocol

import "testing"

// LockNames cuts every name of a lock from one string; each must equal what the functions
// that make it alone return.
func TestLockNames_AsTheirOwnFunctions(t *testing.T) {
	for _, tc := range []struct{ prefix, name string }{
		{"dlock:", "orders:42"}, {"", "x"}, {"p:", "{tagged}"}, {"p:", "}odd"}, {"dlock:", ""}, {"a:", "é ü"},
	} {
		key, q, w, ch, g := LockNames(tc.prefix, tc.name, "c1d")
		wq, ww := QueueKeys(LockKey(tc.prefix, tc.name))
		if key != LockKey(tc.prefix, tc.name) || q != wq || w != ww || ch != ReleaseChannel(key) || g != GrantChannel(key, "c1d") {
			t.Errorf("LockNames(%q, %q) = %q %q %q %q %q", tc.prefix, tc.name, key, q, w, ch, g)
		}
	}
}
