package protocol

import (
	"reflect"
	"testing"
	"time"
)

func TestParseGrants(t *testing.T) {
	cases := []struct {
		in   string
		want []Grant
		ok   bool
	}{
		{"g 1700000000000016 c1.7 1000", []Grant{{"c1.7", 1700000000000016, time.Second}}, true},
		{"g notatoken c1.7 1000", nil, false},
		{"g 5 c1.7", []Grant{{"c1.7", 5, 0}}, true}, // a window that does not read: 0, a lease that needs renewing at once
		{"G c1.7 16 250", []Grant{{"c1.7", 16, 250 * time.Millisecond}}, true},
		{"G c1.7 16 250 c2.3 17 999", []Grant{{"c1.7", 16, 250 * time.Millisecond}, {"c2.3", 17, 999 * time.Millisecond}}, true},
		{"G c1.7 x 250 c2.3 17 999", []Grant{{"c2.3", 17, 999 * time.Millisecond}}, true}, // a grant that does not read is skipped
		{"G  c1.7  16 250 ", []Grant{{"c1.7", 16, 250 * time.Millisecond}}, true},
		{"G c1.7 16", nil, true}, // cut short: no whole grant
		{"1700000000000016", nil, false},
		{"", nil, false},
		{"gx 1 2 3", nil, false},
	}
	for _, tc := range cases {
		got, ok := ParseGrants(tc.in, nil)
		if ok != tc.ok || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseGrants(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
	// Appends to dst, without allocating for a single grant when dst has room.
	buf := make([]Grant, 0, 1)
	if n := testing.AllocsPerRun(100, func() { buf, _ = ParseGrants("g 16 c1.7 1000", buf[:0]) }); n != 0 {
		t.Errorf("a single grant cost %v allocations", n)
	}
}

func TestParseRelease(t *testing.T) {
	if got := ParseRelease("1700000000000016"); got != 1700000000000016 {
		t.Errorf("ParseRelease = %d", got)
	}
	if got := ParseRelease("nonsense"); got != AnyToken {
		t.Errorf("ParseRelease(nonsense) = %d, want AnyToken", got)
	}
}
