package dlock

import "testing"

// lockNames cuts every name of a lock from one string; each must equal what the functions
// that make it alone return.
func TestLockNames_AsTheirOwnFunctions(t *testing.T) {
	for _, tc := range []struct{ prefix, name string }{
		{"dlock:", "orders:42"}, {"", "x"}, {"p:", "{tagged}"}, {"p:", "}odd"}, {"dlock:", ""}, {"a:", "é ü"},
	} {
		key, q, w, ch, g := lockNames(tc.prefix, tc.name, "c1d")
		wq, ww := queueKeys(lockKey(tc.prefix, tc.name))
		if key != lockKey(tc.prefix, tc.name) || q != wq || w != ww || ch != releaseChannel(key) || g != grantChannel(key, "c1d") {
			t.Errorf("lockNames(%q, %q) = %q %q %q %q %q", tc.prefix, tc.name, key, q, w, ch, g)
		}
	}
}
