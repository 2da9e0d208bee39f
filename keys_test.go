package dlock

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/protocol"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/slot"
)

// braceNames are names that a naive "<prefix>{<name>}" key would get wrong on a Cluster (the
// key form's own tests, without a server, are in internal/protocol).
var braceNames = []string{
	"}", "{", "}}", "{{", "{}", "}{", "}a", "{a", "a}", "a{", "a}b", "a{b}", "}a{b}", "{a}b",
	"orders:42", "-", " ", "}\x00{", "é}", "{:rel", "}:rel",
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
		key := protocol.LockKey(DefaultPrefix, name)
		for _, k := range []string{key, protocol.ReleaseChannel(key)} {
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
