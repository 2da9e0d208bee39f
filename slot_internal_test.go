package dlock

import "testing"

// Reference values from the Redis Cluster specification's CRC16 (XMODEM) and CLUSTER KEYSLOT.
func TestKeySlot(t *testing.T) {
	if got := crc16("123456789"); got != 0x31C3 {
		t.Fatalf("crc16(123456789) = %#x, want 0x31c3", got)
	}
	for key, want := range map[string]int{
		"foo":                  12182,
		"{user1000}.following": keySlot("user1000"),
		"foo{}{bar}":           keySlot("foo{}{bar}"),
		"dlock:{a}":            keySlot("a"),
		"dlock:{a}:rel":        keySlot("a"),
	} {
		if got := keySlot(key); got != want {
			t.Errorf("keySlot(%q) = %d, want %d", key, got, want)
		}
	}
	if got := keySlot("foo{}{bar}"); got != int(crc16("foo{}{bar}"))%clusterSlots {
		t.Errorf("an empty tag must hash the whole key, got %d", got)
	}
}
