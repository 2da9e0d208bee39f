package slot

import "testing"

// Reference values: the Redis Cluster specification gives CRC16("123456789") = 0x31C3 and the
// slot of "foo" (CLUSTER KEYSLOT foo) is 12182. internal/redistest's cluster test also compares
// Of with CLUSTER KEYSLOT on a real cluster.
func TestOf(t *testing.T) {
	if got := CRC16("123456789"); got != 0x31C3 {
		t.Fatalf("CRC16(123456789) = %#x, want 0x31c3", got)
	}
	for key, want := range map[string]int{
		"foo":                  12182,
		"{user1000}.following": Of("user1000"),
		"dlock:{a}":            Of("a"),
		"dlock:{a}:rel":        Of("a"),
		"a{}b":                 int(CRC16("a{}b")) % Count, // an empty tag hashes the whole key
		"a{b":                  int(CRC16("a{b")) % Count,  // no closing brace: the whole key
		"{a}{b}":               Of("a"),                    // the first tag counts
	} {
		if got := Of(key); got != want {
			t.Errorf("Of(%q) = %d, want %d", key, got, want)
		}
	}
}
